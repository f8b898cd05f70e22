// Request bodies: read with a byte limit (413 beyond it, checked against Content-Length before
// reading a byte and again while streaming), and JSON parsed only from a JSON content type.
import type { IncomingMessage } from 'node:http';
import { AsbError } from '../errors.ts';

/** JSON bodies are objects of a few fields; 1 MiB holds any real one with room to spare. */
export const DEFAULT_JSON_LIMIT_BYTES = 1024 * 1024;
/** File uploads through PUT /files: 64 MiB keeps one upload in memory without risk on 24 GB. */
export const DEFAULT_UPLOAD_LIMIT_BYTES = 64 * 1024 * 1024;

function tooLarge(limitBytes: number): AsbError {
  return new AsbError('PayloadTooLarge', `request body is larger than the limit of ${limitBytes} bytes`);
}

/** The whole body, or PayloadTooLarge as soon as it passes limitBytes. */
export async function readBody(req: IncomingMessage, limitBytes: number): Promise<Buffer> {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > limitBytes) throw tooLarge(limitBytes);
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of req as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > limitBytes) throw tooLarge(limitBytes);
      chunks.push(chunk);
    }
  } catch (err) {
    if (err instanceof AsbError) throw err;
    throw new AsbError('BadRequest', 'the request body could not be read (connection aborted?)', { cause: err });
  }
  return Buffer.concat(chunks, size);
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
