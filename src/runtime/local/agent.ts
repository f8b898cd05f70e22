// The host's side of asb-init's agent: exec, spawn and terminals over one TCP connection per
// process to the agent in the pod's network namespace (agent-link.ts is the wire; agent-init.ts
// how asb-init is started with it). Processes started this way are children of the container's
// init, so a checkpoint keeps them (runc exec's and runsc exec's are outside that tree: asb-init.c's
// header). An exec of `true` takes 1.2 ms on runc and 9.5 ms under gVisor (p50 of 50,
// .scratch-style probe of 2026-11-29), against ~30 ms for `runc exec` and ~210 ms for `runsc exec`
// (test/oci-runsc.test.ts prints it).
import { constants } from 'node:os';
import { PassThrough } from 'node:stream';
import { AsbError } from '../../errors.ts';
import { CappedBuffer, DEFAULT_MAX_OUTPUT } from '../capped-buffer.ts';
import type { ExecRequest, ExecResult, PodProcess, PtyOptions, PtySession, SpawnRequest } from '../runtime.ts';
import { AgentStream, frame, type AgentLink, type AgentRequest } from './agent-link.ts';

export function agentExec(link: AgentLink, req: AgentRequest, opts: Pick<ExecRequest, 'stdin' | 'timeoutMs' | 'maxOutputBytes'>): Promise<ExecResult> {
  const max = opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
  const stdout = new CappedBuffer(max);
  const stderr = new CappedBuffer(max);
  let timedOut = false;
  let timer: NodeJS.Timeout | undefined;
  return new Promise<ExecResult>((resolve, reject) => {
    const stream: AgentStream = new AgentStream(link, {
      started: () => {
        if (opts.timeoutMs !== undefined) {
          timer = setTimeout(() => {
            timedOut = true;
            stream.send(frame('K', Uint8Array.of(constants.signals.SIGKILL)));
          }, opts.timeoutMs);
        }
      },
      failed: (message) => {
        stderr.push(Buffer.from(`${message}\n`));
      },
      stdout: (b) => stdout.push(b),
      stderr: (b) => stderr.push(b),
      ended: (end) => {
        clearTimeout(timer);
        const result: ExecResult = { exitCode: end.exitCode, stdout: stdout.bytes(), stderr: stderr.bytes(), timedOut, truncated: stdout.truncated || stderr.truncated };
        if (end.signal !== undefined) result.signal = end.signal;
        resolve(result);
      },
    });
    const opening = stream.open(req);
    // Queued before the connection is up, so they go out in the request's own write: sent after
    // it, they could reach an agent that has run the command and closed already (agent-link.ts).
    if (opts.stdin !== undefined) stream.send(frame('I', typeof opts.stdin === 'string' ? Buffer.from(opts.stdin) : opts.stdin));
    stream.send(frame('E'));
    opening.catch(reject);
  });
}

export function agentSpawn(link: AgentLink, req: AgentRequest): Promise<PodProcess> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let resolveEnd: (end: { exitCode: number; signal?: string }) => void = () => undefined;
  const exited = new Promise<{ exitCode: number; signal?: string }>((resolve) => (resolveEnd = resolve));
  return new Promise<PodProcess>((resolve, reject) => {
    let stream: AgentStream | undefined = undefined;
    // Writes go out as frames; end() is the end of stdin. Backpressure is the socket's.
    const stdin = new PassThrough();
    stdin.on('data', (chunk: Buffer) => stream?.send(frame('I', chunk)));
    stdin.on('end', () => stream?.send(frame('E')));
    stdin.pause();
    const handle: PodProcess = {
      stdin, stdout, stderr, exited,
      kill: (signal) => stream?.send(frame('K', Uint8Array.of(constants.signals[signal]))),
    };
    stream = new AgentStream(link, {
      started: () => {
        stdin.resume();
        resolve(handle);
      },
      failed: (message) => {
        // As runc exec did: the process "ran" and said why it could not start, with 255.
        stderr.write(`${message}\n`);
        resolve(handle);
      },
      stdout: (b) => {
        if (!stdout.write(b)) stream?.pause();
      },
      stderr: (b) => {
        if (!stderr.write(b)) stream?.pause();
      },
      ended: (end) => {
        stdout.end();
        stderr.end();
        resolveEnd(end.signal === undefined ? { exitCode: end.exitCode } : { exitCode: end.exitCode, signal: end.signal });
        // Ended before the agent named it: the pod ended under the request (its process may have
        // killed it), and `exited` says how. Without this the spawn never settled.
        resolve(handle);
      },
    });
    const flow = (): void => {
      if (stdout.writableLength === 0 && stderr.writableLength === 0) stream.resume();
    };
    stdout.on('drain', flow);
    stderr.on('drain', flow);
    stream.open(req).catch(reject);
  });
}

