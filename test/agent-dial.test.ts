// The runtime's connection to a sandbox's init (src/runtime/local/agent.ts) when the init never
// answers: a pod gone while its address keeps the static neighbour entry the runtime gave it drops
// SYNs silently, and the kernel resends them for ~2 min. Here the same silence on loopback: a
// listener whose accept queue is full (it never accepts) drops every further SYN.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer, Socket, type AddressInfo } from 'node:net';
import { test } from 'node:test';
import { agentExec, agentPty, agentSpawn } from '../src/runtime/local/agent.ts';
import { AgentLink } from '../src/runtime/local/agent-link.ts';

/** A loopback port that takes no more connections and refuses none: its queue (backlog 0) is filled and never accepted. */
const SILENT = `
import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(0)
port = s.getsockname()[1]
fill = []
for _ in range(3):
    c = socket.socket(); c.setblocking(False)
    try: c.connect(('127.0.0.1', port))
    except BlockingIOError: pass
    fill.append(c)
time.sleep(0.3)
print(port, flush=True)
sys.stdin.read()
`;

test('an exec in a sandbox whose init never answers fails, naming the address, instead of waiting out the kernel\'s ~2 min of SYN retries', { timeout: 60_000 }, async (t) => {
  const silent = spawn('python3', ['-c', SILENT], { stdio: ['pipe', 'pipe', 'inherit'] });
  t.after(() => silent.kill('SIGKILL'));
  const [line] = (await once(silent.stdout, 'data')) as [Buffer];
  const port = Number(String(line).trim());
  assert.ok(port > 0, String(line));
  const link = new AgentLink({ host: '127.0.0.1', port, token: 'unused' });
  const exec = agentExec(link, { uid: 0, gid: 0, cwd: '/', command: ['true'], env: [] }, {});
  await assert.rejects(exec, (err: Error) => {
    assert.match(err.message, new RegExp(`cannot reach the sandbox's init at 127\\.0\\.0\\.1:${String(port)}: no answer in \\d+ ms`));
    return true;
  });
  assert.equal(link.size, 0, 'the failed process is not followed');
});

