// Runs a real worker process (src/assembly/worker-main.ts) for end-to-end tests, on its own data
// directory, port, bridge and subnet so test files never collide with each other or `make up`.
import { testImages } from './test-images.ts';
import { execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createApiKey } from '../../src/auth/keys.ts';
import { openSqliteStore } from '../../src/store/sqlite.ts';
import { startChild } from '../../src/base/child.ts';

const repoRoot = resolve(import.meta.dirname, '../..');

/** The parts of the API's sandbox view (GET /v1/sandboxes/{id}) end-to-end tests read. */
export interface View {
  id: string;
  phase: string;
  ready: boolean;
  launchType: string;
  owner: string;
}

/** POST /v1/sandboxes/{id}/exec's answer. */
export interface ExecOut {
  exitCode: number;
  stdout: string;
  stderr: string;
}

export interface WorkerProcess {
  apiUrl: string;
  adminKey: string;
  dataDir: string;
  proc: ChildProcess;
  /** Resolves when the process has exited. */
  exited: Promise<number | null>;
  /** Asks for a graceful stop (SIGTERM) and waits for the exit. */
  stop(): Promise<void>;
}

export interface WorkerProcessOptions {
  /** Reuse a data directory (restart after a crash); default a fresh temp dir. */
  dataDir?: string;
  /** 4-char [a-z0-9] id tag; also seeds the bridge name. */
  clusterTag: string;
  /** Second octet of the /16 pod subnet, e.g. 215 → 10.215.0.0/16. */
  subnetOctet: number;
  basePool?: number;
  extraArgs?: string[];
}

export function tempDataDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `asb-${prefix}-`));
}

/** Bridges made by workers this test process started; removed when it exits (see below). */
const bridges = new Set<string>();
process.once('exit', () => {
  for (const bridge of bridges) {
    try {
      execFileSync('ip', ['link', 'del', bridge], { stdio: 'ignore' });
    } catch {
      // already gone, or never created (degraded mode)
    }
  }
});

export async function startWorkerProcess(opts: WorkerProcessOptions): Promise<WorkerProcess> {
  bridges.add(`asb${opts.clusterTag}`);
  const dataDir = opts.dataDir ?? tempDataDir(opts.clusterTag);
  const keyFile = join(dataDir, 'admin.key');
  const child = await startChild<{ ready: true; apiUrl: string }>({
    name: `worker ${opts.clusterTag}`,
    entry: join(repoRoot, 'src/assembly/worker-main.ts'),
    args: [
      '--data-dir', join(dataDir, 'data'),
      '--admin-key-file', keyFile,
      '--port', '0',
      '--cluster-tag', opts.clusterTag,
      '--bridge', `asb${opts.clusterTag}`,
      '--subnet', `10.${opts.subnetOctet}.0.0/16`,
      '--base-pool', String(opts.basePool ?? 3),
      '--log-level', 'warn',
      ...(await testImages()).workerArgs,
      ...(opts.extraArgs ?? []),
    ],
    logPath: join(dataDir, 'worker.log'),
  });
  return {
    apiUrl: child.ready.apiUrl,
    adminKey: readFileSync(keyFile, 'utf8').trim(),
    dataDir,
    proc: child.proc,
    exited: child.exited.then((code) => (typeof code === 'number' ? code : null)),
    stop: () => child.stop(),
  };
}

/**
 * Removes a test's data directory, first killing whatever still runs from it: pods outlive their
 * worker by design (the next worker re-adopts them), so a test that killed a worker and never
 * brought it back would otherwise leave its sandboxes running.
 */
export function removeDataDir(dir: string): void {
  try {
    execFileSync('pkill', ['-KILL', '-f', `${dir}/`], { stdio: 'ignore' });
  } catch {
    // nothing left running
  }
  rmSync(dir, { recursive: true, force: true });
}

/** A JSON call to the worker API with the admin key (or another). */
export async function api<T = unknown>(w: { apiUrl: string; adminKey: string }, method: string, path: string, body?: unknown, key?: string): Promise<{ status: number; body: T }> {
  const res = await fetch(`${w.apiUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${key ?? w.adminKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // raw body
  }
  return { status: res.status, body: parsed as T };
}

/** A key of `team`, written into a worker's store before the worker starts (workers otherwise get keys from the hub). */
export async function teamKeyIn(dataDir: string, team: string): Promise<string> {
  mkdirSync(join(dataDir, 'data'), { recursive: true });
  const store = await openSqliteStore({ path: join(dataDir, 'data', 'store.db') });
  try {
    return (await createApiKey(store, { team })).key;
  } finally {
    await store.close();
  }
}
