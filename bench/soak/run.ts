// `make soak`: the whole system (`make up`, federated, runc and gVisor) under a mixed workload
// with faults for SOAK_MINUTES (default 30), then checked: nothing acknowledged lost, every
// sandbox converged, nothing left after the final drain, no process growing, latency flat.
// Prints a table, writes bench/results/soak-<time>.json and soak-latest.json, and exits 1
// naming each failed check. Not part of `make test` (its checks are: test/soak-checks.test.ts).
//
// Settings (environment):
//   SOAK_MINUTES     how long the workload runs (default 30); the drain and checks come after
//   SOAK_PORT_BASE   its ports from here (default 27150; see system.ts portEnv)
//   SOAK_INJECT      test only (make soak-selftest): `lost-write` removes one acknowledged file
//                    behind the soak's back; `leak` leaves a tmpfs mount under a worker's runtime
//                    root per create, as a runtime bug would. Nothing in the product reads it.
//   SOAK_FAULTS      the fault kinds, in turn (default all: worker,router,envoy,hub,shim,launcher,
//                    registry,sentry,disk,memory); a run with fewer says so in its table
//   SOAK_STATE_DIR   its state dir (default a fresh one under /tmp, removed after a passing run)
import { rewriteBlock } from '../measured-blocks.ts';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join, resolve } from 'node:path';
import { expectedState, flatnessFailures, growthVerdicts, latencyWindows, residueRows, verifyLedger, type Observed, type Sample } from './checks.ts';
import { CLUSTERS, envoyAdminPort, envoyHeap, processes, residue, startUp, stopUp, usage, type Kind } from './system.ts';
import { MAX_LIVE, soakObjects, Workload, type Mine } from './workload.ts';

const REPO = resolve(import.meta.dirname, '../..');
const minutes = Number(process.env.SOAK_MINUTES ?? '30');
if (!(minutes > 0 && minutes <= 24 * 60)) {
  console.error(`SOAK_MINUTES must be a number of minutes from 1 to 1440, got "${process.env.SOAK_MINUTES ?? ''}"`);
  process.exit(2);
}
const inject = process.env.SOAK_INJECT ?? '';
if (!['', 'lost-write', 'leak'].includes(inject)) {
  console.error(`SOAK_INJECT must be lost-write or leak, got "${inject}"`);
  process.exit(2);
}
const BASE = Number(process.env.SOAK_PORT_BASE ?? '27150');
const RUN_MS = minutes * 60_000;
const SHORT = minutes < 20;
/** Latency windows: 10 min, or 2 min for a short run (fewer than two 10-min windows otherwise). */
const WINDOW_MS = SHORT ? 120_000 : 600_000;
/** RSS/fd sampling: each minute; every 30 s in a short run, so a slope has enough points. */
const SAMPLE_MS = SHORT ? 30_000 : 60_000;
const WARMUP_MS = SHORT ? 150_000 : 300_000;
/** A fault every this often, in turn (10 kinds); a short run gets each once. */
const FAULT_EVERY_MS = Math.max(45_000, Math.min(180_000, (RUN_MS - 90_000) / 10));
const CHECK_EVERY_MS = 120_000;
/** A sandbox must reach what it was asked (running, paused, gone) within this. */
const CONVERGE_MS = 90_000;
const TICK_MS = 1500;
const ALL_FAULTS: readonly (Kind | 'disk' | 'memory')[] = ['worker', 'router', 'envoy', 'hub', 'shim', 'launcher', 'registry', 'sentry', 'disk', 'memory'];
const FAULTS = (process.env.SOAK_FAULTS ?? ALL_FAULTS.join(',')).split(',').filter((f) => f !== '') as (Kind | 'disk' | 'memory')[];
const unknownFaults = FAULTS.filter((f) => !ALL_FAULTS.includes(f));
if (unknownFaults.length > 0) {
  console.error(`SOAK_FAULTS names faults the soak does not know: ${unknownFaults.join(', ')} (known: ${ALL_FAULTS.join(', ')})`);
  process.exit(2);
}
const GROWTH = { rss: { absPerHour: 64 * 2 ** 20, fractionPerHour: 0.5 }, heap: { absPerHour: 64 * 2 ** 20, fractionPerHour: 0.5 }, fds: { absPerHour: 40, fractionPerHour: 0.5 } };
const FLAT = { factor: 4, slackMs: 250, minCount: 5 };

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const say = (line: string): void => console.log(`[soak ${new Date().toISOString().slice(11, 19)}] ${line}`);

