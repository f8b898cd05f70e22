// The files API acts INSIDE the sandbox, as its user, with the sandbox's own tools: a symlink the
// sandbox made can never lead a read or write to a host file, and permissions are the sandbox's.
// Exit codes chosen by the scripts below tell the outcomes apart without parsing messages.
import { posix } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { FileEntry } from '../runtime.ts';
import { checkedPath, fileFailure, MAX_READ_BYTES, READ } from '../shell-files.ts';
import { execInPod, type PodTarget } from './exec.ts';

const WRITE = 'if [ -d "$1" ]; then exit 21; fi; mkdir -p -- "${1%/*}/" && cat > "$1" && if [ -n "$2" ]; then chmod -- "$2" "$1"; fi';
const LIST = 'if [ ! -e "$1" ]; then exit 44; fi; if [ ! -d "$1" ]; then exit 20; fi; ' +
  'exec find "$1" -mindepth 1 -maxdepth 1 -printf "%y\\t%s\\t%m\\t%T@\\t%f\\0"';

function absolute(target: PodTarget, path: string): string {
  return posix.resolve(target.cwd, checkedPath(path));
}

export async function readPodFile(target: PodTarget, path: string): Promise<Uint8Array> {
  const abs = absolute(target, path);
  const result = await execInPod(target, { command: ['sh', '-c', READ, 'sh', abs], maxOutputBytes: MAX_READ_BYTES });
  if (result.exitCode !== 0) throw fileFailure(result, 'read', abs);
  if (result.truncated) throw new AsbError('PayloadTooLarge', `${abs} is larger than ${MAX_READ_BYTES} bytes`);
  return result.stdout;
}

export async function writePodFile(target: PodTarget, path: string, data: Uint8Array, mode?: number): Promise<void> {
  const abs = absolute(target, path);
  const modeArg = mode === undefined ? '' : (mode & 0o7777).toString(8);
  const result = await execInPod(target, { command: ['sh', '-c', WRITE, 'sh', abs, modeArg], stdin: data });
  if (result.exitCode !== 0) throw fileFailure(result, 'write', abs);
}

const TYPES: Record<string, FileEntry['type']> = { f: 'file', d: 'dir', l: 'symlink' };

export async function listPodDir(target: PodTarget, path: string): Promise<FileEntry[]> {
  const abs = absolute(target, path);
  const result = await execInPod(target, { command: ['sh', '-c', LIST, 'sh', abs], maxOutputBytes: 64 * 1024 * 1024 });
  if (result.exitCode !== 0) throw fileFailure(result, 'list', abs);
  const entries: FileEntry[] = [];
  for (const record of Buffer.from(result.stdout).toString('utf8').split('\0')) {
    if (record === '') continue;
    const [type = '', size = '0', mode = '0', mtime = '0', ...rest] = record.split('\t');
    const name = rest.join('\t');
    entries.push({
      name,
      path: posix.join(abs, name),
      type: TYPES[type] ?? 'other',
      size: Number(size),
      mode: Number.parseInt(mode, 8),
      mtime: new Date(Number(mtime) * 1000).toISOString(),
    });
  }
  return entries.sort((a, b) => a.name.localeCompare(b.name));
}
