// The soak's checks (bench/soak/run.ts), as pure functions of what it recorded, so `make test`
// pins them on synthetic data (test/soak-checks.test.ts) with no system running:
// - the ledger: every acknowledged create, file write (content hash) and delete, and what each
//   sandbox was last asked to be (running or paused), verified against what the system answers;
// - the slope of each long-lived process's RSS, open fds and heap, fitted per hour;
// - the residue left on the host: before, the most seen during the run, after the final drain;
// - latency per window (10 min, or 2 min for runs under 20 min), p50/p99, flat within a factor.
// Each check returns the failures it found, each a sentence naming what broke.

export type Want = 'running' | 'paused';

/** What the soak was told succeeded: the only things it may later call lost. */
export type LedgerEvent =
  | { kind: 'create'; id: string; atMs: number; want?: Want }
  | { kind: 'write'; id: string; path: string; sha256: string; atMs: number }
  | { kind: 'state'; id: string; want: Want; atMs: number }
  /** Deleted, or due to expire at atMs (a create with a timeout): gone within the bound after. */
  | { kind: 'delete'; id: string; atMs: number }
  /** Given up on purpose (a sandbox whose disk or memory the soak filled): no longer checked. */
  | { kind: 'forfeit'; id: string; atMs: number };

export interface LiveSandbox {
  want: Want;
  /** When it was last asked to change: convergence is judged from here. */
  sinceMs: number;
  files: Map<string, string>;
}

export interface Expected {
  live: Map<string, LiveSandbox>;
  /** id → when it must be gone by (delete acknowledged, or expiry due). */
  gone: Map<string, number>;
}

/** Folds the acknowledged events, in order, into what the system must now show. */
export function expectedState(events: readonly LedgerEvent[]): Expected {
  const live = new Map<string, LiveSandbox>();
  const gone = new Map<string, number>();
  for (const e of events) {
    if (e.kind === 'create') {
      live.set(e.id, { want: e.want ?? 'running', sinceMs: e.atMs, files: new Map() });
      continue;
    }
    const sb = live.get(e.id);
    if (e.kind === 'write') sb?.files.set(e.path, e.sha256);
    else if (e.kind === 'state' && sb !== undefined) {
      sb.want = e.want;
      sb.sinceMs = e.atMs;
    } else if (e.kind === 'delete') {
      live.delete(e.id);
      gone.set(e.id, e.atMs);
    } else if (e.kind === 'forfeit') live.delete(e.id);
  }
  return { live, gone };
}

/** What the system answered for one sandbox at a checkpoint. */
export interface Observed {
  /** undefined: the API says it does not exist (404). */
  phase: string | undefined;
  /** Hash of each file read back; null: not found. Only files of running sandboxes are read. */
  files: Map<string, string | null>;
}

/** Phases that count as each wish met. */
const PHASES: Record<Want, readonly string[]> = { running: ['Running'], paused: ['Hibernated', 'Paused', 'Suspended'] };

/**
 * Every acknowledged create still exists, every acknowledged write reads back with its hash,
 * every acknowledged delete (or expiry) took effect within `boundMs`, and every sandbox is in the
 * state last asked of it within `boundMs` of the asking.
 */
export function verifyLedger(expected: Expected, observed: ReadonlyMap<string, Observed>, nowMs: number, boundMs: number): string[] {
  const failures: string[] = [];
  for (const [id, sb] of expected.live) {
    const o = observed.get(id);
    if (o === undefined) continue; // not looked at this checkpoint
    if (o.phase === undefined) {
      failures.push(`acknowledged create lost: sandbox ${id} no longer exists`);
      continue;
    }
    if (!PHASES[sb.want].includes(o.phase) && nowMs - sb.sinceMs > boundMs) {
      failures.push(`sandbox ${id} did not converge: asked to be ${sb.want} ${Math.round((nowMs - sb.sinceMs) / 1000)} s ago, phase ${o.phase}`);
    }
    for (const [path, sha] of sb.files) {
      if (!o.files.has(path)) continue;
      const got = o.files.get(path);
      if (got !== sha) failures.push(`acknowledged write lost: ${id}:${path} should hash ${sha.slice(0, 12)}, reads ${got === null || got === undefined ? 'as missing' : got.slice(0, 12)}`);
    }
  }
  for (const [id, dueMs] of expected.gone) {
    const o = observed.get(id);
    if (o?.phase !== undefined && nowMs - dueMs > boundMs) failures.push(`acknowledged delete lost: sandbox ${id} still exists (phase ${o.phase}) ${Math.round((nowMs - dueMs) / 1000)} s after it should be gone`);
  }
  return failures;
}

export interface Sample {
  tMs: number;
  value: number;
}

/** Least-squares slope of value over time, per hour; undefined with fewer than two distinct times. */
export function slopePerHour(samples: readonly Sample[]): number | undefined {
  const n = samples.length;
  if (n < 2) return undefined;
  const mt = samples.reduce((s, p) => s + p.tMs, 0) / n;
  const mv = samples.reduce((s, p) => s + p.value, 0) / n;
  let num = 0;
  let den = 0;
  for (const p of samples) {
    num += (p.tMs - mt) * (p.value - mv);
    den += (p.tMs - mt) ** 2;
  }
  return den === 0 ? undefined : (num / den) * 3_600_000;
}