interface FaultRecord {
  atS: number;
  kind: string;
  what: string;
  recoveredS: number | undefined;
}

async function main(): Promise<void> {
  const stateDir = process.env.SOAK_STATE_DIR ?? mkdtempSync(join(tmpdir(), 'asb-soak-'));
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const before = await residue(stateDir);
  say(`starting make up in ${stateDir} (ports from ${String(BASE)}, bridges asbs0/asbs1, 10.142.0.0/16 and 10.143.0.0/16), ${String(minutes)} min${inject === '' ? '' : `, injecting ${inject}`}`);
  const up = await startUp(stateDir, BASE);
  const edges = [up.env.ASB_EDGE_URL ?? '', `http://127.0.0.1:${String(BASE + 150)}`];
  let faultUntil = 0;
  const workers = [`http://127.0.0.1:${String(BASE + 20)}`, `http://127.0.0.1:${String(BASE + 21)}`];
  const w: Workload = new Workload({ edges, workers, key: up.env.ASB_API_KEY ?? '', kubeconfig: join(stateDir, 'kubeconfig'), stateDir }, (): boolean => w.now() < faultUntil);
  const series = new Map<string, Sample[]>();
  const during: Record<string, number>[] = [];
  const faults: FaultRecord[] = [];
  const checkFailures = new Map<string, string>();
  const leaks: string[] = [];
  const injected = { lostWrite: false };

  const sample = async (): Promise<void> => {
    const t = w.now();
    for (const p of processes(up)) {
      if (!['up', 'registry', 'hub', 'worker', 'router', 'envoy', 'launcher'].includes(p.kind)) continue;
      const u = usage(p.pid);
      if (u === undefined) continue;
      const name = `${p.kind}${p.cluster === '' ? '' : ` ${p.cluster}`} pid ${String(p.pid)}`;
      for (const [metric, value] of [['rss', u.rss], ['fds', u.fds]] as const) push(series, `${name} ${metric}`, t, value);
      if (p.kind === 'envoy') {
        const heap = await envoyHeap(envoyAdminPort(BASE, p.cluster));
        if (heap !== undefined) push(series, `${name} heap`, t, heap);
      }
    }
    during.push(await residue(stateDir));
  };

  const checkpoint = async (final: boolean): Promise<void> => {
    const want = expectedState(w.ledger);
    const observed = new Map<string, Observed>();
    for (const id of [...want.live.keys(), ...want.gone.keys()]) {
      try {
        const r = await w.call('GET', `/v1/sandboxes/${id}`, undefined, 20_000);
        if (r.status === 404) {
          observed.set(id, { phase: undefined, files: new Map() });
          continue;
        }
        if (r.status !== 200) continue; // no answer now (a fault): not observed
        const phase = String(r.body.phase);
        const files = new Map<string, string | null>();
        const live = want.live.get(id);
        if (live !== undefined && phase === 'Running' && live.want === 'running') {
          for (const path of live.files.keys()) files.set(path, await w.readHash(id, path));
        }
        observed.set(id, { phase, files });
      } catch {
        // unreachable now: not observed this time
      }
    }
    const failures = verifyLedger(want, observed, w.now(), CONVERGE_MS);
    for (const f of failures) checkFailures.set(f.replace(/\d+ s/g, 'N s'), f);
    say(`checkpoint${final ? ' (final)' : ''}: ${String(observed.size)} sandboxes observed, ${String(failures.length)} failures${failures.length > 0 ? `: ${failures.slice(0, 3).join('; ')}` : ''}`);
  };

  const fault = async (kind: Kind | 'disk' | 'memory'): Promise<void> => {
    const at = w.now();
    const rec: FaultRecord = { atS: Math.round(at / 1000), kind, what: '', recoveredS: undefined };
    faults.push(rec);
    if (kind === 'disk' || kind === 'memory') {
      faultUntil = at + 60_000;
      rec.what = await w.fill(kind);
      // Others unaffected: every other sandbox answers an exec.
      const hurt: string[] = [];
      for (const sb of w.mine.filter((s) => !s.paused)) {
        try {
          await w.exec(sb, 'true');
        } catch (err) {
          hurt.push(`${sb.id}: ${err instanceof Error ? err.message : String(err)}`);
        }
      }
      if (hurt.length > 0) w.findings.push(`${kind} fill hurt other sandboxes: ${hurt.join('; ')}`);
      rec.recoveredS = Math.round(w.now() / 1000);
      say(`fault ${kind}: ${rec.what}`);
      return;
    }
    const procs = processes(up);
    const podOf = (argv: readonly string[]): string => /\/pods\/([a-z0-9]+)/.exec(argv.join(' '))?.[1] ?? '';
    const running = new Set(w.mine.filter((s) => !s.paused).map((s) => s.id));
    const victims = procs.filter((p) => p.kind === kind && (kind !== 'shim' && kind !== 'sentry' ? true : running.has(podOf(p.argv))));
    // A shim of a runc pod for 'shim' (gVisor pods have their own fault: the sentry).
    const victim = (kind === 'shim' ? victims.filter((p) => p.argv.join(' ').includes('/runc/bin/runc')) : victims)[0];
    if (victim === undefined) {
      rec.what = `no ${kind} process to kill`;
      say(`fault ${kind}: none found`);
      return;
    }
    faultUntil = at + 120_000;
    process.kill(victim.pid, 'SIGKILL');
    rec.what = `kill -9 ${kind}${victim.cluster === '' ? '' : ` of ${victim.cluster}`} (pid ${String(victim.pid)}${kind === 'shim' || kind === 'sentry' ? `, sandbox ${podOf(victim.argv)}` : ''})`;
    say(`fault: ${rec.what}`);
    // Recovered: that kind runs again (a new pid) and both edges answer the API.
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline) {
      await sleep(1000);
      const again = kind === 'shim' || kind === 'sentry' ? true : processes(up).some((p) => p.kind === kind && p.pid !== victim.pid);
      let healthy = again;
      for (const e of edges) {
        if (!healthy) break;
        try {
          healthy = (await fetch(`${e}/v1/status`, { headers: { authorization: `Bearer ${up.env.ASB_API_KEY ?? ''}` }, signal: AbortSignal.timeout(5000) })).status === 200;
        } catch {
          healthy = false;
        }
      }
      if (healthy) {
        rec.recoveredS = Math.round(w.now() / 1000);
        break;
      }
    }
    if (rec.recoveredS === undefined) w.findings.push(`not recovered within 120 s of ${rec.what}`);
    if (kind === 'shim' || kind === 'sentry') rec.what += `: ${await podFate(w, podOf(victim.argv))}`;
    faultUntil = w.now() + 10_000;
  };

  const leakMount = (): void => {
    const dir = join(stateDir, 'clusters', 'region-a', 'data', 'runtime', `soak-leak-${String(leaks.length)}`);
    mkdirSync(dir, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'soakleak', dir]);
    leaks.push(dir);
  };

  let exitCode = 0;
  try {
    say('applying the soak templates and pools (runc, gVisor, runc Hibernate, web, cold, fill)');
    await w.apply(soakObjects(2), true);
    await sleep(15_000);
    await sample();
    const start = w.now();
    let nextSample = start + SAMPLE_MS;
    let nextCheck = start + CHECK_EVERY_MS;
    let nextFault = start + Math.min(90_000, FAULT_EVERY_MS);
    let faultIndex = 0;
    let step = 0;
    while (w.now() - start < RUN_MS) {
      const tickStart = w.now();
      if (tickStart >= nextSample) {
        await sample();
        nextSample += SAMPLE_MS;
      }
      if (tickStart >= nextCheck) {
        await checkpoint(false);
        nextCheck += CHECK_EVERY_MS;
      }
      if (tickStart >= nextFault) {
        const kind = FAULTS[faultIndex++ % FAULTS.length] ?? 'worker';
        await fault(kind);
        nextFault = w.now() + FAULT_EVERY_MS;
      }
      const made = await operation(w, step++);
      if (made !== undefined && inject === 'leak') leakMount();
      if (inject === 'lost-write' && !injected.lostWrite && w.now() - start > 60_000) {
        // The newest such sandbox: the oldest are the ones the workload deletes first.
        const sb = [...w.mine].reverse().find((s) => !s.paused && s.files.length > 0 && !s.template.startsWith('soakgv'));
        const path = sb?.files[0];
        if (sb !== undefined && path !== undefined) {
          await w.exec(sb, `rm -f ${path}`).then(() => {
            injected.lostWrite = true;
            say(`injected: removed ${sb.id}:${path} behind the ledger's back`);
          }, () => undefined);
        }
      }
      const rest = TICK_MS - (w.now() - tickStart);
      if (rest > 0) await sleep(rest);
    }
    await sample();
    // Give the last asks their bound, then the final check.
    say('workload done; final checkpoint');
    await checkpoint(true);

    say('drain: pools to 0, every sandbox deleted');
    await w.apply(soakObjects(0).map((o) => (o as { kind: string }).kind === 'SandboxWarmPool' ? { ...(o as object), spec: { ...(o as { spec: object }).spec, replicas: 0 } } : o), true).catch((err: unknown) => w.findings.push(`drain apply: ${String(err)}`));
    for (const sb of [...w.mine]) await w.remove(sb);
    const drainDeadline = Date.now() + 180_000;
    let left: number[] = [];
    while (Date.now() < drainDeadline) {
      left = await w.listed();
      if (left.every((n) => n === 0)) break;
      await sleep(2000);
    }
    if (!left.every((n) => n === 0)) w.findings.push(`drain: sandboxes still listed by region-a, region-b 180 s after every delete: ${left.join(', ')}`);
    // An object is gone before its pod is torn down: the drain is over when no pod dir is left
    // either (a stop before that leaves them to the next start's reclaim). Bounded: what is left
    // after 120 s is residue.
    const drained = Date.now();
    let pods = -1;
    while (Date.now() - drained < 120_000) {
      pods = (await residue(stateDir)).podDirs ?? 0;
      if (pods === 0) break;
      await sleep(2000);
    }
    if (pods !== 0) {
      // What each cluster's pools say then: a pool still above 0 there never got the drain's apply.
      const pools = await Promise.all(workers.map(async (api, i) => {
        try {
          const res = await fetch(`${api}/v1/pools`, { headers: { authorization: `Bearer ${up.env.ASB_API_KEY ?? ''}` }, signal: AbortSignal.timeout(10_000) });
          const body = (await res.json()) as { items?: { metadata: { name: string }; spec: { replicas?: number }; status?: { replicas?: number } }[] };
          return `${CLUSTERS[i] ?? ''}: ${(body.items ?? []).map((p) => `${p.metadata.name} ${String(p.spec.replicas)}/${String(p.status?.replicas ?? '?')}`).join(', ')}`;
        } catch (err) {
          return `${CLUSTERS[i] ?? ''}: ${err instanceof Error ? err.message : String(err)}`;
        }
      }));
      w.findings.push(`drain: ${String(pods)} pod dirs still there 120 s after the pools went to 0 and every sandbox was deleted; pools (spec/status replicas) ${pools.join('; ')}`);
    }
    say(`drain: objects gone; ${pods === 0 ? `every pod torn down ${String(Math.round((Date.now() - drained) / 1000))} s later` : `${String(pods)} pod dirs still there after 120 s`}`);
    await checkpoint(true);
  } catch (err) {
    w.findings.push(`soak aborted: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
  }
  say('stopping make up (SIGTERM to its group)');
  const upExit = await stopUp(up, 120_000);
  await sleep(2000);
  const after = await residue(stateDir);
  for (const dir of leaks) {
    try {
      execFileSync('umount', [dir]);
    } catch {
      // already gone
    }
  }

  // The checks.
  const res = residueRows(before, during, after);
  const verdicts = [
    ...growthVerdicts(filterSeries(series, 'rss'), GROWTH.rss, WARMUP_MS, 5),
    ...growthVerdicts(filterSeries(series, 'fds'), GROWTH.fds, WARMUP_MS, 5),
    ...growthVerdicts(filterSeries(series, 'heap'), GROWTH.heap, WARMUP_MS, 5),
  ];
  const windows = latencyWindows(w.latencies, 0, WINDOW_MS);
  const flat = flatnessFailures(windows, FLAT);
  const ledgerFailures = [...checkFailures.values()];
  const growthFailures = verdicts.filter((v) => !v.ok).map((v) => `growth: ${v.series} ${fmt(v.slopePerHour ?? 0, v.series)}/h over the bound ${fmt(v.boundPerHour, v.series)}/h`);
  const stopFailures = upExit === 0 || upExit === 'SIGTERM' ? [] : [`make up exited ${String(upExit)} on SIGTERM`];
  const checks: { name: string; failures: string[] }[] = [
    { name: 'ledger (acknowledged creates, writes, deletes; convergence)', failures: ledgerFailures },
    { name: 'residue after the drain', failures: res.failures },
    { name: 'process growth (RSS, fds, heap)', failures: growthFailures },
    { name: 'latency flat per window', failures: flat },
    { name: 'workload findings (memory kept, others unaffected by fills, recovery, drain)', failures: [...w.findings, ...stopFailures] },
  ];

  // The table.
  const lines: string[] = [];
  lines.push(`Soak: ${String(minutes)} min, federation of 2 clusters (runc + gVisor), ${String(faults.length)} faults${FAULTS.length === ALL_FAULTS.length ? '' : ` (only ${FAULTS.join(', ')})`}, machine: ${String(cpus().length)} cores (${cpus()[0]?.model ?? '?'}), ${String(Math.round(totalmem() / 2 ** 30))} GiB`);
  lines.push('', '| check | result |', '|---|---|');
  for (const c of checks) lines.push(`| ${c.name} | ${c.failures.length === 0 ? 'pass' : `**FAIL** (${String(c.failures.length)}): ${esc(c.failures.slice(0, 3).join('; '))}`} |`);
  lines.push('', '| operation | acknowledged | failed after 3 tries |', '|---|---|---|');
  for (const [op, [ok, failed]] of [...w.counts].sort()) lines.push(`| ${op} | ${String(ok)} | ${String(failed)} |`);
  lines.push('', '| fault | at s | recovered at s |', '|---|---|---|');
  for (const f of faults) lines.push(`| ${esc(f.what)} | ${String(f.atS)} | ${f.recoveredS === undefined ? '—' : String(f.recoveredS)} |`);
  lines.push('', '| residue kind | before | max during | after |', '|---|---|---|---|');
  for (const r of res.rows) lines.push(`| ${r.kind} | ${String(r.before)} | ${String(r.maxDuring)} | ${String(r.after)} |`);
  lines.push('', `| process series (after ${String(WARMUP_MS / 60_000)} min warm-up) | samples | median | slope per hour | bound |`, '|---|---|---|---|---|');
  for (const v of verdicts) lines.push(`| ${v.series} | ${String(v.samples)} | ${fmt(v.median, v.series)} | ${v.slopePerHour === undefined ? 'too few samples' : fmt(v.slopePerHour, v.series)} | ${fmt(v.boundPerHour, v.series)}${v.ok ? '' : ' **over**'} |`);
  lines.push('', `| latency (${String(WINDOW_MS / 60_000)}-min windows, fault windows left out) | window | count | p50 ms | p99 ms |`, '|---|---|---|---|---|');
  for (const r of windows) lines.push(`| ${r.metric} | ${String(r.window)} | ${String(r.count)} | ${String(r.p50)} | ${String(r.p99)} |`);
  console.log(`\n${lines.join('\n')}\n`);
  if (w.failures.length > 0) console.log(`operations that failed after retries (not acknowledged, not counted lost):\n  ${w.failures.slice(0, 30).join('\n  ')}`);

  const failed = checks.filter((c) => c.failures.length > 0);
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const results = { minutes, inject, checks, counts: Object.fromEntries(w.counts), faults, residue: res.rows, growth: verdicts, latency: windows, failedOps: w.failures, table: lines.join('\n') };
  if (inject === '') {
    const dir = join(REPO, 'bench', 'results');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, `soak-${stamp}.json`), JSON.stringify(results, null, 2));
    writeFileSync(join(dir, 'soak-latest.json'), JSON.stringify(results, null, 2));
    // The table in docs/operations.md, as make bench replaces its own: between the soak markers.
    const when = `Measured ${new Date().toISOString().slice(0, 10)} by \`SOAK_MINUTES=${String(minutes)}${FAULTS.length === ALL_FAULTS.length ? '' : ` SOAK_FAULTS=${FAULTS.join(',')}`} make soak\` (${failed.length === 0 ? 'passed' : `FAILED: ${failed.map((c) => c.name).join('; ')}`}).`;
    rewriteBlock('soak', () => [when, ...lines]);
  }
  if (failed.length > 0) {
    console.log(`SOAK FAILED: ${failed.map((c) => c.name).join('; ')}`);
    for (const c of failed) for (const f of c.failures) console.log(`  [${c.name}] ${f}`);
    exitCode = 1;
    console.log(`state dir kept for a look: ${stateDir}`);
  } else {
    console.log('SOAK PASSED');
    if (process.env.SOAK_STATE_DIR === undefined) rmSync(stateDir, { recursive: true, force: true });
  }
  process.exit(exitCode);
}

