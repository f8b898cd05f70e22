// Terminal benchmarks (src/terminal/contract.ts): keystroke echo latency, and how many sessions
// one worker holds with how much memory.
//
// A one-cluster federation runs for real (hub process, worker process with real sandboxes, router,
// Envoy). A keystroke is one byte sent on the session's WebSocket; its echo is that byte coming
// back from the PTY (the line discipline echoes it, as for a person typing), timed one at a time
// on one session through each path: the edge Envoy (the router sends the API path to the worker)
// and the hub (its proxy relays to the worker). Then N sessions are opened straight to the worker
// and held; memory per session is the growth of the worker's RSS, and of the proportional set size
// of what the sessions run inside the sandbox (one PTY bridge and one shell each), divided by N.
import { readFileSync, readdirSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import WebSocket from 'ws';
import { startTestFederation, type TestFederation } from '../test/support/federation.ts';
import { round, summarize, type LatencySummary } from './claims.ts';

const KEYSTROKES = 300;
const KEYSTROKE_TIMEOUT_MS = 5_000;
const SESSIONS = 200;
const SESSION_OPEN_TIMEOUT_MS = 30_000;
/** Sessions opened at once while filling up to SESSIONS. */
const OPEN_CONCURRENCY = 20;

export interface TerminalBench {
  viaEdge: LatencySummary;
  viaHub: LatencySummary;
  sessions: number;
  workerKbPerSession: number;
  sandboxKbPerSession: number;
}

interface Session {
  ws: WebSocket;
  /** Resolves with the next output chunk. */
  next(): Promise<Buffer>;
}

function open(url: string, headers: Record<string, string>): Promise<Session> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    const chunks: Buffer[] = [];
    let waiting: ((b: Buffer) => void) | undefined;
    const timer = setTimeout(() => {
      ws.terminate();
      reject(new Error(`terminal ${url} did not open within ${SESSION_OPEN_TIMEOUT_MS} ms`));
    }, SESSION_OPEN_TIMEOUT_MS);
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (!isBinary) {
        const control = JSON.parse(data.toString()) as { type: string };
        if (control.type === 'ready') {
          clearTimeout(timer);
          resolve({
            ws,
            next: () => {
              const chunk = chunks.shift();
              if (chunk !== undefined) return Promise.resolve(chunk);
              return new Promise((res) => (waiting = res));
            },
          });
        }
        return;
      }
      if (waiting !== undefined) {
        const w = waiting;
        waiting = undefined;
        w(data);
      } else chunks.push(data);
    });
    ws.once('unexpected-response', (_req, res) => {
      clearTimeout(timer);
      reject(new Error(`terminal ${url}: HTTP ${res.statusCode ?? 0}`));
    });
    ws.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

/** Waits for output containing `text`, bounded in time. */
async function until(s: Session, text: string): Promise<void> {
  let seen = '';
  const deadline = performance.now() + KEYSTROKE_TIMEOUT_MS;
  while (!seen.includes(text)) {
    const left = deadline - performance.now();
    if (left <= 0) throw new Error(`no "${text}" in the terminal within ${KEYSTROKE_TIMEOUT_MS} ms; saw ${JSON.stringify(seen.slice(-200))}`);
    const chunk = await Promise.race([s.next(), new Promise<undefined>((res) => setTimeout(() => res(undefined), left))]);
    if (chunk !== undefined) seen += chunk.toString('latin1');
  }
}

/** One byte at a time, each timed until it is echoed back. */
async function keystrokes(s: Session): Promise<LatencySummary> {
  // Under `cat` the PTY echoes every byte typed at once (canonical mode, echo on), as a person
  // typing sees it; cat itself writes nothing until a newline.
  s.ws.send(Buffer.from('cat\r'));
  await until(s, 'cat\r\n');
  const samples: number[] = [];
  const letters = 'abcdefghijklmnopqrstuvwxyz';
  for (let i = 0; i < KEYSTROKES; i++) {
    const key = letters[i % letters.length] ?? 'x';
    const start = performance.now();
    s.ws.send(Buffer.from(key));
    await until(s, key);
    samples.push(performance.now() - start);
  }
  s.ws.send(Buffer.from('\x03'));
  return summarize(samples);
}

function rssKb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /VmRSS:\s+(\d+) kB/.exec(status);
  return m === null ? 0 : Number(m[1]);
}

/** Proportional set size (shared pages split between their users), in KB. */
function pssKb(pid: number): number {
  const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
  const m = /^Pss:\s+(\d+) kB/m.exec(rollup);
  return m === null ? 0 : Number(m[1]);
}

/**
 * PSS of every descendant of `root`: each session's PTY bridge and shell run under the worker
 * (entered into the sandbox's namespaces), as do the pods' launchers. Sampled before and after,
 * the difference is what the sessions cost.
 */
function descendantsPssKb(root: number): number {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // pid (comm) state ppid …: comm may hold spaces, so parse after the last ')'.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // gone meanwhile
    }
  }
  let total = 0;
  const queue = [...(children.get(root) ?? [])];
  for (let pid = queue.shift(); pid !== undefined; pid = queue.shift()) {
    try {
      total += pssKb(pid);
    } catch {
      // gone meanwhile
    }
    queue.push(...(children.get(pid) ?? []));
  }
  return total;
}

export async function benchTerminals(): Promise<TerminalBench> {
  const fed: TestFederation = await startTestFederation([['bench-term', 'bntm', 218]], 1);
  try {
    const cluster = fed.clusters[0];
    if (cluster === undefined) throw new Error('no cluster');
    const auth = { authorization: `Bearer ${fed.adminKey}` };
    const created = await fetch(`${cluster.apiUrl}/v1/sandboxes`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify({ template: 'base' }) });
    const sandbox = (await created.json()) as { id: string };
    if (created.status !== 201) throw new Error(`create: HTTP ${created.status} ${JSON.stringify(sandbox)}`);
    const path = `/v1/sandboxes/${sandbox.id}/terminal?cols=80&rows=24`;

    const edge = await open(`${cluster.edgeUrl.replace('http', 'ws')}${path}`, auth);
    const viaEdge = await keystrokes(edge);
    edge.ws.close();
    const hub = await open(`${fed.hubUrl.replace('http', 'ws')}${path}`, auth);
    const viaHub = await keystrokes(hub);
    hub.ws.close();

    const workerPid = cluster.worker.proc.pid ?? 0;
    await new Promise((res) => setTimeout(res, 1_000));
    const workerBefore = rssKb(workerPid);
    const sandboxBefore = descendantsPssKb(workerPid);
    const sessions: Session[] = [];
    try {
      while (sessions.length < SESSIONS) {
        const batch = Math.min(OPEN_CONCURRENCY, SESSIONS - sessions.length);
        sessions.push(...(await Promise.all(Array.from({ length: batch }, () => open(`${cluster.apiUrl.replace('http', 'ws')}${path}`, auth)))));
      }
      // Every session answers, so all are really held.
      await Promise.all(
        sessions.map(async (s, i) => {
          s.ws.send(Buffer.from(`echo held-${i}\r`));
          await until(s, `held-${i}`);
        }),
      );
      const workerAfter = rssKb(workerPid);
      const sandboxAfter = descendantsPssKb(workerPid);
      return {
        viaEdge,
        viaHub,
        sessions: sessions.length,
        workerKbPerSession: round((workerAfter - workerBefore) / sessions.length, 0),
        sandboxKbPerSession: round((sandboxAfter - sandboxBefore) / sessions.length, 0),
      };
    } finally {
      for (const s of sessions) s.ws.terminate();
    }
  } finally {
    await fed.cleanup();
  }
}
