// The patch types a custom resource takes, applied to plain JSON:
// - JSON merge patch (RFC 7386, application/merge-patch+json): what `kubectl apply` and
//   `kubectl patch --type=merge` send for custom resources;
// - JSON patch (RFC 6902, application/json-patch+json): `kubectl patch --type=json`;
// - apply (application/apply-patch+yaml, `kubectl apply --server-side`): applied here as a merge
//   patch of the whole configuration, without field ownership (see handlers.ts).
// Strategic merge patch needs per-field merge keys that CRDs do not have; the apiserver refuses it
// for custom resources with 415, and so do we.
import { AsbError } from '../errors.ts';

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isObject(patch)) return structuredClone(patch);
  const out: Record<string, unknown> = isObject(target) ? { ...target } : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) Reflect.deleteProperty(out, key);
    else out[key] = mergePatch(out[key], value);
  }
  return out;
}

interface Operation {
  op: string;
  path: string;
  from?: string;
  value?: unknown;
}

function bad(i: number, why: string): AsbError {
  return new AsbError('BadRequest', `the JSON patch's operation ${i} ${why}`, { fields: [{ field: `[${i}]`, message: why }] });
}

/** RFC 6901: "/a/b~1c/0" → ["a", "b/c", "0"]. */
function pointer(path: string, i: number): string[] {
  if (path === '') return [];
  if (!path.startsWith('/')) throw bad(i, `has path ${JSON.stringify(path)}, which is not a JSON pointer (must start with "/")`);
  return path.slice(1).split('/').map((t) => t.replaceAll('~1', '/').replaceAll('~0', '~'));
}

function parentOf(doc: unknown, tokens: readonly string[], i: number): { parent: Record<string, unknown> | unknown[]; key: string } {
  let cur: unknown = doc;
  for (const t of tokens.slice(0, -1)) {
    if (Array.isArray(cur)) cur = cur[Number(t)];
    else if (isObject(cur)) cur = cur[t];
    else cur = undefined;
    if (cur === undefined) throw bad(i, `names a path whose parent does not exist ("/${tokens.join('/')}")`);
  }
  if (!Array.isArray(cur) && !isObject(cur)) throw bad(i, `names a path inside a value that is not an object or array ("/${tokens.join('/')}")`);
  return { parent: cur, key: tokens[tokens.length - 1] ?? '' };
}

function arrayIndex(arr: readonly unknown[], key: string, i: number, insert: boolean): number {
  if (insert && key === '-') return arr.length;
  const n = /^(0|[1-9][0-9]*)$/.test(key) ? Number(key) : NaN;
  if (!(n >= 0 && n < arr.length + (insert ? 1 : 0))) throw bad(i, `has array index ${JSON.stringify(key)} out of range (length ${arr.length})`);
  return n;
}

function get(doc: unknown, tokens: readonly string[], i: number): unknown {
  if (tokens.length === 0) return doc;
  const { parent, key } = parentOf(doc, tokens, i);
  const value = Array.isArray(parent) ? parent[arrayIndex(parent, key, i, false)] : parent[key];
  if (value === undefined) throw bad(i, `names "/${tokens.join('/')}", which does not exist`);
  return value;
}

function remove(doc: unknown, tokens: readonly string[], i: number): unknown {
  const { parent, key } = parentOf(doc, tokens, i);
  if (Array.isArray(parent)) return parent.splice(arrayIndex(parent, key, i, false), 1)[0];
  if (!Object.hasOwn(parent, key)) throw bad(i, `removes "/${tokens.join('/')}", which does not exist`);
  const value = parent[key];
  Reflect.deleteProperty(parent, key);
  return value;
}

function add(doc: unknown, tokens: readonly string[], value: unknown, i: number): unknown {
  if (tokens.length === 0) return value;
  const { parent, key } = parentOf(doc, tokens, i);
  if (Array.isArray(parent)) parent.splice(arrayIndex(parent, key, i, true), 0, value);
  else parent[key] = value;
  return doc;
}

export function jsonPatch(target: unknown, ops: unknown): unknown {
  if (!Array.isArray(ops)) throw new AsbError('BadRequest', 'a JSON patch (application/json-patch+json) must be an array of operations');
  let doc = structuredClone(target);
  for (const [i, raw] of ops.entries()) {
    if (!isObject(raw) || typeof raw.op !== 'string' || typeof raw.path !== 'string') throw bad(i, 'must be an object with string "op" and "path"');
    const op = raw as unknown as Operation;
    const tokens = pointer(op.path, i);
    const needValue = (): unknown => {
      if (!Object.hasOwn(raw, 'value')) throw bad(i, `(${op.op}) needs a "value"`);
      return structuredClone(op.value);
    };
    const from = (): string[] => {
      if (typeof op.from !== 'string') throw bad(i, `(${op.op}) needs a string "from"`);
      return pointer(op.from, i);
    };
    switch (op.op) {
      case 'add':
        doc = add(doc, tokens, needValue(), i);
        break;
      case 'remove':
        remove(doc, tokens, i);
        break;
      case 'replace':
        get(doc, tokens, i);
        if (tokens.length === 0) doc = needValue();
        else {
          remove(doc, tokens, i);
          doc = add(doc, tokens, needValue(), i);
        }
        break;
      case 'move': {
        const value = remove(doc, from(), i);
        doc = add(doc, tokens, value, i);
        break;
      }
      case 'copy':
        doc = add(doc, tokens, structuredClone(get(doc, from(), i)), i);
        break;
      case 'test':
        if (JSON.stringify(get(doc, tokens, i)) !== JSON.stringify(needValue())) throw new AsbError('Invalid', `the JSON patch's test at operation ${i} failed: "${op.path}" does not hold the given value`);
        break;
      default:
        throw bad(i, `has unknown op ${JSON.stringify(op.op)} (add, remove, replace, move, copy, test)`);
    }
  }
  return doc;
}
