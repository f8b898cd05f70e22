// DNS messages (RFC 1035 §4), just what the sandbox resolver needs: read one question from a
// query, write a response to it with A/AAAA answers. Queries with compression pointers in the
// question, several questions, or an opcode other than QUERY are answered FORMERR/NOTIMP.
import { isIPv4 } from 'node:net';

export const RCODE = { noError: 0, formErr: 1, servFail: 2, nxDomain: 3, notImp: 4, refused: 5 } as const;
export const QTYPE = { a: 1, aaaa: 28 } as const;
const CLASS_IN = 1;
/** A UDP response larger than this is truncated (TC), and the client retries over TCP (RFC 1035 §4.2.1). */
export const UDP_LIMIT = 512;

export interface DnsQuestion {
  id: number;
  /** Recursion desired, echoed back. */
  rd: boolean;
  /** Lower case, without the trailing dot. */
  name: string;
  qtype: number;
  qclass: number;
  /** The question section's bytes, echoed back verbatim. */
  raw: Buffer;
}

export type ParsedQuery = { ok: true; question: DnsQuestion } | { ok: false; id: number; rcode: number };

export function parseQuery(msg: Buffer): ParsedQuery | undefined {
  if (msg.length < 12) return undefined; // not even a header: nothing to answer
  const id = msg.readUInt16BE(0);
  const flags = msg.readUInt16BE(2);
  if ((flags & 0x8000) !== 0) return undefined; // a response, not a query: never answer (no loops)
  const opcode = (flags >> 11) & 0xf;
  if (opcode !== 0) return { ok: false, id, rcode: RCODE.notImp };
  if (msg.readUInt16BE(4) !== 1) return { ok: false, id, rcode: RCODE.formErr };
  const labels: string[] = [];
  let pos = 12;
  for (;;) {
    const len = msg[pos];
    if (len === undefined) return { ok: false, id, rcode: RCODE.formErr };
    pos++;
    if (len === 0) break;
    if (len > 63 || pos + len > msg.length) return { ok: false, id, rcode: RCODE.formErr };
    labels.push(msg.toString('latin1', pos, pos + len));
    pos += len;
  }
  if (pos + 4 > msg.length) return { ok: false, id, rcode: RCODE.formErr };
  const name = labels.join('.').toLowerCase();
  if (name.length > 253) return { ok: false, id, rcode: RCODE.formErr };
  return {
    ok: true,
    question: { id, rd: (flags & 0x0100) !== 0, name, qtype: msg.readUInt16BE(pos), qclass: msg.readUInt16BE(pos + 2), raw: msg.subarray(12, pos + 4) },
  };
}

function header(id: number, rd: boolean, rcode: number, qd: number, an: number, tc: boolean): Buffer {
  const h = Buffer.alloc(12);
  h.writeUInt16BE(id, 0);
  // QR=1, opcode 0, AA=0, TC, RD echoed, RA=1, rcode.
  h.writeUInt16BE(0x8000 | (tc ? 0x0200 : 0) | (rd ? 0x0100 : 0) | 0x0080 | (rcode & 0xf), 2);
  h.writeUInt16BE(qd, 4);
  h.writeUInt16BE(an, 6);
  return h;
}

/** An error answer for a query we could not read as one question. */
export function errorResponse(id: number, rcode: number): Buffer {
  return header(id, false, rcode, 0, 0, false);
}

function ipBytes(ip: string): Buffer {
  if (isIPv4(ip)) return Buffer.from(ip.split('.').map(Number));
  // Expand "::" and write eight 16-bit groups.
  const [head = '', tail] = ip.split('::');
  const h = head === '' ? [] : head.split(':');
  const t = tail === undefined || tail === '' ? [] : tail.split(':');
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  const out = Buffer.alloc(16);
  groups.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2));
  return out;
}

/**
 * The response to `q`: rcode, and A or AAAA records (addresses of the question's family) with ttlS.
 * Over UDP (limit set), answers that do not fit are left out and TC is set.
 */
export function buildResponse(q: DnsQuestion, rcode: number, addresses: readonly string[], ttlS: number, limit?: number): Buffer {
  const records: Buffer[] = [];
  let size = 12 + q.raw.length;
  let tc = false;
  for (const ip of addresses) {
    const rdata = ipBytes(ip);
    const rr = Buffer.alloc(12 + rdata.length);
    rr.writeUInt16BE(0xc00c, 0); // pointer to the question's name
    rr.writeUInt16BE(rdata.length === 4 ? QTYPE.a : QTYPE.aaaa, 2);
    rr.writeUInt16BE(CLASS_IN, 4);
    rr.writeUInt32BE(Math.max(0, Math.min(ttlS, 0x7fffffff)), 6);
    rr.writeUInt16BE(rdata.length, 10);
    rdata.copy(rr, 12);
    if (limit !== undefined && size + rr.length > limit) {
      tc = true;
      break;
    }
    size += rr.length;
    records.push(rr);
  }
  return Buffer.concat([header(q.id, q.rd, rcode, 1, records.length, tc), q.raw, ...records]);
}
