// What both pod runtimes' files APIs share: they run the sandbox's own POSIX tools inside it (no
// agent in the image), and the scripts pick exit codes that tell the outcomes apart without
// parsing messages. The read script (writes: file-upload.ts), the listing's record format and its parser, and
// the mapping of a failed script to our errors live here.
import { posix } from 'node:path';
import { AsbError } from '../errors.ts';
import type { ExecResult, FileEntry } from './runtime.ts';

export const NOT_FOUND = 44;
export const IS_DIR = 21;
export const NOT_DIR = 20;
/** readFile's cap: bigger files are refused rather than silently truncated. */
export const MAX_READ_BYTES = 512 * 1024 * 1024;

/** `sh -c READ sh <path>`: the file's bytes on stdout. */
export const READ = 'if [ -d "$1" ]; then exit 21; fi; if [ ! -e "$1" ]; then exit 44; fi; exec cat -- "$1"';
/** One listing record per entry, NUL-terminated (names may hold anything else): `find -printf` format. */
export const ENTRY_FORMAT = '%y\\t%s\\t%m\\t%T@\\t%f\\0';

const TYPES: Record<string, FileEntry['type']> = { f: 'file', d: 'dir', l: 'symlink' };

/** The entries of `dir` from ENTRY_FORMAT records ("type<TAB>size<TAB>mode<TAB>mtime<TAB>name"), by name. */
export function parseEntries(dir: string, records: readonly string[]): FileEntry[] {
  const entries: FileEntry[] = [];
  for (const record of records) {
    if (record === '') continue;
    const [type = '', size = '0', mode = '0', mtime = '0', ...rest] = record.split('\t');
    const name = rest.join('\t');
    entries.push({
      name,
      path: posix.join(dir, name),
      type: TYPES[type] ?? 'other',
      size: Number(size),
      mode: Number.parseInt(mode, 8),
      mtime: new Date(Number(mtime) * 1000).toISOString(),
    });
  }
  return entries.sort((a, b) => a.name.localeCompare(b.name));
}

/** A path a script may be given: not empty, no NUL. */
export function checkedPath(path: string): string {
  if (path === '') throw new AsbError('BadRequest', 'path is empty');
  if (path.includes('\0')) throw new AsbError('BadRequest', 'path contains a NUL byte');
  return path;
}

/** The error a failed files script stands for. */
export function fileFailure(result: ExecResult, op: string, path: string): AsbError {
  const message = Buffer.from(result.stderr).toString('utf8').trim();
  switch (result.exitCode) {
    case NOT_FOUND: return new AsbError('NotFound', `${path}: no such file or directory`);
    case IS_DIR: return new AsbError('BadRequest', `${path} is a directory`);
    case NOT_DIR: return new AsbError('BadRequest', `${path} is not a directory`);
  }
  if (/Permission denied|Read-only file system|Operation not permitted/.test(message)) {
    return new AsbError('Forbidden', `${op} ${path}: ${message}`);
  }
  if (/Not a directory|No such file/.test(message)) return new AsbError('NotFound', `${op} ${path}: ${message}`);
  return new AsbError('Internal', `${op} ${path} failed (exit ${result.exitCode}): ${message}`);
}
