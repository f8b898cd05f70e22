// The pod a build's RUN, COPY and WORKDIR steps run in: a sandbox like any other (the runtime's
// user namespace of its own, seccomp, Docker's default capabilities within that namespace as a
// template may ask for (BUILD_CAPABILITIES), the build's cpu, memory and disk limits as
// its container's, the egress policy the worker sets for builds (--build-egress; else a sandbox's
// default)), started on the template's runtime class. Nothing
// of a step runs on the host: a COPY's tar is streamed into the pod (decompressed on the way) and
// unpacked there by the image's own tar, as the step's user.
import { randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';
import { createGunzip } from 'node:zlib';
import type { Readable } from 'node:stream';
import { AsbError } from '../errors.ts';
import type { EgressPolicy } from '../network/egress-policy.ts';
import { resolveExecUser, type ExecUser } from '../runtime/oci/user-spec.ts';
import type { PodRuntime, PodState } from '../runtime/runtime.ts';
import type { BuildConfig } from './steps.ts';

/**
 * What root in a build step may do, in the pod's own user namespace only: Docker's default set
 * (which a sandbox's template may ask for too, the PSS baseline) without MKNOD and SETFCAP (a
 * layer keeps neither devices nor file capabilities). Without them `apt-get install`, `useradd`
 * and any `chown` fail (measured: useradd could not write /etc/shadow).
 */
export const BUILD_CAPABILITIES: readonly string[] = ['CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'SETGID', 'SETUID', 'SETPCAP', 'SYS_CHROOT', 'NET_BIND_SERVICE', 'AUDIT_WRITE'];

export interface BuildPodLimits { cpu: number; memoryBytes: number; diskBytes: number }

/** A build pod that has not run after this long (no node has room, its image does not come) fails the build. */
const START_TIMEOUT_MS = 5 * 60_000;

/** The kubelet's reasons for an image it will not get (the waiting reason starts the pod state's message). */
const IMAGE_FAILURE = /^(ErrImagePull|ImagePullBackOff|InvalidImageName|ErrImageNeverPull)\b/;

/**
 * The pod's state once it runs, or once it will not: the local runtime answers start() with a
 * running pod; on Kubernetes the Pod is still Pending then, and runs once the kubelet pulled its
 * image (an image the node cannot pull ends the wait at once, named in the message).
 */
async function running(runtime: PodRuntime, id: string, first: PodState, signal: AbortSignal | undefined): Promise<PodState> {
  const settled = (s: PodState): boolean => s.phase !== 'Pending' || IMAGE_FAILURE.test(s.message ?? '');
  if (settled(first)) return first;
  const limit = AbortSignal.timeout(START_TIMEOUT_MS);
  const stop = signal === undefined ? limit : AbortSignal.any([signal, limit]);
  return await new Promise<PodState>((resolve) => {
    const done = (): void => {
      off();
      stop.removeEventListener('abort', done);
      resolve(runtime.state(id));
    };
    const off = runtime.onChange((changed) => {
      if (changed === id && settled(runtime.state(id))) done();
    });
    stop.addEventListener('abort', done, { once: true });
    if (settled(runtime.state(id))) done();
  });
}

/** Starts the pod on `image`; rejects (BuildFailed) when it does not run. */
export async function startBuildPod(runtime: PodRuntime, image: string, runtimeClassName: string | undefined, limits: BuildPodLimits, egress?: EgressPolicy, signal?: AbortSignal): Promise<string> {
  const id = `build-${randomBytes(6).toString('hex')}`;
  const started = await runtime.start({
    id, uid: `build-${randomBytes(8).toString('hex')}`, namespace: 'builds', hostname: 'build',
    ...(egress === undefined ? {} : { egress }),
    spec: {
      ...(runtimeClassName === undefined ? {} : { runtimeClassName }),
      containers: [{
        name: 'build', image, command: ['sleep', 'infinity'], securityContext: { runAsUser: 0, runAsGroup: 0, capabilities: { add: [...BUILD_CAPABILITIES] } },
        resources: { limits: { cpu: String(limits.cpu), memory: String(limits.memoryBytes), 'ephemeral-storage': String(limits.diskBytes) } },
      }],
    },
  });
  const state = await running(runtime, id, started, signal);
  if (state.phase !== 'Running') {
    await runtime.remove(id).catch(() => undefined);
    signal?.throwIfAborted();
    throw new AsbError('BuildFailed', `the build sandbox did not start from ${image}: ${state.reason ?? state.phase}: ${state.message ?? ''}`.trim());
  }
  return id;
}

/**
 * Who a USER value is, read from the pod's /etc/passwd and /etc/group now (an earlier step may
 * have added the user or group), as Docker reads it (user-spec.ts): `name:group` and `uid:gid` set
 * the group, `name` alone gets the groups /etc/group lists it in. An unknown name fails the step.
 */
export async function resolveUser(runtime: PodRuntime, id: string, user: string | undefined): Promise<ExecUser> {
  const read = async (path: string): Promise<string> => {
    try {
      return Buffer.from(await runtime.readFile(id, path)).toString('utf8');
    } catch {
      return ''; // no such file: only numbers and root can be found
    }
  };
  const [passwd, group] = await Promise.all([read('/etc/passwd'), read('/etc/group')]);
  const who = resolveExecUser(user ?? '', passwd, group);
  if ('error' in who) throw new AsbError('BuildFailed', `USER "${user ?? ''}": ${who.error}`);
  return who;
}

export function envRecord(config: BuildConfig): Record<string, string> {
  const env: Record<string, string> = {};
  for (const e of config.env) {
    const at = e.indexOf('=');
    if (at > 0) env[e.slice(0, at)] = e.slice(at + 1);
  }
  return env;
}

export interface StepRun {
  exitCode: number;
  signal?: string;
  /** The last lines of its output (stdout and stderr), for the error. */
  tail: string[];
}

const TAIL_LINES = 20;
const MAX_LINE = 4096;

/** Runs `sh -c script` as the user (uid, gid, supplementary groups), each output line to `line` as it comes; a signal kills it. */
export async function runInPod(runtime: PodRuntime, id: string, script: string, opts: { user: { uid: number; gid?: number; groups?: readonly number[]; home?: string }; config: BuildConfig; env?: Record<string, string>; line: (text: string) => void; signal: AbortSignal }): Promise<StepRun> {
  const env = envRecord(opts.config);
  // HOME from /etc/passwd, as Docker sets it, unless an ENV step set one.
  if (env.HOME === undefined && opts.user.home !== undefined) env.HOME = opts.user.home;
  const proc = await runtime.spawn(id, {
    command: ['sh', '-c', script], user: opts.user.uid, group: opts.user.gid ?? opts.user.uid, groups: opts.user.groups ?? [], cwd: opts.config.workingDir ?? '/',
    env: { ...env, ...opts.env },
  });
  proc.stdin.end();
  const tail: string[] = [];
  const say = (text: string): void => {
    opts.line(text);
    tail.push(text);
    if (tail.length > TAIL_LINES) tail.shift();
  };
  const reader = (stream: Readable): Promise<void> => new Promise((resolve) => {
    let partial = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      const lines = (partial + chunk).split('\n');
      partial = lines.pop() ?? '';
      for (const l of lines) say(l.slice(0, MAX_LINE));
      if (partial.length > MAX_LINE) {
        say(partial.slice(0, MAX_LINE));
        partial = '';
      }
    });
    stream.on('end', () => {
      if (partial !== '') say(partial);
      resolve();
    });
    stream.on('error', () => resolve());
  });
  const kill = (): void => proc.kill('SIGKILL');
  opts.signal.addEventListener('abort', kill, { once: true });
  try {
    const readers = Promise.all([reader(proc.stdout), reader(proc.stderr)]);
    const exited = await proc.exited;
    // A background child of the step may hold the pipes open: its output stops counting here.
    await Promise.race([readers, new Promise((r) => setTimeout(r, 200).unref())]);
    return { ...exited, tail };
  } finally {
    opts.signal.removeEventListener('abort', kill);
  }
}

