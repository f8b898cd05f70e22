// The floor under the runtime's cold start: a bare `runc run -d` of a pod's own config.json, timed
// from spawn to runc's exit (the container's process then runs, as when start() says Running).
// What it leaves out, and start() does not: the pod's directories and config.json, the overlay
// mount (made once here, beforehand, as a wake reuses its upper dir), the veth and its addresses,
// and the shim. research/runtime.md §2b measured 26-34 ms for runc 1.1.5 from a shell.
import { spawn } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { performance } from 'node:perf_hooks';
import { ROOT_ID_MAP, type OciSpec } from '../src/runtime/oci/spec.ts';
import { summarize, type LatencySummary } from './claims.ts';

/** runc's own deadline here: it takes tens of ms, a hang fails the bench. */
const RUNC_TIMEOUT_MS = 30_000;

/** `runs` containers of `spec` on an overlay of `lowerdir`, one at a time, each deleted before the next. */
export async function benchRuncFloor(runc: string, spec: OciSpec, lowerdir: string, runs: number): Promise<LatencySummary> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-bench-floor-'));
  // The user namespace's root (host uid ROOT_ID_MAP.hostId) must walk to its rootfs and own its `/`.
  chmodSync(dir, 0o755);
  const [upper, work, rootfs, state] = ['upper', 'work', 'rootfs', 'state'].map((d) => join(dir, d)) as [string, string, string, string];
  for (const d of [upper, work, rootfs, state]) mkdirSync(d);
  chownSync(upper, ROOT_ID_MAP.hostId, ROOT_ID_MAP.hostId);
  let mounted = false;
  let live: string | undefined;
  try {
    if ((await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowerdir},upperdir=${upper},workdir=${work}`, rootfs])) !== 0) throw new Error(`cannot mount an overlay on ${lowerdir}`);
    mounted = true;
    const times: number[] = [];
    const log = join(dir, 'runc.log');
    for (let i = 0; i < runs; i++) {
      const id = `bn-floor-${process.pid}-${i}`;
      const bare = withRuncUserNamespace(spec);
      const config: OciSpec = { ...bare, root: { ...bare.root, path: rootfs }, linux: { ...bare.linux, cgroupsPath: posix.join(posix.dirname(spec.linux.cgroupsPath), id) } };
      writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
      live = id;
      const t0 = performance.now();
      const code = await run(runc, ['--root', state, '--log', log, 'run', '-d', '--bundle', dir, id]);
      times.push(performance.now() - t0);
      if (code !== 0) throw new Error(`runc run -d failed (${code}): ${readFileSync(log, 'utf8').trim().split('\n').at(-1) ?? ''}`);
      await run(runc, ['--root', state, 'delete', '-f', id]);
      live = undefined;
    }
    return summarize(times);
  } finally {
    if (live !== undefined) await run(runc, ['--root', state, 'delete', '-f', live]);
    if (mounted) await run('umount', [rootfs]);
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * A pod's config.json as bare runc runs it: runc makes the user namespace itself, in the range the
 * image tree is owned by. The pod's own (a namespace the shim made, over an idmapped tree) is the
 * runtime's work, which a floor leaves out.
 */
export function withRuncUserNamespace(spec: OciSpec): OciSpec {
  const mapping = [{ containerID: 0, hostID: ROOT_ID_MAP.hostId, size: ROOT_ID_MAP.size }];
  const namespaces = spec.linux.namespaces.map((n) => (n.type === 'user' ? { type: 'user' } : n));
  return { ...spec, linux: { ...spec.linux, namespaces, uidMappings: mapping, gidMappings: mapping } };
}

/** Runs a command with no stdio (a detached container inherits it) to its exit; its exit code. */
function run(command: string, args: readonly string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: 'ignore', timeout: RUNC_TIMEOUT_MS });
    child.on('error', reject);
    child.on('exit', (code, signal) => resolve(code ?? (signal === null ? 1 : 128)));
  });
}
