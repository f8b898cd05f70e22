// Where a client puts its API key: `Authorization: Bearer <key>` or `X-API-Key: <key>`. Shared by
// the request pipeline and the WebSocket upgrade path, which must authenticate the same way, and
// by the processes that pass a caller's request on with its key as presented.
import type { IncomingMessage } from 'node:http';

export const AUTH_HINT = 'pass an API key as "Authorization: Bearer asb_<prefix>_<secret>" or "X-API-Key: asb_<prefix>_<secret>"';

/** The presented key; '' for a malformed Authorization header; undefined when none was sent. */
export function presentedKey(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization;
  if (header !== undefined) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
    return m?.[1] ?? '';
  }
  const apiKey = req.headers['x-api-key'];
  return typeof apiKey === 'string' ? apiKey.trim() : undefined;
}

/**
 * The caller's key headers as presented, and those of `also` the request carries, for a request
 * passed on to another process on the caller's behalf (the hub to a worker, an API process to its
 * cluster's operator), which checks the key and scopes the answer to the caller's team itself.
 */
export function forwardedHeaders(req: IncomingMessage, also: readonly string[] = []): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of ['authorization', 'x-api-key', ...also]) {
    const value = req.headers[name];
    if (typeof value === 'string') out[name] = value;
  }
  return out;
}
