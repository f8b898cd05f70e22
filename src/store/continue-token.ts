// The opaque `continue` token of a paged list. It carries the last key returned (namespace and
// name); the next page starts strictly after that key in the store's order (namespace, then
// name) and reads the store as it is *then*, not as it was when the first page was read.
// So: no object is returned twice and none that existed throughout is skipped, but objects
// created or deleted between pages may or may not show up, and each page carries the store's
// resourceVersion at its own read. (The apiserver serves later pages from a snapshot; an
// in-memory store without MVCC cannot, and controllers only need the guarantee above.)
import { AsbError } from '../errors.ts';

const VERSION = 1;

export interface ContinueKey {
  namespace: string;
  name: string;
}

export function encodeContinue(key: ContinueKey): string {
  return Buffer.from(JSON.stringify({ v: VERSION, ns: key.namespace, n: key.name })).toString('base64url');
}

export function decodeContinue(token: string): ContinueKey {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
  } catch (err) {
    throw new AsbError('BadRequest', 'invalid continue token: not produced by this store', { cause: err });
  }
  if (typeof parsed !== 'object' || parsed === null) throw new AsbError('BadRequest', 'invalid continue token');
  const { v, ns, n } = parsed as Record<string, unknown>;
  if (v !== VERSION || typeof ns !== 'string' || typeof n !== 'string') {
    throw new AsbError('BadRequest', 'invalid continue token: not produced by this store');
  }
  return { namespace: ns, name: n };
}
