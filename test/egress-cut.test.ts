// An egress policy that shrinks cuts the open connections it now forbids, on runc and on gVisor:
// the kernel rules accept established packets before a pod's chain, so before this a connection
// opened under the old policy ran on for its whole life. A real pod holds two TCP connections to
// servers in a network namespace this file makes (10.250.101.2 and .3); the policy then allows .3
// only: the connection to .2 is reset, the one to .3 goes on. Its own subnet (10.250.1.0/24 for
// the pods, 10.250.101.0/24 for the servers) and bridge names (asbrc...).
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { spawn, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { test, type TestContext } from 'node:test';
import { cutDestinations, parseConntrackFlows } from '../src/network/conntrack-cut.ts';
import { DEFAULT_FLOOR } from '../src/network/egress-floor.ts';
import { DEFAULT_CLAIMS_DIR, releaseNetwork } from '../src/runtime/local/network-claim.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { run } from './support/egress-net.ts';
import { lines } from './support/pod-lines.ts';
import { startTestRuntime, stopTestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbrcec0';
const SUBNET = '10.250.1.0/24';
const SERVER_A = '10.250.101.2';
const SERVER_B = '10.250.101.3';
const PORT = 7000;

async function must(cmd: string, args: readonly string[]): Promise<void> {
  const r = await run(cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${String(r.code)}): ${r.stderr.trim()}`);
}

/** A namespace with two addresses and a TCP echo server on both, routed from the host over a veth. */
async function serverNamespace(t: TestContext): Promise<void> {
  const ns = `asbrc-ec-${randomInt(0, 0xffff).toString(16)}`;
  const hostIf = `asbrcecs${randomInt(0, 0xfff).toString(16)}`;
  t.after(async () => {
    await run('ip', ['netns', 'del', ns]);
    await run('ip', ['link', 'del', hostIf]);
  });
  await must('ip', ['netns', 'add', ns]);
  await must('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
  await must('ip', ['addr', 'add', '10.250.101.1/24', 'dev', hostIf]);
  await must('ip', ['link', 'set', hostIf, 'up']);
  // Replies come back in on this link and are forwarded to the pod's bridge.
  writeFileSync(`/proc/sys/net/ipv4/conf/${hostIf}/forwarding`, '1\n');
  for (const ip of [SERVER_A, SERVER_B]) await must('ip', ['-n', ns, 'addr', 'add', `${ip}/24`, 'dev', 'eth0']);
  await must('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
  await must('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  await must('ip', ['-n', ns, 'route', 'add', 'default', 'via', '10.250.101.1']);
  const server = `require('node:net').createServer((s) => { s.on('error', () => {}); s.pipe(s); }).listen(${String(PORT)}, '0.0.0.0', () => console.log('ready'));`;
  const child: ChildProcess = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', server], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => child.kill('SIGKILL'));
  await new Promise<void>((ready, fail) => {
    child.stdout?.once('data', () => ready());
    child.once('exit', (code) => fail(new Error(`the echo server exited (${String(code)})`)));
  });
}

// Inside the pod: one connection to each server, then for each line on stdin a round trip on both.
const CLIENT = `
import socket, sys
conns = [(name, socket.create_connection((addr, ${String(PORT)}), timeout=10)) for name, addr in (("A", sys.argv[1]), ("B", sys.argv[2]))]
print("connected", flush=True)
for line in sys.stdin:
    for name, s in conns:
        try:
            s.sendall(line.encode())
            print(name, "ok" if s.recv(100) else "closed", flush=True)
        except OSError as e:
            print(name, "cut", type(e).__name__, flush=True)
`;

test('which open flows a new policy forbids: forwarded ones to what it denies; proxied and host ones are not the kernel\'s to cut', () => {
  const pod = '10.250.1.5';
  const flows = parseConntrackFlows([
    // forwarded (masqueraded: the reply goes to the host's address)
    'tcp      6 431999 ESTABLISHED src=10.250.1.5 dst=10.250.101.2 sport=40000 dport=7000 src=10.250.101.2 dst=10.250.101.1 sport=7000 dport=40000 [ASSURED] mark=0 use=1',
    'tcp      6 431999 ESTABLISHED src=10.250.1.5 dst=10.250.101.3 sport=40002 dport=7000 src=10.250.101.3 dst=10.250.101.1 sport=7000 dport=40002 [ASSURED] mark=0 use=1',
    'udp      17 29 src=10.250.1.5 dst=203.0.113.9 sport=5000 dport=53 src=203.0.113.9 dst=192.168.1.10 sport=53 dport=5000 mark=0 use=1',
    // DNAT'ed to the egress proxy on the gateway: the reply comes back to the pod's address
    'tcp      6 431999 ESTABLISHED src=10.250.1.5 dst=198.51.100.7 sport=40004 dport=443 src=10.250.1.1 dst=10.250.1.5 sport=15001 dport=40004 [ASSURED] mark=0 use=1',
    // another pod's flow, and conntrack's summary line
    'tcp      6 431999 ESTABLISHED src=10.250.1.6 dst=10.250.101.2 sport=40000 dport=7000 src=10.250.101.2 dst=10.250.101.1 sport=7000 dport=40000 [ASSURED] mark=0 use=1',
    'conntrack v1.4.7 (conntrack-tools): 5 flow entries have been shown.',
  ].join('\n'));
  assert.equal(flows.length, 5);
  const ctx = { floor: DEFAULT_FLOOR, proxy: true };
  assert.deepEqual(cutDestinations(flows, pod, { internet: false, allow: ['10.250.101.3/32'], deny: [] }, ctx), ['10.250.101.2', '203.0.113.9']);
  assert.deepEqual(cutDestinations(flows, pod, { internet: true, allow: ['10.250.101.0/24'], deny: [] }, ctx), []);
  assert.deepEqual(cutDestinations(flows, pod, { internet: true, allow: ['10.250.101.0/24'], deny: ['203.0.113.0/24'] }, ctx), ['203.0.113.9']);
  // Denied domains with no proxy to judge them: the kernel fails the internet closed.
  assert.deepEqual(cutDestinations(flows, pod, { internet: true, allow: ['10.250.101.0/24'], deny: ['evil.example'] }, { ...ctx, proxy: false }), ['203.0.113.9']);
});

test('an egress policy that shrinks cuts the open connections it forbids and keeps the ones it allows, on runc and gVisor', async (t) => {
  await serverNamespace(t);
  const runtime = await startTestRuntime('asb-egcut-', BRIDGE, SUBNET, { pollIntervalMs: 100 });
  t.after(() => stopTestRuntime(runtime));
  t.after(() => releaseNetwork(DEFAULT_CLAIMS_DIR, BRIDGE, resolve(runtime.root)));
  const { rt } = runtime;

  for (const runtimeClassName of ['runc', 'gvisor'] as const) {
    await t.test(runtimeClassName, async () => {
      const id = `egcut-${runtimeClassName}`;
      const request: PodRequest = {
        id, uid: `uid-${id}`, namespace: 'default', hostname: id,
        spec: { ...(runtimeClassName === 'gvisor' ? { runtimeClassName } : {}), containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] },
        egress: { internet: false, allow: [`${SERVER_A}/32`, `${SERVER_B}/32`], deny: [] },
      };
      t.after(() => rt.remove(id));
      assert.equal((await rt.start(request)).phase, 'Running');
      const client = await rt.spawn(id, { command: ['python3', '-c', CLIENT, SERVER_A, SERVER_B] });
      const next = lines(client);
      assert.deepEqual(await next(1), ['connected']);
      client.stdin.write('one\n');
      assert.deepEqual(await next(2), ['A ok', 'B ok']);

      // The policy now allows B's address only: A's open connection is cut, B's keeps working.
      await rt.setEgressPolicy(id, { internet: false, allow: [`${SERVER_B}/32`], deny: [] });
      client.stdin.write('two\n');
      const [a, b] = await next(2);
      assert.match(a ?? '', /^A cut ConnectionResetError$/, 'the connection the new policy forbids is reset');
      assert.equal(b, 'B ok', 'the connection the new policy still allows keeps working');
      client.stdin.write('three\n');
      assert.equal((await next(2))[1], 'B ok');
      // And a new connection to A is refused at once, as before this change.
      const fresh = await rt.exec(id, { command: ['python3', '-c', `import socket\ntry:\n    socket.create_connection(("${SERVER_A}", ${String(PORT)}), timeout=5); print("open")\nexcept OSError as e:\n    print(type(e).__name__)`], timeoutMs: 30_000 });
      assert.equal(Buffer.from(fresh.stdout).toString().trim(), 'ConnectionRefusedError');
      client.kill('SIGKILL');
    });
  }
});
