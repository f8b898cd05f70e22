// The soak's mixed workload, one operation at a time at a modest rate (2 cores): warm claims and
// cold creates on runc and gVisor, exec, file writes and reads, terminals, pause and resume (with
// memory on gVisor and on the runc Hibernate template), wake through Envoy, egress policy changes,
// template applies, deletes and expiries, through the REST API at either edge, the unmodified E2B
// JS SDK and kubernetes-sigs' Python SDK. Only what the system acknowledged goes in the ledger;
// an operation that fails is retried a few times and then recorded as failed, never as lost.
import { createHash, randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { request } from 'node:http';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Sandbox } from 'e2b';
import { openTerminal } from '../../test/support/terminal-client.ts';
import type { LatencySample, LedgerEvent } from './checks.ts';

const REPO = resolve(import.meta.dirname, '../..');
const IMAGE = 'agent-sandbox/base';
/** Live sandboxes the soak keeps at most (besides warm pool members): bounded in count. */
export const MAX_LIVE = 8;
/** One try of an operation: past this it counts as failed (a create's wait is the longest part). */
const TRY_MS = 150_000;

export interface Mine {
  id: string;
  template: string;
  accessToken: string;
  paused: boolean;
  /** Keeps memory across a pause: a process started before it must still run after. */
  memory: boolean;
  web: boolean;
  files: string[];
}

export interface Target {
  edges: string[];
  /** Each cluster's worker API: what the drain lists, cluster by cluster. */
  workers: string[];
  key: string;
  kubeconfig: string;
  stateDir: string;
}

type Container = Record<string, unknown>;

function template(name: string, container: Container, extra: Record<string, unknown> = {}): unknown {
  return { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxTemplate', metadata: { name, namespace: 'default' }, spec: { podTemplate: { spec: { containers: [{ name: 'main', image: IMAGE, command: ['sleep', 'infinity'], ...container }], ...extra } } } };
}

function pool(name: string, replicas: number): unknown {
  return { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name, namespace: 'default' }, spec: { replicas, sandboxTemplateRef: { name } } };
}

/** The soak's templates: runc and gVisor with warm pools, runc Hibernate, a web server, cold-only and a small one to fill. */
export function soakObjects(runcReplicas: number): unknown[] {
  const hib = template('soakhib', {}) as { spec: Record<string, unknown> };
  hib.spec.suspensionStrategy = 'Hibernate';
  return [
    template('soakrunc', {}), pool('soakrunc', runcReplicas),
    template('soakgv', {}, { runtimeClassName: 'gvisor' }), pool('soakgv', 2),
    hib, pool('soakhib', 1),
    template('soakweb', { image: 'python:3.11', command: ['sh', '-c', 'exec python3 -m http.server 8080 --directory /tmp'], ports: [{ containerPort: 8080 }], readinessProbe: { tcpSocket: { port: 8080 }, periodSeconds: 1 } }), pool('soakweb', 1),
    template('soakcold', {}),
    template('soakgvcold', {}, { runtimeClassName: 'gvisor' }),
    template('soakfill', { resources: { limits: { memory: '64Mi', 'ephemeral-storage': '64Mi' } } }),
  ];
}

export class Workload {
  readonly ledger: LedgerEvent[] = [];
  readonly latencies: LatencySample[] = [];
  readonly mine: Mine[] = [];
  /** op → [acknowledged, failed after retries]. */
  readonly counts = new Map<string, [number, number]>();
  readonly failures: string[] = [];
  /** Problems the workload itself saw that are product failures (memory not kept, a file write refused on a healthy sandbox…). */
  readonly findings: string[] = [];
  #n = 0;
  #t: Target;
  #inFault: () => boolean;
  #t0 = performance.now();

  constructor(target: Target, inFault: () => boolean) {
    this.#t = target;
    this.#inFault = inFault;
  }

  now(): number {
    return performance.now() - this.#t0;
  }

  edge(): string {
    return this.#t.edges[this.#n++ % this.#t.edges.length] ?? '';
  }

