// multipart/form-data request bodies (RFC 7578), as the E2B SDK sends file uploads: one part per
// file, its filename the full target path. Parsed incrementally from the body's chunks, each
// part's data passed on as it arrives, so an upload is never held whole (see parseMultipart).
import { AsbError } from '../../errors.ts';

function malformed(why: string): AsbError {
  return new AsbError('BadRequest', `malformed multipart body: ${why}`);
}

export function boundaryOf(contentType: string): string {
  const m = /;\s*boundary=(?:"([^"]{1,70})"|([^\s;]{1,70}))/i.exec(contentType);
  const boundary = m?.[1] ?? m?.[2];
  if (boundary === undefined) throw new AsbError('BadRequest', 'Content-Type multipart/form-data needs a boundary parameter');
  return boundary;
}

/** A quoted parameter of Content-Disposition. Browsers and undici escape `"`, CR and LF as %22, %0D, %0A (HTML's form encoding). */
function param(disposition: string, key: string): string | undefined {
  const extended = new RegExp(`;\\s*${key}\\*=(?:UTF-8|utf-8)''([^;]*)`).exec(disposition);
  if (extended?.[1] !== undefined) {
    try {
      return decodeURIComponent(extended[1]);
    } catch {
      throw malformed(`${key}* is not percent-encoded UTF-8`);
    }
  }
  const m = new RegExp(`;\\s*${key}="((?:[^"\\\\]|\\\\.)*)"`).exec(disposition) ?? new RegExp(`;\\s*${key}=([^;\\s]+)`).exec(disposition);
  if (m?.[1] === undefined) return undefined;
  return m[1].replace(/\\(.)/g, '$1').replace(/%22/g, '"').replace(/%0D/gi, '\r').replace(/%0A/gi, '\n');
}

/** A part of the body. Read `data` to its end (or leave it) before asking for the next part. */
export interface Part {
  name: string | undefined;
  filename: string | undefined;
  data: AsyncIterable<Buffer>;
}

/** A part's header block: one Content-Disposition and a few more lines; browsers send ~200 bytes. */
const MAX_HEADER_BYTES = 16 * 1024;
const MAX_PARTS = 10_000;
const CRLF = Buffer.from('\r\n', 'latin1');
const CRLF2 = Buffer.from('\r\n\r\n', 'latin1');

/** The unread bytes of the body: what was received and not yet consumed, then the rest on demand. */
class Cursor {
  buf: Buffer = Buffer.alloc(0);
  readonly #chunks: AsyncIterator<Buffer>;

  constructor(chunks: AsyncIterable<Buffer>) {
    this.#chunks = chunks[Symbol.asyncIterator]();
  }

  /** Appends the next chunk; false at the end of the body. */
  async fill(): Promise<boolean> {
    const next = await this.#chunks.next();
    if (next.done === true) return false;
    this.buf = this.buf.length === 0 ? next.value : Buffer.concat([this.buf, next.value]);
    return true;
  }

  /** Stops reading the body (whoever stopped early): the source can then be read away or closed. */
  async close(): Promise<void> {
    await this.#chunks.return?.();
  }

  skip(n: number): void {
    this.buf = this.buf.subarray(n);
  }

  /** Where `needle` starts, reading more as needed; malformed(why) if it is not within `max` bytes or the body ends first. */
  async find(needle: Buffer, max: number, why: string): Promise<number> {
    for (;;) {
      const at = this.buf.indexOf(needle);
      if (at !== -1 && at <= max) return at;
      if (this.buf.length > max + needle.length || !(await this.fill())) throw malformed(why);
    }
  }

  /** At least n bytes buffered, unless the body ends first. */
  async need(n: number): Promise<boolean> {
    while (this.buf.length < n) if (!(await this.fill())) return false;
    return true;
  }
}

/**
 * A part's data: yields what lies before the next delimiter as it arrives, holding back only
 * the delimiter's length (a delimiter may straddle two chunks). Consumed bytes leave the cursor
 * before each yield, so a reader that stops early leaves the cursor where it stopped.
 */
async function* partData(cursor: Cursor, next: Buffer, state: { done: boolean }): AsyncGenerator<Buffer> {
  for (;;) {
    const at = cursor.buf.indexOf(next);
    if (at !== -1) {
      const data = cursor.buf.subarray(0, at);
      cursor.skip(at + next.length);
      state.done = true;
      if (data.length > 0) yield data;
      return;
    }
    const ready = cursor.buf.length - (next.length - 1);
    if (ready > 0) {
      const data = cursor.buf.subarray(0, ready);
      cursor.skip(ready);
      yield data;
    }
    if (!(await cursor.fill())) throw malformed('the last part is not closed by a delimiter');
  }
}

/**
 * The parts of a multipart body, parsed as it streams in: at any time the parser holds one
 * received chunk and at most a delimiter's length or a header block besides, never a whole part.
 */
export async function* parseMultipart(chunks: AsyncIterable<Buffer>, boundary: string): AsyncGenerator<Part> {
  const delimiter = Buffer.from(`--${boundary}`, 'latin1');
  const next = Buffer.from(`\r\n--${boundary}`, 'latin1');
  const cursor = new Cursor(chunks);
  try {
    // The preamble before the first delimiter is ignored, as RFC 2046 says.
    for (;;) {
      const at = cursor.buf.indexOf(delimiter);
      if (at !== -1) {
        cursor.skip(at + delimiter.length);
        break;
      }
      cursor.skip(Math.max(0, cursor.buf.length - (delimiter.length - 1)));
      if (!(await cursor.fill())) throw malformed(`no --${boundary} delimiter`);
    }
    for (let count = 0; ; count++) {
      if (!(await cursor.need(2))) throw malformed('the body ends right after a delimiter');
      if (cursor.buf[0] === 0x2d && cursor.buf[1] === 0x2d) return; // the closing delimiter "--"; the epilogue is ignored
      if (count >= MAX_PARTS) throw malformed(`more than ${MAX_PARTS} parts`);
      // The rest of the delimiter's line (transport padding), then the headers up to a blank line;
      // a part with no headers has its blank line at once.
      cursor.skip((await cursor.find(CRLF, 1024, 'a delimiter is not followed by a line break')) + CRLF.length);
      let headerText = '';
      if (!(await cursor.need(2))) throw malformed('a part has no blank line after its headers');
      if (cursor.buf[0] === 0x0d && cursor.buf[1] === 0x0a) {
        cursor.skip(2);
      } else {
        const end = await cursor.find(CRLF2, MAX_HEADER_BYTES, `a part has no blank line after its headers (within ${MAX_HEADER_BYTES} bytes)`);
        headerText = cursor.buf.subarray(0, end).toString('utf8');
        cursor.skip(end + CRLF2.length);
      }
      let disposition = '';
      for (const line of headerText.split('\r\n')) {
        const colon = line.indexOf(':');
        if (colon !== -1 && line.slice(0, colon).trim().toLowerCase() === 'content-disposition') disposition = line.slice(colon + 1);
      }
      const state = { done: false };
      yield { name: param(disposition, 'name'), filename: param(disposition, 'filename'), data: partData(cursor, next, state) };
      // What the reader left of the part is skipped, not kept.
      if (!state.done) {
        const rest = partData(cursor, next, state);
        while (!(await rest.next()).done) continue;
      }
    }
  } finally {
    await cursor.close();
  }
}
