// Where gVisor's runsc lives: built static with Go from the module proxy by scripts/runsc-build.sh
// (make runsc, a prerequisite of make test) into .tools/runsc/bin/runsc, at the version
// tools/runsc/go.mod pins. Debian 12's runsc (20221219) is not used: its --network=sandbox fails on
// this kernel (google/gvisor#10704, fixed in 2024; research/runtime.md §2c), and its /tmp, overlay
// and exec defaults differ from today's. The local runtime runs pods with runtimeClassName gvisor
// under it (src/runtime/local/runtime-class.ts).
import { execFile } from 'node:child_process';
import { accessSync, closeSync, constants, existsSync, openSync, readSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { AsbError } from '../../errors.ts';

/** The gvisor.dev/gvisor pseudo-version tools/runsc/go.mod pins (the module proxy's @latest on 2026-11-24). */
export const RUNSC_VERSION = 'v0.0.0-20260905035102-160fafc42237';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
export const DEFAULT_RUNSC_DIR = join(repoRoot, '.tools', 'runsc');

/**
 * Absolute path of the built runsc, or an Unavailable error saying how to build it. A dynamically
 * linked runsc is refused here: it builds, then every sandbox dies with "error executing umounter:
 * fork/exec /proc/self/exe: no such file or directory" (scripts/runsc-build.sh says why).
 */
export function findRunscBinary(runscDir: string = DEFAULT_RUNSC_DIR): string {
  const path = join(runscDir, 'bin', 'runsc');
  try {
    accessSync(path, constants.X_OK);
  } catch {
    throw new AsbError('Unavailable', `runsc ${RUNSC_VERSION} is not built: run \`make runsc\` (scripts/runsc-build.sh builds it with Go into ${path})`);
  }
  if (elfInterpreter(path) !== undefined) {
    throw new AsbError('Unavailable', `${path} is dynamically linked, so its sandboxes cannot start: rebuild it with \`make runsc\` (CGO_ENABLED=0)`);
  }
  return path;
}

/** The ELF interpreter (PT_INTERP) a binary names, or undefined for a static one. Reads the first 4 KiB, where the program headers are. */
export function elfInterpreter(path: string): string | undefined {
  const head = Buffer.alloc(4096);
  const fd = openSync(path, 'r');
  let length: number;
  try {
    length = readSync(fd, head, 0, head.length, 0);
  } finally {
    closeSync(fd);
  }
  // 64-bit little-endian ELF only (x86-64 and arm64 hosts): e_phoff at 0x20, e_phentsize 0x36, e_phnum 0x38.
  if (length < 64 || head.readUInt32BE(0) !== 0x7f454c46 || head[4] !== 2 || head[5] !== 1) return undefined;
  const phoff = Number(head.readBigUInt64LE(0x20));
  const phentsize = head.readUInt16LE(0x36);
  const phnum = head.readUInt16LE(0x38);
  for (let i = 0; i < phnum; i++) {
    const ph = phoff + i * phentsize;
    if (ph + 40 > length) break;
    if (head.readUInt32LE(ph) !== 3 /* PT_INTERP */) continue;
    const offset = Number(head.readBigUInt64LE(ph + 8));
    const size = Number(head.readBigUInt64LE(ph + 32));
    return offset + size <= length ? head.subarray(offset, offset + size).toString('latin1').replace(/\0+$/, '') : '(beyond the first 4 KiB)';
  }
  return undefined;
}

/** What `runsc --version` reports (one short exec, ~20 ms). */
export async function runscVersion(binary: string): Promise<string> {
  const { stdout } = await promisify(execFile)(binary, ['--version'], { timeout: 10_000, env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } });
  const version = /^runsc version (\S+)/m.exec(stdout)?.[1];
  if (version === undefined) throw new AsbError('Unavailable', `${binary} --version printed no version: ${stdout.slice(0, 200)}`);
  return version;
}

/** Concurrent first sandboxes may each bind the null netns (runsc's UnmountNullNetNS loops the same way); more than this is not runsc. */
const MAX_NULL_NETNS_MOUNTS = 16;

/**
 * Removes a runsc state directory (--root) once none of its sandboxes runs: runsc bind-mounts a
 * shared empty network namespace for the gofers at `<root>/null-netns` on the first sandbox and
 * never unmounts it, so a plain rm fails with EBUSY and the namespace outlives the worker.
 */
export async function releaseRunscRoot(root: string): Promise<void> {
  const nullNetns = join(root, 'null-netns');
  const run = promisify(execFile);
  for (let i = 0; i < MAX_NULL_NETNS_MOUNTS && existsSync(nullNetns); i++) {
    try {
      await run('umount', ['--lazy', nullNetns], { timeout: 10_000 });
    } catch {
      break; // not (or no longer) a mount point
    }
  }
  await rm(root, { recursive: true, force: true });
}