/**
 * What became of a sandbox whose shim or sentry was killed: its object must tell the truth within
 * 60 s (Running and answering, or not Running); it then leaves the ledger and is deleted, since
 * what it keeps after such a death is the product's choice (today: phase Failed, for good).
 */
async function podFate(w: Workload, id: string): Promise<string> {
  const sb = w.mine.find((s) => s.id === id);
  let fate = 'no answer';
  for (let i = 0; i < 30; i++) {
    const r = await w.call('GET', `/v1/sandboxes/${id}`, undefined, 10_000).catch(() => undefined);
    const phase = typeof r?.body.phase === 'string' ? r.body.phase : `HTTP ${String(r?.status ?? 'none')}`;
    const why = (r?.body.conditions as { message?: string }[] | undefined)?.[0]?.message ?? '';
    if (phase === 'Running' && sb !== undefined) {
      const alive = await w.exec(sb, 'true').then(() => true, () => false);
      fate = alive ? 'phase Running, answering' : 'phase Running but exec fails';
      if (alive) break;
    } else {
      fate = `phase ${phase}${why === '' ? '' : ` (${why.slice(0, 120)})`}`;
      if (phase !== 'Pending' && phase !== 'Waking') break;
    }
    await sleep(2000);
  }
  if (fate === 'phase Running but exec fails') w.findings.push(`sandbox ${id} says Running 60 s after its pod was killed, but does not answer`);
  if (sb !== undefined) {
    w.ledger.push({ kind: 'forfeit', id, atMs: w.now() });
    await w.remove(sb);
  }
  return fate;
}

