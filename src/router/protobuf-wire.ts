// Protocol Buffers wire format, just enough for the ext_proc messages the router reads and
// writes by hand (extproc-codec.ts): varints, length-delimited fields and skipping unknown ones.
// Why by hand: see extproc-codec.ts. Spec: protobuf.dev/programming-guides/encoding.
import { AsbError } from '../errors.ts';

export const WIRE = { varint: 0, fixed64: 1, len: 2, fixed32: 5 } as const;

// Tags, lengths and small values are almost always one byte: share those buffers instead of
// allocating one per field.
const ONE_BYTE: readonly Buffer[] = Array.from({ length: 128 }, (_, i) => Buffer.from([i]));

/** A cursor over one message's bytes. Positions are absolute offsets into `buf`. */
export interface WireReader {
  readonly buf: Buffer;
  pos: number;
  readonly end: number;
}

export function reader(buf: Buffer, start = 0, end = buf.length): WireReader {
  return { buf, pos: start, end };
}

function malformed(what: string): AsbError {
  return new AsbError('BadRequest', `malformed protobuf: ${what}`);
}

/** Reads a varint of up to 53 bits (field numbers, lengths, bools and enums never need more). */
export function readVarint(r: WireReader): number {
  let result = 0;
  let mul = 1;
  for (let i = 0; i < 10; i++) {
    if (r.pos >= r.end) throw malformed('truncated varint');
    const b = r.buf[r.pos++] ?? 0;
    if (mul < 2 ** 53) result += (b & 0x7f) * mul;
    if (b < 0x80) return result;
    mul *= 128;
  }
  throw malformed('varint longer than 10 bytes');
}

/** The [start, end) of a length-delimited field's payload; moves past it. */
export function readLen(r: WireReader): [number, number] {
  const len = readVarint(r);
  const start = r.pos;
  if (start + len > r.end) throw malformed('length past the end of the message');
  r.pos = start + len;
  return [start, start + len];
}

/** Skips a field we do not read: Envoy adds fields over time (checklist 3). */
export function skipField(r: WireReader, wireType: number): void {
  switch (wireType) {
    case WIRE.varint:
      readVarint(r);
      return;
    case WIRE.fixed64:
      r.pos += 8;
      break;
    case WIRE.len:
      readLen(r);
      return;
    case WIRE.fixed32:
      r.pos += 4;
      break;
    default:
      throw malformed(`unsupported wire type ${wireType}`);
  }
  if (r.pos > r.end) throw malformed('truncated fixed-width field');
}

/**
 * Builds a message as a list of byte chunks; nested messages are built in their own writer and
 * added with `message()`, which knows their length. One Buffer.concat at the end.
 */
export class WireWriter {
  readonly #chunks: Buffer[] = [];
  #length = 0;

  get length(): number {
    return this.#length;
  }

  #push(chunk: Buffer): void {
    this.#chunks.push(chunk);
    this.#length += chunk.length;
  }

  #varint(n: number): void {
    const small = ONE_BYTE[n];
    if (small !== undefined) {
      this.#push(small);
      return;
    }
    const bytes: number[] = [];
    let v = n;
    while (v >= 0x80) {
      bytes.push((v % 128) | 0x80);
      v = Math.floor(v / 128);
    }
    bytes.push(v);
    this.#push(Buffer.from(bytes));
  }

  #tag(field: number, wireType: number): void {
    this.#varint(field * 8 + wireType);
  }

  /** A non-negative integer (varint), bool as 0/1. Proto3 omits zero; so do we. */
  uint(field: number, n: number): this {
    if (n === 0) return this;
    this.#tag(field, WIRE.varint);
    this.#varint(n);
    return this;
  }

  bool(field: number, b: boolean | undefined): this {
    return this.uint(field, b === true ? 1 : 0);
  }

  bytes(field: number, b: Buffer): this {
    this.#tag(field, WIRE.len);
    this.#varint(b.length);
    this.#push(b);
    return this;
  }

  string(field: number, s: string): this {
    return this.bytes(field, Buffer.from(s, 'utf8'));
  }

  /** A nested message, written even when empty (`request_headers:{}` is the CONTINUE answer). */
  message(field: number, m: WireWriter): this {
    this.#tag(field, WIRE.len);
    this.#varint(m.#length);
    for (const c of m.#chunks) this.#push(c);
    return this;
  }

  finish(): Buffer {
    return Buffer.concat(this.#chunks, this.#length);
  }
}
