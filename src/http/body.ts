// Request bodies: read with a byte limit (413 beyond it, checked against Content-Length before
// reading a byte and again while streaming), and JSON parsed only from a JSON content type.
import type { IncomingMessage } from 'node:http';
import { AsbError } from '../errors.ts';

/** JSON bodies are objects of a few fields; 1 MiB holds any real one with room to spare. */
export const DEFAULT_JSON_LIMIT_BYTES = 1024 * 1024;
/** The largest file an upload (PUT /files, envd's /files) may write; uploads stream (upload-body.ts), so this bounds the file, not the worker's memory. */
export const DEFAULT_UPLOAD_LIMIT_BYTES = 64 * 1024 * 1024;

function tooLarge(limitBytes: number): AsbError {
  return new AsbError('PayloadTooLarge', `request body is larger than the limit of ${limitBytes} bytes`);
}

/**
 * The whole body, or PayloadTooLarge as soon as it passes limitBytes. Read with 'data'/'end'
 * listeners rather than `for await`: the async iterator cost 17 ms of a 5×64-claim probe's
 * ~540 ms of worker CPU (bench/claim-probe.ts), more than parsing the JSON.
 */
export function readBody(req: IncomingMessage, limitBytes: number): Promise<Buffer> {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > limitBytes) return Promise.reject(tooLarge(limitBytes));
  if (req.readableEnded) return Promise.resolve(Buffer.alloc(0));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const cleanup = (): void => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('close', onClose);
    };
    const fail = (err: AsbError): void => {
      cleanup();
      // Nothing more is read: the rest of an oversized body is discarded, not buffered.
      req.resume();
      reject(err);
    };
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limitBytes) fail(tooLarge(limitBytes));
      else chunks.push(chunk);
    };
    const onEnd = (): void => {
      cleanup();
      resolve(chunks.length === 1 && chunks[0] !== undefined ? chunks[0] : Buffer.concat(chunks, size));
    };
    const onError = (err: Error): void => {
      fail(new AsbError('BadRequest', 'the request body could not be read (connection aborted?)', { cause: err }));
    };
    const onClose = (): void => {
      if (!req.complete) fail(new AsbError('BadRequest', 'the request body could not be read (connection aborted?)'));
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
}

export function isJsonContentType(header: string | undefined): boolean {
  if (header === undefined) return false;
  const mediaType = (header.split(';')[0] ?? '').trim().toLowerCase();
  return mediaType === 'application/json' || (mediaType.startsWith('application/') && mediaType.endsWith('+json'));
}

/**
 * The parsed JSON body. An empty body is `undefined` (routes whose body is optional treat it as
 * `{}`); a non-empty body needs a JSON content type (415 otherwise) and must parse (400 with
 * the parser's position otherwise).
 */
export async function readJson(req: IncomingMessage, limitBytes: number = DEFAULT_JSON_LIMIT_BYTES): Promise<unknown> {
  const contentType = req.headers['content-type'];
  const declared = req.headers['content-length'];
  const hasBody = (declared !== undefined && declared !== '0') || req.headers['transfer-encoding'] !== undefined;
  if (hasBody && !isJsonContentType(contentType)) {
    throw new AsbError('UnsupportedMediaType', `this route takes a JSON body: send it with Content-Type: application/json (got ${contentType === undefined ? 'no Content-Type' : `"${contentType}"`})`);
  }
  const raw = await readBody(req, limitBytes);
  if (raw.length === 0) return undefined;
  if (!isJsonContentType(contentType)) {
    throw new AsbError('UnsupportedMediaType', 'this route takes a JSON body: send it with Content-Type: application/json');
  }
  const text = raw.toString('utf8');
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    throw new AsbError('MalformedJson', `request body is not valid JSON: ${message}`);
  }
}

/** A parsed JSON body that is an object (not null, not an array). */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
