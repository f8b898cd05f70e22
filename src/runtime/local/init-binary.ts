// pod-init (pod-init.c) is compiled on first use into the runtime's state dir, named by the hash
// of its source so an upgrade never runs a stale binary. Compiling takes ~0.3 s once; a `cc`
// (Debian package gcc) must be installed. Several runtimes sharing a root may race: each compiles
// to a private temp name and renames, which is atomic.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { access, mkdir, readFile, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { AsbError } from '../../errors.ts';

const execFileAsync = promisify(execFile);
const SOURCE = new URL('./pod-init.c', import.meta.url);

export async function ensureInitBinary(root: string): Promise<string> {
  const source = await readFile(SOURCE);
  const hash = createHash('sha256').update(source).digest('hex').slice(0, 12);
  const dir = join(root, 'bin');
  const target = join(dir, `pod-init-${hash}`);
  try {
    await access(target);
    return target;
  } catch {
    // not built yet
  }
  await mkdir(dir, { recursive: true });
  const tmp = `${target}.${process.pid}.${Date.now()}.tmp`;
  try {
    await execFileAsync('cc', ['-O2', '-Wall', '-o', tmp, SOURCE.pathname]);
    await rename(tmp, target);
  } catch (err) {
    await rm(tmp, { force: true });
    throw new AsbError('Internal', `cannot build the local pod init (cc -O2 ${SOURCE.pathname}); is gcc installed?`, { cause: err });
  }
  return target;
}
