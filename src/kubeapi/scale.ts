// The scale subresource (`…/<plural>/<name>/scale`) where our CRDs declare one (src/api/crd.ts):
// SandboxWarmPool, for `kubectl scale swp/<name> --replicas=N`, HPA and KEDA; and Sandbox, whose
// v1alpha1 replicas is 0 or 1. As kube-apiserver 1.37 serves a custom resource's: an
// autoscaling/v1 Scale read from the CRD's specReplicasPath, statusReplicasPath and
// labelSelectorPath; a PUT or a merge or JSON patch of that Scale writes specReplicasPath into
// the object through the same update as any other write (validation, tenancy, the team's owner
// label kept). Shapes copied from its answers (test/kubeapi.test.ts pins them):
// - spec.replicas is omitted when 0, and a missing specReplicasPath reads as 0 (the Scale's
//   int32 default; only a GET of such an object is a 500 there, which we do not copy);
// - status.replicas is always present, status.selector only when the object has one;
// - a Scale's metadata.resourceVersion is the object's, and a write naming another is a Conflict;
// - server-side apply of a Scale is a 500 there ("failed to create manager"): refused here (400).
import type { ScaleSubresource } from '../api/crd.ts';
import type { KubeObject } from '../api/meta.ts';
import type { Principal } from '../auth/keyring.ts';
import { AsbError, isAsbError } from '../errors.ts';
import type { WorkerContext } from '../worker/deps.ts';
import { conflictError, nameOf, replace, requireWrite, visible, type Answer, type PatchType } from './objects.ts';
import { jsonPatch, mergePatch } from './patch.ts';
import { refuseDryRun, type ResourcePath } from './request.ts';
import { asVersion, scaleSubresource } from './resources.ts';

export interface Scale {
  kind: 'Scale';
  apiVersion: 'autoscaling/v1';
  metadata: { name: string; namespace?: string; uid?: string; resourceVersion?: string; creationTimestamp?: string };
  spec: { replicas?: number };
  status: { replicas: number; selector?: string };
}

// Scale's replicas are int32.
const MAX_REPLICAS = 2 ** 31 - 1;
// As for patches of the object (objects.ts): a write lost to a concurrent one is re-read and
// redone, unless the request named the version it meant.
const WRITE_ATTEMPTS = 5;

/** `.spec.replicas` → ['spec', 'replicas']: the dotted field paths CRDs allow for scale. */
function fields(path: string): string[] {
  return path.replace(/^\./, '').split('.');
}

function valueAt(obj: unknown, path: string): unknown {
  let at: unknown = obj;
  for (const f of fields(path)) at = typeof at === 'object' && at !== null && !Array.isArray(at) ? (at as Record<string, unknown>)[f] : undefined;
  return at;
}

/** The object with `value` at `path`, every object on the way copied (or made). */
function withValueAt<T>(obj: T, path: string, value: unknown): T {
  const set = (at: unknown, rest: string[]): unknown => {
    const [head = '', ...tail] = rest;
    const copy = typeof at === 'object' && at !== null && !Array.isArray(at) ? { ...(at as Record<string, unknown>) } : {};
    copy[head] = tail.length === 0 ? value : set(copy[head], tail);
    return copy;
  };
  return set(obj, fields(path)) as T;
}

function int(v: unknown): number {
  return typeof v === 'number' && Number.isInteger(v) ? v : 0;
}

/** The resource's scale subresource for the path's version, if its CRD declares one. */
export function scaleSpecOf(rp: ResourcePath): ScaleSubresource | undefined {
  return scaleSubresource(rp.served, rp.version);
}

/** The object's Scale. */
export function scaleOf(obj: KubeObject, scale: ScaleSubresource): Scale {
  const { name, namespace, uid, resourceVersion, creationTimestamp } = obj.metadata;
  const replicas = int(valueAt(obj, scale.specReplicasPath));
  const selector = scale.labelSelectorPath === undefined ? undefined : valueAt(obj, scale.labelSelectorPath);
  return {
    kind: 'Scale',
    apiVersion: 'autoscaling/v1',
    metadata: { name, ...(namespace === undefined ? {} : { namespace }), ...(uid === undefined ? {} : { uid }), ...(resourceVersion === undefined ? {} : { resourceVersion }), ...(creationTimestamp === undefined ? {} : { creationTimestamp }) },
    spec: replicas === 0 ? {} : { replicas },
    status: { replicas: int(valueAt(obj, scale.statusReplicasPath)), ...(typeof selector === 'string' && selector !== '' ? { selector } : {}) },
  };
}

