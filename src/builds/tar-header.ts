// Tar headers for image layers (POSIX ustar, with a pax extended header when a name, a link or a
// number does not fit ustar's fields). Written here rather than with tar-stream: a layer needs
// only these five entry types and the bytes of a header are all the format there is (~80 lines).
export type TarType = 'file' | 'hardlink' | 'symlink' | 'dir' | 'fifo';

export interface TarEntry {
  /** Relative, no leading `/`; a dir's without its trailing `/` (added here). */
  path: string;
  type: TarType;
  /** Permission bits with setuid, setgid and sticky (07777). */
  mode: number;
  uid: number;
  gid: number;
  /** Bytes of content that follow (files only). */
  size: number;
  /** Seconds since the epoch. */
  mtime: number;
  /** Symlink target, or the path (in this layer) a hardlink names. */
  linkname?: string;
}

export const BLOCK = 512;
const TYPE_FLAG: Record<TarType, string> = { file: '0', hardlink: '1', symlink: '2', dir: '5', fifo: '6' };
const MAX_OCTAL_11 = 0o77777777777;
const MAX_OCTAL_7 = 0o7777777;

/** The header block(s) of an entry: a pax header first when needed. */
export function tarHeader(entry: TarEntry): Buffer {
  const name = entry.type === 'dir' ? `${entry.path}/` : entry.path;
  const link = entry.linkname ?? '';
  const pax: [string, string][] = [];
  const split = splitName(name);
  if (split === undefined) pax.push(['path', name]);
  if (Buffer.byteLength(link) > 100) pax.push(['linkpath', link]);
  if (entry.size > MAX_OCTAL_11) pax.push(['size', String(entry.size)]);
  if (entry.uid > MAX_OCTAL_7) pax.push(['uid', String(entry.uid)]);
  if (entry.gid > MAX_OCTAL_7) pax.push(['gid', String(entry.gid)]);
  const main = ustar({
    name: split?.name ?? name.slice(0, 100), prefix: split?.prefix ?? '', type: TYPE_FLAG[entry.type],
    mode: entry.mode & 0o7777, uid: Math.min(entry.uid, MAX_OCTAL_7), gid: Math.min(entry.gid, MAX_OCTAL_7),
    size: Math.min(entry.size, MAX_OCTAL_11), mtime: Math.max(0, Math.min(Math.floor(entry.mtime), MAX_OCTAL_11)), link: link.slice(0, 100),
  });
  if (pax.length === 0) return main;
  const body = Buffer.from(pax.map(([k, v]) => paxRecord(k, v)).join(''));
  const header = ustar({ name: 'PaxHeader', prefix: '', type: 'x', mode: 0o644, uid: 0, gid: 0, size: body.length, mtime: 0, link: '' });
  return Buffer.concat([header, body, padding(body.length), main]);
}

/** Zero bytes that fill the last block of `size` bytes of content. */
export function padding(size: number): Buffer {
  return Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK);
}

/** The two zero blocks that end an archive. */
export function tarEnd(): Buffer {
  return Buffer.alloc(2 * BLOCK);
}

/** ustar's name (100 bytes) and prefix (155 bytes), split at a `/`; undefined when it cannot fit. */
function splitName(name: string): { name: string; prefix: string } | undefined {
  if (Buffer.byteLength(name) <= 100) return { name, prefix: '' };
  for (let i = name.indexOf('/'); i !== -1 && i < name.length - 1; i = name.indexOf('/', i + 1)) {
    const prefix = name.slice(0, i);
    const rest = name.slice(i + 1);
    if (Buffer.byteLength(prefix) <= 155 && Buffer.byteLength(rest) <= 100) return { name: rest, prefix };
  }
  return undefined;
}

/** "<length> key=value\n", the length counting itself. */
function paxRecord(key: string, value: string): string {
  const rest = ` ${key}=${value}\n`;
  const restBytes = Buffer.byteLength(rest);
  let length = restBytes + String(restBytes).length;
  if (String(length).length + restBytes !== length) length = restBytes + String(length).length;
  return `${String(length)}${rest}`;
}

interface Fields { name: string; prefix: string; type: string; mode: number; uid: number; gid: number; size: number; mtime: number; link: string }

function ustar(f: Fields): Buffer {
  const b = Buffer.alloc(BLOCK);
  b.write(f.name, 0, 100, 'utf8');
  octal(b, 100, 8, f.mode);
  octal(b, 108, 8, f.uid);
  octal(b, 116, 8, f.gid);
  octal(b, 124, 12, f.size);
  octal(b, 136, 12, f.mtime);
  b.fill(0x20, 148, 156); // the checksum counts its own field as spaces
  b.write(f.type, 156, 1, 'latin1');
  b.write(f.link, 157, 100, 'utf8');
  b.write('ustar\u000000', 257, 8, 'latin1');
  b.write(f.prefix, 345, 155, 'utf8');
  let sum = 0;
  for (const byte of b) sum += byte;
  b.write(`${sum.toString(8).padStart(6, '0')}\u0000 `, 148, 8, 'latin1');
  return b;
}

function octal(b: Buffer, offset: number, width: number, value: number): void {
  b.write(`${value.toString(8).padStart(width - 1, '0')}\u0000`, offset, width, 'latin1');
}