/** A bound on growth per hour: the larger of an absolute floor and a fraction of the series' median. */
export interface GrowthBound {
  absPerHour: number;
  fractionPerHour: number;
}

export interface SeriesVerdict {
  series: string;
  samples: number;
  median: number;
  slopePerHour: number | undefined;
  boundPerHour: number;
  ok: boolean;
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? Number.NaN : (s[Math.floor((s.length - 1) / 2)] ?? Number.NaN);
};

/**
 * One series per process instance (a restarted process starts a new one): its samples from
 * `warmupMs` after its first on, fitted; fails when the slope is over the bound. A series with
 * fewer than `minSamples` after its warm-up is reported, never failed: too short to fit.
 */
export function growthVerdicts(series: ReadonlyMap<string, readonly Sample[]>, bound: GrowthBound, warmupMs: number, minSamples: number): SeriesVerdict[] {
  const out: SeriesVerdict[] = [];
  for (const [name, all] of series) {
    const first = all[0]?.tMs ?? 0;
    const kept = all.filter((s) => s.tMs - first >= warmupMs);
    const m = median(kept.map((s) => s.value));
    const slope = kept.length >= minSamples ? slopePerHour(kept) : undefined;
    const boundPerHour = Math.max(bound.absPerHour, bound.fractionPerHour * (Number.isNaN(m) ? 0 : m));
    out.push({ series: name, samples: kept.length, median: m, slopePerHour: slope, boundPerHour, ok: slope === undefined || slope <= boundPerHour });
  }
  return out;
}

export interface ResidueRow {
  kind: string;
  before: number;
  maxDuring: number;
  after: number;
}

/** Rows of each residue kind; failures: every kind with more after the drain than before the run. */
export function residueRows(before: Record<string, number>, during: readonly Record<string, number>[], after: Record<string, number>): { rows: ResidueRow[]; failures: string[] } {
  const kinds = [...new Set([...Object.keys(before), ...Object.keys(after), ...during.flatMap((d) => Object.keys(d))])];
  const rows = kinds.map((kind) => ({ kind, before: before[kind] ?? 0, maxDuring: Math.max(0, ...during.map((d) => d[kind] ?? 0)), after: after[kind] ?? 0 }));
  const failures = rows.filter((r) => r.after > r.before).map((r) => `residue after the drain: ${r.kind} ${String(r.before)} before, ${String(r.after)} after`);
  return { rows, failures };
}

export interface LatencySample {
  metric: string;
  atMs: number;
  ms: number;
  /** Taken while a fault was being recovered from: reported, not judged. */
  inFault: boolean;
}

export interface WindowRow {
  metric: string;
  window: number;
  count: number;
  p50: number;
  p99: number;
}

const quantile = (sorted: readonly number[], q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;

/** p50/p99 per metric per window of `windowMs` from `startMs`, fault-window samples left out. */
export function latencyWindows(samples: readonly LatencySample[], startMs: number, windowMs: number): WindowRow[] {
  const groups = new Map<string, number[]>();
  for (const s of samples) {
    if (s.inFault) continue;
    const key = `${s.metric}\0${String(Math.floor((s.atMs - startMs) / windowMs))}`;
    const list = groups.get(key) ?? [];
    list.push(s.ms);
    groups.set(key, list);
  }
  const rows: WindowRow[] = [];
  for (const [key, list] of groups) {
    const [metric = '', w = '0'] = key.split('\0');
    const sorted = list.sort((a, b) => a - b);
    rows.push({ metric, window: Number(w), count: sorted.length, p50: Math.round(quantile(sorted, 0.5)), p99: Math.round(quantile(sorted, 0.99)) });
  }
  return rows.sort((a, b) => a.metric.localeCompare(b.metric) || a.window - b.window);
}

export interface Flatness {
  /** A window's p50 may be at most factor × the lowest window's p50 + slackMs (p99 likewise). */
  factor: number;
  slackMs: number;
  /** Windows with fewer samples are shown, not judged. */
  minCount: number;
}

/** Per metric: failures where a window's p50 or p99 exceeds factor × the best window's + slack. */
export function flatnessFailures(rows: readonly WindowRow[], flat: Flatness): string[] {
  const failures: string[] = [];
  for (const metric of new Set(rows.map((r) => r.metric))) {
    const judged = rows.filter((r) => r.metric === metric && r.count >= flat.minCount);
    if (judged.length < 2) continue;
    for (const q of ['p50', 'p99'] as const) {
      const best = Math.min(...judged.map((r) => r[q]));
      const limit = flat.factor * best + flat.slackMs;
      for (const r of judged) {
        if (r[q] > limit) failures.push(`latency not flat: ${metric} ${q} ${String(r[q])} ms in window ${String(r.window)} over ${String(Math.round(limit))} ms (${String(flat.factor)} × best ${String(best)} + ${String(flat.slackMs)})`);
      }
    }
  }
  return failures;
}
