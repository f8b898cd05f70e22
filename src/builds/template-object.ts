// The SandboxTemplate a successful build makes: its pod runs the built image, owned by the team
// (LABEL.owner, as a team's Sandbox is), found by its E2B name through TEMPLATE_NAME_LABEL.
//
// The start command (E2B's startCmd) is the container's command, in a subshell followed by
// `exec sleep infinity`: it starts with the sandbox, as the image's user in its workdir with its
// env, and the sandbox stays up and reachable when it exits (E2B's start commands are servers,
// but a one-shot setup script is common too). Without one the container sleeps, as base does.
// The ready command becomes an exec readiness probe (`sh -c`, each second): a create waits for it.
import { apiVersionOf } from '../api/meta.ts';
import { LABEL, SandboxTemplateType, type Container, type SandboxTemplate } from '../api/types.ts';

/** The team's name for the template (E2B's alias), on its SandboxTemplate. */
export const TEMPLATE_NAME_LABEL = 'asb.dev/template-name';
/** The build whose image the template runs. */
export const TEMPLATE_BUILD_ANNOTATION = 'asb.dev/template-build';
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
      name: b.templateId,
      namespace: b.namespace,
      labels: { [LABEL.owner]: b.team, [TEMPLATE_NAME_LABEL]: b.name },
      annotations: { [TEMPLATE_BUILD_ANNOTATION]: b.buildId },
    },
    spec: { podTemplate: { spec: { containers: [main] } } },
  };
}
