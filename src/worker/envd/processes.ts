// The processes envd started in each sandbox: what process.List shows and what Connect,
// SendInput, SendSignal, Update and CloseStdin find by pid or tag. A process outlives the request
// that started it (E2B background commands: the SDK's disconnect() only aborts its fetch), so the
// table, not the stream, owns it; it leaves the table when it exits.
//
// pids are envd's handles, numbered per sandbox from 1000: the runtime enters the sandbox with
// nsenter from outside, so the pid a command has inside the sandbox is not known here.
//
// Output goes to whoever is attached at the time (the Start stream, Connect streams); with
// nobody attached it is read and dropped so the process never blocks on a full pipe, as envd does.
import type { PodProcess, PtySession } from '../../runtime/runtime.ts';

/** process.ProcessConfig in its JSON form. */
export interface ProcessConfig {
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
}

/** process.ProcessEvent in its JSON form (bytes as base64). */
export type ProcessEvent =
  | { start: { pid: number } }
  | { data: { stdout: string } | { stderr: string } | { pty: string } }
  | { end: { exitCode: number; exited: boolean; status: string; error?: string } }
  | { keepalive: Record<string, never> };

type EndEvent = Extract<ProcessEvent, { end: unknown }>;

const FIRST_PID = 1000;
/** After the process exits, how long its pipes may still deliver output (a child left holding them open must not delay the end forever). */
const DRAIN_AFTER_EXIT_MS = 1000;

export class EnvdProcess {
  readonly pid: number;
  readonly tag: string | undefined;
  readonly config: ProcessConfig;
  readonly #listeners = new Set<(event: ProcessEvent) => void>();
  readonly #pipes: PodProcess | undefined;
  readonly #pty: PtySession | undefined;
  #end: EndEvent | undefined;
  readonly ended: Promise<EndEvent>;

  constructor(pid: number, tag: string | undefined, config: ProcessConfig, io: { pipes: PodProcess } | { pty: PtySession }) {
    this.pid = pid;
    this.tag = tag;
    this.config = config;
    if ('pipes' in io) {
      this.#pipes = io.pipes;
      this.ended = this.#followPipes(io.pipes);
    } else {
      this.#pty = io.pty;
      this.ended = this.#followPty(io.pty);
    }
  }

  get isPty(): boolean {
    return this.#pty !== undefined;
  }

  /** Receives every later event until the end event (included); returns the detach function. */
  attach(listener: (event: ProcessEvent) => void): () => void {
    if (this.#end !== undefined) {
      listener(this.#end);
      return () => undefined;
    }
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  async writeStdin(bytes: Buffer): Promise<void> {
    const stdin = this.#pipes?.stdin;
    if (stdin === undefined) throw new Error(`process ${this.pid} is a pty: send input as pty`);
    if (!stdin.writable) throw new Error(`stdin of process ${this.pid} is closed`);
    await new Promise<void>((resolve, reject) => stdin.write(bytes, (err) => (err ? reject(err) : resolve())));
  }

  async writePty(bytes: Buffer): Promise<void> {
    if (this.#pty === undefined) throw new Error(`process ${this.pid} has no pty: send input as stdin`);
    await this.#pty.write(bytes);
  }

  closeStdin(): void {
    if (this.#pipes === undefined) throw new Error(`process ${this.pid} is a pty: it has no stdin to close`);
    this.#pipes.stdin.end();
  }

  resize(cols: number, rows: number): void {
    if (this.#pty === undefined) throw new Error(`process ${this.pid} has no pty to resize`);
    this.#pty.resize(cols, rows);
  }

  signal(signal: 'SIGTERM' | 'SIGKILL'): void {
    if (this.#pipes !== undefined) this.#pipes.kill(signal);
    // A terminal is hung up (SIGHUP) and then killed: the pty bridge owns the shell's group.
    else this.#pty?.close();
  }

  #emit(event: ProcessEvent): void {
    for (const listener of this.#listeners) listener(event);
  }

  async #followPipes(p: PodProcess): Promise<EndEvent> {
    const drained = Promise.all([this.#pump(p.stdout, 'stdout'), this.#pump(p.stderr, 'stderr')]);
    const { exitCode, signal } = await p.exited;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([drained, new Promise<void>((resolve) => (timer = setTimeout(resolve, DRAIN_AFTER_EXIT_MS)))]);
    clearTimeout(timer);
    p.stdout.destroy();
    p.stderr.destroy();
    return this.#finish(exitCode, signal);
  }

  async #pump(stream: NodeJS.ReadableStream, kind: 'stdout' | 'stderr'): Promise<void> {
    await new Promise<void>((resolve) => {
      stream.on('data', (chunk: Buffer) => this.#emit({ data: kind === 'stdout' ? { stdout: chunk.toString('base64') } : { stderr: chunk.toString('base64') } }));
      stream.on('end', resolve);
      stream.on('close', resolve);
      stream.on('error', () => resolve());
    });
  }

  async #followPty(pty: PtySession): Promise<EndEvent> {
    const reading = (async () => {
      for await (const chunk of pty.output) this.#emit({ data: { pty: Buffer.from(chunk).toString('base64') } });
    })().catch(() => undefined);
    const exitCode = await pty.exited;
    await reading;
    return this.#finish(exitCode, exitCode > 128 ? `signal ${exitCode - 128}` : undefined);
  }

  #finish(exitCode: number, signal: string | undefined): EndEvent {
    // envd's status is Go's ProcessState.String(): "exit status 1", "signal: killed".
    const status = signal === undefined ? `exit status ${exitCode}` : `signal: ${signal}`;
    const end: EndEvent = { end: { exitCode, exited: signal === undefined, status } };
    this.#end = end;
    this.#emit(end);
    this.#listeners.clear();
    return end;
  }
}

/** One sandbox's processes, by pid. */
export class ProcessTable {
  readonly #bySandbox = new Map<string, Map<number, EnvdProcess>>();
  readonly #nextPid = new Map<string, number>();

  /** Registers a process made by `make` under a new pid; it leaves the table when it ends. */
  add(sandboxId: string, make: (pid: number) => EnvdProcess): EnvdProcess {
    const pid = this.#nextPid.get(sandboxId) ?? FIRST_PID;
    this.#nextPid.set(sandboxId, pid + 1);
    const proc = make(pid);
    let procs = this.#bySandbox.get(sandboxId);
    if (procs === undefined) this.#bySandbox.set(sandboxId, (procs = new Map<number, EnvdProcess>()));
    procs.set(pid, proc);
    void proc.ended.then(() => {
      procs.delete(pid);
      if (procs.size === 0 && this.#bySandbox.get(sandboxId) === procs) this.#bySandbox.delete(sandboxId);
    });
    return proc;
  }

  /** Forgets a sandbox whose pod is gone: its numbering starts again at FIRST_PID. */
  forget(sandboxId: string): void {
    this.#nextPid.delete(sandboxId);
  }

  list(sandboxId: string): EnvdProcess[] {
    return [...(this.#bySandbox.get(sandboxId)?.values() ?? [])];
  }

  find(sandboxId: string, selector: { pid?: number; tag?: string }): EnvdProcess | undefined {
    const procs = this.#bySandbox.get(sandboxId);
    if (procs === undefined) return undefined;
    if (selector.pid !== undefined) return procs.get(selector.pid);
    for (const p of procs.values()) if (p.tag === selector.tag) return p;
    return undefined;
  }
}
