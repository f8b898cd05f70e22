// Where a client puts its API key: `Authorization: Bearer <key>` or `X-API-Key: <key>`. Shared by
// the request pipeline and the WebSocket upgrade path, which must authenticate the same way.
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
