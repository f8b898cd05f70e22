// The real Prometheus server (Debian's `prometheus` package) for tests: on loopback, in its own
// private temp directory (config, credentials, TSDB), scraping and evaluating rules every second,
// stopped (SIGTERM, then SIGKILL) and removed with the test. Queries go through its HTTP API.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { stringify } from 'yaml';
import { freePort } from '../../src/assembly/local-system.ts';
import { waitFor } from './wait.ts';

export interface ScrapeTarget {
  job: string;
  /** host:port */
  address: string;
  metricsPath?: string;
  /** Sent as "Authorization: Bearer <key>" (written to a 0600 file Prometheus reads). */
  bearer?: string;
  /** Target labels, e.g. { cluster: 'local' }. */
  labels?: Record<string, string>;
}

export interface QueryResult {
  resultType: 'vector' | 'matrix' | 'scalar' | 'string';
  result: { metric: Record<string, string>; value?: [number, string]; values?: [number, string][] }[];
}

export interface Prometheus {
  url: string;
  /** An instant query; throws with Prometheus's own error when the expression is refused. */
  query(expr: string): Promise<QueryResult>;
  /** A range query over the last `seconds`, one point per `stepS`. */
  queryRange(expr: string, seconds: number, stepS: number): Promise<QueryResult>;
  /** GET /api/v1/<path> (alerts, rules, targets): the `data` field. */
  api(path: string): Promise<unknown>;
  stop(): Promise<void>;
}

export async function startPrometheus(targets: readonly ScrapeTarget[], ruleFiles: readonly string[]): Promise<Prometheus> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-prometheus-'));
  chmodSync(dir, 0o700);
  const rules = ruleFiles.map((file, i) => {
    const copy = join(dir, `${String(i)}-${basename(file)}`);
    copyFileSync(file, copy);
    return copy;
  });
  const scrapeConfigs = targets.map((target, i) => {
    let authorization: { credentials_file: string } | undefined;
    if (target.bearer !== undefined) {
      const file = join(dir, `key-${String(i)}`);
      writeFileSync(file, target.bearer, { mode: 0o600 });
      authorization = { credentials_file: file };
    }
    return {
      job_name: `${target.job}-${String(i)}`,
      metrics_path: target.metricsPath ?? '/metrics',
      ...(authorization === undefined ? {} : { authorization }),
      static_configs: [{ targets: [target.address], labels: { job: target.job, ...target.labels } }],
    };
  });
  // One second: a test sees a change within a couple of scrapes; rules run as often.
  writeFileSync(join(dir, 'prometheus.yml'), stringify({ global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' }, rule_files: rules, scrape_configs: scrapeConfigs }));
  const port = await freePort();
  const url = `http://127.0.0.1:${String(port)}`;
  const child: ChildProcess = spawn('prometheus', [
    `--config.file=${join(dir, 'prometheus.yml')}`,
    `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${String(port)}`,
    '--storage.tsdb.retention.time=1h',
    '--log.level=warn',
  ], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr?.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-4000)));
  const exited = once(child, 'exit');
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    })();
    return stopping;
  };
  const get = async (path: string): Promise<unknown> => {
    const res = await fetch(`${url}${path}`, { signal: AbortSignal.timeout(10_000) });
    const body = (await res.json()) as { status: string; data?: unknown; error?: string; errorType?: string };
    if (body.status !== 'success') throw new Error(`Prometheus ${path.slice(0, 200)}: ${body.errorType ?? ''} ${body.error ?? ''}`);
    return body.data;
  };
  try {
    await waitFor('Prometheus to be ready', async () => {
      if (child.exitCode !== null) throw new Error(`prometheus exited with code ${String(child.exitCode)}: ${log}`);
      try {
        return (await fetch(`${url}/-/ready`, { signal: AbortSignal.timeout(1000) })).ok ? true : undefined;
      } catch {
        return undefined;
      }
    }, 20_000, 100);
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    url,
    query: async (expr) => (await get(`/api/v1/query?query=${encodeURIComponent(expr)}`)) as QueryResult,
    queryRange: async (expr, seconds, stepS) => {
      const end = Date.now() / 1000;
      return (await get(`/api/v1/query_range?query=${encodeURIComponent(expr)}&start=${String(end - seconds)}&end=${String(end)}&step=${String(stepS)}`)) as QueryResult;
    },
    api: (path) => get(`/api/v1/${path}`),
    stop,
  };
}
