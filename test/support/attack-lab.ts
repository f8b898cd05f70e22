// The security suite's harness (test/security-runtime.test.ts; network isolation,
// test/security-network.test.ts, adds its cases the same way): a real local runtime with its own
// bridge and subnet, and a list of attacks, each a real attempt from inside sandboxes it starts
// itself. Every attack runs once per runtime class the runtime really supports: runc always, gVisor
// (`runtimeClassName: gvisor`) once the runtime says it runs it (rootIsolation.gvisor), with no
// code change here: the hook is `classes`.
//
//   lab.register([
//     { name: 'unshare -U fails', run: async (a) => {
//       const p = await a.pod('userns');
//       assert.notEqual((await p.sh('unshare -U true')).exitCode, 0);
//     } },
//   ]);
//
// Pods, host directories and anything added with `a.cleanup` are removed after the attack, last
// first, whether it passed or not. Attacks aim only at the sandboxes and host paths they made.
import { execFile } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import type { Container, PodSpec, VolumeClaimTemplate } from '../../src/api/types.ts';
import type { EgressPolicy } from '../../src/network/egress-policy.ts';
import type { LocalRuntime } from '../../src/runtime/local/local-runtime.ts';
import type { LocalRuntimeOptions } from '../../src/runtime/local/runtime-options.ts';
import type { ExecResult, PodRequest, PodState } from '../../src/runtime/runtime.ts';
import { waitForPodState } from './pod-state.ts';
import { onCleanup } from './oci-fixture.ts';
import { startTestRuntime, stopTestRuntime } from './test-runtime.ts';

export const run = promisify(execFile);

export type RuntimeClass = 'runc' | 'gvisor';

export interface Exec {
  exitCode: number;
  out: string;
  err: string;
  /** Wall time of the exec, as the caller saw it. */
  ms: number;
  timedOut: boolean;
  signal?: string;
}

export interface ShOptions {
  /** Run as this uid in the sandbox (0: the sandbox's root); default the pod's user. */
  user?: number;
  env?: Record<string, string>;
  stdin?: string;
  timeoutMs?: number;
}

export interface PodOptions {
  /** Pod-level fields (securityContext, volumes, ...); runtimeClassName is the lab's. */
  spec?: Omit<Partial<PodSpec>, 'containers' | 'runtimeClassName'>;
  volumeClaimTemplates?: VolumeClaimTemplate[];
  /** Wait for Running (default); false returns whatever start() answered (a pod whose command ends at once). */
  running?: boolean;
  /** The pod's egress policy (PodRequest.egress); default the runtime's. */
  egress?: EgressPolicy;
}

/** A sandbox an attack started. */
export interface LabPod {
  readonly id: string;
  readonly request: PodRequest;
  /** The pod's address on the bridge. */
  ip(): string;
  /** `sh -c script` in the sandbox. */
  sh(script: string, opts?: ShOptions): Promise<Exec>;
  /** A command (argv) in the sandbox: python3 -c CODE ARGS without shell quoting. */
  exec(command: string[], opts?: ShOptions): Promise<Exec>;
  state(): PodState;
  /** Hibernates (stop) and wakes (start) the same pod: the same disk, as after an idle period. */
  hibernate(): Promise<void>;
  wake(): Promise<PodState>;
}

export interface AttackContext {
  readonly cls: RuntimeClass;
  readonly rt: LocalRuntime;
  /** The runtime's state dir on the host (pods/, volumes/, runc/). */
  readonly root: string;
  /** Starts a sandbox (base image unless `container.image` says otherwise), removed after the attack. */
  pod(name: string, container?: Partial<Container>, opts?: PodOptions): Promise<LabPod>;
  /** A fresh host directory outside every sandbox (mode 0700, root), removed after the attack. */
  hostDir(prefix: string): Promise<string>;
  /** Runs after the attack, before the pods and directories made before it are removed. */
  cleanup(step: () => unknown): void;
  /** Prints a line under the test's result (node:test's t.diagnostic): figures measured alongside. */
  diagnostic(message: string): void;
  /** Resolves once pred holds for the pod's state (checked on every change), or fails after timeoutMs. */
  waitForState(id: string, pred: (s: PodState) => boolean, what: string, timeoutMs?: number): Promise<PodState>;
}

export interface Attack {
  name: string;
  /**
   * The runtime classes the attack applies to, default every class the runtime runs. Restrict it
   * only when the assertion reads something one runtime shows and another cannot (runc's uid_map
   * of the host kernel, its host cgroup files).
   */
  classes?: readonly RuntimeClass[];
  /** node:test's per-test timeout; default the runner's. */
  timeoutMs?: number;
  run(a: AttackContext): Promise<void>;
}

export interface LabOptions {
  /** ≤ 12 characters, unused on this host. */
  bridge: string;
  /** A /16 no other test or worker uses. */
  subnet: string;
  /** Runtime options the lab passes on (egressProxy, podDns). */
  runtime?: Partial<LocalRuntimeOptions>;
}

