// An upload's request body as a stream of decoded chunks, never the whole body: the bytes are
// passed on as the socket delivers them (backpressure reaches the client through TCP), gzip is
// inflated as a stream, and the size limit is applied while streaming, to the raw bytes and to
// the inflated ones (a 64 KiB gzip of zeros inflates to 64 MiB). Content-Length over the limit is
// refused before a byte is read.
import type { IncomingMessage } from 'node:http';
import { pipeline, Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { AsbError } from '../errors.ts';

function tooLarge(limitBytes: number, what: string): AsbError {
  return new AsbError('PayloadTooLarge', `${what} is larger than the limit of ${limitBytes} bytes`);
}

async function* limited(chunks: AsyncIterable<Buffer>, limitBytes: number, what: string): AsyncGenerator<Buffer> {
  let size = 0;
  for await (const chunk of chunks) {
    size += chunk.length;
    if (size > limitBytes) throw tooLarge(limitBytes, what);
    yield chunk;
  }
}

async function* raw(req: IncomingMessage): AsyncGenerator<Buffer> {
  // destroyOnReturn false: when the upload stops early (413, a failed write), the socket must
  // stay open for the error reply; discardRest() reads the rest away.
  try {
    for await (const chunk of req.iterator({ destroyOnReturn: false }) as AsyncIterable<Buffer>) yield chunk;
  } catch (err) {
    throw new AsbError('BadRequest', 'the request body could not be read (connection aborted?)', { cause: err });
  }
}

async function* inflate(chunks: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  // pipeline destroys every stream with the first error, so the gunzip stream's iterator throws
  // ours (413 from the raw limit) or zlib's (a corrupt body).
  const gunzip = pipeline(Readable.from(chunks, { objectMode: false }), createGunzip(), () => undefined);
  try {
    for await (const chunk of gunzip as AsyncIterable<Buffer>) yield chunk;
  } catch (err) {
    if (err instanceof AsbError) throw err;
    throw new AsbError('BadRequest', `the gzip body could not be inflated: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * The decoded body of an upload: its chunks, at most limitBytes of them in all (PayloadTooLarge
 * past it), inflated when Content-Encoding is gzip (UnsupportedMediaType for any other coding).
 */
export function uploadChunks(req: IncomingMessage, limitBytes: number): AsyncIterable<Buffer> {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > limitBytes) throw tooLarge(limitBytes, 'the request body');
  const encoding = req.headers['content-encoding']?.trim().toLowerCase();
  const body = limited(raw(req), limitBytes, 'the request body');
  if (encoding === undefined || encoding === '' || encoding === 'identity') return body;
  if (encoding !== 'gzip') throw new AsbError('UnsupportedMediaType', `Content-Encoding "${encoding}" is not supported; send gzip or none`);
  return limited(inflate(body), limitBytes, 'the inflated request body');
}

/** After an upload stopped early: reads the rest of the body away (not kept), so the client gets the error reply. */
export function discardRest(req: IncomingMessage): void {
  if (!req.readableEnded) req.resume();
}
