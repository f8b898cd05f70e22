// The files API over pods/exec, with the container's own POSIX tools and as its user: no agent in
// the image, and a symlink in the sandbox leads only where the sandbox itself could go. Relative
// paths are relative to the container's working directory (the exec's). Exit codes chosen by the
// scripts tell the outcomes apart without parsing messages.
import { AsbError } from '../../errors.ts';
import type { ExecRequest, FileEntry, SpawnRequest } from '../runtime.ts';
import { writeFileFrom } from '../file-upload.ts';
import { checkedPath, ENTRY_FORMAT, fileFailure, MAX_READ_BYTES, parseEntries, READ } from '../shell-files.ts';
import { execInPod, spawnInPod, type ExecContext } from './exec.ts';

// Records end with NUL (names may hold anything else): first the directory's absolute path, then
// per entry "type<TAB>size<TAB>mode<TAB>mtime<TAB>name". GNU find does it in one process; where
// find has no -printf (busybox), a loop with stat -c gives the same fields.
export const LIST = [
  'if [ ! -e "$1" ]; then exit 44; fi; if [ ! -d "$1" ]; then exit 20; fi; cd -- "$1" || exit 1',
  'printf "%s\\0" "$PWD"',
  `if find . -maxdepth 0 -printf "" >/dev/null 2>&1; then exec find . -mindepth 1 -maxdepth 1 -printf "${ENTRY_FORMAT}"; fi`,
  'for f in * .[!.]* ..?*; do',
  '  if [ -h "$f" ]; then t=l; elif [ -d "$f" ]; then t=d; elif [ -f "$f" ]; then t=f; elif [ -e "$f" ]; then t=o; else continue; fi',
  '  printf "%s\\t%s\\t%s\\0" "$t" "$(stat -c "%s\t%a\t%Y" -- "$f")" "$f"',
  'done',
].join('\n');

export async function readPodFile(ctx: ExecContext, path: string): Promise<Uint8Array> {
  const result = await execInPod(ctx, { command: ['sh', '-c', READ, 'sh', checkedPath(path)], maxOutputBytes: MAX_READ_BYTES });
  if (result.exitCode !== 0) throw fileFailure(result, 'read', path);
  if (result.truncated) throw new AsbError('PayloadTooLarge', `${path} is larger than ${MAX_READ_BYTES} bytes`);
  return result.stdout;
}

/** Streams a body into the file (src/runtime/file-upload.ts): the target changes only once all of it arrived. */
export async function writePodFile(ctx: ExecContext, path: string, data: Uint8Array | AsyncIterable<Uint8Array>, mode?: number): Promise<void> {
  const shell = { spawn: (req: SpawnRequest) => spawnInPod(ctx, req), exec: (req: ExecRequest) => execInPod(ctx, req) };
  await writeFileFrom(shell, checkedPath(path), data, { mode });
}

/** Parses LIST's output (exported for a test of the stat fallback). */
export function parseListing(output: Uint8Array): FileEntry[] {
  const [dir = '/', ...records] = Buffer.from(output).toString('utf8').split('\0');
  return parseEntries(dir, records);
}

export async function listPodDir(ctx: ExecContext, path: string): Promise<FileEntry[]> {
  const result = await execInPod(ctx, { command: ['sh', '-c', LIST, 'sh', checkedPath(path)], maxOutputBytes: 64 * 1024 * 1024 });
  if (result.exitCode !== 0) throw fileFailure(result, 'list', path);
  return parseListing(result.stdout);
}
