// One behaviour for both pod runtimes' writeFile with a stream (src/runtime/file-upload.ts): the
// body arrives in chunks and is piped into the sandbox; the file changes only once all of it
// arrived; a stream that fails half way (413, an aborted client) leaves the old file and no
// temporary file; a write the sandbox refuses is refused with the sandbox's reason.
import assert from 'node:assert/strict';
import { isAsbError } from '../../src/errors.ts';
import type { PodRuntime } from '../../src/runtime/runtime.ts';

const CHUNK = 64 * 1024;

/** `count` chunks of 64 KiB (chunk i filled with byte i), then `failure` thrown if given. */
export async function* chunks(count: number, failure?: Error): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < count; i++) {
    await Promise.resolve(); // a stream, not a list: each chunk arrives on its own turn
    yield new Uint8Array(CHUNK).fill(i % 256);
  }
  if (failure !== undefined) throw failure;
}

/** Runs the checks in `dir` (made first, may be relative to the pod's working directory) of a running pod `id`. */
export async function checkStreamedWrites(rt: PodRuntime, id: string, dir: string): Promise<void> {
  const path = `${dir}/streamed.bin`;
  await rt.writeFile(id, path, chunks(32)); // 2 MiB
  const written = await rt.readFile(id, path);
  assert.equal(written.length, 32 * CHUNK);
  assert.equal(written[31 * CHUNK], 31);

  const gone = new Error('the client went away');
  await assert.rejects(rt.writeFile(id, path, chunks(8, gone)), (err) => err === gone);
  const kept = await rt.readFile(id, path);
  assert.equal(kept.length, 32 * CHUNK, 'a failed write leaves the old file as it was');
  assert.deepEqual((await rt.listDir(id, dir)).map((e) => e.name), ['streamed.bin'], 'no temporary file is left');

  // A directory is not replaced by a file, streamed or not.
  await assert.rejects(rt.writeFile(id, dir, chunks(1)), (err) => isAsbError(err, 'BadRequest'));
}
