// Federation benchmarks: how fast a change at the hub is applied everywhere, and how many
// placement decisions the hub can make.
//
// Propagation: the real hub (src/hub/hub.ts) runs in this process on its own embedded store, and
// 20 real worker processes (src/assembly/worker-main.ts), each with its own store, dial it for sync.
// A change is an API key creation or revocation or a template apply through the hub's admin API,
// one at a time. Its latency runs from its commit at the hub to the moment the hub has an ack for
// that version (or a later one) from every worker: applied and persisted in all 20 stores. The
// commit is seen by a watch on the hub's store in this process; when the admin API's answer
// arrives first, the clock starts at the answer (the commit came before both). A burst then
// sends 50 key creations back to back (each as soon as the previous one was answered) and times
// the first commit to every worker's ack of the last.
//
// Placement: the hub's pure place() over 20 candidates, in a loop bounded by time and count.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { KubeObject } from '../src/api/meta.ts';
import { ApiKeyType, SandboxTemplateType } from '../src/api/types.ts';
import type { PlacementCandidate, PlacementRequest } from '../src/api/hub-contract.ts';
import { startHub, type RunningHub } from '../src/hub/hub.ts';
import { place } from '../src/hub/placement.ts';
import type { Watch } from '../src/store/store.ts';
import { startChild, type ReadyChild } from '../src/base/child.ts';
import { createLogger } from '../src/base/log.ts';
import { call, round, summarize, type LatencySummary, type Target } from './claims.ts';

const repoRoot = resolve(import.meta.dirname, '..');

const WORKERS = 20;
/** Key creations and revocations, alternating, one at a time. */
const KEY_CHANGES = 200;
/** A template apply after every this many key changes (10 in all). */
const TEMPLATE_EVERY = 20;
const BURST = 50;
/** A change not acked by every worker within this is counted as timed out (and the run goes on). */
const ACK_TIMEOUT_MS = 10_000;
/** More than this many timeouts means the federation is broken, not slow: stop. */
const MAX_TIMEOUTS = 5;
/** The admin API's answer and the store watch event come within microseconds of each other. */
const COMMIT_TIMEOUT_MS = 5_000;
const SYNCED_TIMEOUT_MS = 120_000;
/** Worker starts at once: each spends ~1 s of CPU starting, and the machine may have 2 cores. */
const START_CONCURRENCY = 4;
const PLACEMENT_MS = 2_000;
const PLACEMENT_MAX_DECISIONS = 100_000_000;

const REGIONS = ['us-east', 'us-west', 'eu-west', 'ap-south'] as const;

export interface PropagationFigures {
  workers: number;
  /** Seconds from the first worker start until all were connected and synced. */
  startSec: number;
  changes: LatencySummary & { timeouts: number };
  burst: { changes: number; ms: number; apiMs: number; changesPerSec: number };
}

export interface PlacementFigures {
  candidates: number;
  decisions: number;
  decisionsPerSec: number;
}

/** Each worker's ack history, in arrival order, as the hub's sync server reports it. */
class AckLog {
  readonly #history = new Map<string, { version: number; at: number }[]>();
  readonly #listeners = new Set<() => void>();

  constructor(clusters: readonly string[]) {
    for (const c of clusters) this.#history.set(c, []);
  }

  record(cluster: string, version: number): void {
    this.#history.get(cluster)?.push({ version, at: performance.now() });
    for (const fn of [...this.#listeners]) fn();
  }

  /** When the last worker first acked `version` or later; undefined while one has not. */
  allAt(version: number): number | undefined {
    let latest = 0;
    for (const acks of this.#history.values()) {
      const first = acks.find((a) => a.version >= version);
      if (first === undefined) return undefined;
      latest = Math.max(latest, first.at);
    }
    return latest;
  }

  /** allAt(version) once every worker has acked it; undefined after timeoutMs. */
  waitAll(version: number, timeoutMs: number): Promise<number | undefined> {
    return new Promise((res) => {
      const check = (): void => {
        const at = this.allAt(version);
        if (at === undefined) return;
        done(at);
      };
      const done = (at: number | undefined): void => {
        clearTimeout(timer);
        this.#listeners.delete(check);
        res(at);
      };
      const timer = setTimeout(() => done(undefined), timeoutMs);
      this.#listeners.add(check);
      check();
    });
  }
}

/** Every commit of a synced kind at the hub (ApiKeys, SandboxTemplates), with when it was seen. */
class CommitLog {
  readonly entries: { version: number; at: number }[] = [];
  readonly #listeners = new Set<() => void>();
  readonly #watches: Watch[];
  #failure: Error | undefined;

