// envd's REST file transfer, /files:
// - GET ?path= → the file's bytes (gzip when the client accepts it). 404/400/401 as JSON
//   `{code, message}` with the numeric status, which the SDK maps to its error classes.
// - POST, multipart/form-data: one part per file, its filename the full target path (`?path=`
//   overrides it for a single file); or application/octet-stream with `?path=`. A body with
//   Content-Encoding: gzip is inflated first. Answers `[{path, name, type:"file"}]`.
// Either carries the access token, or a signed URL (uploadUrl/downloadUrl) instead.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { posix } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { AsbError } from '../../errors.ts';
import { readBody } from '../body.ts';
import { boundaryOf, parseMultipart } from './multipart.ts';
import { absolutePath, readFile, writeFile, type FsTarget } from './entries.ts';

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

function pathQuery(query: URLSearchParams, required: boolean): string | undefined {
  const path = query.get('path');
  if (path === null || path === '') {
    if (required) throw new AsbError('BadRequest', 'query parameter path is required: the file\'s path inside the sandbox');
    return undefined;
  }
  return absolutePath(path);
}

export async function getFile(call: FilesCall): Promise<void> {
  const path = pathQuery(call.query, true) ?? '/';
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

async function bodyOf(call: FilesCall): Promise<Buffer> {
  const raw = await readBody(call.req, call.maxBytes);
  const encoding = call.req.headers['content-encoding']?.trim().toLowerCase();
  if (encoding === undefined || encoding === '' || encoding === 'identity') return raw;
  if (encoding !== 'gzip') throw new AsbError('UnsupportedMediaType', `Content-Encoding "${encoding}" is not supported; send gzip or none`);
  try {
    return gunzipSync(raw, { maxOutputLength: call.maxBytes });
  } catch (err) {
    throw new AsbError('BadRequest', `the gzip body could not be inflated: ${(err as Error).message}`);
  }
}

export async function postFiles(call: FilesCall): Promise<void> {
  const contentType = call.req.headers['content-type'] ?? '';
  const mediaType = (contentType.split(';')[0] ?? '').trim().toLowerCase();
  const path = pathQuery(call.query, mediaType !== 'multipart/form-data');
  const body = await bodyOf(call);
  const files: { path: string; data: Uint8Array }[] = [];
  if (mediaType === 'multipart/form-data') {
    for (const part of parseMultipart(body, boundaryOf(contentType))) {
      if (part.filename === undefined) continue; // a plain field, not a file
      const target = path ?? (part.filename === '' ? undefined : absolutePath(part.filename, 'the part\'s filename'));
      if (target === undefined) throw new AsbError('BadRequest', 'a multipart file part needs a filename (the full target path) or the path query parameter');
      files.push({ path: target, data: part.data });
    }
    if (files.length === 0) throw new AsbError('BadRequest', 'the multipart body holds no file part');
    if (path !== undefined && files.length > 1) throw new AsbError('BadRequest', `the path query parameter names one file but the body holds ${files.length}; give each part its path as filename instead`);
  } else if (mediaType === 'application/octet-stream' || mediaType === '') {
    files.push({ path: path ?? '/', data: body });
  } else {
    throw new AsbError('UnsupportedMediaType', `POST /files takes multipart/form-data or application/octet-stream, got "${contentType}"`);
  }
  const written: WriteInfo[] = [];
  for (const file of files) {
    await writeFile(call.target, file.path, file.data);
    written.push({ path: file.path, name: posix.basename(file.path), type: 'file' });
  }
  const json = JSON.stringify(written);
  call.res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  call.res.end(json);
}

/** envd's REST error body: the HTTP status as a number, and the message. */
export function writeRestError(res: ServerResponse, err: unknown, statusOverride?: number): void {
  const status = statusOverride ?? (err instanceof AsbError ? err.status : 500);
  const message = err instanceof Error ? err.message : String(err);
  const json = JSON.stringify({ code: status, message });
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  res.end(json);
}