const text = (b: Uint8Array): string => Buffer.from(b).toString('utf8');

export class AttackLab {
  readonly rt: LocalRuntime;
  readonly root: string;
  readonly #bridge: string;

  private constructor(rt: LocalRuntime, root: string, bridge: string) {
    this.rt = rt;
    this.root = root;
    this.#bridge = bridge;
  }

  /** Makes the runtime now (at import: the classes decide which tests exist) and removes it after the file. */
  static async create(opts: LabOptions): Promise<AttackLab> {
    const { rt, root } = await startTestRuntime('asb-attack-', opts.bridge, opts.subnet, { probeIntervalMs: 100, pollIntervalMs: 100, ...opts.runtime });
    const lab = new AttackLab(rt, root, opts.bridge);
    after(() => lab.close());
    return lab;
  }

  /** runc always; gVisor only when this runtime really runs `runtimeClassName: gvisor` under runsc. */
  get classes(): RuntimeClass[] {
    return this.rt.rootIsolation.gvisor ? ['runc', 'gvisor'] : ['runc'];
  }

  /** Declares one node:test test per attack and runtime class: `<class>: <name>`. */
  register(attacks: readonly Attack[]): void {
    for (const cls of this.classes) {
      for (const attack of attacks) {
        if (attack.classes !== undefined && !attack.classes.includes(cls)) continue;
        test(`${cls}: ${attack.name}`, attack.timeoutMs === undefined ? {} : { timeout: attack.timeoutMs }, async (t) => {
          await attack.run(this.#context(cls, (step) => onCleanup(t, step), (message) => t.diagnostic(message)));
        });
      }
    }
  }

  #context(cls: RuntimeClass, cleanup: (step: () => unknown) => void, diagnostic: (message: string) => void): AttackContext {
    const rt = this.rt;
    const suffix = cls === 'runc' ? 'r' : 'g';
    const waitForState = (id: string, pred: (s: PodState) => boolean, what: string, timeoutMs = 20_000): Promise<PodState> => waitForPodState(rt, id, pred, what, timeoutMs);
    return {
      cls,
      rt,
      root: this.root,
      cleanup,
      diagnostic,
      waitForState,
      hostDir: async (prefix) => {
        const dir = await mkdtemp(join(tmpdir(), prefix));
        await chmod(dir, 0o700);
        cleanup(() => rm(dir, { recursive: true, force: true }));
        return dir;
      },
      pod: async (name, container = {}, opts = {}) => {
        const id = `${name}-${suffix}`;
        if (rt.state(id).phase !== 'Absent') throw new Error(`pod ${id} exists already: two attacks share a pod name`);
        const request: PodRequest = {
          id,
          uid: `uid-${id}`,
          namespace: 'default',
          hostname: id,
          spec: { ...opts.spec, ...(cls === 'gvisor' ? { runtimeClassName: 'gvisor' } : {}), containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'], ...container }] },
          ...(opts.volumeClaimTemplates === undefined ? {} : { volumeClaimTemplates: opts.volumeClaimTemplates }),
          ...(opts.egress === undefined ? {} : { egress: opts.egress }),
        };
        cleanup(() => rt.remove(id));
        const started = await rt.start(request);
        if (opts.running !== false) assert(started.phase === 'Running', `pod ${id} did not start: ${JSON.stringify(started)}`);
        return {
          id,
          request,
          ip: () => rt.state(id).ip ?? '',
          sh: (script, o = {}) => exec(rt, id, ['sh', '-c', script], o),
          exec: (command, o = {}) => exec(rt, id, command, o),
          state: () => rt.state(id),
          hibernate: () => rt.stop(id),
          wake: () => rt.start(request),
        };
      },
    };
  }

  close(): Promise<void> {
    return stopTestRuntime({ rt: this.rt, root: this.root, bridge: this.#bridge });
  }
}

async function exec(rt: LocalRuntime, id: string, command: string[], opts: ShOptions): Promise<Exec> {
  const begun = Date.now();
  const r: ExecResult = await rt.exec(id, {
    command,
    ...(opts.user === undefined ? {} : { user: opts.user }),
    ...(opts.env === undefined ? {} : { env: opts.env }),
    ...(opts.stdin === undefined ? {} : { stdin: opts.stdin }),
    timeoutMs: opts.timeoutMs ?? 60_000,
  });
  const result: Exec = { exitCode: r.exitCode, out: text(r.stdout), err: text(r.stderr), ms: Date.now() - begun, timedOut: r.timedOut };
  if (r.signal !== undefined) result.signal = r.signal;
  return result;
}

function assert(condition: boolean, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

/** `key=value` lines of an attack's output (the last value of a repeated key wins). */
export function fields(out: string): Map<string, string> {
  return new Map(out.split('\n').filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
}