  async call(method: string, path: string, body?: unknown, timeoutMs = 60_000): Promise<{ status: number; body: Record<string, unknown> & { items?: unknown[] }; text: string }> {
    const res = await fetch(`${this.edge()}${path}`, {
      method,
      headers: { authorization: `Bearer ${this.#t.key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body) }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    let parsed: Record<string, unknown> = {};
    try {
      parsed = JSON.parse(text) as Record<string, unknown>;
    } catch {
      parsed = {};
    }
    return { status: res.status, body: parsed, text };
  }

  #count(op: string, ok: boolean): void {
    const c = this.counts.get(op) ?? [0, 0];
    c[ok ? 0 : 1]++;
    this.counts.set(op, c);
  }

  #latency(metric: string, startedAt: number): void {
    this.latencies.push({ metric, atMs: this.now(), ms: performance.now() - this.#t0 - startedAt, inFault: this.#inFault() });
  }

  /**
   * Runs `fn` up to 3 times, 2 s apart, each try bounded by TRY_MS; the op counts as acknowledged
   * or as failed (with why). A try that timed out may still take effect later: it was never
   * acknowledged, so the ledger holds nothing of it.
   */
  async attempt(op: string, fn: () => Promise<void>): Promise<boolean> {
    let last = '';
    for (let i = 0; i < 3; i++) {
      const started = performance.now();
      let timer: NodeJS.Timeout | undefined;
      try {
        if (process.env.SOAK_VERBOSE === '1') console.log(`  op ${op} (try ${String(i + 1)})`);
        await Promise.race([fn(), new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`no answer within ${String(TRY_MS / 1000)} s`)), TRY_MS)))]);
        this.#count(op, true);
        return true;
      } catch (err) {
        last = err instanceof Error ? err.message : String(err);
        console.log(`  ${op} try ${String(i + 1)} failed after ${String(Math.round(performance.now() - started))} ms: ${last.slice(0, 200)}`);
        await new Promise((r) => setTimeout(r, 2000));
      } finally {
        clearTimeout(timer);
      }
    }
    this.#count(op, false);
    this.failures.push(`${Math.round(this.now() / 1000)} s ${op}${this.#inFault() ? ' (fault window)' : ''}: ${last.slice(0, 300)}`);
    return false;
  }

  /** Sandboxes each worker still lists (pool members and deleted ones being torn down included); -1: no answer. */
  async listed(): Promise<number[]> {
    return Promise.all(this.#t.workers.map(async (api) => {
      try {
        const res = await fetch(`${api}/v1/sandboxes`, { headers: { authorization: `Bearer ${this.#t.key}` }, signal: AbortSignal.timeout(20_000) });
        const body = (await res.json()) as { items?: unknown[] };
        return res.status === 200 ? (body.items ?? []).length : -1;
      } catch {
        return -1;
      }
    }));
  }

  /**
   * /v1/apply at an edge goes to that edge's cluster only (each cluster holds its own pools), so
   * the edges take turns; `everywhere` applies at every cluster (the drain: all pools to 0).
   */
  async apply(objects: unknown[], everywhere = false): Promise<void> {
    for (let i = 0; i < (everywhere ? this.#t.edges.length : 1); i++) {
      const r = await this.call('POST', '/v1/apply', { objects });
      if (r.status !== 200) throw new Error(`apply: ${String(r.status)} ${r.text.slice(0, 200)}`);
    }
  }

  /** A create through REST: warm when the template has a pool, cold otherwise; `timeoutMs` makes it expire. */
  async create(tpl: string, opts: { timeoutMs?: number; memory?: boolean } = {}): Promise<Mine | undefined> {
    let made: Mine | undefined;
    await this.attempt(`create ${tpl}`, async () => {
      const t = this.now();
      const r = await this.call('POST', '/v1/sandboxes', { template: tpl, wait: true, ...(opts.timeoutMs === undefined ? {} : { timeoutMs: opts.timeoutMs }) }, 120_000);
      if (r.status !== 201) throw new Error(`${String(r.status)} ${r.text.slice(0, 200)}`);
      const id = String(r.body.id);
      this.#latency(r.body.launchType === 'warm' ? 'warm claim' : 'cold create', t);
      this.ledger.push({ kind: 'create', id, atMs: this.now() });
      if (opts.timeoutMs !== undefined) {
        this.ledger.push({ kind: 'delete', id, atMs: this.now() + opts.timeoutMs });
        return;
      }
      made = { id, template: tpl, accessToken: String(r.body.accessToken), paused: false, memory: opts.memory ?? false, web: tpl === 'soakweb', files: [] };
      this.mine.push(made);
    });
    return made;
  }

  async exec(sb: Mine, command: string): Promise<string> {
    const t = this.now();
    const r = await this.call('POST', `/v1/sandboxes/${sb.id}/exec`, { command }, 60_000);
    if (r.status !== 200) throw new Error(`exec ${sb.id}: ${String(r.status)} ${r.text.slice(0, 200)}`);
    this.#latency('exec', t);
    return String(r.body.stdout);
  }

  async write(sb: Mine): Promise<void> {
    const path = `/tmp/soak-${String(sb.files.length)}.bin`;
    const data = randomBytes(1024 + Math.floor(Math.random() * 64 * 1024));
    await this.attempt('file write', async () => {
      const r = await this.call('PUT', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent(path)}`, data);
      if (r.status >= 300) throw new Error(`write ${sb.id}:${path}: ${String(r.status)} ${r.text.slice(0, 200)}`);
      this.ledger.push({ kind: 'write', id: sb.id, path, sha256: sha(data), atMs: this.now() });
      if (!sb.files.includes(path)) sb.files.push(path);
    });
  }

  /** The file's hash as the sandbox reads it now; null when it is not there. */
  async readHash(id: string, path: string): Promise<string | null> {
    const res = await fetch(`${this.edge()}/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`, { headers: { authorization: `Bearer ${this.#t.key}` }, signal: AbortSignal.timeout(60_000) });
    const body = Buffer.from(await res.arrayBuffer());
    if (res.status === 404) return null;
    if (res.status !== 200) throw new Error(`read ${id}:${path}: ${String(res.status)} ${body.toString().slice(0, 200)}`);
    return sha(body);
  }

  async terminal(sb: Mine): Promise<void> {
    await this.attempt('terminal', async () => {
      const term = await openTerminal(this.edge(), sb.id, { key: this.#t.key, command: ['sh'] });
      const mark = `soak-${randomBytes(4).toString('hex')}`;
      try {
        term.send(`echo ${mark}-$((6*7))\n`);
        await term.waitFor(`${mark}-42`, 20_000);
        term.send('exit\n');
        const closed = await Promise.race([term.closed, new Promise<undefined>((r) => setTimeout(r, 10_000, undefined))]);
        if (closed?.exitCode !== 0) throw new Error(`terminal of ${sb.id} ended ${JSON.stringify(closed)}`);
      } finally {
        term.ws.terminate();
      }
    });
  }

  /** Pause (keeping memory where the sandbox can), then resume; memory kept means a process started before still runs. */
  async pauseResume(sb: Mine): Promise<void> {
    let pid = '';
    if (sb.memory) {
      const ok = await this.attempt('start a process', async () => {
        pid = (await this.exec(sb, 'sleep 86400 >/dev/null 2>&1 & echo $!')).trim();
      });
      if (!ok) return;
    }
    const paused = await this.attempt('pause', async () => {
      const r = await this.call('POST', `/v1/sandboxes/${sb.id}/pause`, { memory: sb.memory }, 120_000);
      if (r.status !== 200) throw new Error(`pause ${sb.id}: ${String(r.status)} ${r.text.slice(0, 200)}`);
      sb.paused = true;
      this.ledger.push({ kind: 'state', id: sb.id, want: 'paused', atMs: this.now() });
    });
    if (!paused) return;
    await new Promise((r) => setTimeout(r, 3000));
    let woke: boolean;
    if (sb.web) {
      // Woken by its first request through Envoy, as a browser would.
      woke = await this.attempt('wake through Envoy', async () => {
        const t = this.now();
        await this.edgeGet(sb);
        this.#latency('wake first request', t);
      });
    } else {
      woke = await this.attempt('resume', async () => {
        const r = await this.call('POST', `/v1/sandboxes/${sb.id}/resume`, { wait: true }, 120_000);
        if (r.status !== 200) throw new Error(`resume ${sb.id}: ${String(r.status)} ${r.text.slice(0, 200)}`);
      });
    }
    // Not acknowledged: it stays paused as far as the ledger knows (the drain deletes it).
    if (!woke) return;
    sb.paused = false;
    this.ledger.push({ kind: 'state', id: sb.id, want: 'running', atMs: this.now() });
    if (sb.memory && pid !== '') {
      await this.attempt('memory kept', async () => {
        const out = await this.exec(sb, `kill -0 ${pid} && echo alive || echo gone`);
        if (!out.includes('alive')) this.findings.push(`memory not kept: ${sb.template} sandbox ${sb.id} lost process ${pid} across a pause with memory`);
      });
    }
  }

  /** A GET through Envoy addressed by Host (fetch may not set Host, so node:http). */
  edgeGet(sb: Mine): Promise<void> {
    const edge = this.edge();
    return new Promise((res, rej) => {
      const req = request(`${edge}/`, { headers: { host: `8080-${sb.id}.asb.localhost`, 'x-access-token': sb.accessToken }, timeout: 60_000 }, (r) => {
        let body = '';
        r.setEncoding('utf8');
        r.on('data', (c: string) => (body += c));
        r.on('end', () => (r.statusCode === 200 ? res() : rej(new Error(`GET 8080-${sb.id}: ${String(r.statusCode)} ${body.slice(0, 200)}`))));
      });
      req.on('timeout', () => req.destroy(new Error(`GET 8080-${sb.id}: no answer in 60 s`)));
      req.on('error', rej);
      req.end();
    });
  }

  async firstRequest(sb: Mine): Promise<void> {
    await this.attempt('first request', async () => {
      const t = this.now();
      await this.edgeGet(sb);
      this.#latency('first request', t);
    });
  }

  async egress(sb: Mine): Promise<void> {
    const policies = [{ deny: ['203.0.113.0/24'] }, { allow: ['198.51.100.0/24'], deny: ['0.0.0.0/0'] }, { deny: ['bad.example'] }];
    const policy = policies[this.#n % policies.length];
    await this.attempt('egress policy change', async () => {
      const r = await this.call('PUT', `/v1/sandboxes/${sb.id}/network`, policy);
      if (r.status !== 200) throw new Error(`network ${sb.id}: ${String(r.status)} ${r.text.slice(0, 200)}`);
    });
  }

  async remove(sb: Mine): Promise<void> {
    const ok = await this.attempt('delete', async () => {
      const r = await this.call('DELETE', `/v1/sandboxes/${sb.id}`);
      if (r.status !== 200 && r.status !== 202 && r.status !== 204) throw new Error(`delete ${sb.id}: ${String(r.status)} ${r.text.slice(0, 200)}`);
      this.ledger.push({ kind: 'delete', id: sb.id, atMs: this.now() });
    });
    if (ok) this.mine.splice(this.mine.indexOf(sb), 1);
  }

  /** The E2B JS SDK, unmodified: create, a command, a file written and read back, kept in the ledger. */
  async e2b(tpl: string): Promise<void> {
    const edge = this.edge();
    await this.attempt(`e2b SDK ${tpl}`, async () => {
      const opts = { apiUrl: edge, sandboxUrl: edge, apiKey: this.#t.key, requestTimeoutMs: 60_000 };
      const t = this.now();
      const sbx = await Sandbox.create(tpl, opts);
      this.#latency(tpl === 'soakgv' || tpl === 'soakrunc' ? 'warm claim' : 'cold create', t);
      this.ledger.push({ kind: 'create', id: sbx.sandboxId, atMs: this.now() });
      const sb: Mine = { id: sbx.sandboxId, template: tpl, accessToken: '', paused: false, memory: tpl === 'soakgv', web: false, files: [] };
      this.mine.push(sb);
      const text = `e2b ${randomBytes(16).toString('hex')}`;
      await sbx.files.write('/tmp/e2b.txt', text);
      this.ledger.push({ kind: 'write', id: sb.id, path: '/tmp/e2b.txt', sha256: sha(Buffer.from(text)), atMs: this.now() });
      sb.files.push('/tmp/e2b.txt');
      const r = await sbx.commands.run('cat /tmp/e2b.txt');
      if (r.stdout !== text) this.findings.push(`E2B SDK: ${sb.id} read back ${JSON.stringify(r.stdout.slice(0, 80))}, wrote ${text}`);
    });
  }

  /** kubernetes-sigs' Python SDK, unmodified, in Direct mode: claim, command, file, terminate. */
  async k8sSigs(poolName: string): Promise<void> {
    const edge = this.#t.edges[0] ?? '';
    const script = `
import os, sys
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
cfg = SandboxDirectConnectionConfig(api_url=os.environ["EDGE"], extra_headers={"X-API-Key": os.environ["KEY"]})
with SandboxClient(connection_config=cfg) as c:
    sb = c.create_sandbox(warmpool=os.environ["POOL"], namespace="default", sandbox_ready_timeout=60)
    r = sb.commands.run("echo k8s-sigs-ok")
    sb.files.write("soak.txt", "kept")
    assert sb.files.read("soak.txt") == b"kept"
    assert r.stdout == "k8s-sigs-ok\\n", r
    sb.terminate()
print("done")
`;
    await this.attempt('k8s-sigs SDK', () => new Promise<void>((res, rej) => {
      execFile(join(REPO, '.venv/bin/python'), ['-c', script], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: this.#t.stateDir, KUBECONFIG: this.#t.kubeconfig, EDGE: edge, KEY: this.#t.key, POOL: poolName, PYTHONDONTWRITEBYTECODE: '1' }, timeout: 150_000 }, (err, stdout, stderr) => {
        if (err === null && stdout.includes('done')) res();
        else rej(new Error(`k8s-sigs SDK: ${err?.message ?? ''} ${stderr.slice(-400)}`));
      });
    }));
  }

  /** Fills a sandbox's disk past its limit, then its memory: it must be handled, the others untouched. */
  async fill(kind: 'disk' | 'memory'): Promise<string> {
    const sb = await this.create('soakfill');
    if (sb === undefined) return 'the fill sandbox could not be created';
    this.ledger.push({ kind: 'forfeit', id: sb.id, atMs: this.now() });
    this.mine.splice(this.mine.indexOf(sb), 1);
    const cmd = kind === 'disk' ? 'dd if=/dev/zero of=/tmp/fill bs=1M count=256 2>&1; echo rc=$?' : 'head -c 512m /dev/zero | tail > /dev/null; echo rc=$?';
    let said = '';
    try {
      const r = await this.call('POST', `/v1/sandboxes/${sb.id}/exec`, { command: cmd, timeoutMs: 60_000 }, 90_000);
      said = `exec ${String(r.status)} ${r.text.slice(0, 160).replace(/\s+/g, ' ')}`;
    } catch (err) {
      said = `exec ended: ${err instanceof Error ? err.message : String(err)}`;
    }
    await new Promise((r) => setTimeout(r, 3000));
    const g = await this.call('GET', `/v1/sandboxes/${sb.id}`).catch(() => undefined);
    const phase = g === undefined ? 'unknown' : typeof g.body.phase === 'string' ? g.body.phase : `HTTP ${String(g.status)}`;
    await this.call('DELETE', `/v1/sandboxes/${sb.id}`).catch(() => undefined);
    this.ledger.push({ kind: 'delete', id: sb.id, atMs: this.now() });
    return `${kind} fill of ${sb.id}: ${said}; then phase ${phase}`;
  }
}

export function sha(data: Buffer | Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}
