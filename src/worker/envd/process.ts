// process.Process: Start and Connect (streams of ProcessEvent), List, SendInput, StreamInput (a
// client stream of input: the Python SDK's stream_input), SendSignal, Update (pty resize) and
// CloseStdin, on the runtime's spawn (pipes) and openPty (terminals).
//
// A Start stream's Connect-Timeout-Ms is the command's timeout (the SDK's timeoutMs): at the
// deadline the process is killed and the stream ends with deadline_exceeded. A client that just
// goes away (the SDK's disconnect(), a background command) leaves the process running; Connect
// re-attaches to it by pid or tag.
import { AsbError } from '../../errors.ts';
import type { PodRuntime } from '../../runtime/runtime.ts';
import { checkSpawnInput, spawnFailure } from '../input.ts';
import { ConnectError, record, type ServerStream } from './connect.ts';
import { userPath } from './paths.ts';
import { EnvdProcess, type ProcessConfig, type ProcessEvent, type ProcessTable } from './processes.ts';

/** Who calls: the sandbox, the uid to run as (undefined: the pod's user). */
export interface ProcessCall {
  runtime: PodRuntime;
  table: ProcessTable;
  id: string;
  uid: number | undefined;
  /** The name of a user other than the default one (whose HOME and USER come with the pod's environment). */
  user: string | undefined;
  /** The user's home, for a relative cwd (paths.ts) and a named user's HOME. */
  home: () => Promise<string>;
  /** The sandbox's environment (E2B create's envVars); a process's own envs override it. */
  envs: Record<string, string>;
}

function stringMap(value: unknown, what: string): Record<string, string> {
  if (value === undefined || value === null) return {};
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(record(value, what))) {
    if (typeof v !== 'string') throw new AsbError('BadRequest', `${what}.${k} must be a string`);
    out[k] = v;
  }
  return out;
}

function configOf(value: unknown): ProcessConfig {
  const p = record(value, 'process');
  if (typeof p.cmd !== 'string' || p.cmd === '') throw new AsbError('BadRequest', 'process.cmd is required: the program to run, e.g. "/bin/bash"');
  const args = p.args ?? [];
  if (!Array.isArray(args) || !args.every((a): a is string => typeof a === 'string')) throw new AsbError('BadRequest', 'process.args must be an array of strings');
  const config: ProcessConfig = { cmd: p.cmd, args, envs: stringMap(p.envs, 'process.envs') };
  // Empty: the pod's working dir, as envd's default workdir. Otherwise resolved in start().
  if (p.cwd !== undefined && p.cwd !== null && p.cwd !== '') {
    if (typeof p.cwd !== 'string') throw new AsbError('BadRequest', `process.cwd must be a path, got ${JSON.stringify(p.cwd)}`);
    config.cwd = p.cwd;
  }
  return config;
}

function sizeOf(pty: unknown): { cols: number; rows: number } {
  const size = record(record(pty, 'pty').size ?? {}, 'pty.size');
  const dim = (v: unknown, name: string): number => {
    if (v === undefined) return name === 'cols' ? 80 : 24;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 0xffff) throw new AsbError('BadRequest', `pty.size.${name} must be 1-65535, got ${JSON.stringify(v)}`);
    return v;
  };
  return { cols: dim(size.cols, 'cols'), rows: dim(size.rows, 'rows') };
}

function selectorOf(msg: Record<string, unknown>): { pid?: number; tag?: string } {
  const s = record(msg.process, 'process (the selector: {pid} or {tag})');
  if (s.pid !== undefined) {
    const pid = typeof s.pid === 'string' ? Number(s.pid) : s.pid;
    if (typeof pid !== 'number' || !Number.isInteger(pid) || pid < 0) throw new AsbError('BadRequest', `process.pid must be a whole number, got ${JSON.stringify(s.pid)}`);
    return { pid };
  }
  if (typeof s.tag === 'string') return { tag: s.tag };
  throw new AsbError('BadRequest', 'process must name a pid or a tag');
}

