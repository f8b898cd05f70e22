// A native child process (Envoy, the image registry) started and watched the same way: it dies
// with us even if we are SIGKILLed (setpriv --pdeathsig), writes its output to a log file the
// caller opened, and reports an exit nobody asked for; stop() is SIGTERM, then SIGKILL.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync } from 'node:fs';
import type { Clock } from './clock.ts';
import type { Logger } from './log.ts';

const SETPRIV = '/usr/bin/setpriv';

/**
 * The command and arguments that run `binary` so that it gets `signal` when this process dies
 * (setpriv --pdeathsig), or `binary` as it is where setpriv is missing.
 */
export function withPdeathsig(binary: string, args: readonly string[], signal: 'SIGKILL' | 'SIGTERM'): [string, string[]] {
  return existsSync(SETPRIV) ? [SETPRIV, ['--pdeathsig', signal, '--', binary, ...args]] : [binary, [...args]];
}

export interface WatchedProcessOptions {
  /** What it is, for log lines ("envoy", "registry"). */
  name: string;
  binary: string;
  args: readonly string[];
  /** stdout and stderr go here; closed once the child has it. */
  logFd: number;
  logPath: string;
  log: Logger;
  /** Default: ours. */
  env?: NodeJS.ProcessEnv;
  /** In a process group of its own, so a signal to ours does not reach it (make up stops it in order). */
  ownGroup?: boolean;
  /** Called when it exits without being asked to. */
  onUnexpectedExit?: ((code: number | null, signal: NodeJS.Signals | null) => void) | undefined;
}

export class WatchedProcess {
  readonly child: ChildProcess;
  /** Resolves when it has exited, or at once when it could not be spawned. */
  readonly exited: Promise<void>;
  #stopping = false;
  #spawnError: Error | undefined;

  constructor(opts: WatchedProcessOptions) {
    const [command, argv] = withPdeathsig(opts.binary, opts.args, 'SIGKILL');
    try {
      this.child = spawn(command, argv, { stdio: ['ignore', opts.logFd, opts.logFd], detached: opts.ownGroup === true, ...(opts.env === undefined ? {} : { env: opts.env }) });
    } finally {
      closeSync(opts.logFd);
    }
    const child = this.child;
    this.exited = new Promise<void>((resolveExit) => {
      child.once('exit', (code, signal) => {
        if (!this.#stopping) {
          opts.log.warn({ code, signal, log: opts.logPath }, `${opts.name} exited unexpectedly`);
          opts.onUnexpectedExit?.(code, signal);
        }
        resolveExit();
      });
      // A process that never started emits 'error' and no 'exit'.
      child.once('error', (err) => {
        this.#spawnError = err;
        opts.log.error({ err }, `${opts.name} could not be spawned`);
        if (child.pid === undefined) resolveExit();
      });
    });
  }

  /** Why it could not be spawned, if it could not. */
  get spawnError(): Error | undefined {
    return this.#spawnError;
  }

  /** Its pid while it runs. */
  get pid(): number | undefined {
    return this.child.exitCode === null && this.child.signalCode === null ? this.child.pid : undefined;
  }

  /** Sends `signal` as asked (its exit is then not unexpected); resolves when it has exited. */
  kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    if (this.pid === undefined) return this.exited;
    this.#stopping = true;
    this.child.kill(signal);
    return this.exited;
  }

  /** SIGTERM, then SIGKILL after `timeoutMs` (logged); resolves when it has exited. */
  async stop(clock: Clock, timeoutMs: number, log: Logger): Promise<void> {
    if (this.pid === undefined) return this.exited;
    this.#stopping = true;
    this.child.kill('SIGTERM');
    const timer = clock.after(timeoutMs, () => {
      log.warn({ pid: this.child.pid }, 'did not stop after SIGTERM: killing it');
      this.child.kill('SIGKILL');
    });
    await this.exited;
    timer.cancel();
  }
}
