// Which SandboxTemplate a team's create names. Templates an admin applies carry no owner and
// serve every team, as always; a template a team built (src/builds/) carries the team as its
// owner and serves that team only, found by its id or by its name (E2B's alias) through
// TEMPLATE_NAME_LABEL. `name:tag` starts the build the tag names: the build service of the
// cluster that built it knows the tags and names that build's own SandboxTemplate (a pin,
// template-object.ts); on any other cluster the pins came through the hub, and the pin whose
// TEMPLATE_TAGS_ANNOTATION names the tag is the one. `name` and `name:default` start the
// template's own. Another team's template answers as absent, by id and
// by name, so its existence is not revealed. The object name is tried first, from the claimer's
// cache (no read on the warm path for `base`); so an admin's template named like a team's
// template wins over it, and a team's names cost one labelled list per create.
import type { Principal } from '../auth/keyring.ts';
import { LABEL, SandboxTemplateType, type SandboxTemplate } from '../api/types.ts';
import { pinTags, TEMPLATE_ID_LABEL, TEMPLATE_NAME_LABEL, TEMPLATE_PIN_LABEL } from '../builds/template-object.ts';
import { AsbError } from '../errors.ts';
import type { WorkerContext } from './deps.ts';

const LABEL_VALUE = /^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$/;

export function usableBy(p: Principal, t: SandboxTemplate): boolean {
  const owner = t.metadata.labels?.[LABEL.owner];
  return owner === undefined || owner === p.team;
}

function notFound(name: string, namespace: string): AsbError {
  return new AsbError('NotFound', `template "${name}" not found in namespace "${namespace}"; list templates with GET /v1/templates`);
}

/** The object name of the template `name` the principal may start, or NotFound. */
export async function resolveTemplate(w: WorkerContext, p: Principal, namespace: string, name: string): Promise<string> {
  // `name:tag` is no object name (a kube-apiserver would refuse the read).
  const byName = name.includes(':') ? undefined : (w.operator.claimer.cachedTemplate(namespace, name) ?? (await w.store.tryGet<SandboxTemplate>(SandboxTemplateType, namespace, name)));
  if (byName !== undefined && usableBy(p, byName)) return name;
  const colon = name.indexOf(':');
  const alias = colon === -1 ? name : name.slice(0, colon);
  const tag = colon === -1 ? undefined : name.slice(colon + 1);
  if (tag !== undefined && tag !== 'default') {
    const pinned = namespace === w.builds?.namespace ? w.builds.templateObjectFor(p.team, name) : undefined;
    const obj = pinned === undefined ? undefined : await w.store.tryGet<SandboxTemplate>(SandboxTemplateType, namespace, pinned);
    if (pinned !== undefined && obj !== undefined && usableBy(p, obj) && obj.metadata.deletionTimestamp === undefined) return pinned;
    if (pinned === undefined && LABEL_VALUE.test(alias) && LABEL_VALUE.test(p.team)) {
      // By the template's name, else by its id (`<id>:tag`).
      for (const label of [TEMPLATE_NAME_LABEL, TEMPLATE_ID_LABEL]) {
        const pins = await w.store.list<SandboxTemplate>(SandboxTemplateType, { namespace, labelSelector: `${LABEL.owner}=${p.team},${label}=${alias},${TEMPLATE_PIN_LABEL}` });
        const found = pins.items.find((t) => t.metadata.deletionTimestamp === undefined && pinTags(t).includes(tag));
        if (found !== undefined) return found.metadata.name;
      }
    }
    throw new AsbError('NotFound', `template "${name}" not found in namespace "${namespace}": no template of your team named "${alias}" has the tag "${tag}"; list your templates with asb template ls`);
  }
  const own = await ownTemplateNamed(w, p.team, namespace, alias);
  if (own !== undefined) return own.metadata.name;
  throw notFound(name, namespace);
}

/** The team's template named `name` (E2B's alias): its own object, not a pinned build's (which carries the same name). */
export async function ownTemplateNamed(w: WorkerContext, team: string, namespace: string, name: string): Promise<SandboxTemplate | undefined> {
  // Both go into a label selector; what is no label value names no template.
  if (!LABEL_VALUE.test(name) || !LABEL_VALUE.test(team)) return undefined;
  const own = await w.store.list<SandboxTemplate>(SandboxTemplateType, { namespace, labelSelector: `${LABEL.owner}=${team},${TEMPLATE_NAME_LABEL}=${name},!${TEMPLATE_PIN_LABEL}` });
  return own.items.find((t) => t.metadata.deletionTimestamp === undefined);
}
