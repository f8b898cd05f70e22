// envd's REST file transfer, /files:
// - GET ?path= → the file's bytes (gzip when the client accepts it). 404/400/401 as JSON
//   `{code, message}` with the numeric status, which the SDK maps to its error classes.
// - POST, multipart/form-data: one part per file, its filename the target path (`?path=`
//   overrides it for a single file); or application/octet-stream with `?path=`. A body with
//   Content-Encoding: gzip is inflated as it streams. Answers `[{path, name, type:"file"}]`.
//   The body is streamed into the sandbox, never held (postFiles); uploads at once are bounded
//   per sandbox token and per worker (envd.ts, upload-slots.ts).
// Either carries the access token, or a signed URL (uploadUrl/downloadUrl) instead. A path is
// absolute, or relative to (or ~ for) the home of the request's user, as under envd (paths.ts).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { posix } from 'node:path';
import { gzipSync } from 'node:zlib';
import { AsbError } from '../../errors.ts';
import { commitFiles, discardFiles, stageFile, writeFileFrom, type PodShell, type StagedFile } from '../../runtime/file-upload.ts';
import { discardRest, uploadChunks } from '../upload-body.ts';
import { boundaryOf, parseMultipart } from './multipart.ts';
import { readFile, type FsTarget } from './entries.ts';
import { userPath } from './paths.ts';

/** A written file as the SDK's WriteInfo. */
interface WriteInfo {
  path: string;
  name: string;
  type: 'file';
}

export interface FilesCall {
  target: FsTarget;
  req: IncomingMessage;
  res: ServerResponse;
  query: URLSearchParams;
  maxBytes: number;
}

function acceptsGzip(req: IncomingMessage): boolean {
  const header = req.headers['accept-encoding'];
  if (typeof header !== 'string') return false;
  return header.split(',').some((item) => {
    const [coding = '', ...params] = item.split(';').map((p) => p.trim().toLowerCase());
    const q = params.find((p) => p.startsWith('q='));
    return coding === 'gzip' && (q === undefined || Number(q.slice(2)) > 0);
  });
}

/** The path query parameter for the request's user (relative and ~ from its home, paths.ts). */
async function pathQuery(call: FilesCall, required: boolean): Promise<string | undefined> {
  const path = call.query.get('path');
  if (path === null || path === '') {
    if (required) throw new AsbError('BadRequest', 'query parameter path is required: the file\'s path inside the sandbox (absolute, or from the user\'s home)');
    return undefined;
  }
  return userPath(call.target.home, path);
}

export async function getFile(call: FilesCall): Promise<void> {
  const path = await pathQuery(call, true) ?? '/';
  const bytes = Buffer.from(await readFile(call.target, path, call.maxBytes));
  const headers: Record<string, string | number> = { 'content-type': 'application/octet-stream' };
  let body = bytes;
  if (acceptsGzip(call.req) && bytes.length > 0) {
    body = gzipSync(bytes);
    headers['content-encoding'] = 'gzip';
  }
  headers['content-length'] = body.length;
  call.res.writeHead(200, headers);
  call.res.end(body);
}

/** Where uploads of this call run: its sandbox, as its user. */
function shellOf(t: FsTarget): PodShell {
  return { spawn: (req) => t.runtime.spawn(t.id, req), exec: (req) => t.runtime.exec(t.id, req) };
}

/**
 * Streams the body into the sandbox: each file is staged as its bytes arrive and all of them are
 * renamed into place only once the whole body has been read, so a failure at any point (413, a
 * malformed part, an aborted client) leaves no file changed and no temporary file behind.
 */
export async function postFiles(call: FilesCall): Promise<void> {
  const contentType = call.req.headers['content-type'] ?? '';
  const mediaType = (contentType.split(';')[0] ?? '').trim().toLowerCase();
  const multipart = mediaType === 'multipart/form-data';
  if (!multipart && mediaType !== 'application/octet-stream' && mediaType !== '') {
    throw new AsbError('UnsupportedMediaType', `POST /files takes multipart/form-data or application/octet-stream, got "${contentType}"`);
  }
  const path = await pathQuery(call, !multipart);
  const boundary = multipart ? boundaryOf(contentType) : '';
  const shell = shellOf(call.target);
  const user = { user: call.target.uid };
  const staged: StagedFile[] = [];
  try {
    const chunks = uploadChunks(call.req, call.maxBytes);
    if (multipart) {
      for await (const part of parseMultipart(chunks, boundary)) {
        if (part.filename === undefined) continue; // a plain field, not a file: the parser skips its data
        const target = path ?? (part.filename === '' ? undefined : await userPath(call.target.home, part.filename, 'the part\'s filename'));
        if (target === undefined) throw new AsbError('BadRequest', 'a multipart file part needs a filename (the full target path) or the path query parameter');
        if (path !== undefined && staged.length > 0) throw new AsbError('BadRequest', 'the path query parameter names one file but the body holds more than one; give each part its path as filename instead');
        staged.push(await stageFile(shell, target, part.data, user));
      }
      if (staged.length === 0) throw new AsbError('BadRequest', 'the multipart body holds no file part');
      await commitFiles(shell, staged, user);
    } else {
      await writeFileFrom(shell, path ?? '/', chunks, user);
    }
  } catch (err) {
    await discardFiles(shell, staged, user);
    throw err;
  } finally {
    discardRest(call.req); // what follows the closing delimiter, or the rest of a refused body
  }
  const paths = multipart ? staged.map((f) => f.path) : [path ?? '/'];
  const written: WriteInfo[] = paths.map((p) => ({ path: p, name: posix.basename(p), type: 'file' }));
  const json = JSON.stringify(written);
  call.res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  call.res.end(json);
}

/** envd's REST error body: the HTTP status as a number, and the message. */
export function writeRestError(res: ServerResponse, err: unknown, statusOverride?: number): void {
  const status = statusOverride ?? (err instanceof AsbError ? err.status : 500);
  const message = err instanceof Error ? err.message : String(err);
  const json = JSON.stringify({ code: status, message });
  const retryAfter = err instanceof AsbError && err.retryAfterS !== undefined ? { 'retry-after': String(err.retryAfterS) } : {};
  res.writeHead(status, { ...retryAfter, 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  res.end(json);
}
