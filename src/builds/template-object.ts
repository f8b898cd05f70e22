// The SandboxTemplate a successful build makes: its pod runs the built image, owned by the team
// (LABEL.owner, as a team's Sandbox is), found by its E2B name through TEMPLATE_NAME_LABEL.
//
// The start command (E2B's startCmd) is the container's command, in a subshell followed by
// `exec sleep infinity`: it starts with the sandbox, as the image's user in its workdir with its
// env, and the sandbox stays up and reachable when it exits (E2B's start commands are servers,
// but a one-shot setup script is common too). Without one the container sleeps, as base does.
// The ready command becomes an exec readiness probe (`sh -c`, each second): a create waits for it.
//
// Tags pin builds: besides the template's own object (named by its id, running the build its
// `default` tag names: what `name` starts), each build another tag names (`name:v1`) has a
// SandboxTemplate of its own, named `<template id>-<build id>` and labelled with the build
// (TEMPLATE_PIN_LABEL). A create of `name:tag` starts that object; the build service makes it
// when a tag first names the build and deletes it when no tag does (template-objects.ts). One object per
// pinned build, rather than one object whose image a claim replaces: a sandbox copies its
// template's pod spec when it is made, so a pin is an ordinary template to the claimer, the
// operator, kubectl and the hub, and a build's env, workdir, start and ready commands stay with it.
// A pin also carries the tags that name its build (TEMPLATE_TAGS_ANNOTATION): the build records
// that hold the tags are the building worker's, but the pins travel through the hub to every
// cluster, where a create of `name:tag` finds the pin by its tags (src/worker/team-templates.ts).
import { apiVersionOf } from '../api/meta.ts';
import { LABEL, SandboxTemplateType, type Container, type SandboxTemplate } from '../api/types.ts';

/** The team's name for the template (E2B's alias), on its SandboxTemplate. */
export const TEMPLATE_NAME_LABEL = 'asb.dev/template-name';
/** The build whose image the template runs. */
export const TEMPLATE_BUILD_ANNOTATION = 'asb.dev/template-build';
/** The template id (the build service's) on every SandboxTemplate of a built template: its own and its pins. */
export const TEMPLATE_ID_LABEL = 'asb.dev/template-id';
/** On a pinned build's SandboxTemplate only: the build it runs. */
export const TEMPLATE_PIN_LABEL = 'asb.dev/template-pin';

/** On a pinned build's SandboxTemplate: the tags that name its build, comma-separated (a tag has no comma). */
export const TEMPLATE_TAGS_ANNOTATION = 'asb.dev/template-tags';

/** The tags a pin's annotation names (none when it has no annotation). */
export function pinTags(t: { metadata: { annotations?: Record<string, string> } }): string[] {
  const value = t.metadata.annotations?.[TEMPLATE_TAGS_ANNOTATION] ?? '';
  return value === '' ? [] : value.split(',');
}

/** The annotation value of `tags`: sorted, so the same set is the same text (and no write). */
export function tagsAnnotation(tags: Iterable<string>): string {
  return [...new Set(tags)].sort().join(',');
}

/** The SandboxTemplate of a pinned build: 20 + 1 + 36 characters, a valid label value (sandboxes carry it). */
export function pinnedTemplateName(templateId: string, buildId: string): string {
  return `${templateId}-${buildId}`;
}
/** The envd port E2B SDKs connect to, declared as base declares it. */
const ENVD_PORT = 49983;

export interface BuiltTemplate {
  namespace: string;
  templateId: string;
  team: string;
  name: string;
  buildId: string;
  image: string;
  config: { env: string[]; workingDir?: string; user?: string };
  startCmd?: string;
  readyCmd?: string;
  cpuCount: number;
  memoryMB: number;
  /** The object of this build alone (a tag names it), not the template's own. */
  pinned?: boolean;
  /** A pin's tags: those that name its build (TEMPLATE_TAGS_ANNOTATION). */
  tags?: readonly string[];
}

/** The command that runs startCmd and then keeps the sandbox alive. */
export function startCommand(startCmd: string | undefined): string[] {
  if (startCmd === undefined || startCmd.trim() === '') return ['sleep', 'infinity'];
  return ['/bin/sh', '-c', `(\n${startCmd}\n)\nexec sleep infinity`];
}

export function builtTemplateObject(b: BuiltTemplate): SandboxTemplate {
  const env = b.config.env.flatMap((kv) => {
    const eq = kv.indexOf('=');
    return eq <= 0 ? [] : [{ name: kv.slice(0, eq), value: kv.slice(eq + 1) }];
  });
  const main: Container = {
    name: 'main',
    image: b.image,
    command: startCommand(b.startCmd),
    env,
    ports: [{ containerPort: ENVD_PORT, name: 'envd', protocol: 'TCP' }],
    resources: { limits: { cpu: String(b.cpuCount), memory: `${String(b.memoryMB)}Mi` } },
  };
  if (b.config.workingDir !== undefined && b.config.workingDir !== '') main.workingDir = b.config.workingDir;
  if (b.readyCmd !== undefined && b.readyCmd.trim() !== '') main.readinessProbe = { exec: { command: ['/bin/sh', '-c', b.readyCmd] }, periodSeconds: 1 };
  return {
    apiVersion: apiVersionOf(SandboxTemplateType),
    kind: SandboxTemplateType.kind,
    metadata: {
      name: b.pinned === true ? pinnedTemplateName(b.templateId, b.buildId) : b.templateId,
      namespace: b.namespace,
      labels: { [LABEL.owner]: b.team, [TEMPLATE_NAME_LABEL]: b.name, [TEMPLATE_ID_LABEL]: b.templateId, ...(b.pinned === true ? { [TEMPLATE_PIN_LABEL]: b.buildId } : {}) },
      annotations: { [TEMPLATE_BUILD_ANNOTATION]: b.buildId, ...(b.pinned === true ? { [TEMPLATE_TAGS_ANNOTATION]: tagsAnnotation(b.tags ?? []) } : {}) },
    },
    spec: { podTemplate: { spec: { containers: [main] } } },
  };
}
