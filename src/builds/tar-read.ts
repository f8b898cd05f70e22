// Reads a tar stream that a build pod wrote (hostile bytes): ustar headers, pax extended headers
// (`path`, `linkpath`, `size`) and GNU long names (`L`, `K`), one entry at a time, its content
// handed on in chunks and never held whole. Anything else in a header (xattrs, sparse maps, device
// numbers) is not read: the caller writes its own headers (tar-header.ts) from what is kept here.
import { AsbError } from '../errors.ts';
import { BLOCK } from './tar-header.ts';

export interface ReadEntry {
  /** As the archive names it (no normalisation here). */
  path: string;
  /** The ustar type flag: '0' file, '1' hardlink, '2' symlink, '5' dir, '6' fifo, others as given. */
  typeFlag: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtime: number;
  linkname: string;
}

/** Pulls exact byte counts out of a stream of chunks. */
class ChunkReader {
  readonly #it: AsyncIterator<Buffer>;
  #buf: Buffer = Buffer.alloc(0);
  #done = false;
  constructor(source: AsyncIterable<Buffer | string>) {
    const inner = source[Symbol.asyncIterator]();
    this.#it = { next: async () => {
      const r = await inner.next();
      return r.done === true ? { done: true, value: undefined } : { done: false, value: typeof r.value === 'string' ? Buffer.from(r.value) : r.value };
    } };
  }

  /** Up to n bytes (fewer only at the end of the stream). */
  async take(n: number): Promise<Buffer> {
    while (this.#buf.length < n && !this.#done) {
      const r = await this.#it.next();
      if (r.done === true) this.#done = true;
      else this.#buf = this.#buf.length === 0 ? r.value : Buffer.concat([this.#buf, r.value]);
    }
    const out = this.#buf.subarray(0, n);
    this.#buf = this.#buf.subarray(out.length);
    return out;
  }

  /** Exactly n bytes to `sink` in pieces of at most `piece`; fails at a short stream. */
  async copy(n: number, sink: (b: Buffer) => Promise<void>, piece = 1 << 20): Promise<void> {
    let left = n;
    while (left > 0) {
      const b = await this.take(Math.min(left, piece));
      if (b.length === 0) throw new AsbError('BuildFailed', 'the build sandbox\'s archive of the step\'s files ended early');
      await sink(Buffer.from(b));
      left -= b.length;
    }
  }
}

function field(b: Buffer, offset: number, width: number): string {
  const raw = b.subarray(offset, offset + width);
  const nul = raw.indexOf(0);
  return raw.subarray(0, nul === -1 ? raw.length : nul).toString('utf8');
}

function numeric(b: Buffer, offset: number, width: number): number {
  // GNU base-256 for big numbers: the high bit of the first byte.
  if (((b[offset] ?? 0) & 0x80) !== 0) {
    let v = 0;
    for (let i = offset + 1; i < offset + width; i++) v = v * 256 + (b[i] ?? 0);
    return v;
  }
  const text = field(b, offset, width).trim();
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw new AsbError('BuildFailed', `the build sandbox's archive has a malformed number "${text.slice(0, 20)}"`);
  return parseInt(text, 8);
}

function checksumOk(b: Buffer): boolean {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : (b[i] ?? 0);
  return numeric(b, 148, 8) === sum;
}

function paxRecords(body: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let at = 0;
  while (at < body.length) {
    const space = body.indexOf(0x20, at);
    if (space === -1) break;
    const len = Number(body.subarray(at, space).toString('latin1'));
    if (!Number.isInteger(len) || len <= space - at || at + len > body.length) throw new AsbError('BuildFailed', 'the build sandbox\'s archive has a malformed pax header');
    const rec = body.subarray(space + 1, at + len - 1).toString('utf8');
    const eq = rec.indexOf('=');
    if (eq > 0) out.set(rec.slice(0, eq), rec.slice(eq + 1));
    at += len;
  }
  return out;
}

/** Metadata entries (pax, GNU long names) larger than this are refused: a path is at most 4 KiB. */
const MAX_META = 1 << 20;

/**
 * Calls `onEntry` for each entry in order; `content` writes the entry's bytes (files only) to a
 * sink and must be called at most once; content not asked for is skipped.
 */
export async function readTar(source: AsyncIterable<Buffer | string>, onEntry: (entry: ReadEntry, content: (sink: (b: Buffer) => Promise<void>) => Promise<void>) => Promise<void>): Promise<void> {
  const r = new ChunkReader(source);
  let pax = new Map<string, string>();
  let longName: string | undefined;
  let longLink: string | undefined;
  for (;;) {
    const header = await r.take(BLOCK);
    if (header.length === 0) return;
    if (header.length < BLOCK) throw new AsbError('BuildFailed', 'the build sandbox\'s archive ended inside a header');
    if (header.every((x) => x === 0)) return;
    if (!checksumOk(header)) throw new AsbError('BuildFailed', 'the build sandbox\'s archive has a header with a bad checksum');
    const typeFlag = field(header, 156, 1) || '0';
    let size = numeric(header, 124, 12);
    const pad = (n: number): number => (BLOCK - (n % BLOCK)) % BLOCK;
    if (typeFlag === 'x' || typeFlag === 'g' || typeFlag === 'L' || typeFlag === 'K') {
      if (size > MAX_META) throw new AsbError('BuildFailed', `the build sandbox's archive has a ${String(size)}-byte metadata entry`);
      const body = await r.take(size);
      await r.take(pad(size));
      if (typeFlag === 'x') pax = paxRecords(body);
      else if (typeFlag === 'L') longName = field(body, 0, body.length);
      else if (typeFlag === 'K') longLink = field(body, 0, body.length);
      continue;
    }
    const prefix = field(header, 345, 155);
    const name = field(header, 0, 100);
    const paxSize = pax.get('size');
    if (paxSize !== undefined && /^\d+$/.test(paxSize)) size = Number(paxSize);
    const entry: ReadEntry = {
      path: pax.get('path') ?? longName ?? (prefix === '' ? name : `${prefix}/${name}`),
      typeFlag,
      mode: numeric(header, 100, 8),
      uid: numeric(header, 108, 8),
      gid: numeric(header, 116, 8),
      size: typeFlag === '0' || typeFlag === '7' ? size : 0,
      mtime: Math.floor(Number(pax.get('mtime') ?? numeric(header, 136, 12))),
      linkname: pax.get('linkpath') ?? longLink ?? field(header, 157, 100),
    };
    pax = new Map();
    longName = undefined;
    longLink = undefined;
    const content = { read: false };
    await onEntry(entry, async (sink) => {
      if (content.read) throw new AsbError('Internal', 'tar entry content read twice');
      content.read = true;
      await r.copy(entry.size, sink);
    });
    if (!content.read) await r.copy(entry.size, () => Promise.resolve());
    // A hardlink or a symlink carries no content, whatever its size field says (the ustar rule).
    await r.take(pad(entry.size));
  }
}
