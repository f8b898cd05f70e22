// A terminal client for tests (src/terminal/contract.ts): opens the WebSocket, collects output as
// text, and reports the exit frame and close code. Refusals before the upgrade reject with the
// HTTP status and problem body.
import WebSocket from 'ws';
import type { TerminalServerControl } from '../../src/terminal/contract.ts';

export interface TerminalOpen {
  /** API key for the Authorization header. */
  key?: string;
  token?: string;
  cols?: number;
  rows?: number;
  command?: string[];
}

export interface Terminal {
  ws: WebSocket;
  ready: TerminalServerControl | undefined;
  /** Everything the PTY printed so far. */
  output(): string;
  /** Resolves once the output (since `from`) contains the text; rejects after timeoutMs. */
  waitFor(text: string | RegExp, timeoutMs?: number, from?: number): Promise<string>;
  send(text: string): void;
  resize(cols: number, rows: number): void;
  /** The exit frame's code (undefined when none came) and the close code. */
  closed: Promise<{ exitCode: number | undefined; closeCode: number; reason: string }>;
}

export class Refused extends Error {
  readonly status: number;
  readonly body: string;
  constructor(status: number, body: string) {
    super(`terminal refused with ${status}: ${body}`);
    this.status = status;
    this.body = body;
  }
}

export function openTerminal(apiUrl: string, id: string, opts: TerminalOpen): Promise<Terminal> {
  const q = new URLSearchParams();
  if (opts.cols !== undefined) q.set('cols', String(opts.cols));
  if (opts.rows !== undefined) q.set('rows', String(opts.rows));
  if (opts.token !== undefined) q.set('token', opts.token);
  for (const arg of opts.command ?? []) q.append('command', arg);
  const url = `${apiUrl.replace(/^http/, 'ws')}/v1/sandboxes/${id}/terminal?${q.toString()}`;
  const ws = new WebSocket(url, { headers: opts.key === undefined ? {} : { authorization: `Bearer ${opts.key}` } });
  let text = '';
  let exitCode: number | undefined;
  const waiters = new Set<() => void>();
  const term: Terminal = {
    ws,
    ready: undefined,
    output: () => text,
    waitFor(needle, timeoutMs = 20_000, from = 0) {
      return new Promise((resolve, reject) => {
        const check = (): boolean => {
          const seen = text.slice(from);
          if (typeof needle === 'string' ? seen.includes(needle) : needle.test(seen)) {
            waiters.delete(check);
            clearTimeout(timer);
            resolve(seen);
            return true;
          }
          return false;
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`terminal output never showed ${String(needle)}; saw ${JSON.stringify(text.slice(-500))}`));
        }, timeoutMs);
        if (!check()) waiters.add(check);
      });
    },
    send: (data) => ws.send(Buffer.from(data, 'utf8'), { binary: true }),
    resize: (cols, rows) => ws.send(JSON.stringify({ type: 'resize', cols, rows })),
    closed: new Promise((resolve) => ws.on('close', (closeCode, reason) => resolve({ exitCode, closeCode, reason: reason.toString() }))),
  };
  ws.on('message', (data, isBinary) => {
    const chunk = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
    if (isBinary) {
      text += chunk.toString('utf8');
      for (const check of [...waiters]) check();
      return;
    }
    const msg = JSON.parse(chunk.toString('utf8')) as TerminalServerControl;
    if (msg.type === 'exit') exitCode = msg.code;
    else term.ready = msg;
  });
  return new Promise((resolve, reject) => {
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => reject(new Refused(res.statusCode ?? 0, body)));
    });
    ws.once('error', reject);
    // The ready frame is the first message; wait for it so callers start from a live shell.
    ws.once('message', () => resolve(term));
  });
}
