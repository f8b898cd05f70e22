// The pod-security level each pod spec a team key applies is held to (the policy itself is
// src/api/pod-security.ts). Admin keys are trusted and not checked: they write the templates.
//
// - A Sandbox a team applies is `restricted`, unless the Sandbox it replaces carries a looser
//   `asb.dev/pod-security` annotation: the controller copies that from the SandboxTemplate a
//   sandbox was claimed from (src/operator/blueprint.ts), so only an admin can relax a level.
// - A team may narrow its Sandbox's level with the same annotation (`restricted` on a sandbox of
//   a `baseline` template), never loosen it: the annotation is refused when looser than allowed.
//   The level applied is kept on the object, so the next apply is held to it too.
import type { KubeObject } from '../api/meta.ts';
import { isLooser, levelOf, NO_ROOT_ISOLATION, POD_SECURITY_ANNOTATION, podSecurityProblems, type PodSecurityLevel } from '../api/pod-security.ts';
import { SandboxType, type Sandbox } from '../api/types.ts';
import type { Principal } from '../auth/keyring.ts';
import type { FieldProblem } from '../errors.ts';
import { canSee } from './access.ts';
import type { WorkerContext } from './deps.ts';

const TENANT_DEFAULT: PodSecurityLevel = 'restricted';

/**
 * Every field of every applied Sandbox that its level refuses, for a team key (none for an admin).
 * Stamps the level onto each Sandbox that keeps a relaxed one. `path` names an object in the request.
 */
export async function tenantPodProblems(w: WorkerContext, p: Principal, items: readonly { obj: KubeObject; path: string; existing?: KubeObject | undefined }[]): Promise<FieldProblem[]> {
  if (p.admin) return [];
  const problems: FieldProblem[] = [];
  for (const item of items) {
    const { obj } = item;
    if (obj.kind !== SandboxType.kind) continue;
    const sandbox = obj as Sandbox;
    // The caller's read of the stored object when it has one ('existing' in item, even undefined: none stored).
    const existing = ('existing' in item ? item.existing : await w.store.tryGet<Sandbox>(SandboxType, sandbox.metadata.namespace ?? w.defaultNamespace, sandbox.metadata.name)) as Sandbox | undefined;
    const path = (field: string): string => (item.path === '' ? field : `${item.path}.${field}`);
    const allowed = existing !== undefined && canSee(p, existing) ? levelOf(existing.metadata.annotations, TENANT_DEFAULT) : TENANT_DEFAULT;
    const level = levelOf(sandbox.metadata.annotations, allowed);
    if (isLooser(level, allowed)) {
      problems.push({
        field: path(`metadata.annotations[${JSON.stringify(POD_SECURITY_ANNOTATION)}]`),
        message: `must be ${allowed} or stricter, got "${level}": only a SandboxTemplate (written with an admin key) can relax the pod security level`,
      });
      continue;
    }
    const isolation = w.runtime.rootIsolation ?? NO_ROOT_ISOLATION;
    problems.push(...podSecurityProblems(sandbox.spec.podTemplate.spec, level, path('spec.podTemplate.spec'), isolation));
    if (level !== TENANT_DEFAULT) sandbox.metadata.annotations = { ...sandbox.metadata.annotations, [POD_SECURITY_ANNOTATION]: level };
  }
  return problems;
}
