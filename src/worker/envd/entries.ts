// Filesystem work inside a sandbox for envd, run with the sandbox's own tools through the
// runtime's exec (as the calling user, so permissions are the sandbox's, and a symlink the
// sandbox made can never lead to a host file). One `find -printf` record per entry gives
// everything filesystem.EntryInfo holds. Exit codes chosen by the scripts tell outcomes apart.
import { posix } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { ExecResult, PodRuntime } from '../../runtime/runtime.ts';
import { fileFailure, NOT_DIR, NOT_FOUND, READ } from '../../runtime/shell-files.ts';

/** filesystem.EntryInfo in its JSON form. */
export interface EntryInfo {
  name: string;
  type: 'FILE_TYPE_FILE' | 'FILE_TYPE_DIRECTORY' | 'FILE_TYPE_SYMLINK' | 'FILE_TYPE_UNSPECIFIED';
  path: string;
  size: number;
  mode: number;
  permissions: string;
  owner: string;
  group: string;
  modifiedTime: string;
  symlinkTarget?: string;
}

// Besides the runtimes' NOT_FOUND, NOT_DIR and IS_DIR (shell-files.ts), makeDir's outcomes:
const EXISTS = 17;
const EXISTS_NOT_DIR = 18;

/** type, size, mode (octal), owner, group, mtime, symlink target, path; NUL-terminated. */
const FORMAT = '%y\\t%s\\t%m\\t%u\\t%g\\t%T@\\t%l\\t%p\\0';
const EXISTS_CHECK = `if [ ! -e "$1" ] && [ ! -L "$1" ]; then exit ${NOT_FOUND}; fi; `;
const SCRIPTS = {
  stat: `${EXISTS_CHECK}exec find "$1" -maxdepth 0 -printf '${FORMAT}'`,
  list: `if [ ! -e "$1" ]; then exit ${NOT_FOUND}; fi; if [ ! -d "$1" ]; then exit ${NOT_DIR}; fi; exec find -H "$1" -mindepth 1 -maxdepth "$2" -printf '${FORMAT}'`,
  makeDir: `if [ -d "$1" ]; then exit ${EXISTS}; fi; if [ -e "$1" ] || [ -L "$1" ]; then exit ${EXISTS_NOT_DIR}; fi; mkdir -p -- "$1" && exec find "$1" -maxdepth 0 -printf '${FORMAT}'`,
  move: `${EXISTS_CHECK}mkdir -p -- "$(dirname -- "$2")" && mv -T -- "$1" "$2" && exec find "$2" -maxdepth 0 -printf '${FORMAT}'`,
  remove: 'exec rm -rf -- "$1"',
  read: READ,
} as const;

/** Where a caller runs: the sandbox, the uid (undefined: the pod's user), and that user's home (paths.ts). */
export interface FsTarget {
  runtime: PodRuntime;
  id: string;
  uid: number | undefined;
  /** Looked up once per sandbox and user (UserIds), and only for a path that needs it. */
  home: () => Promise<string>;
}

async function run(t: FsTarget, script: keyof typeof SCRIPTS, args: string[], opts: { maxOutputBytes?: number } = {}): Promise<ExecResult> {
  const result = await t.runtime.exec(t.id, {
    command: ['sh', '-c', SCRIPTS[script], 'sh', ...args],
    timeoutMs: 60_000,
    ...(t.uid === undefined ? {} : { user: t.uid }),
    ...(opts.maxOutputBytes === undefined ? {} : { maxOutputBytes: opts.maxOutputBytes }),
  });
  if (result.exitCode !== 0) throw failure(result, script, args[0] ?? '');
  return result;
}

/** The runtimes' mapping of a failed script (fileFailure), plus makeDir's outcomes and a full disk. */
function failure(result: ExecResult, op: string, path: string): AsbError {
  if (result.exitCode === EXISTS) return new AsbError('AlreadyExists', `directory ${path} already exists`);
  if (result.exitCode === EXISTS_NOT_DIR) return new AsbError('BadRequest', `${path} already exists and is not a directory`);
  const err = fileFailure(result, op, path);
  const message = Buffer.from(result.stderr).toString('utf8').trim();
  if (err.code === 'Internal' && /No space left|Disk quota/.test(message)) return new AsbError('PayloadTooLarge', `${op} ${path}: ${message}`);
  return err;
}

