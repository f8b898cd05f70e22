// Where CRIU lives: built from Debian trixie's source package by scripts/criu-build.sh (make criu,
// a prerequisite of make up and make test) into .tools/criu/bin/criu. Debian 12's /usr/sbin/criu
// (3.17) is not used: it fails on kernels 6.13+ before it looks at any process ("vdso: Unexpected
// rt vDSO area bounds", docs/criu.md).
//
// runc 1.5.2 has no flag naming CRIU: `runc checkpoint` and `runc restore` run `criu swrk` found
// on runc's own PATH. So the runtime must run those two subcommands, and only those, with
// criuPath(): this binary's directory first, then the usual system directories. Every other runc
// call keeps its PATH (oci-shim.c sets a fixed one), and nothing else on the worker sees this criu.
import { execFile } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { AsbError } from '../../errors.ts';

/** The version scripts/criu-build.sh builds (Debian trixie's criu 4.1.1-1 source). */
export const CRIU_VERSION = '4.1.1';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
export const DEFAULT_CRIU_DIR = join(repoRoot, '.tools', 'criu');

/** The PATH oci-shim.c gives runc; CRIU itself runs iptables/nft and ip from it for network locks. */
const SYSTEM_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Absolute path of the built criu, or an Unavailable error saying how to build it. */
export function findCriuBinary(criuDir: string = DEFAULT_CRIU_DIR): string {
  const path = join(criuDir, 'bin', 'criu');
  try {
    accessSync(path, constants.X_OK);
    return path;
  } catch {
    throw new AsbError('Unavailable', `CRIU ${CRIU_VERSION} is not built: run \`make criu\` (scripts/criu-build.sh builds it from Debian's source into ${path})`);
  }
}

/** The PATH for `runc checkpoint` and `runc restore` only: runc runs the first `criu` on it. */
export function criuPath(binary: string): string {
  return `${dirname(binary)}:${SYSTEM_PATH}`;
}

export interface CriuCheck {
  ok: boolean;
  /** `criu --version`'s version. */
  version: string;
  /** Why `criu check` failed (its error lines); undefined when it passed. */
  reason: string | undefined;
}

/**
 * `criu --version` and `criu check` (~0.1 s: CRIU probes the kernel's features). check fails on a
 * kernel or a machine CRIU cannot serve; its error lines say why (Debian 12's 3.17 on this kernel:
 * "vdso: Unexpected rt vDSO area bounds"). Run once per worker, not per checkpoint.
 */
export async function criuCheck(binary: string): Promise<CriuCheck> {
  const run = promisify(execFile);
  const opts = { timeout: 30_000, env: { PATH: SYSTEM_PATH } };
  const { stdout: versionText } = await run(binary, ['--version'], opts);
  const version = /^Version: (\S+)/m.exec(versionText)?.[1];
  if (version === undefined) throw new AsbError('Unavailable', `${binary} --version printed no version: ${versionText.slice(0, 200)}`);
  try {
    await run(binary, ['check'], opts);
    return { ok: true, version, reason: undefined };
  } catch (err) {
    const { stdout = '', stderr = '', message } = err as { stdout?: string; stderr?: string; message: string };
    const errors = `${stderr}\n${stdout}`.split('\n').filter((line) => /Error|error/.test(line)).map((line) => line.trim());
    return { ok: false, version, reason: errors.length > 0 ? errors.join('; ') : (stderr.trim() || message) };
  }
}