/** One operation of the mix, chosen by step; returns a sandbox it created, if any. */
async function operation(w: Workload, step: number): Promise<Mine | undefined> {
  const running = w.mine.filter((s) => !s.paused);
  const pick = <T>(xs: readonly T[]): T | undefined => xs[step % Math.max(1, xs.length)];
  const slot = step % 16;
  if (w.mine.length >= MAX_LIVE && [0, 1, 2, 3].includes(slot)) {
    const oldest = w.mine[0];
    if (oldest !== undefined) await w.remove(oldest);
    return undefined;
  }
  switch (slot) {
    case 0: return w.create('soakrunc');
    case 1: return w.create('soakgv', { memory: true });
    case 2: return w.create(step % 32 === 2 ? 'soakgvcold' : 'soakcold');
    case 3: return w.create(step % 32 === 3 ? 'soakhib' : 'soakweb', { memory: step % 32 === 3 });
    case 4:
    case 5: {
      const sb = pick(running);
      if (sb !== undefined) await w.attempt('exec', async () => {
        await w.exec(sb, 'echo ok');
      });
      return undefined;
    }
    case 6:
    case 7: {
      const sb = pick(running);
      if (sb !== undefined) await w.write(sb);
      return undefined;
    }
    case 8: {
      const sb = pick(running.filter((s) => s.web));
      if (sb !== undefined) await w.firstRequest(sb);
      return undefined;
    }
    case 9: {
      const sb = pick(running);
      if (sb !== undefined) await w.terminal(sb);
      return undefined;
    }
    case 10: {
      const sb = pick(running.filter((s) => s.memory || s.web));
      if (sb !== undefined) await w.pauseResume(sb);
      return undefined;
    }
    case 11: {
      const sb = pick(running);
      if (sb !== undefined) await w.egress(sb);
      return undefined;
    }
    case 12:
      await w.attempt('template apply', () => w.apply(soakObjects(step % 32 === 12 ? 3 : 2)));
      return undefined;
    case 13:
      await w.create('soakrunc', { timeoutMs: 20_000 });
      return undefined;
    case 14:
      if (step % 64 === 14) await w.k8sSigs('soakrunc');
      else await w.e2b(step % 32 === 14 ? 'soakgv' : 'soakrunc');
      return undefined;
    default: {
      const sb = pick(running.filter((s) => s.files.length > 0));
      const path = sb?.files[0];
      if (sb !== undefined && path !== undefined) await w.attempt('file read', async () => {
        await w.readHash(sb.id, path);
      });
      return undefined;
    }
  }
}

function push(series: Map<string, Sample[]>, key: string, tMs: number, value: number): void {
  const list = series.get(key) ?? [];
  list.push({ tMs, value });
  series.set(key, list);
}

function filterSeries(series: Map<string, Sample[]>, metric: string): Map<string, Sample[]> {
  return new Map([...series].filter(([k]) => k.endsWith(` ${metric}`)));
}

/** A series' value: bytes (rss, heap) in KiB or MiB, counts (fds) as they are. */
function fmt(n: number, series = ''): string {
  if (!Number.isFinite(n)) return '—';
  const a = Math.abs(n);
  if (series.endsWith(' fds')) return n.toFixed(1);
  return a >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(1)} MiB` : a >= 1000 ? `${(n / 1024).toFixed(0)} KiB` : n.toFixed(1);
}

function esc(s: string): string {
  return s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
}

void main();