const TYPES: Record<string, EntryInfo['type']> = { f: 'FILE_TYPE_FILE', d: 'FILE_TYPE_DIRECTORY', l: 'FILE_TYPE_SYMLINK' };
// Go's os.FileMode bits, which envd puts in `mode` as they are.
// 2 ** 31, not 1 << 31: JS shifts are signed 32-bit, and the SDK refuses a negative uint32.
const GO_MODE = { dir: 2 ** 31, symlink: 1 << 27, setuid: 1 << 23, setgid: 1 << 22, sticky: 1 << 20 };

function goMode(type: string, octal: number): number {
  let mode = octal & 0o777;
  if (type === 'd') mode += GO_MODE.dir;
  if (type === 'l') mode += GO_MODE.symlink;
  if ((octal & 0o4000) !== 0) mode += GO_MODE.setuid;
  if ((octal & 0o2000) !== 0) mode += GO_MODE.setgid;
  if ((octal & 0o1000) !== 0) mode += GO_MODE.sticky;
  return mode;
}

/** Go's FileMode.String() for the common cases: "drwxr-xr-x", "-rw-r--r--", "Lrwxrwxrwx". */
function permissionString(type: string, octal: number): string {
  let s = type === 'd' ? 'd' : type === 'l' ? 'L' : '-';
  for (let shift = 6; shift >= 0; shift -= 3) {
    const bits = (octal >> shift) & 7;
    s += (bits & 4) !== 0 ? 'r' : '-';
    s += (bits & 2) !== 0 ? 'w' : '-';
    s += (bits & 1) !== 0 ? 'x' : '-';
  }
  return s;
}

export function parseEntries(stdout: Uint8Array): EntryInfo[] {
  const entries: EntryInfo[] = [];
  for (const record of Buffer.from(stdout).toString('utf8').split('\0')) {
    if (record === '') continue;
    const [type = '', size = '0', mode = '0', owner = '', group = '', mtime = '0', target = '', ...rest] = record.split('\t');
    const path = rest.join('\t');
    const octal = Number.parseInt(mode, 8);
    const entry: EntryInfo = {
      name: posix.basename(path),
      type: TYPES[type] ?? 'FILE_TYPE_UNSPECIFIED',
      path,
      size: Number(size),
      mode: goMode(type, octal),
      permissions: permissionString(type, octal),
      owner,
      group,
      modifiedTime: new Date(Math.floor(Number(mtime) * 1000)).toISOString(),
    };
    if (type === 'l') entry.symlinkTarget = target;
    entries.push(entry);
  }
  return entries;
}

function single(result: ExecResult, path: string): EntryInfo {
  const entry = parseEntries(result.stdout)[0];
  if (entry === undefined) throw new AsbError('NotFound', `${path}: no such file or directory`);
  return entry;
}

export async function stat(t: FsTarget, path: string): Promise<EntryInfo> {
  return single(await run(t, 'stat', [path]), path);
}

/** Entries under `path` down to `depth` levels (1: its children), sorted by path. */
export async function listDir(t: FsTarget, path: string, depth: number): Promise<EntryInfo[]> {
  const result = await run(t, 'list', [path, String(depth)], { maxOutputBytes: 64 * 1024 * 1024 });
  if (result.truncated) throw new AsbError('PayloadTooLarge', `${path} holds too many entries to list at depth ${depth}`);
  return parseEntries(result.stdout).sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

export async function makeDir(t: FsTarget, path: string): Promise<EntryInfo> {
  return single(await run(t, 'makeDir', [path]), path);
}

export async function move(t: FsTarget, source: string, destination: string): Promise<EntryInfo> {
  return single(await run(t, 'move', [source, destination]), destination);
}

export async function remove(t: FsTarget, path: string): Promise<void> {
  await run(t, 'remove', [path]);
}

export async function readFile(t: FsTarget, path: string, maxBytes: number): Promise<Uint8Array> {
  const result = await run(t, 'read', [path], { maxOutputBytes: maxBytes });
  if (result.truncated) throw new AsbError('PayloadTooLarge', `${path} is larger than ${maxBytes} bytes`);
  return result.stdout;
}
