// One terminal session in the page (src/terminal/contract.ts): a single-use terminal token from
// POST /v1/sandboxes/{id}/terminal-tokens (browsers cannot put a key on a WebSocket), then a
// WebSocket to the hub with ?token=, which the hub relays to the sandbox's worker. Keystrokes go
// out as binary frames, resizes as JSON text frames; output comes back binary, `ready` and
// `exit` as JSON text.
import { Terminal } from './vendor/xterm.mjs';
import { api } from './api.js';

const COLS = 100;
const ROWS = 24;
const encoder = new TextEncoder();

/** Human words for the contract's close codes. */
const CLOSE_REASONS = {
  1000: 'the shell exited',
  1001: 'the server is going away',
  1002: 'protocol error',
  1006: 'the connection was lost',
  1011: 'internal error at the worker',
  4001: 'the sandbox stopped',
  4002: 'idle for too long',
  4003: 'the API key was revoked',
};

export class TerminalSession {
  #term;
  #ws;
  #onStatus;

  constructor(container, onStatus) {
    this.#onStatus = onStatus;
    this.#term = new Terminal({ cols: COLS, rows: ROWS, convertEol: false, cursorBlink: true, fontFamily: 'ui-monospace, monospace' });
    this.#term.open(container);
  }

  async connect(sandboxId) {
    this.#onStatus(`asking for a terminal token for ${sandboxId}…`);
    const token = await api('POST', `/v1/sandboxes/${encodeURIComponent(sandboxId)}/terminal-tokens`, { json: {} });
    const url = new URL(token.path ?? `/v1/sandboxes/${encodeURIComponent(sandboxId)}/terminal`, location.href);
    url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    url.searchParams.set('token', token.token);
    url.searchParams.set('cols', String(this.#term.cols));
    url.searchParams.set('rows', String(this.#term.rows));
    const ws = new WebSocket(url);
    ws.binaryType = 'arraybuffer';
    this.#ws = ws;
    ws.addEventListener('open', () => {
      this.#onStatus(`connected to ${sandboxId}`);
      this.#term.focus();
    });
    ws.addEventListener('message', (event) => {
      if (typeof event.data !== 'string') {
        this.#term.write(new Uint8Array(event.data));
        return;
      }
      let msg;
      try {
        msg = JSON.parse(event.data);
      } catch {
        return;
      }
      if (msg.type === 'ready') this.#onStatus(`connected to ${msg.sandboxId} on cluster ${msg.cluster}`);
      else if (msg.type === 'exit') this.#term.write(`\r\n[the shell exited with code ${msg.code}]\r\n`);
    });
    ws.addEventListener('close', (event) => {
      const why = CLOSE_REASONS[event.code] ?? `code ${event.code}`;
      this.#onStatus(`terminal closed: ${why}${event.reason ? ` (${event.reason})` : ''}`);
    });
    ws.addEventListener('error', () => this.#onStatus('the terminal connection failed; the sandbox may not be running (resume it) or the token expired'));
    this.#term.onData((data) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
    });
    this.#term.onResize(({ cols, rows }) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
    });
  }

  close() {
    this.#ws?.close(1000, 'closed in the console');
    this.#term.dispose();
  }
}