  constructor(hub: RunningHub) {
    const onEvent = (e: { type: string; object: KubeObject }): void => {
      if (e.type === 'BOOKMARK') return;
      this.entries.push({ version: Number(e.object.metadata.resourceVersion), at: performance.now() });
      for (const fn of [...this.#listeners]) fn();
    };
    const onError = (err: Error): void => {
      this.#failure = new Error('the benchmark lost its watch on the hub store', { cause: err });
      for (const fn of [...this.#listeners]) fn();
    };
    this.#watches = [ApiKeyType, SandboxTemplateType].map((rt) => hub.store.watch(rt, {}, { onEvent, onError }));
  }

  /** The commit at `index` (0 = the first since this log began), waiting for it if need be. */
  at(index: number): Promise<{ version: number; at: number }> {
    return new Promise((res, rej) => {
      const check = (): void => {
        const entry = this.entries[index];
        const failure = this.#failure;
        if (entry === undefined && failure === undefined) return;
        clearTimeout(timer);
        this.#listeners.delete(check);
        if (entry !== undefined) res(entry);
        else if (failure !== undefined) rej(failure);
      };
      const timer = setTimeout(() => {
        this.#listeners.delete(check);
        rej(new Error(`no commit #${index} at the hub within ${COMMIT_TIMEOUT_MS} ms of the admin API's answer`));
      }, COMMIT_TIMEOUT_MS);
      this.#listeners.add(check);
      check();
    });
  }

  close(): void {
    for (const w of this.#watches) w.close();
  }
}

export async function benchPropagation(): Promise<PropagationFigures> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-bench-fed-'));
  const log = createLogger({ level: 'warn', destination: join(dir, 'hub.log') });
  const hub = await startHub({ dataDir: join(dir, 'hub'), host: '127.0.0.1', port: 0, adminKeyFile: join(dir, 'hub-admin.key'), logLevel: 'warn' }, { log });
  const workers: ReadyChild<{ ready: true }>[] = [];
  // Last resort if this process exits or is stopped by a signal mid-run: no worker outlives it
  // (a worker whose hub is gone would go on reconnecting forever).
  const killAll = (): void => {
    for (const w of workers) if (w.proc.exitCode === null && w.proc.signalCode === null) w.proc.kill('SIGKILL');
  };
  const onSignal = (signal: NodeJS.Signals): void => {
    killAll();
    removeBridges();
    console.error(`federation bench: stopped by ${signal}; state and logs left in ${dir}`);
    process.exit(128 + (signal === 'SIGINT' ? 2 : 15));
  };
  process.once('exit', killAll);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  let ok = false;
  try {
    const figures = await measure(dir, hub, workers);
    ok = true;
    return figures;
  } finally {
    await Promise.all(workers.map((w) => w.stop(10_000)));
    process.removeListener('exit', killAll);
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
    await hub.close();
    removeBridges();
    if (ok) rmSync(dir, { recursive: true, force: true });
    else console.error(`federation bench: hub and worker logs kept in ${dir}`);
  }
}

async function measure(dir: string, hub: RunningHub, workers: ReadyChild<{ ready: true }>[]): Promise<PropagationFigures> {
  if (hub.adminKey === undefined) throw new Error('the hub made no admin key');
  const target: Target = { apiUrl: hub.url, adminKey: hub.adminKey };
  const names = Array.from({ length: WORKERS }, (_, i) => `bench-fed-${String(i).padStart(2, '0')}`);
  const acks = new AckLog(names);
  const offAck = hub.sync.onAck((cluster, version) => acks.record(cluster, version));
  const commits = new CommitLog(hub);
  try {
    const started = performance.now();
    await startWorkers(dir, hub, target, names, workers);
    await waitSynced(hub, names);
    const startSec = round((performance.now() - started) / 1000, 1);

    // One change at a time, each waited for at every worker before the next.
    const samples: number[] = [];
    let timeouts = 0;
    let created = '';
    for (let k = 0; k < KEY_CHANGES; k++) {
      // Key changes alternate creation and revocation of the key just created; a template
      // apply follows every TEMPLATE_EVERY of them.
      const template = k % TEMPLATE_EVERY === TEMPLATE_EVERY - 1;
      for (const change of template ? ['key', 'template'] : ['key']) {
        const index = commits.entries.length;
        let answer: { status: number; body: unknown };
        if (change === 'template') answer = await call(target, 'POST', '/v1/apply', { objects: [benchTemplate(k)] });
        else if (k % 2 === 0) {
          answer = await call<{ prefix?: string }>(target, 'POST', '/v1/keys', { team: 'bench' });
          created = (answer.body as { prefix?: string }).prefix ?? '';
        } else answer = await call(target, 'POST', `/v1/keys/${created}/revoke`);
        const answered = performance.now();
        if (answer.status >= 300) throw new Error(`hub admin API refused a ${change} change: ${answer.status} ${JSON.stringify(answer.body)}`);
        const commit = await commits.at(index);
        const acked = await acks.waitAll(commit.version, ACK_TIMEOUT_MS);
        if (acked === undefined) {
          timeouts++;
          if (timeouts > MAX_TIMEOUTS) throw new Error(`${timeouts} changes were not acked by all ${WORKERS} workers within ${ACK_TIMEOUT_MS} ms; see the logs`);
          continue;
        }
        samples.push(Math.max(0, acked - Math.min(commit.at, answered)));
      }
    }

    // A burst: changes back to back, each sent when the previous one's answer came.
    const first = commits.entries.length;
    let firstAnswer = 0;
    for (let i = 0; i < BURST; i++) {
      const answer = await call(target, 'POST', '/v1/keys', { team: 'burst' });
      if (i === 0) firstAnswer = performance.now();
      if (answer.status !== 201) throw new Error(`hub admin API refused burst change ${i}: ${answer.status} ${JSON.stringify(answer.body)}`);
    }
    const apiDone = performance.now();
    const start = Math.min((await commits.at(first)).at, firstAnswer);
    const last = await commits.at(first + BURST - 1);
    const acked = await acks.waitAll(last.version, 6 * ACK_TIMEOUT_MS);
    if (acked === undefined) throw new Error(`a burst of ${BURST} changes was not acked by all ${WORKERS} workers within ${6 * ACK_TIMEOUT_MS} ms`);
    const burstMs = acked - start;

    return {
      workers: WORKERS,
      startSec,
      changes: { ...summarize(samples), timeouts },
      burst: { changes: BURST, ms: round(burstMs, 1), apiMs: round(apiDone - start, 1), changesPerSec: Math.round((BURST * 1000) / burstMs) },
    };
  } finally {
    commits.close();
    offAck();
  }
}

/** A template whose annotation changes with `round`, so every apply is a real change. */
function benchTemplate(round: number): KubeObject {
  return {
    apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
    kind: 'SandboxTemplate',
    metadata: { name: 'bench-fed', namespace: 'default', annotations: { 'bench.asb.dev/round': String(round) } },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] } } },
  };
}

/**
 * Registers each cluster at the hub and starts its worker, a few at a time. Every child that
 * started is in `workers` when this returns or throws, so the caller can stop them all.
 */
async function startWorkers(dir: string, hub: RunningHub, target: Target, names: readonly string[], workers: ReadyChild<{ ready: true }>[]): Promise<void> {
  const queue = names.map((name, i) => ({ name, i }));
  let failed = false;
  const runner = async (): Promise<void> => {
    for (let next = queue.shift(); next !== undefined && !failed; next = queue.shift()) {
      const { name, i } = next;
      const tag = `bf${String(i).padStart(2, '0')}`;
      const registered = await call<{ credential?: string }>(target, 'PUT', `/v1/clusters/${name}`, { region: REGIONS[i % REGIONS.length], ingressAddress: `127.0.0.1:${20_000 + i}`, tag });
      const credential = registered.body.credential;
      if (registered.status !== 201 || credential === undefined) throw new Error(`registering ${name}: ${registered.status} ${JSON.stringify(registered.body)}`);
      const home = join(dir, name);
      mkdirSync(home, { recursive: true });
      writeFileSync(join(home, 'hub.credential'), `${credential}\n`, { mode: 0o600 });
      workers.push(
        await startChild({
          name: `worker ${name}`,
          entry: join(repoRoot, 'src/assembly/worker-main.ts'),
          args: [
            '--data-dir', join(home, 'data'),
            '--port', '0',
            '--cluster', name,
            '--cluster-tag', tag,
            // No sandboxes run here (base pool 0), so the runtime never creates the bridge; the
            // names and subnets are still this benchmark's own (tests use asb<tag> and 10.x/16).
            '--bridge', `asbf${i}`,
            '--subnet', `100.${64 + i}.0.0/16`,
            '--base-pool', '0',
            '--log-level', 'warn',
            '--hub-url', hub.url,
            '--hub-credential-file', join(home, 'hub.credential'),
          ],
          logPath: join(home, 'worker.log'),
        }),
      );
    }
  };
  const results = await Promise.allSettled(
    Array.from({ length: START_CONCURRENCY }, () =>
      runner().catch((err: unknown) => {
        failed = true;
        throw err;
      }),
    ),
  );
  for (const r of results) if (r.status === 'rejected') throw r.reason;
}

/** Until every cluster is connected and has acked the hub's current version. */
async function waitSynced(hub: RunningHub, names: readonly string[]): Promise<void> {
  const deadline = performance.now() + SYNCED_TIMEOUT_MS;
  while (performance.now() < deadline) {
    const version = hub.sync.version();
    const current = new Set(hub.sync.connections().filter((c) => c.appliedVersion >= version).map((c) => c.cluster));
    if (version > 0 && names.every((n) => current.has(n))) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  const connected = hub.sync.connections().map((c) => `${c.cluster}@${c.appliedVersion}`);
  throw new Error(`workers did not all sync within ${SYNCED_TIMEOUT_MS} ms (hub version ${hub.sync.version()}; connected: ${connected.join(', ') || 'none'})`);
}

function removeBridges(): void {
  for (let i = 0; i < WORKERS; i++) {
    try {
      execFileSync('ip', ['link', 'del', `asbf${i}`], { stdio: 'ignore' });
    } catch {
      // never created: no sandbox ran
    }
  }
}

/**
 * 20 clusters in 4 regions: some drained, some down, warm counts that differ, templates that
 * only some clusters hold. Requests rotate over preferred regions, a named cluster and none.
 */
export function benchPlacement(): PlacementFigures {
  const candidates: PlacementCandidate[] = Array.from({ length: WORKERS }, (_, i) => {
    const templates: Record<string, number> = { 'default/base': (i * 7) % 5 };
    if (i % 2 === 0) templates['default/python'] = i % 3;
    if (i % 5 === 0) templates['team-a/gpu'] = i % 4;
    return { name: `c${i}`, region: REGIONS[i % REGIONS.length] ?? 'us-east', drain: i % 7 === 3, healthy: i % 9 !== 4, templates };
  });
  const requests: PlacementRequest[] = [
    { namespace: 'default', template: 'base' },
    { namespace: 'default', template: 'base', region: 'eu-west' },
    { namespace: 'default', template: 'python', region: 'us-west' },
    { namespace: 'team-a', template: 'gpu' },
    { namespace: 'team-a', template: 'gpu', region: 'ap-south' },
    { namespace: 'default', template: 'base', cluster: 'c6' },
    { namespace: 'default', template: 'missing', region: 'us-east' },
    { namespace: 'default', template: 'python' },
  ];
  // Something of every result is kept, so the loop cannot be optimized away.
  let placed = 0;
  let decisions = 0;
  const start = performance.now();
  let elapsed = 0;
  while (decisions < PLACEMENT_MAX_DECISIONS) {
    for (const req of requests) placed += place(req, candidates).order.length;
    decisions += requests.length;
    if (decisions % 1024 === 0) {
      elapsed = performance.now() - start;
      if (elapsed >= PLACEMENT_MS) break;
    }
  }
  elapsed = performance.now() - start;
  if (placed === 0) throw new Error('placement never chose a cluster: the candidates or requests are wrong');
  return { candidates: candidates.length, decisions, decisionsPerSec: Math.round((decisions * 1000) / elapsed) };
}
