// Where runc lives: built with Go from the module proxy by scripts/runc-build.sh (make runc, a
// prerequisite of make test) into .tools/runc/bin/runc, at the version tools/runc/go.mod pins.
// Debian 12's /usr/sbin/runc (1.1.5) is not used: it lacks the November 2025 container-escape
// fixes (research/runtime.md §2d). The local runtime drives it (local/local-runtime.ts).
import { execFile } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { AsbError } from '../../errors.ts';

/** The version tools/runc/go.mod pins. */
export const RUNC_VERSION = '1.5.2';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
export const DEFAULT_RUNC_DIR = join(repoRoot, '.tools', 'runc');

/** Absolute path of the built runc, or an Unavailable error saying how to build it. */
export function findRuncBinary(runcDir: string = DEFAULT_RUNC_DIR): string {
  const path = join(runcDir, 'bin', 'runc');
  try {
    accessSync(path, constants.X_OK);
    return path;
  } catch {
    throw new AsbError('Unavailable', `runc ${RUNC_VERSION} is not built: run \`make runc\` (scripts/runc-build.sh builds it with Go into ${path})`);
  }
}

export interface RuncInfo {
  version: string;
  /** libseccomp runc was linked against; undefined when built without the seccomp tag. */
  libseccomp: string | undefined;
  /** `runc features`: whether seccomp filters are supported. */
  seccomp: boolean;
}

/** What `runc --version` and `runc features` report (two short execs, ~10 ms each). */
export async function runcInfo(binary: string): Promise<RuncInfo> {
  const run = promisify(execFile);
  const opts = { timeout: 10_000, env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } };
  const { stdout: versionText } = await run(binary, ['--version'], opts);
  const version = /^runc version (\S+)/m.exec(versionText)?.[1];
  if (version === undefined) throw new AsbError('Unavailable', `${binary} --version printed no version: ${versionText.slice(0, 200)}`);
  const { stdout: featuresText } = await run(binary, ['features'], opts);
  const features = JSON.parse(featuresText) as { linux?: { seccomp?: { enabled?: boolean } } };
  return { version, libseccomp: /^libseccomp: (\S+)/m.exec(versionText)?.[1], seccomp: features.linux?.seccomp?.enabled === true };
}