/** A loopback agent speaking the frame protocol: the first `unanswered` connections close without a word, later ones run the request. */
async function flakyAgent(t: { after: (fn: () => void) => void }, unanswered: number): Promise<{ port: number; connections: () => number; frames: string[][] }> {
  let n = 0;
  const frames: string[][] = [];
  const server = createServer((socket) => {
    n++;
    if (n <= unanswered) {
      socket.once('data', () => socket.destroy());
      return;
    }
    const got: string[] = [];
    frames.push(got);
    let buffered = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 5 && buffered.length >= 5 + buffered.readUInt32BE(1)) {
        const type = String.fromCharCode(buffered[0] ?? 0);
        const payload = buffered.subarray(5, 5 + buffered.readUInt32BE(1));
        buffered = buffered.subarray(5 + payload.length);
        got.push(type === 'Q' ? 'Q' : `${type}${payload.toString()}`);
        if (type === 'E') {
          const out = (kind: string, body: Buffer): Buffer => {
            const head = Buffer.alloc(5);
            head.write(kind, 0);
            head.writeUInt32BE(body.length, 1);
            return Buffer.concat([head, body]);
          };
          const pid = Buffer.alloc(4);
          pid.writeUInt32BE(42);
          const exit = Buffer.alloc(5);
          exit.writeUInt32BE(7);
          socket.end(Buffer.concat([out('P', pid), out('O', Buffer.from(got.filter((f) => f.startsWith('I')).map((f) => f.slice(1)).join(''))), out('X', exit)]));
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => server.close());
  return { port: (server.address() as AddressInfo).port, connections: () => n, frames };
}

test('a request whose connection the init closes before a word was not taken: it is asked again, with its stdin, and runs once', async (t) => {
  const agent = await flakyAgent(t, 2);
  const link = new AgentLink({ host: '127.0.0.1', port: agent.port, token: 'tok' });
  const result = await agentExec(link, { uid: 0, gid: 0, cwd: '/', command: ['cat'], env: [] }, { stdin: 'from stdin' });
  assert.equal(result.exitCode, 7);
  assert.equal(Buffer.from(result.stdout).toString(), 'from stdin', 'the stdin sent on the first connection went again');
  assert.equal(agent.connections(), 3);
  assert.deepEqual(agent.frames, [['Q', 'Ifrom stdin', 'E']], 'one connection ran it, once');
});

test('an init that closes every try before a word fails the call, saying so, after three tries', async (t) => {
  const agent = await flakyAgent(t, 10);
  const link = new AgentLink({ host: '127.0.0.1', port: agent.port, token: 'wrong' });
  const result = await agentExec(link, { uid: 0, gid: 0, cwd: '/', command: ['true'], env: [] }, {});
  assert.deepEqual([result.exitCode, Buffer.from(result.stderr).toString()], [255, 'the sandbox\'s init closed the connection\n']);
  assert.equal(agent.connections(), 3);
  assert.equal(link.size, 0);
});

test('a process whose sandbox ends before the init names it settles: a spawn resolves and its exit says SIGKILL, a terminal is refused, saying why', async (t) => {
  // An init that takes every request and never answers: the pod ends under it (a step that killed it).
  const taken: number[] = [];
  const server = createServer((socket) => {
    taken.push(1);
    socket.on('data', () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => server.close());
  const link = new AgentLink({ host: '127.0.0.1', port: (server.address() as AddressInfo).port, token: 'tok' });
  const req = { uid: 0, gid: 0, cwd: '/', command: ['sh'], env: [] };
  const spawned = agentSpawn(link, req);
  const terminal = agentPty(link, { ...req, pty: { cols: 80, rows: 24 } }, 'pod-a');
  for (let i = 0; i < 200 && (taken.length < 2 || link.size < 2); i++) await new Promise((r) => setTimeout(r, 5));
  assert.equal(link.size, 2, 'both requests are followed');
  link.end(); // what the runtime does when the pod ends
  const proc = await spawned;
  assert.deepEqual(await proc.exited, { exitCode: 137, signal: 'SIGKILL' });
  await assert.rejects(terminal, /container pod-a ended before the terminal's command started/);
  assert.equal(link.size, 0);
});

/**
 * An init that runs a request at once: as soon as a whole request frame is in, it answers (pid,
 * "hi\n", exit 0) and closes, without reading what comes after; each request taken prints a line.
 */
const PROMPT = `
import socket, struct, sys
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
frame = lambda kind, body: kind + struct.pack('>I', len(body)) + body
while True:
    c, _ = s.accept()
    got = b''
    while len(got) < 5 or len(got) < 5 + struct.unpack('>I', got[1:5])[0]:
        more = c.recv(65536)
        if not more: break
        got += more
    print('request', flush=True)
    c.sendall(frame(b'P', struct.pack('>I', 42)) + frame(b'O', b'hi\\n') + frame(b'X', struct.pack('>IB', 0, 0)))
    c.close()
`;

test('an exec whose command ends before the host has sent its stdin still gets its answer, and runs once: the stdin and its end leave with the request', { timeout: 60_000 }, async (t) => {
  const agent = spawn('python3', ['-c', PROMPT], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => agent.kill('SIGKILL'));
  const [line] = (await once(agent.stdout, 'data')) as [Buffer];
  const port = Number(String(line).trim());
  let taken = 0;
  agent.stdout.on('data', (b: Buffer) => (taken += String(b).split('\n').filter((l) => l === 'request').length));
  // The host preempted between its writes to the init (a loaded machine): every write after a
  // connection's first waits 100 ms with the event loop held, as a descheduled process would.
  const proto = Socket.prototype as unknown as { write: (this: Socket, ...args: unknown[]) => boolean };
  const write = proto.write;
  const writes = new WeakMap<Socket, number>();
  proto.write = function (this: Socket, ...args: unknown[]): boolean {
    if (this.remotePort === port) {
      const n = (writes.get(this) ?? 0) + 1;
      writes.set(this, n);
      if (n > 1) for (const until = Date.now() + 100; Date.now() < until; );
    }
    return write.apply(this, args);
  };
  t.after(() => (proto.write = write));
  const link = new AgentLink({ host: '127.0.0.1', port, token: 'tok' });
  const result = await agentExec(link, { uid: 0, gid: 0, cwd: '/', command: ['echo', 'hi'], env: [] }, { stdin: '' });
  assert.deepEqual([result.exitCode, Buffer.from(result.stdout).toString(), Buffer.from(result.stderr).toString()], [0, 'hi\n', '']);
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(taken, 1, 'the command ran once');
});