/** After close(): how long a hung-up terminal has before it is killed (as the runc terminal did). */
const HANGUP_GRACE_MS = 2000;
/** Terminal output held for a reader that does not read: beyond it the agent stops reading the terminal. */
const PTY_HIGH_WATER = 256 * 1024;

export function agentPty(link: AgentLink, req: AgentRequest & { pty: { cols: number; rows: number } }, id: string): Promise<PtySession> {
  const chunks: Uint8Array[] = [];
  let held = 0;
  let wake: (() => void) | undefined;
  let ended = false;
  let resolveExit: (code: number) => void = () => undefined;
  const exited = new Promise<number>((resolve) => (resolveExit = resolve));
  return new Promise<PtySession>((resolve, reject) => {
    let closed = false;
    const stream = new AgentStream(link, {
      started: () => resolve(session),
      failed: (message) => reject(new AsbError('BadRequest', `cannot start the terminal's command in container ${id}: ${message}`, { fields: [{ field: 'command', message }] })),
      stdout: (b) => {
        chunks.push(new Uint8Array(b));
        held += b.length;
        if (held > PTY_HIGH_WATER) stream.pause();
        wake?.();
      },
      stderr: () => undefined,
      ended: (end) => {
        ended = true;
        wake?.();
        resolveExit(end.exitCode);
        // Ended before the agent named it (the pod ended under the request): never settled before.
        reject(new AsbError('SandboxNotRunning', `container ${id} ended before the terminal's command started`));
      },
    });
    const output = (async function* () {
      for (;;) {
        const next = chunks.shift();
        if (next !== undefined) {
          held -= next.length;
          if (held <= PTY_HIGH_WATER / 2) stream.resume();
          yield next;
          continue;
        }
        if (ended) return;
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    })();
    const session: PtySession = {
      write: (data) => {
        stream.send(frame('I', typeof data === 'string' ? Buffer.from(data, 'utf8') : data));
        return Promise.resolve();
      },
      resize(cols, rows) {
        const size = Buffer.alloc(4);
        size.writeUInt16BE(Math.max(1, Math.min(cols, 65535)), 0);
        size.writeUInt16BE(Math.max(1, Math.min(rows, 65535)), 2);
        stream.send(frame('W', size));
      },
      output,
      exited,
      close() {
        if (closed) return;
        closed = true;
        stream.send(frame('K', Uint8Array.of(constants.signals.SIGHUP)));
        const timer = setTimeout(() => stream.send(frame('K', Uint8Array.of(constants.signals.SIGKILL))), HANGUP_GRACE_MS);
        timer.unref();
        void exited.then(() => clearTimeout(timer));
      },
    };
    stream.open(req).catch(reject);
  });
}

/** The request for a PodProcess-style call: who runs it (the pod's user unless `user`), where and with what. */
export function agentRequest(target: ProcessOwner & { env: Record<string, string>; cwd: string }, req: SpawnRequest | PtyOptions, pty?: { cols: number; rows: number }): AgentRequest {
  const { uid, gid, groups } = processUser(target, req);
  const env: Record<string, string> = { ...target.env, ...req.env };
  // A user other than the pod's gets its own HOME unless the caller set one (as runc exec did).
  if (uid !== target.uid && req.env?.HOME === undefined) env.HOME = uid === 0 ? '/root' : '/';
  return {
    uid, gid, ...(groups.length === 0 ? {} : { groups }), cwd: req.cwd ?? target.cwd,
    command: req.command ?? [],
    env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
    ...(pty === undefined ? {} : { pty }),
  };
}

/** The pod's own user: who its processes are unless a request names another. */
export interface ProcessOwner {
  uid: number;
  gid: number;
  /** The pod's supplementary groups (its image user's, from /etc/group). */
  groups?: readonly number[];
}

/**
 * Who a started process is: the request's uid, group and groups; the pod's group and groups for the
 * pod's own uid when the request names none; else the uid as its gid and no groups.
 */
export function processUser(owner: ProcessOwner, req: { user?: number; group?: number; groups?: readonly number[] }): { uid: number; gid: number; groups: readonly number[] } {
  const uid = req.user ?? owner.uid;
  const own = uid === owner.uid && req.group === undefined;
  return { uid, gid: req.group ?? (own ? owner.gid : uid), groups: req.groups ?? (own ? owner.groups ?? [] : []) };
}
