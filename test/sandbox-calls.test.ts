// One sandbox's callers hold a bounded share of the worker's processes (src/worker/sandbox-calls.ts):
// past its bound an exec or a file call on that sandbox is refused at once with 429
// TooManyRequests naming the bound and Retry-After, while another team's sandbox is still served
// (its exec latency measured alongside), and the sandbox is served again once its calls end.
// Before the bound every call was taken until the worker ran out of descriptors, when exec failed
// for every tenant with 500 (spawn EMFILE). A real worker API over the memory runtime, whose exec
// runs on the host: the held calls wait on a FIFO this test opens to release them.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { AsbError } from '../src/errors.ts';
import type { ExecResult, PodRuntime, PtySession } from '../src/runtime/runtime.ts';
import type { Clock, Timer } from '../src/base/clock.ts';
import { boundSandboxCalls, DEFAULT_SANDBOX_CALL_LIMITS } from '../src/worker/sandbox-calls.ts';
import { call, startWorkerFixture } from './support/worker-fixture.ts';
import { waitFor } from './support/wait.ts';

const PER_SANDBOX = 4;

/** A clock that moves only when told (the start buckets read now() and nothing else). */
class ManualClock implements Clock {
  #now = 1_700_000_000_000;
  now(): number {
    return this.#now;
  }
  after(): Timer {
    throw new Error('no timers here');
  }
  advance(ms: number): void {
    this.#now += ms;
  }
}

test('a sandbox past its processes in flight gets 429 naming the bound for exec and files; another team\'s exec still answers; the first is served again once its calls end', async (t) => {
  const fx = await startWorkerFixture((fn) => t.after(fn), {}, { sandboxCallLimits: { ...DEFAULT_SANDBOX_CALL_LIMITS, processes: { perKey: PER_SANDBOX, total: 64 } } });
  const dir = mkdtempSync(join(tmpdir(), 'asb-calls-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fifo = join(dir, 'release');
  execFileSync('mkfifo', [fifo]);
  // Opening the FIFO for writing and closing it ends every cat waiting on it (none: ENXIO).
  const release = (): void => {
    try {
      closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
    } catch {
      // No reader left.
    }
  };
  const create = async (key: string): Promise<string> => {
    const r = await call(fx, 'POST', '/v1/sandboxes', { key, json: { template: 'base' } });
    assert.equal(r.status, 201, r.text);
    return (r.json as { id: string }).id;
  };
  const a = await create(fx.keys.teamA);
  const b = await create(fx.keys.teamB);
  const exec = (key: string, id: string, command: string[]): Promise<{ status: number; ms: number; json: unknown; retryAfter: string | null }> => {
    const begun = performance.now();
    return call(fx, 'POST', `/v1/sandboxes/${id}/exec`, { key, json: { command } }).then((r) => ({ status: r.status, ms: performance.now() - begun, json: r.json, retryAfter: r.headers.get('retry-after') }));
  };
  const victimMs = async (): Promise<number[]> => {
    const ms: number[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await exec(fx.keys.teamB, b, ['true']);
      assert.equal(r.status, 200, JSON.stringify(r.json));
      ms.push(r.ms);
    }
    return ms.sort((x, y) => x - y);
  };
  const before = await victimMs();

  // Team A's sandbox holds its bound: each exec says it started, then waits on the FIFO.
  const held = Array.from({ length: PER_SANDBOX }, (_, i) => exec(fx.keys.teamA, a, ['sh', '-c', `: > ${dir}/started.${String(i)}; cat ${fifo}`]));
  try {
    await waitFor('the held execs to start', () => Promise.resolve(readdirSync(dir).filter((f) => f.startsWith('started.')).length === PER_SANDBOX ? true : undefined), 30_000, 20);

    const refused = await exec(fx.keys.teamA, a, ['true']);
    assert.equal(refused.status, 429, JSON.stringify(refused.json));
    assert.equal((refused.json as { code?: string }).code, 'TooManyRequests');
    assert.match((refused.json as { detail?: string }).detail ?? '', new RegExp(`sandbox "${a}" already has ${String(PER_SANDBOX)} processes`));
    assert.equal(refused.retryAfter, '1');
    const file = await call(fx, 'GET', `/v1/sandboxes/${a}/files?path=/etc/hostname`, { key: fx.keys.teamA });
    assert.equal(file.status, 429, 'a file read is a process in the sandbox too');

    const during = await victimMs();
    t.diagnostic(`another team's exec p50 before / while one sandbox holds its bound: ${before[2]?.toFixed(1) ?? '?'} / ${during[2]?.toFixed(1) ?? '?'} ms`);
  } finally {
    release();
  }
  for (const r of await Promise.all(held)) assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal((await exec(fx.keys.teamA, a, ['true'])).status, 200, 'served again once its calls ended');
});

test('a terminal or a spawned process holds its sandbox\'s slot until it exits, not until it opens; a failed open gives it back', async () => {
  const exits: (() => void)[] = [];
  let fail = false;
  const opened = (): Promise<PtySession> => {
    if (fail) return Promise.reject(new Error('no such command'));
    let exit = (): void => undefined;
    const exited = new Promise<number>((resolve) => (exit = () => resolve(0)));
    exits.push(exit);
    return Promise.resolve({ exited, output: (async function* () {})(), write: () => Promise.resolve(), resize: () => undefined, close: exit });
  };
  const runtime = boundSandboxCalls({ openPty: opened, state: () => ({ phase: 'Running', ready: true }) } as unknown as PodRuntime, new ManualClock(), { ...DEFAULT_SANDBOX_CALL_LIMITS, terminals: { perKey: 2, total: 3 } });
  const pty = (id: string): Promise<PtySession> => runtime.openPty(id, { cols: 80, rows: 24 });
  await pty('a');
  await pty('a');
  await assert.rejects(pty('a'), (err: unknown) => err instanceof AsbError && err.code === 'TooManyRequests' && /sandbox "a" already has 2 terminals/.test(err.message));
  await pty('b');
  await assert.rejects(pty('c'), /this worker already has 3 terminals open/, 'the worker-wide bound');
  exits[0]?.();
  await new Promise((resolve) => setImmediate(resolve));
  await pty('a');
  fail = true;
  exits[1]?.();
  await new Promise((resolve) => setImmediate(resolve));
  await assert.rejects(pty('a'), /no such command/);
  fail = false;
  await pty('a');
  assert.equal(runtime.state('a').phase, 'Running', 'the rest of the runtime is the runtime\'s own');
});

test('a sandbox starting processes faster than its rate gets 429 with the seconds until the next one after its burst; another sandbox is not held back', async () => {
  const clock = new ManualClock();
  const exec = (): Promise<ExecResult> => Promise.resolve({ exitCode: 0, stdout: new Uint8Array(), stderr: new Uint8Array(), timedOut: false, truncated: false });
  const runtime = boundSandboxCalls({ exec } as unknown as PodRuntime, clock, { ...DEFAULT_SANDBOX_CALL_LIMITS, starts: { ratePerS: 2, burst: 3 } });
  const run = (id: string): Promise<ExecResult> => runtime.exec(id, { command: ['true'] });
  for (let i = 0; i < 3; i++) await run('a');
  await assert.rejects(run('a'), (err: unknown) => err instanceof AsbError && err.code === 'TooManyRequests' && err.retryAfterS === 1 && /sandbox "a" started 3 processes and terminals in a burst and is held to 2 a second/.test(err.message));
  await run('b');
  clock.advance(500);
  await run('a');
  await assert.rejects(run('a'), /held to 2 a second/);
});
