// `asb shell`: an interactive terminal in a sandbox over the terminal WebSocket
// (src/terminal/contract.ts). On a TTY the user's terminal goes raw (every key, Ctrl-C included,
// goes to the sandbox) and its size follows SIGWINCH; with stdin not a TTY (a pipe, a file) the
// input is typed into the shell as is and, when it ends, an EOF (Ctrl-D) follows. The exit status
// is the remote program's.
//
// Backpressure both ways: remote output is written to stdout and the socket is paused while
// stdout has not drained; stdin is paused while the socket holds more than the contract's high
// water mark, so `cat big-file | asb shell ID` never buffers the file in memory.
import WebSocket from 'ws';
import { ApiError, ApiUnreachableError } from '../client/api-client.ts';
import type { FieldProblem } from '../errors.ts';
import { TERMINAL_CLOSE, TERMINAL_HIGH_WATER_BYTES, TERMINAL_PATH_SUFFIX, type TerminalClientControl, type TerminalServerControl } from '../terminal/contract.ts';
import { parseCommandArgs, UsageError } from './args.ts';
import { EXIT, type CliIo, type Command } from './command.ts';
import { resolveClientConfig } from './env-file.ts';

const EOF_KEY = '\x04';
const DEFAULT_SIZE = { cols: 80, rows: 24 } as const;
const MAX_DIMENSION = 1000;

/** What `asb shell` needs of stdin beyond an async iterable: the events and controls of a Node Readable (a TTY may add raw mode). */
interface ShellInput {
  isTTY?: boolean;
  setRawMode?: (raw: boolean) => unknown;
  on(event: 'data', fn: (chunk: Buffer | string) => void): unknown;
  on(event: 'end', fn: () => void): unknown;
  removeAllListeners(event: string): unknown;
  pause(): unknown;
  resume(): unknown;
}

interface ShellOutput {
  write(chunk: Uint8Array): unknown;
  once?: (event: 'drain', fn: () => void) => unknown;
  columns?: number;
  rows?: number;
  isTTY?: boolean;
}

export const shellCommand: Command = {
  name: 'shell',
  summary: 'Open a terminal in a sandbox',
  usage: 'asb shell <id> [-- <command> [args...]]',
  help: `Opens an interactive terminal (the sandbox's bash, or the command after --) and exits with
its exit status. On a terminal, keys go straight to the sandbox (Ctrl-C interrupts the remote
program; type exit or Ctrl-D to leave) and window size changes follow. When stdin is not a
terminal its bytes are typed into the shell, then Ctrl-D: echo 'make test; exit $?' | asb shell ID

Examples:
  asb shell loc1abc
  asb shell loc1abc -- python3`,
  options: {},
  async run(argv, ctx) {
    const dashes = argv.indexOf('--');
    const ours = dashes === -1 ? argv : argv.slice(0, dashes);
    const { positionals, global } = parseCommandArgs(ours, this.options, this.usage);
    const [id, ...rest] = positionals;
    if (id === undefined) throw new UsageError('missing sandbox id', this.usage);
    if (rest.length > 0) throw new UsageError(`unexpected argument "${rest[0] ?? ''}" (put the command after --)`, this.usage);
    const command = dashes === -1 ? [] : argv.slice(dashes + 1);
    const config = resolveClientConfig({ flags: global, env: ctx.io.env, cwd: ctx.io.cwd });
    const stdin = ctx.io.stdin as unknown as ShellInput;
    const stdout = ctx.io.stdout as ShellOutput;
    const raw = stdin.isTTY === true && typeof stdin.setRawMode === 'function';
    const size = sizeOf(stdout);
    const query = new URLSearchParams({ cols: String(size.cols), rows: String(size.rows) });
    for (const arg of command) query.append('command', arg);
    const url = `${config.url.replace(/^http/, 'ws')}/v1/sandboxes/${encodeURIComponent(id)}${TERMINAL_PATH_SUFFIX}?${query.toString()}`;
    const ws = await connect(url, config.url, config.key);
    return session(ws, ctx.io, stdin, stdout, raw);
  },
};

function sizeOf(out: ShellOutput): { cols: number; rows: number } {
  const clamp = (n: number | undefined, fallback: number): number => (n !== undefined && Number.isInteger(n) && n >= 1 ? Math.min(n, MAX_DIMENSION) : fallback);
  if (out.isTTY !== true) return { ...DEFAULT_SIZE };
  return { cols: clamp(out.columns, DEFAULT_SIZE.cols), rows: clamp(out.rows, DEFAULT_SIZE.rows) };
}

