// Uploaded build files on the worker's disk: one private directory per team, one tar per sha256.
// An upload is written to a temporary file beside its final name and renamed into place only
// once its sha256 is the one it was named by, so a store never holds a file under a wrong hash
// (the hash is the build cache's key) nor a half-written one, and a failed upload leaves nothing.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync } from 'node:fs';
import { open, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { randomString } from '../api/ids.ts';
import { AsbError } from '../errors.ts';
import type { FileStore } from './contract.ts';
import { isSha256 } from './spec-check.ts';

/** A FileStore that also takes uploads. */
export interface BuildFiles extends FileStore {
  /**
   * Stores the chunks as the team's tar named `hash` once their sha256 is `hash`; rejects with
   * BadRequest naming both hashes otherwise, storing nothing. Returns the bytes stored.
   */
  write(team: string, hash: string, chunks: AsyncIterable<Buffer>): Promise<number>;
}

export class DirFileStore implements BuildFiles {
  readonly #root: string;

  /** root: a directory only the worker may read (created 0700 when absent). */
  constructor(root: string) {
    mkdirSync(root, { recursive: true, mode: 0o700 });
    this.#root = root;
  }

  // Team names are free text: a directory named by their hash cannot escape the root.
  #teamDir(team: string): string {
    return join(this.#root, createHash('sha256').update(team).digest('hex').slice(0, 32));
  }

  path(team: string, hash: string): string | undefined {
    if (!isSha256(hash)) return undefined;
    const p = join(this.#teamDir(team), `${hash}.tar`);
    return existsSync(p) ? p : undefined;
  }

  has(team: string, hash: string): boolean {
    return this.path(team, hash) !== undefined;
  }

  async write(team: string, hash: string, chunks: AsyncIterable<Buffer>): Promise<number> {
    if (!isSha256(hash)) throw new AsbError('BadRequest', `"${hash}" is not a sha256 (64 lower-case hex digits)`);
    const dir = this.#teamDir(team);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const tmp = join(dir, `.upload-${randomString(12)}`);
    const digest = createHash('sha256');
    let bytes = 0;
    const file = await open(tmp, 'wx', 0o600);
    try {
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
      await rename(tmp, join(dir, `${hash}.tar`));
      return bytes;
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
  }
}
