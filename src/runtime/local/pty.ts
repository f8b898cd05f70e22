// A terminal inside a sandbox. Node has no pty binding, so pty-bridge.py (run inside the pod as
// its user, with the pod's python3) owns the pty and speaks a framed protocol on its stdin.
// Output is the bridge's stdout read through an async iterator: it is pulled, so a consumer that
// stops reading leaves the pipe full and the shell blocked, as on a real terminal.
import { readFile } from 'node:fs/promises';
import type { PtyOptions, PtySession } from '../runtime.ts';
import { spawnInPod, type PodTarget, type SpawnInPodOptions } from './exec.ts';
import { constants } from 'node:os';

const HANGUP_GRACE_MS = 2000;
let bridgeSource: Promise<string> | undefined;

function frame(kind: 'd' | 'r', payload: Uint8Array): Buffer {
  const header = Buffer.alloc(5);
  header.write(kind, 0, 'latin1');
  header.writeUInt32BE(payload.length, 1);
  return Buffer.concat([header, payload]);
}

function sizePayload(cols: number, rows: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt16BE(Math.max(1, Math.min(cols, 0xffff)), 0);
  b.writeUInt16BE(Math.max(1, Math.min(rows, 0xffff)), 2);
  return b;
}

export async function openPodPty(target: PodTarget, opts: PtyOptions): Promise<PtySession> {
  bridgeSource ??= readFile(new URL('./pty-bridge.py', import.meta.url), 'utf8');
  const source = await bridgeSource;
  const command = opts.command !== undefined && opts.command.length > 0 ? opts.command : ['bash'];
  const spawnOpts: SpawnInPodOptions = { env: { TERM: 'xterm-256color', ...opts.env } };
  if (opts.user !== undefined) spawnOpts.user = opts.user;
  if (opts.cwd !== undefined) spawnOpts.cwd = opts.cwd;
  const proc = spawnInPod(target, ['python3', '-I', '-S', '-c', source, String(opts.cols), String(opts.rows), ...command], spawnOpts);
  const child = proc.child;
  const stdin = child.stdin;
  const stdout = child.stdout;
  if (stdin === null || stdout === null) throw new Error('pty bridge has no pipes');
  stdin.on('error', () => undefined); // the bridge exited; `exited` reports it
  child.stderr?.resume();
  const exited = new Promise<number>((resolve) => {
    // 'exit', not 'close': 'close' waits for stdout to end, which never happens if nobody reads it.
    child.on('exit', (code, signal) => resolve(code ?? (signal === null ? 1 : 128 + constants.signals[signal])));
    child.on('error', () => resolve(127));
  });
  let closed = false;
  const session: PtySession = {
    write: (data) =>
      new Promise<void>((resolve, reject) => {
        const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
        stdin.write(frame('d', bytes), (err) => (err ? reject(err) : resolve()));
      }),
    resize(cols, rows) {
      if (!stdin.writable) return;
      stdin.write(frame('r', sizePayload(cols, rows)));
    },
    output: (async function* () {
      for await (const chunk of stdout) yield new Uint8Array(chunk as Buffer);
    })(),
    exited,
    close() {
      if (closed) return;
      closed = true;
      stdin.end(); // the bridge hangs up the terminal (SIGHUP to the shell)
      const timer = setTimeout(() => proc.kill('SIGKILL'), HANGUP_GRACE_MS);
      timer.unref();
      void exited.then(() => clearTimeout(timer));
    },
  };
  return session;
}