/**
 * The COPY script, run as the sandbox's root: unpacks $ASB_TAR with the image's tar and copies
 * $ASB_SRC (a path or glob in it) to $ASB_DEST, with $ASB_MODE, owned by $ASB_OWNER (uid:gid) when
 * set. As Docker does: the destination's missing directories are root's, what is copied the owner's,
 * so a COPY for a user works where that user could not write.
 */
const COPY_SCRIPT = `
command -v tar >/dev/null 2>&1 || { echo "the image has no tar: a COPY step needs one to unpack its files" >&2; exit 127; }
set -e
stage="$ASB_TAR.d"
rm -rf "$stage"; mkdir -p "$stage"
if tar --help 2>&1 | grep -q -- --no-same-owner; then tar -x --no-same-owner -f "$ASB_TAR" -C "$stage"; else tar -x -o -f "$ASB_TAR" -C "$stage"; fi
rm -f "$ASB_TAR" 2>/dev/null || true
IFS=''
found=0
for s in "$stage"/$ASB_SRC; do
  [ -e "$s" ] || [ -L "$s" ] || continue
  found=1
  if [ -n "$ASB_MODE" ]; then chmod -R "$ASB_MODE" "$s"; fi
  if [ -n "$ASB_OWNER" ]; then chown -R -h "$ASB_OWNER" "$s"; fi
  if [ -d "$s" ] && [ ! -L "$s" ]; then mkdir -p "$ASB_DEST"; cp -a "$s/." "$ASB_DEST/"
  else
    case "$ASB_DEST" in
      */) mkdir -p "$ASB_DEST"; cp -a "$s" "$ASB_DEST" ;;
      *) if [ -d "$ASB_DEST" ]; then cp -a "$s" "$ASB_DEST/"; else mkdir -p "$(dirname "$ASB_DEST")"; cp -a "$s" "$ASB_DEST"; fi ;;
    esac
  fi
done
rm -rf "$stage"
[ "$found" = 1 ] || { echo "$ASB_SRC is not in the uploaded files" >&2; exit 1; }
`;

