// The pod shim (oci-shim.c) and the launcher (launcher.c) are compiled on first use into the runtime's
// state dir, each named by the hash of its source so an upgrade never runs a stale binary.
// Compiling takes ~0.3 s once; a `cc` (Debian package gcc) must be installed. Several runtimes
// sharing a root may race: each compiles to a private temp name and renames, which is atomic.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { access, mkdir, readFile, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { AsbError } from '../../errors.ts';

const execFileAsync = promisify(execFile);

export function ensureShimBinary(root: string): Promise<string> {
  return ensureBinary(root, 'oci-shim');
}

export function ensureLauncherBinary(root: string): Promise<string> {
  return ensureBinary(root, 'launcher');
}

async function ensureBinary(root: string, name: string): Promise<string> {
  const file = new URL(`./${name}.c`, import.meta.url);
  const source = await readFile(file);
  const hash = createHash('sha256').update(source).digest('hex').slice(0, 12);
  const dir = join(root, 'bin');
  const target = join(dir, `${name}-${hash}`);
  try {
    await access(target);
    return target;
  } catch {
    // not built yet
  }
  await mkdir(dir, { recursive: true });
  const tmp = `${target}.${process.pid}.${Date.now()}.tmp`;
  try {
    await execFileAsync('cc', ['-O2', '-Wall', '-o', tmp, file.pathname]);
    await rename(tmp, target);
  } catch (err) {
    await rm(tmp, { force: true });
    throw new AsbError('Internal', `cannot build the local ${name} (cc -O2 ${file.pathname}); is gcc installed?`, { cause: err });
  }
  return target;
}
