// The files API acts INSIDE the sandbox, as its user, with the sandbox's own tools: a symlink the
// sandbox made can never lead a read or write to a host file, and permissions are the sandbox's.
// Exit codes chosen by the scripts below tell the outcomes apart without parsing messages.
import { posix } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { ExecRequest, FileEntry, SpawnRequest } from '../runtime.ts';
import { writeFileFrom } from '../file-upload.ts';
import { checkedPath, ENTRY_FORMAT, fileFailure, MAX_READ_BYTES, parseEntries, READ } from '../shell-files.ts';
import { execInPod, type PodTarget } from './exec.ts';
import { spawnPodProcess } from './process.ts';

const LIST = 'if [ ! -e "$1" ]; then exit 44; fi; if [ ! -d "$1" ]; then exit 20; fi; ' +
  `exec find "$1" -mindepth 1 -maxdepth 1 -printf "${ENTRY_FORMAT}"`;

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

/** Streams a body into the file (src/runtime/file-upload.ts): the target changes only once all of it arrived. */
export async function writePodFile(target: PodTarget, path: string, data: Uint8Array | AsyncIterable<Uint8Array>, mode?: number): Promise<void> {
  const shell = { spawn: (req: SpawnRequest) => spawnPodProcess(target, req), exec: (req: ExecRequest) => execInPod(target, req) };
  await writeFileFrom(shell, absolute(target, path), data, { mode });
}

export async function listPodDir(target: PodTarget, path: string): Promise<FileEntry[]> {
  const abs = absolute(target, path);
  const result = await execInPod(target, { command: ['sh', '-c', LIST, 'sh', abs], maxOutputBytes: 64 * 1024 * 1024 });
  if (result.exitCode !== 0) throw fileFailure(result, 'list', abs);
  return parseEntries(abs, Buffer.from(result.stdout).toString('utf8').split('\0'));
}
