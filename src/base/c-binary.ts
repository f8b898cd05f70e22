// Our few C programs (the pod shim, the launcher, the disk helper, the terminal helper) are compiled on first use
// into a state dir, each named by the hash of its source and flags so an upgrade never runs a
// stale binary. Compiling takes ~0.3 s once; a `cc` (Debian package gcc) must be installed.
// Several processes sharing a root may race: each compiles to a private temp name and renames,
// which is atomic.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { access, mkdir, readFile, rename, rm } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { AsbError } from '../errors.ts';

const execFileAsync = promisify(execFile);
const DEFAULT_FLAGS: readonly string[] = ['-O2', '-Wall'];

/**
 * The path of `source` (a `.c` file) compiled into `<root>/bin/<name>-<hash>`, building it if it
 * is not there yet. `flags` replace the default `-O2 -Wall`.
 */
export async function ensureCBinary(root: string, source: URL, flags: readonly string[] = DEFAULT_FLAGS): Promise<string> {
  const path = fileURLToPath(source);
  const name = basename(path, '.c');
  const text = await readFile(path);
  // The default flags hash as before flags existed, so binaries already built stay valid.
  const hash = createHash('sha256').update(text);
  if (flags !== DEFAULT_FLAGS) hash.update(`\0${flags.join('\0')}`);
  const dir = join(root, 'bin');
  const target = join(dir, `${name}-${hash.digest('hex').slice(0, 12)}`);
  try {
    await access(target);
    return target;
  } catch {
    // not built yet
  }
  await mkdir(dir, { recursive: true });
  const tmp = `${target}.${String(process.pid)}.${String(Date.now())}.tmp`;
  try {
    await execFileAsync('cc', [...flags, '-o', tmp, path]);
    await rename(tmp, target);
  } catch (err) {
    await rm(tmp, { force: true });
    throw new AsbError('Internal', `cannot build ${name} (cc ${flags.join(' ')} ${path}); is gcc installed?`, { cause: err });
  }
  return target;
}
