// The files a team's COPY steps need, uploaded as tars by the hash the E2B SDK names them with
// (a sha256 over the COPY's source, destination, paths, modes, sizes and contents: the server
// cannot recompute it from the tar, so the hash is a name, and an upload is checked for being one
// well-formed tar, plain or gzip, within MAX_FILE_BYTES). One 0700 directory per team, named by a
// digest of the team so no team name reaches a path; a tar is `<hash>.tar`, written to a
// temporary name and renamed, so a build never reads half an upload.
//
// Kept until unused for maxAgeMs (default 7 days, measured from the upload or the last build that
// used it: the cache is shared across a team's templates, so a tar outlives the template that
// uploaded it), and every file of a team goes when its last template is deleted.
import { createHash } from 'node:crypto';
import { closeSync, createWriteStream, existsSync, openSync, readdirSync, readSync, renameSync, rmSync, statSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Transform, type Readable } from 'node:stream';
import { gunzipSync } from 'node:zlib';
import { AsbError } from '../errors.ts';
import { privateDir } from '../base/private-files.ts';
import type { FileStore } from './contract.ts';

/** Largest uploaded tar: 1 GiB, the E2B SDK's build contexts are repositories, not data sets. */
export const MAX_FILE_BYTES = 1024 * 1024 * 1024;
export const DEFAULT_FILE_MAX_AGE_MS = 7 * 24 * 3600 * 1000;
const HASH = /^[a-f0-9]{64}$/;

export function isFilesHash(hash: string): boolean {
  return HASH.test(hash);
}

function teamDirName(team: string): string {
  return createHash('sha256').update(team).digest('hex').slice(0, 32);
}

/** Whether the first bytes are a tar header (ustar magic at 257) or gzip's magic; a gzip's own first block is checked too. */
function looksLikeTar(path: string): boolean {
  const fd = openSync(path, 'r');
  try {
    const head = Buffer.alloc(64 * 1024);
    const n = readSync(fd, head, 0, head.length, 0);
    let block = head.subarray(0, n);
    if (block[0] === 0x1f && block[1] === 0x8b) {
      try {
        block = gunzipSync(block, { finishFlush: 2 /* Z_SYNC_FLUSH: a prefix is enough */ });
      } catch {
        return false;
      }
    }
    if (block.length < 512) return false;
    return block.subarray(257, 262).toString('latin1') === 'ustar';
  } finally {
    closeSync(fd);
  }
}

export class TeamFileStore implements FileStore {
  readonly #root: string;
  readonly #maxBytes: number;
  readonly #maxAgeMs: number;
  readonly #now: () => number;

  constructor(opts: { dir: string; maxBytes?: number; maxAgeMs?: number; now: () => number }) {
    this.#root = opts.dir;
    this.#maxBytes = opts.maxBytes ?? MAX_FILE_BYTES;
    this.#maxAgeMs = opts.maxAgeMs ?? DEFAULT_FILE_MAX_AGE_MS;
    this.#now = opts.now;
    privateDir(this.#root);
  }

  #file(team: string, hash: string): string | undefined {
    return isFilesHash(hash) ? join(this.#root, teamDirName(team), `${hash}.tar`) : undefined;
  }

  has(team: string, hash: string): boolean {
    return this.path(team, hash) !== undefined;
  }

  path(team: string, hash: string): string | undefined {
    const file = this.#file(team, hash);
    return file !== undefined && existsSync(file) ? file : undefined;
  }

  /** Marks the team's file as used now (a build read it), so the age sweep keeps it. */
  touch(team: string, hash: string): void {
    const file = this.path(team, hash);
    if (file === undefined) return;
    const now = new Date(this.#now());
    utimesSync(file, now, now);
  }

  /** Stores the body as the team's tar `hash`: 413 past maxBytes, 400 when it is no tar; nothing is kept on failure. */
  async put(team: string, hash: string, body: Readable): Promise<void> {
    const file = this.#file(team, hash);
    if (file === undefined) throw new AsbError('BadRequest', `files hash "${hash}" is not a sha256 (64 lowercase hex characters)`);
    const dir = join(this.#root, teamDirName(team));
    privateDir(dir);
    const partial = `${file}.${String(process.pid)}.${String(this.#now())}.${Math.random().toString(36).slice(2)}.part`;
    let seen = 0;
    const max = this.#maxBytes;
    const limit = new Transform({
      transform(chunk: Buffer, _enc, done) {
        seen += chunk.length;
        if (seen > max) done(new AsbError('PayloadTooLarge', `the files of hash ${hash} are larger than ${String(max)} bytes`));
        else done(null, chunk);
      },
    });
    try {
      await pipeline(body, limit, createWriteStream(partial, { mode: 0o600 }));
      if (seen === 0 || !looksLikeTar(partial)) throw new AsbError('BadRequest', `the upload for files hash ${hash} is not a tar archive (plain or gzip), as the SDK's copy() sends`);
      renameSync(partial, file);
    } finally {
      rmSync(partial, { force: true });
    }
  }

  /** Removes tars unused for longer than maxAgeMs; returns how many went. */
  sweep(): number {
    let removed = 0;
    const cutoff = this.#now() - this.#maxAgeMs;
    for (const team of existsSync(this.#root) ? readdirSync(this.#root) : []) {
      const dir = join(this.#root, team);
      for (const name of readdirSync(dir)) {
        const path = join(dir, name);
        const mtime = statSync(path).mtimeMs;
        // A .part is an upload in flight; one an hour old was left by a process that died.
        if (name.endsWith('.part') ? mtime < this.#now() - 3600_000 : mtime < cutoff) {
          rmSync(path, { force: true });
          removed++;
        }
      }
    }
    return removed;
  }

  /** Every file of the team (its last template was deleted). */
  removeTeam(team: string): void {
    rmSync(join(this.#root, teamDirName(team)), { recursive: true, force: true });
  }
}
