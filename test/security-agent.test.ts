// The agent in each sandbox's pid 1 (src/runtime/local/asb-init.c) starts processes as any user of
// the sandbox for whoever presents its token on TCP 49982 in the pod's network namespace, so from
// inside a sandbox it is a door to the sandbox's root. These attacks try it from inside, on runc
// and gVisor: a sandbox user reads every environment, command line and memory of pid 1 it can reach
// and must not find the token; requests with wrong, empty, overlong and truncated tokens start
// nothing and leave the agent serving the host; another sandbox cannot reach the agent at all.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Attack, LabPod } from './support/attack-lab.ts';
import { AttackLab } from './support/attack-lab.ts';
import { readInitProcess } from '../src/runtime/local/agent-init.ts';
import type { OciSpec } from '../src/runtime/oci/spec.ts';
import { AGENT_PORT } from '../src/router/contract.ts';

// Free on this host and in every other test (grep test/ for 10.2xx before taking another).
const lab = await AttackLab.create({ bridge: 'asbagt0', subnet: '10.231.0.0/16' });

/** The token the runtime gave the pod's init, read on the host from the pod's bundle. */
async function tokenOf(p: LabPod): Promise<string> {
  const spec = JSON.parse(await readFile(join(lab.root, 'pods', p.id, 'config.json'), 'utf8')) as OciSpec;
  const token = readInitProcess(spec.process, '/dev/.asb-init')?.agent?.token;
  assert.ok(token !== undefined && token.length >= 32, `the pod ${p.id} has an agent token of at least 32 characters`);
  return token;
}

// Everything of every process a user can read in /proc that could hold the token, then pid 1's
// memory, mapping by mapping. Prints what it read (hex) and a line per refusal.
const READ_PROC = String.raw`
import os, sys, binascii
out = []
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    for f in ('environ', 'cmdline'):
        try:
            with open(f'/proc/{pid}/{f}', 'rb') as h: out.append(binascii.hexlify(h.read()).decode())
        except OSError as e: out.append(f'refused {pid}/{f} {e.errno}')
try:
    maps = open('/proc/1/maps').read().splitlines()
except OSError as e:
    maps = []; print(f'mem refused maps {e.errno}')
read = 0
try:
    with open('/proc/1/mem', 'rb', buffering=0) as mem:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
            try:
                mem.seek(lo); out.append(binascii.hexlify(mem.read(min(hi - lo, 1 << 22))).decode()); read += 1
            except OSError: pass
except OSError as e:
    print(f'mem refused open {e.errno}')
print(f'mem mappings read {read}')
print('\n'.join(out))
`;

/** A request frame as the host's agent client sends one (agent.ts requestFrame), with any token. */
const CLIENT = String.raw`
import socket, struct, sys
port, mode = int(sys.argv[1]), sys.argv[2]
tokens = {'empty': b'', 'wrong': b'0' * 32, 'long': b'A' * 200000, 'nul': b'\0' + b'x' * 40}[mode]
fields = [tokens, b'exec', b'0', b'0', b'', b'/', b'0', b'0', b'3', b'sh', b'-c', b'touch /tmp/agent-pwned-' + mode.encode(), b'0']
payload = b''.join(f + b'\0' for f in fields)
s = socket.create_connection(('127.0.0.1', port), timeout=5)
s.sendall(b'Q' + struct.pack('>I', len(payload)) + payload)
got = b''
try:
    while True:
        chunk = s.recv(4096)
        if not chunk: break
        got += chunk
except socket.timeout:
    print('timeout')
print('answer', got[:1].decode('latin1') or 'none', len(got))
`;

const attacks: Attack[] = [
  {
    name: 'a sandbox user finds the agent token in no environment, command line or memory it can read',
    async run(a) {
      const p = await a.pod('agt-read');
      const token = await tokenOf(p);
      const hex = Buffer.from(token).toString('hex');
      for (const user of [1000, 0]) {
        const r = await p.exec(['python3', '-c', READ_PROC], { user, timeoutMs: 60_000 });
        assert.equal(r.exitCode, 0, `the reader ran as uid ${String(user)}: ${r.err}`);
        assert.ok(!r.out.includes(hex), `uid ${String(user)} read the agent's token from /proc`);
        assert.ok(!r.out.includes(Buffer.from('ASB_AGENT=').toString('hex')), `uid ${String(user)} saw the agent's variable in an environment`);
        // Not even the sandbox's root opens pid 1's memory: the init holds capabilities no other process has.
        assert.match(r.out, /mem refused open/, `uid ${String(user)} opened pid 1's memory:\n${r.out.slice(0, 400)}`);
      }
    },
  },
  {
    name: 'requests with a wrong, empty, overlong or NUL-led token start nothing, and the agent goes on serving the host',
    async run(a) {
      const p = await a.pod('agt-forge');
      for (const mode of ['empty', 'wrong', 'long', 'nul']) {
        const r = await p.exec(['python3', '-c', CLIENT, String(AGENT_PORT), mode], { user: 1000, timeoutMs: 30_000 });
        assert.equal(r.exitCode, 0, `the client (${mode}) ran: ${r.err}`);
        // The agent closes a connection with a wrong token without a word: no 'P' (started) frame.
        assert.match(r.out, /answer none 0/, `a ${mode} token got an answer: ${r.out}`);
      }
      const left = await p.sh('ls /tmp | grep -c agent-pwned || true', { user: 0 });
      assert.equal(left.out.trim(), '0', 'no forged request ran its command');
      // The host's own requests still work through the same agent.
      const ok = await p.sh('id -u', { user: 0 });
      assert.equal(ok.exitCode, 0);
      assert.equal(ok.out.trim(), '0');
    },
  },
  {
    name: "another sandbox cannot connect to a sandbox's agent",
    async run(a) {
      const target = await a.pod('agt-target');
      const other = await a.pod('agt-other');
      const probe = `import socket\ntry:\n  socket.create_connection(('${target.ip()}', ${String(AGENT_PORT)}), timeout=3); print('connected')\nexcept OSError as e: print('refused', e)`;
      const r = await other.exec(['python3', '-c', probe], { timeoutMs: 30_000 });
      assert.equal(r.exitCode, 0, r.err);
      assert.doesNotMatch(r.out, /^connected/m, `a neighbour reached ${target.id}'s agent`);
    },
  },
];

lab.register(attacks);
