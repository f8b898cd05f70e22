// The runtime's connection to a sandbox's init (src/runtime/local/agent.ts) when the init never
// answers: a pod gone while its address keeps the static neighbour entry the runtime gave it drops
// SYNs silently, and the kernel resends them for ~2 min. Here the same silence on loopback: a
// listener whose accept queue is full (it never accepts) drops every further SYN.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { test } from 'node:test';
import { AgentLink, agentExec } from '../src/runtime/local/agent.ts';

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
