// A local runtime in a process of its own, for tests that kill it (kill -9) in the middle of an
// operation and start another on the same state dir, as a worker restarted by its supervisor
// does. Run as `node runtime-process.ts '<options JSON>'`; one JSON command per stdin line, one
// JSON answer per stdout line: {"ready":true} once the runtime is up (recovered and reclaimed),
// then {"n":<command's n>,"ok":true,...} or {"n":..,"ok":false,"error":".."} per command.
// The parent side (RuntimeProcess) sends commands and waits for their answers, each bounded.
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { createLocalRuntime } from '../../src/runtime/local/local-runtime.ts';
import type { LocalRuntimeOptions } from '../../src/runtime/local/runtime-options.ts';
import type { PodRequest } from '../../src/runtime/runtime.ts';
import { silentLogger } from '../../src/base/log.ts';
import { testImageStore } from './test-images.ts';

export interface RuntimeProcessOptions {
  root: string;
  bridge: string;
  subnet: string;
  claimsDir: string;
  idRangesDir: string;
}

export type Command =
  | { op: 'start'; id: string; gvisor?: boolean; command?: string[] }
  | { op: 'stop'; id: string; memory?: boolean }
  | { op: 'remove'; id: string }
  | { op: 'exec'; id: string; command: string[] }
  | { op: 'state'; id: string }
  | { op: 'close' };

export function podRequest(id: string, gvisor: boolean, command: string[] = ['sleep', 'infinity']): PodRequest {
  return {
    id, uid: `uid-${id}`, namespace: 'default', hostname: id,
    spec: { ...(gvisor ? { runtimeClassName: 'gvisor' } : {}), containers: [{ name: 'main', image: 'agent-sandbox/base', command }] },
  };
}

async function main(opts: RuntimeProcessOptions): Promise<void> {
  const rt = await createLocalRuntime({ ...opts, log: silentLogger(), images: await testImageStore(), pollIntervalMs: 100 } satisfies LocalRuntimeOptions);
  const say = (value: unknown): void => void process.stdout.write(`${JSON.stringify(value)}\n`);
  say({ ready: true, pid: process.pid });
  for await (const line of createInterface({ input: process.stdin })) {
    const { n, cmd } = JSON.parse(line) as { n: number; cmd: Command };
    void (async () => {
      switch (cmd.op) {
        case 'start': return { state: await rt.start(podRequest(cmd.id, cmd.gvisor === true, cmd.command)) };
        case 'stop': return { stopped: await rt.stop(cmd.id, { memory: cmd.memory === true }) };
        case 'remove': return { removed: await rt.remove(cmd.id) };
        case 'exec': {
          const r = await rt.exec(cmd.id, { command: cmd.command, timeoutMs: 20_000 });
          return { exitCode: r.exitCode, stdout: Buffer.from(r.stdout).toString() };
        }
        case 'state': return { state: rt.state(cmd.id) };
        case 'close': {
          await rt.close();
          setImmediate(() => process.exit(0));
          return {};
        }
      }
    })().then((out) => say({ n, ok: true, ...out }), (err: unknown) => say({ n, ok: false, error: err instanceof Error ? err.message : String(err) }));
  }
}

/** The test's side: a runtime process it can command, and kill. */
export class RuntimeProcess {
  readonly child: ChildProcess;
  readonly #waiting = new Map<number, { answered(answer: Record<string, unknown>): void; exited(): void }>();
  #n = 0;
  readonly ready: Promise<void>;
  readonly exited: Promise<void>;

  constructor(opts: RuntimeProcessOptions) {
    this.child = spawn(process.execPath, [import.meta.filename, JSON.stringify(opts)], { stdio: ['pipe', 'pipe', 'inherit'] });
    this.exited = new Promise((resolve) => this.child.once('exit', () => resolve()));
    // A command the process died in (the tests kill it mid-operation on purpose) fails now, not at its timeout: a pending timer kept the test file's process alive up to 2 min after its last test.
    void this.exited.then(() => {
      for (const w of [...this.#waiting.values()]) w.exited();
    });
    let ready: () => void = () => undefined;
    this.ready = new Promise((resolve, reject) => {
      ready = resolve;
      void this.exited.then(() => reject(new Error('the runtime process exited before it was ready')));
    });
    if (this.child.stdout === null) throw new Error('no stdout');
    const lines = createInterface({ input: this.child.stdout });
    lines.on('line', (line) => {
      const answer = JSON.parse(line) as Record<string, unknown>;
      if (answer.ready === true) ready();
      const n = answer.n;
      if (typeof n === 'number') this.#waiting.get(n)?.answered(answer);
    });
  }

  /** Sends a command; resolves with its answer (rejects when it failed, or after timeoutMs). */
  send(cmd: Command, timeoutMs = 120_000): Promise<Record<string, unknown>> {
    const n = ++this.#n;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiting.delete(n);
        reject(new Error(`no answer to ${JSON.stringify(cmd)} within ${String(timeoutMs)} ms`));
      }, timeoutMs);
      const done = (): void => {
        clearTimeout(timer);
        this.#waiting.delete(n);
      };
      this.#waiting.set(n, {
        answered: (answer) => {
          done();
          if (answer.ok === true) resolve(answer);
          else reject(new Error(`${cmd.op} failed: ${String(answer.error)}`));
        },
        exited: () => {
          done();
          reject(new Error(`the runtime process exited before it answered ${JSON.stringify(cmd)}`));
        },
      });
      this.child.stdin?.write(`${JSON.stringify({ n, cmd })}\n`);
    });
  }

  /** kill -9 of the process, as a crash; resolves once it is gone. */
  async kill(): Promise<void> {
    this.child.kill('SIGKILL');
    await this.exited;
  }
}

if (process.argv[1] === import.meta.filename) {
  main(JSON.parse(process.argv[2] ?? '{}') as RuntimeProcessOptions).catch((err: unknown) => {
    process.stderr.write(`runtime process failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
    process.exit(1);
  });
}
