// An upload to the team's file store under a sha256 it is checked against: our REST API names
// files by the sha256 of the tar itself (src/builds/build-context.ts), so unlike E2B's hash, which
// no server can recompute, it is verified before the store keeps anything. The body is written to
// a private (0700) temporary directory while hashed, handed to the store only when the hash is the
// one named, and removed either way: a store never holds a file under a hash that is not its own,
// and the hash is the build cache's key.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdtemp, open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { AsbError } from '../errors.ts';

export interface FilePut {
  put(team: string, hash: string, body: Readable): Promise<void>;
}

/** Stores the chunks as the team's `hash` once their sha256 is `hash`; BadRequest naming both otherwise, storing nothing. Returns the bytes. */
export async function putVerified(files: FilePut, team: string, hash: string, chunks: AsyncIterable<Buffer>): Promise<number> {
  const dir = await mkdtemp(join(tmpdir(), 'asb-upload-'));
  try {
    const path = join(dir, 'files.tar');
    const digest = createHash('sha256');
    let bytes = 0;
    const file = await open(path, 'wx', 0o600);
    try {
      for await (const chunk of chunks) {
        digest.update(chunk);
        bytes += chunk.length;
        await file.write(chunk);
      }
    } finally {
      await file.close();
    }
    const got = digest.digest('hex');
    if (got !== hash) throw new AsbError('BadRequest', `the uploaded files have sha256 ${got}, not ${hash} as the path names; nothing was stored`, { fields: [{ field: 'sha256', message: `the body's sha256 is ${got}` }] });
    await files.put(team, hash, createReadStream(path));
    return bytes;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