function findProcess(call: ProcessCall, msg: Record<string, unknown>): EnvdProcess {
  const selector = selectorOf(msg);
  const proc = call.table.find(call.id, selector);
  if (proc === undefined) throw new ConnectError('not_found', `process ${selector.pid !== undefined ? `with pid ${selector.pid}` : `tagged "${selector.tag ?? ''}"`} not found in sandbox ${call.id}`);
  return proc;
}

function bytesOf(value: unknown, what: string): Buffer {
  if (typeof value !== 'string') throw new AsbError('BadRequest', `${what} must be base64 bytes`);
  return Buffer.from(value, 'base64');
}

/** Sends the process's events on the stream until it ends, the deadline passes (kill if `killOnDeadline`) or the client leaves. */
async function follow(proc: EnvdProcess, stream: ServerStream, killOnDeadline: boolean): Promise<void> {
  stream.send({ event: { start: { pid: proc.pid } } });
  const detach = proc.attach((event: ProcessEvent) => {
    stream.send({ event });
    if ('end' in event) stream.end();
  });
  const why = await stream.closed;
  detach();
  if (why === 'deadline' && killOnDeadline) proc.signal('SIGKILL');
}

export async function start(call: ProcessCall, message: unknown, stream: ServerStream): Promise<void> {
  const msg = record(message, 'the request');
  const config = configOf(msg.process);
  const tag = typeof msg.tag === 'string' && msg.tag !== '' ? msg.tag : undefined;
  const user = call.uid === undefined ? {} : { user: call.uid };
  const command = [config.cmd, ...config.args];
  // envd gives a process its user's HOME, USER and LOGNAME, under the sandbox's and the request's
  // envs: `~` in a command as root is /root, as in the files API. The default user's are the pod's own.
  const identity = call.uid === undefined || call.user === undefined ? {} : { HOME: await call.home(), USER: call.user, LOGNAME: call.user };
  const env = { ...identity, ...call.envs, ...config.envs };
  // Refused here with the field named, not by spawn with Node's message as an internal error.
  checkSpawnInput({
    argv: { field: 'process.args', args: [{ field: 'process.cmd', value: config.cmd }, ...config.args.map((value, i) => ({ field: `process.args[${i}]`, value }))] },
    env: { field: 'process.envs', vars: env },
    ...(config.cwd === undefined ? {} : { cwd: { field: 'process.cwd', value: config.cwd } }),
  });
  // A relative cwd or ~ is the user's home, as under envd (paths.ts).
  const dir = config.cwd === undefined ? undefined : await userPath(call.home, config.cwd, 'process.cwd');
  const cwd = dir === undefined ? {} : { cwd: dir };
  const asInput = (err: unknown): never => {
    throw spawnFailure(err, 'process.args');
  };
  let proc: EnvdProcess;
  if (msg.pty !== undefined && msg.pty !== null) {
    const size = sizeOf(msg.pty);
    const pty = await call.runtime.openPty(call.id, { command, cols: size.cols, rows: size.rows, env, ...cwd, ...user }).catch(asInput);
    proc = call.table.add(call.id, (pid) => new EnvdProcess(pid, tag, config, { pty }));
  } else {
    const pipes = await call.runtime.spawn(call.id, { command, env, ...cwd, ...user }).catch(asInput);
    proc = call.table.add(call.id, (pid) => new EnvdProcess(pid, tag, config, { pipes }));
    // Without stdin:true the process reads end-of-file at once, as under envd (SDK ≥ envd 0.3.0).
    if (msg.stdin !== true) proc.closeStdin();
  }
  await follow(proc, stream, true);
}

export async function connect(call: ProcessCall, message: unknown, stream: ServerStream): Promise<void> {
  await follow(findProcess(call, record(message, 'the request')), stream, false);
}

function list(call: ProcessCall): unknown {
  return {
    processes: call.table.list(call.id).map((p) => ({ pid: p.pid, ...(p.tag === undefined ? {} : { tag: p.tag }), config: p.config })),
  };
}

