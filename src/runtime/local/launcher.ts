// The Node side of launcher.c: one long-lived process that fork()s and execs every pod shim (and
// `ip -batch` helper) for the runtime, so the worker never spawns per pod. Node's spawn forks the
// whole worker and blocks its event loop until the child execs (6-20 ms each on 2 cores); the
// launcher's fork costs < 0.1 ms and Node only writes one record to a pipe.
// Measured on this machine (2 cores, shared with other load), 300 concurrent start()s, before ->
// after: worst event-loop stall 1.4-7.7 s -> 0.2-1.1 s (p99 stays 20-60 ms), worker user CPU
// 0.37-0.45 s -> 0.19-0.22 s. Wall time to all-ready did not move (3.9-12 s either way, by load):
// it is now bound by the kernel work of the pods themselves (ext4 inode allocation for each new
// pod dir, mounts, namespaces: perf showed the pods' own init and fs threads, not Node, on the CPUs).
// The launcher is supervised: if it dies it is restarted with backoff (50 ms doubling to 5 s);
// children it started keep running (pods are in their own session), their launches report lost()
// and the runtime watches those pods by polling, as it does for adopted pods.
import { spawn, type ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import type { Clock, Timer } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';

/** What a launched child reports. Exactly one of exit() or lost() ends it; nothing comes after. */
export interface LaunchHandlers {
  /** Bytes the child wrote on stdout (and stderr when mergeStderr was asked). */
  output?(chunk: Buffer): void;
  /** Its stdout reached EOF. Comes before exit(). */
  end?(): void;
  /** It exited with this code, or was killed by this signal. */
  exit(code: number | null, signal: NodeJS.Signals | null): void;
  /** The launcher died (or was closed) before the child's exit was seen; the child may still run. */
  lost(): void;
}

export interface Launched {
  write(data: string | Uint8Array): void;
  closeStdin(): void;
  kill(signal: NodeJS.Signals): void;
  /** Stops this child from keeping the worker's event loop alive (as ChildProcess.unref()). */
  unref(): void;
}

export interface LaunchOptions {
  mergeStderr?: boolean;
}

interface Entry {
  id: number;
  handlers: LaunchHandlers;
  /** Launcher incarnation the start request went to; 0 while it waits for one. */
  epoch: number;
  request: Buffer;
  /** The launcher reported the child's pid: it exists, so a restart must not start it again. */
  started: boolean;
  held: boolean;
}

const HEADER = 9;
const BACKOFF_MIN_MS = 50;
const BACKOFF_MAX_MS = 5000;
/** A launcher that ran this long before dying is not crash-looping: backoff starts over. */
const HEALTHY_MS = 10_000;
const SIGNAL_NAMES = new Map(Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]));

function frame(type: string, id: number, payload: Uint8Array = Buffer.alloc(0)): Buffer {
  const out = Buffer.allocUnsafe(HEADER + payload.length);
  out.writeUInt32LE(payload.length, 0);
  out.write(type, 4, 'latin1');
  out.writeUInt32LE(id, 5);
  out.set(payload, HEADER);
  return out;
}

/** argv as NUL-terminated strings; a NUL inside an argument cannot be passed to exec at all. */
function startPayload(argv: readonly string[], opts: LaunchOptions): Buffer {
  if (argv.length === 0 || argv.some((a) => a.includes('\0'))) throw new Error('argv must be non-empty and hold no NUL byte');
  return Buffer.concat([Buffer.from([opts.mergeStderr === true ? 1 : 0]), ...argv.map((a) => Buffer.from(`${a}\0`, 'utf8'))]);
}

export class Launcher {
  readonly #binary: string;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #entries = new Map<number, Entry>();
  #proc: ChildProcess | undefined;
  #epoch = 0;
  #nextId = 1;
  #held = 0;
  #failures = 0;
  #startedAt = 0;
  #restart: Timer | undefined;
  #pending: Buffer = Buffer.alloc(0);
  #closed = false;

  constructor(binary: string, log: Logger, clock: Clock) {
    this.#binary = binary;
    this.#log = log.child({ component: 'pod-launcher' });
    this.#clock = clock;
  }