/** Streams the uploaded tar (plain or gzip) into the pod and unpacks it there. */
export async function copyInPod(runtime: PodRuntime, id: string, tarPath: string, args: { src: string; dest: string; mode: string }, opts: { owner: { uid: number; gid: number }; config: BuildConfig; line: (text: string) => void; signal: AbortSignal }): Promise<StepRun> {
  const inPod = `/tmp/.asb-copy-${randomBytes(6).toString('hex')}.tar`;
  const head = Buffer.alloc(2);
  const fh = await open(tarPath, 'r');
  try {
    await fh.read(head, 0, 2, 0);
  } finally {
    await fh.close();
  }
  const file = createReadStream(tarPath);
  const data: Readable = head[0] === 0x1f && head[1] === 0x8b ? file.pipe(createGunzip()) : file;
  // Readable by the step's user, whoever it is (the pod's writeFile makes it as the pod's user, root).
  try {
    await runtime.writeFile(id, inPod, data, 0o644);
  } catch (err) {
    // A tar that does not fit the build's disk, or a gzip that is not one: said as the step's failure.
    throw new AsbError('BuildFailed', `its files could not be written into the build sandbox: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
  const src = args.src.replace(/^(\.\/)+/, '').replace(/\/+$/, '') || '.';
  try {
    const owner = opts.owner.uid === 0 && opts.owner.gid === 0 ? '' : `${String(opts.owner.uid)}:${String(opts.owner.gid)}`;
    return await runInPod(runtime, id, COPY_SCRIPT, { ...opts, user: { uid: 0, home: '/root' }, env: { ASB_TAR: inPod, ASB_SRC: src, ASB_DEST: args.dest, ASB_MODE: args.mode.replace(/^0(?=[0-7]{4})/, ''), ASB_OWNER: owner } });
  } finally {
    // Written by the pod's user (root): another step user cannot remove it from the sticky /tmp.
    await runtime.exec(id, { command: ['rm', '-f', inPod], user: 0 }).catch(() => undefined);
  }
}
