// A runc pod's CRIU image names the host ids of its user namespace: CRIU restores the namespace with
// the uid_map and gid_map it recorded (userns-<id>.img), not with the ones config.json gives. A new
// pod started from a snapshot (a fork) has its own host id range (id-ranges.ts), and its disk's
// files are shifted to that range: restored with the snapshot's map, its processes would run as the
// source pod's host user and could not open their own files. So the image's map is rewritten for
// the new pod (remapUsernsImage), in a copy made for it; no other image file holds a host id (a
// search of every file of a dump for the range's first id, as a varint and as 32 bits, found it in
// userns-*.img only, besides memory pages).
//
// The file: CRIU's common magic (u32 LE), the image's magic (u32 LE), then one entry: its size
// (u32 LE) and a protobuf UsernsEntry { repeated UidGidExtent uid_map = 1; repeated UidGidExtent
// gid_map = 2 }, UidGidExtent { uint32 first = 1; uint32 lower_first = 2; uint32 count = 3 }
// (criu/images/userns.proto). Only these varint and length-delimited fields occur; anything else
// is refused, never passed through half-understood.
import { AsbError } from '../../errors.ts';

export const USERNS_IMAGE = /^userns-\d+\.img$/;

interface Extent { first: number; lowerFirst: number; count: number }

/** The image with every extent whose host side starts at `from` moved to start at `to`. */
export function remapUsernsImage(image: Uint8Array, from: number, to: number): Uint8Array {
  const bytes = Buffer.from(image);
  if (bytes.length < 12) throw bad('shorter than its header');
  const size = bytes.readUInt32LE(8);
  if (bytes.length !== 12 + size) throw bad(`its entry says ${String(size)} bytes, ${String(bytes.length - 12)} follow`);
  const maps: { uid: Extent[]; gid: Extent[] } = { uid: [], gid: [] };
  for (const field of fields(bytes.subarray(12))) {
    if (field.wire !== 2 || (field.num !== 1 && field.num !== 2)) throw bad(`unknown field ${String(field.num)}`);
    const ext: Extent = { first: 0, lowerFirst: 0, count: 0 };
    for (const f of fields(field.data)) {
      if (f.wire !== 0) throw bad(`unknown extent field ${String(f.num)}`);
      if (f.num === 1) ext.first = f.value;
      else if (f.num === 2) ext.lowerFirst = f.value;
      else if (f.num === 3) ext.count = f.value;
      else throw bad(`unknown extent field ${String(f.num)}`);
    }
    (field.num === 1 ? maps.uid : maps.gid).push(ext.lowerFirst === from ? { ...ext, lowerFirst: to } : ext);
  }
  const entry = Buffer.concat([...maps.uid.map((e) => lengthDelimited(1, extent(e))), ...maps.gid.map((e) => lengthDelimited(2, extent(e)))]);
  const header = Buffer.from(bytes.subarray(0, 12));
  header.writeUInt32LE(entry.length, 8);
  return Buffer.concat([header, entry]);
}

function bad(why: string): AsbError {
  return new AsbError('Internal', `the checkpoint's user namespace image cannot be read: ${why}`);
}

type Field = { num: number; wire: 0; value: number; data: Buffer } | { num: number; wire: 2; value: number; data: Buffer };

function* fields(buf: Buffer): Generator<Field> {
  let at = 0;
  const varint = (): number => {
    let value = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      const byte = buf[at++];
      if (byte === undefined) throw bad('a number runs past the end');
      value += (byte & 0x7f) * 2 ** shift;
      if ((byte & 0x80) === 0) return value;
    }
    throw bad('a number is too long');
  };
  while (at < buf.length) {
    const key = varint();
    const num = Math.floor(key / 8);
    const wire = key % 8;
    if (wire === 0) {
      yield { num, wire, value: varint(), data: Buffer.alloc(0) };
    } else if (wire === 2) {
      const len = varint();
      if (at + len > buf.length) throw bad('a field runs past the end');
      yield { num, wire, value: len, data: buf.subarray(at, at + len) };
      at += len;
    } else {
      throw bad(`wire type ${String(wire)} of field ${String(num)}`);
    }
  }
}

function encodeVarint(n: number): Buffer {
  const out: number[] = [];
  let v = n;
  while (v > 0x7f) {
    out.push((v % 0x80) | 0x80);
    v = Math.floor(v / 0x80);
  }
  out.push(v);
  return Buffer.from(out);
}

function extent(e: Extent): Buffer {
  return Buffer.concat([encodeVarint(1 << 3), encodeVarint(e.first), encodeVarint(2 << 3), encodeVarint(e.lowerFirst), encodeVarint(3 << 3), encodeVarint(e.count)]);
}

function lengthDelimited(num: number, data: Buffer): Buffer {
  return Buffer.concat([encodeVarint((num << 3) | 2), encodeVarint(data.length), data]);
}