async function sendInput(call: ProcessCall, message: unknown): Promise<unknown> {
  const msg = record(message, 'the request');
  await writeInput(findProcess(call, msg), msg.input);
  return {};
}

async function writeInput(proc: EnvdProcess, value: unknown): Promise<void> {
  const input = record(value, 'input');
  try {
    if (input.pty !== undefined) await proc.writePty(bytesOf(input.pty, 'input.pty'));
    else if (input.stdin !== undefined) await proc.writeStdin(bytesOf(input.stdin, 'input.stdin'));
    else throw new AsbError('BadRequest', 'input must carry stdin or pty bytes');
  } catch (err) {
    if (err instanceof AsbError) throw err;
    throw new ConnectError('failed_precondition', (err as Error).message);
  }
}

/**
 * StreamInput: `{start:{process}}` first, then `{data:{input}}` and `{keepalive:{}}` in any number;
 * each input is written (waiting on the pipe, so a slow reader slows the sender) before the next
 * message is read. Answers `{}` when the client ends its stream.
 */
export async function streamInput(call: ProcessCall, messages: AsyncIterable<unknown>): Promise<unknown> {
  let proc: EnvdProcess | undefined;
  for await (const message of messages) {
    const msg = record(message, 'each StreamInput message');
    if (proc === undefined) {
      if (msg.start === undefined || msg.start === null) throw new AsbError('BadRequest', 'the first StreamInput message must be {start: {process: {pid}}}');
      proc = findProcess(call, record(msg.start, 'start'));
    } else if (msg.data !== undefined && msg.data !== null) {
      await writeInput(proc, record(msg.data, 'data').input);
    } else if (msg.keepalive === undefined) {
      throw new AsbError('BadRequest', 'after start, StreamInput messages are {data: {input}} or {keepalive: {}}');
    }
  }
  if (proc === undefined) throw new AsbError('BadRequest', 'StreamInput ended before its {start: {process}} message');
  return {};
}

const SIGNALS: Record<string, 'SIGTERM' | 'SIGKILL'> = { SIGNAL_SIGTERM: 'SIGTERM', SIGNAL_SIGKILL: 'SIGKILL', 15: 'SIGTERM', 9: 'SIGKILL' };

function sendSignal(call: ProcessCall, message: unknown): unknown {
  const msg = record(message, 'the request');
  const proc = findProcess(call, msg);
  const signal = SIGNALS[String(msg.signal)];
  if (signal === undefined) throw new AsbError('BadRequest', `signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL, got ${JSON.stringify(msg.signal)}`);
  proc.signal(signal);
  return {};
}

function update(call: ProcessCall, message: unknown): unknown {
  const msg = record(message, 'the request');
  const proc = findProcess(call, msg);
  if (msg.pty === undefined || msg.pty === null) return {};
  if (!proc.isPty) throw new ConnectError('failed_precondition', `process ${proc.pid} has no pty to resize`);
  const size = sizeOf(msg.pty);
  proc.resize(size.cols, size.rows);
  return {};
}

function closeStdin(call: ProcessCall, message: unknown): unknown {
  const proc = findProcess(call, record(message, 'the request'));
  if (proc.isPty) throw new ConnectError('failed_precondition', `process ${proc.pid} is a pty: it has no stdin to close (send Ctrl-D as pty input)`);
  proc.closeStdin();
  return {};
}

export const PROCESS_UNARY: Readonly<Record<string, (call: ProcessCall, msg: unknown) => Promise<unknown>>> = {
  List: (call) => Promise.resolve(list(call)),
  SendInput: sendInput,
  SendSignal: (call, msg) => Promise.resolve(sendSignal(call, msg)),
  Update: (call, msg) => Promise.resolve(update(call, msg)),
  CloseStdin: (call, msg) => Promise.resolve(closeStdin(call, msg)),
};

export const PROCESS_STREAMS: Readonly<Record<string, (call: ProcessCall, msg: unknown, stream: ServerStream) => Promise<void>>> = {
  Start: start,
  Connect: connect,
};