  /** The launcher's pid while it runs (for diagnostics and tests). */
  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  /** Starts argv in its own session through the launcher; argv[0] is looked up on PATH. */
  launch(argv: readonly string[], handlers: LaunchHandlers, opts: LaunchOptions = {}): Launched {
    const id = this.#nextId++;
    const entry: Entry = { id, handlers, epoch: 0, request: frame('S', id, startPayload(argv, opts)), started: false, held: true };
    if (this.#closed) {
      queueMicrotask(() => handlers.lost());
      return { write: () => undefined, closeStdin: () => undefined, kill: () => undefined, unref: () => undefined };
    }
    this.#entries.set(id, entry);
    this.#hold(1);
    this.#ensure(); // a launcher it starts now is sent every waiting entry, this one included
    if (this.#proc !== undefined && entry.epoch === 0) this.#send(entry);
    const live = (): boolean => this.#entries.get(id) === entry && entry.epoch === this.#epoch && this.#proc !== undefined;
    return {
      write: (data) => {
        if (live()) this.#proc?.stdin?.write(frame('W', id, typeof data === 'string' ? Buffer.from(data) : data));
      },
      closeStdin: () => {
        if (live()) this.#proc?.stdin?.write(frame('C', id));
      },
      kill: (signal) => {
        if (live()) this.#proc?.stdin?.write(frame('K', id, Buffer.from([constants.signals[signal]])));
      },
      unref: () => this.#release(entry),
    };
  }

  /** Runs a short helper to its end: its exit code (or 128+signal) and its stdout+stderr. */
  run(argv: readonly string[], input: string): Promise<{ code: number; output: string }> {
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      const child = this.launch(argv, {
        output: (chunk) => chunks.push(chunk),
        exit: (code, signal) => resolve({ code: code ?? 128 + (signal === null ? 0 : constants.signals[signal]), output: Buffer.concat(chunks).toString('utf8') }),
        lost: () => reject(new Error(`the pod launcher went away while running ${argv[0] ?? ''}`)),
      }, { mergeStderr: true });
      child.write(input);
      child.closeStdin();
    });
  }

  #send(entry: Entry): void {
    entry.epoch = this.#epoch;
    this.#proc?.stdin?.write(entry.request);
  }

  #ensure(): void {
    if (this.#proc !== undefined || this.#restart !== undefined || this.#closed) return;
    const proc = spawn(this.#binary, [], { detached: true, stdio: ['pipe', 'pipe', 'pipe'] });
    this.#proc = proc;
    this.#epoch++;
    this.#startedAt = this.#clock.now();
    this.#pending = Buffer.alloc(0);
    proc.stdin.on('error', () => undefined); // its death is handled once, on 'close'
    proc.stdout.on('data', (chunk: Buffer) => this.#read(chunk));
    proc.stderr.setEncoding('utf8').on('data', (text: string) => this.#log.warn({ stderr: text.trim() }, 'pod launcher'));
    proc.on('error', (err) => {
      this.#log.error({ err }, 'cannot run the pod launcher');
      this.#died(proc, null, null);
    });
    // 'close', not 'exit': the events it wrote before dying are read first.
    proc.on('close', (code, signal) => this.#died(proc, code, signal));
    this.#applyRef();
    for (const entry of this.#entries.values()) if (entry.epoch === 0) this.#send(entry);
  }

  #died(proc: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (this.#proc !== proc) return;
    this.#proc = undefined;
    // Every child of the dead launcher is lost to us: it may still run, but nobody reports its exit.
    // A start it never acknowledged goes to the next launcher instead: a worker that writes a start
    // just as the launcher dies (the kill and the write race) still gets its pod.
    for (const entry of [...this.#entries.values()]) {
      if (!entry.started) {
        entry.epoch = 0;
        continue;
      }
      this.#finish(entry);
      entry.handlers.lost();
    }
    if (this.#closed) return;
    if (this.#clock.now() - this.#startedAt >= HEALTHY_MS) this.#failures = 0;
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** this.#failures++);
    this.#log.error({ code, signal, restartInMs: delay }, 'pod launcher died; running pods are unaffected');
    this.#restart = this.#clock.after(delay, () => {
      this.#restart = undefined;
      this.#ensure();
    });
  }

  /** Parses event records: 'P' pid, 'O' output, 'Z' end of output, 'X' exit. */
  #read(chunk: Buffer): void {
    let buf = this.#pending.length === 0 ? chunk : Buffer.concat([this.#pending, chunk]);
    while (buf.length >= HEADER) {
      const len = buf.readUInt32LE(0);
      if (buf.length < HEADER + len) break;
      const type = String.fromCharCode(buf[4] ?? 0);
      const entry = this.#entries.get(buf.readUInt32LE(5));
      const payload = buf.subarray(HEADER, HEADER + len);
      buf = buf.subarray(HEADER + len);
      if (entry === undefined) continue;
      if (type === 'P') entry.started = true;
      else if (type === 'O') entry.handlers.output?.(Buffer.from(payload));
      else if (type === 'Z') entry.handlers.end?.();
      else if (type === 'X') {
        const status = payload.readInt32LE(0);
        this.#finish(entry);
        entry.handlers.exit(status >= 0 ? status : null, status >= 0 ? null : (SIGNAL_NAMES.get(-status) ?? 'SIGKILL'));
      }
    }
    this.#pending = Buffer.from(buf);
  }

  #finish(entry: Entry): void {
    this.#entries.delete(entry.id);
    this.#release(entry);
  }

  #release(entry: Entry): void {
    if (!entry.held) return;
    entry.held = false;
    this.#hold(-1);
  }

  /** The launcher keeps the worker alive only while a launch is in flight, as a spawned child would. */
  #hold(delta: number): void {
    const before = this.#held;
    this.#held += delta;
    if ((before === 0) !== (this.#held === 0)) this.#applyRef();
  }

  #applyRef(): void {
    const proc = this.#proc;
    if (proc === undefined) return;
    const handles = [proc, proc.stdin, proc.stdout, proc.stderr] as ({ ref(): void; unref(): void } | null)[];
    for (const h of handles) {
      if (this.#held > 0) h?.ref();
      else h?.unref();
    }
  }

  /**
   * Closes the launcher's stdin: it exits WITHOUT touching its children (pods keep running and the
   * next runtime re-adopts them). Pending launches report lost(). Resolves once it has exited
   * (SIGKILL after 2 s, which still leaves the children alone).
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#restart?.cancel();
    const proc = this.#proc;
    for (const entry of [...this.#entries.values()]) {
      this.#finish(entry);
      entry.handlers.lost();
    }
    if (proc === undefined || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => proc.once('close', () => resolve()));
    // A caller awaiting close() must not see the worker exit half-way: hold the loop until it ends.
    proc.ref();
    (proc.stdout as { ref?: () => void } | null)?.ref?.();
    proc.stdin?.end();
    const timer = this.#clock.after(2000, () => proc.kill('SIGKILL'));
    await exited;
    timer.cancel();
  }
}
