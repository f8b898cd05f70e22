// Which OCI runtime runs a local pod, from its `runtimeClassName`, pure. As on Kubernetes, where
// the name picks a RuntimeClass and so a handler of the node's container runtime: none means the
// default (runc here), `gvisor` means gVisor's runsc, and a name the node has no handler for fails
// the pod instead of running it under a weaker runtime than it asked for.

import { GVISOR_RUNTIME_CLASS } from '../../api/types.ts';

export type RuntimeKind = 'runc' | 'runsc';

export type RuntimeClassDecision =
  | { ok: true; kind: RuntimeKind }
  | { ok: false; reason: 'RuntimeClassNotFound' | 'RuntimeUnavailable'; message: string };

/**
 * The runtime for a pod's `runtimeClassName` (absent or empty: runc). `runscUnavailable` says why
 * this worker cannot run gVisor (runsc not built), undefined when it can.
 */
export function decideRuntimeClass(name: unknown, runscUnavailable: string | undefined): RuntimeClassDecision {
  if (name === undefined || name === null || name === '') return { ok: true, kind: 'runc' };
  if (name === GVISOR_RUNTIME_CLASS) {
    if (runscUnavailable === undefined) return { ok: true, kind: 'runsc' };
    return { ok: false, reason: 'RuntimeUnavailable', message: `runtimeClassName "${GVISOR_RUNTIME_CLASS}" needs gVisor, which this worker cannot run: ${runscUnavailable}` };
  }
  const shown = typeof name === 'string' ? JSON.stringify(name) : `of type ${typeof name}`;
  return {
    ok: false,
    reason: 'RuntimeClassNotFound',
    message: `RuntimeClass ${shown} not found: the local runtime runs a pod with no runtimeClassName under runc, and runtimeClassName "${GVISOR_RUNTIME_CLASS}" under gVisor`,
  };
}