/** Opens the WebSocket; a refusal becomes the ApiError the server described, no answer an ApiUnreachableError. */
function connect(url: string, apiUrl: string, key: string | undefined): Promise<WebSocket> {
  const ws = new WebSocket(url, { headers: key === undefined ? {} : { authorization: `Bearer ${key}` } });
  return new Promise((resolve, reject) => {
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => reject(refusal(res.statusCode ?? 0, body)));
      res.on('error', () => reject(refusal(res.statusCode ?? 0, body)));
    });
    ws.once('error', (err) => reject(new ApiUnreachableError(apiUrl, err)));
    ws.once('open', () => {
      ws.removeAllListeners('error');
      // Paused until session() listens: a program that ends at once sends its output, exit code
      // and close right behind the upgrade, and a message with no listener yet would be lost.
      ws.pause();
      resolve(ws);
    });
  });
}

function refusal(status: number, body: string): ApiError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    parsed = undefined;
  }
  const p = (typeof parsed === 'object' && parsed !== null ? parsed : {}) as Record<string, unknown>;
  const detail = typeof p.detail === 'string' ? p.detail : `HTTP ${status}${body.trim() === '' ? '' : `: ${body.trim().slice(0, 200)}`}`;
  const fields = Array.isArray(p.fields) ? (p.fields as FieldProblem[]) : [];
  return new ApiError(status, typeof p.code === 'string' ? p.code : '', detail, fields);
}

function session(ws: WebSocket, io: CliIo, stdin: ShellInput, stdout: ShellOutput, raw: boolean): Promise<number> {
  return new Promise((resolve) => {
    let exitCode: number | undefined;
    const control = (msg: TerminalClientControl): void => ws.send(JSON.stringify(msg));
    const onResize = (): void => {
      if (ws.readyState === WebSocket.OPEN) control({ type: 'resize', ...sizeOf(stdout) });
    };

    ws.on('message', (data, isBinary) => {
      const bytes = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
      if (isBinary) {
        if (stdout.write(bytes) === false && stdout.once !== undefined) {
          ws.pause();
          stdout.once('drain', () => ws.resume());
        }
        return;
      }
      let msg: TerminalServerControl | undefined;
      try {
        msg = JSON.parse(bytes.toString('utf8')) as TerminalServerControl;
      } catch {
        msg = undefined;
      }
      if (msg?.type === 'exit') exitCode = msg.code;
    });

    ws.resume();

    stdin.on('data', (chunk) => {
      if (ws.readyState !== WebSocket.OPEN) return;
      const bytes = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
      if (ws.bufferedAmount + bytes.byteLength <= TERMINAL_HIGH_WATER_BYTES) {
        ws.send(bytes, { binary: true });
        return;
      }
      stdin.pause();
      ws.send(bytes, { binary: true }, () => stdin.resume());
    });
    stdin.on('end', () => {
      // Piped input ran out: Ctrl-D, as a user would type to leave, so a shell that was not told
      // to exit does not wait forever.
      if (ws.readyState === WebSocket.OPEN) ws.send(Buffer.from(EOF_KEY), { binary: true });
    });
    if (raw) {
      stdin.setRawMode?.(true);
      process.on('SIGWINCH', onResize);
    }
    stdin.resume();

    ws.on('error', (err) => io.stderr.write(`asb: terminal connection failed: ${err.message}\n`));
    ws.on('close', (code, reason) => {
      if (raw) {
        stdin.setRawMode?.(false);
        process.off('SIGWINCH', onResize);
      }
      stdin.removeAllListeners('data');
      stdin.removeAllListeners('end');
      stdin.pause();
      if (exitCode !== undefined) {
        resolve(exitCode >= 0 && exitCode <= 255 ? exitCode : EXIT.failed);
        return;
      }
      io.stderr.write(`${raw ? '\r\n' : ''}asb: terminal closed: ${closeText(code, reason.toString('utf8'))}\n`);
      resolve(EXIT.failed);
    });
  });
}

function closeText(code: number, reason: string): string {
  const known: Record<number, string> = {
    [TERMINAL_CLOSE.goingAway]: 'the worker is shutting down',
    [TERMINAL_CLOSE.sandboxGone]: 'the sandbox stopped (hibernated or deleted)',
    [TERMINAL_CLOSE.idle]: 'idle timeout',
    [TERMINAL_CLOSE.keyRevoked]: 'the API key that opened it was revoked',
    [TERMINAL_CLOSE.protocolError]: 'protocol error',
    [TERMINAL_CLOSE.internal]: 'the terminal failed on the worker',
  };
  const text = known[code] ?? (reason === '' ? 'the connection ended without an exit status' : reason);
  return `${text} (code ${code}${reason === '' || known[code] === undefined ? '' : `: ${reason}`})`;
}