/** What a Scale body asks for: the replicas (absent: 0, as the apiserver decodes it) and the version it names, if any. */
export function scaleRequestOf(body: unknown, name: string): { replicas: number; resourceVersion: string | undefined } {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new AsbError('BadRequest', 'the request body must be an autoscaling/v1 Scale object');
  const scale = body as { apiVersion?: unknown; kind?: unknown; metadata?: { name?: unknown; resourceVersion?: unknown }; spec?: { replicas?: unknown } };
  if ((scale.apiVersion !== undefined && scale.apiVersion !== 'autoscaling/v1') || (scale.kind !== undefined && scale.kind !== 'Scale')) {
    throw new AsbError('BadRequest', `the object provided is unrecognized (must be of type Scale): got apiVersion ${JSON.stringify(scale.apiVersion)} and kind ${JSON.stringify(scale.kind)}, want autoscaling/v1 Scale`);
  }
  const named = scale.metadata?.name;
  if (named === undefined || named === '') throw new AsbError('BadRequest', `the name of the object (${name} based on URL) was undeterminable: name must be provided`);
  if (named !== name) throw new AsbError('BadRequest', `the name of the object (${typeof named === 'string' ? named : JSON.stringify(named)}) does not match the name on the URL (${name})`);
  const replicas = scale.spec?.replicas ?? 0;
  if (typeof replicas !== 'number' || !Number.isInteger(replicas) || replicas < 0 || replicas > MAX_REPLICAS) {
    throw new AsbError('Invalid', `spec.replicas: Invalid value: ${JSON.stringify(replicas)}: must be an integer from 0 to ${MAX_REPLICAS}`, {
      fields: [{ field: 'spec.replicas', message: `Invalid value: ${JSON.stringify(replicas)}: must be an integer from 0 to ${MAX_REPLICAS}` }],
    });
  }
  const rv = scale.metadata?.resourceVersion;
  return { replicas, resourceVersion: typeof rv === 'string' && rv !== '' ? rv : undefined };
}

export async function getScale(w: WorkerContext, p: Principal, rp: ResourcePath, scale: ScaleSubresource): Promise<Answer> {
  return { status: 200, body: scaleOf(await visible(w, p, rp), scale) };
}

/**
 * Writes the Scale `next` makes of the current one: its replicas into the object. `pinned`: the
 * request named a resourceVersion itself, so a concurrent write is its Conflict, not a retry.
 */
async function writeScale(w: WorkerContext, p: Principal, rp: ResourcePath, scale: ScaleSubresource, verb: string, pinned: boolean, next: (current: Scale) => unknown): Promise<Answer> {
  const name = nameOf(rp);
  for (let attempt = 1; ; attempt++) {
    const existing = await visible(w, p, rp);
    requireWrite(p, rp, verb);
    const current = scaleOf(existing, scale);
    const wanted = scaleRequestOf(next(current), name);
    if (wanted.resourceVersion !== undefined && wanted.resourceVersion !== existing.metadata.resourceVersion) throw conflictError(rp.served.rt, name);
    if (wanted.replicas === int(valueAt(existing, scale.specReplicasPath)) && valueAt(existing, scale.specReplicasPath) !== undefined) return { status: 200, body: current };
    const updated = withValueAt(asVersion(structuredClone(existing), rp.served.rt, rp.version), scale.specReplicasPath, wanted.replicas);
    try {
      const written = await replace(w, p, rp, existing, updated);
      return { status: 200, body: scaleOf(written.body as KubeObject, scale) };
    } catch (err) {
      if (!isAsbError(err, 'Conflict') || pinned || attempt >= WRITE_ATTEMPTS) throw err;
    }
  }
}

/** PUT of a whole Scale (`kubectl scale --current-replicas`, HPA). */
export function updateScale(w: WorkerContext, p: Principal, rp: ResourcePath, scale: ScaleSubresource, raw: unknown, query: URLSearchParams): Promise<Answer> {
  refuseDryRun(query);
  const pinned = scaleRequestOf(raw, nameOf(rp)).resourceVersion !== undefined;
  return writeScale(w, p, rp, scale, 'update', pinned, () => raw);
}

/** A merge or JSON patch of the Scale (`kubectl scale` sends {"spec":{"replicas":N}} as a merge patch). */
export function patchScale(w: WorkerContext, p: Principal, rp: ResourcePath, scale: ScaleSubresource, type: PatchType, patch: unknown, query: URLSearchParams): Promise<Answer> {
  refuseDryRun(query);
  if (type === 'apply') throw new AsbError('BadRequest', 'server-side apply of the scale subresource is not supported: send a merge or JSON patch ({"spec":{"replicas":N}}), as kubectl scale does');
  const pinned = type === 'json'
    ? Array.isArray(patch) && patch.some((op) => typeof op === 'object' && op !== null && (op as { path?: unknown }).path === '/metadata/resourceVersion')
    : valueAt(patch, '.metadata.resourceVersion') !== undefined;
  return writeScale(w, p, rp, scale, 'patch', pinned, (current) => (type === 'json' ? jsonPatch(current, patch) : mergePatch(current, patch)));
}
