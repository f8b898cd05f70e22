// An egress policy that shrinks closes the connections through the egress proxy that it now
// forbids, on runc and on gVisor, and keeps the ones it still allows: the decision service judged
// a proxied connection once, when it opened, and the kernel's conntrack cut (egress-cut.test.ts)
// leaves proxied flows alone, so before this such a connection ran on for its whole life. The
// worker's own composition (startEgressServices: decision service, resolver, LDS file) behind a
// real Envoy from envoy/edge.yaml; real pods whose TCP the kernel sends to it; two "public"
// servers (198.51.100.219, 203.0.113.219) in a namespace this file makes, reached from the host.
// Its own subnets (10.224.0.0/24 for the pods, 10.224.200.0/30 for the servers' link) and bridge
// names (asbpc...).
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test, type TestContext } from 'node:test';
import { Registry } from 'prom-client';
import { EnvoyProcess } from '../src/edge/envoy-process.ts';
import { CredentialStore } from '../src/egress/credential-store.ts';
import { startEgressServices } from '../src/egress/egress-services.ts';
import { ensureBridge, parseSubnet } from '../src/runtime/local/network.ts';
import { DEFAULT_CLAIMS_DIR, releaseNetwork } from '../src/runtime/local/network-claim.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { run } from './support/egress-net.ts';
import { lines } from './support/pod-lines.ts';
import { freePortOn } from './support/egress-proxy-fixture.ts';
import { startTestRuntime, stopTestRuntime } from './support/test-runtime.ts';

const BRIDGE = 'asbpc0';
const SUBNET = '10.224.0.0/24';
const GATEWAY = '10.224.0.1';
const LINK_HOST = '10.224.200.1';
const LINK_NS = '10.224.200.2';
const SERVER_A = '198.51.100.219';
const SERVER_B = '203.0.113.219';
const PORT = 7000;

async function must(cmd: string, args: readonly string[]): Promise<void> {
  const r = await run(cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${String(r.code)}): ${r.stderr.trim()}`);
}

/**
 * A namespace holding both public addresses with a TCP echo server on each, reached from the host
 * (where Envoy's upstream connections start) by two /32 routes over a veth. It prints `end <addr>`
 * when a connection to <addr> ends, so the test sees the upstream half close too.
 */
async function serverNamespace(t: TestContext): Promise<(addr: string) => Promise<void>> {
  const ns = `asbpc-${randomInt(0, 0xffff).toString(16)}`;
  const hostIf = `asbpcs${randomInt(0, 0xfff).toString(16)}`;
  t.after(async () => {
    for (const ip of [SERVER_A, SERVER_B]) await run('ip', ['route', 'del', `${ip}/32`]);
    await run('ip', ['netns', 'del', ns]);
    await run('ip', ['link', 'del', hostIf]);
  });
  await must('ip', ['netns', 'add', ns]);
  await must('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
  await must('ip', ['addr', 'add', `${LINK_HOST}/30`, 'dev', hostIf]);
  await must('ip', ['link', 'set', hostIf, 'up']);
  await must('ip', ['-n', ns, 'addr', 'add', `${LINK_NS}/30`, 'dev', 'eth0']);
  for (const ip of [SERVER_A, SERVER_B]) await must('ip', ['-n', ns, 'addr', 'add', `${ip}/32`, 'dev', 'eth0']);
  await must('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
  await must('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  await must('ip', ['-n', ns, 'route', 'add', 'default', 'via', LINK_HOST]);
  for (const ip of [SERVER_A, SERVER_B]) await must('ip', ['route', 'add', `${ip}/32`, 'via', LINK_NS, 'dev', hostIf]);
  const server = `require('node:net').createServer((s) => { const at = s.localAddress; s.on('error', () => {}); s.on('close', () => console.log('end ' + at)); s.pipe(s); }).listen(${String(PORT)}, '0.0.0.0', () => console.log('ready'));`;
  const child: ChildProcess = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', server], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => child.kill('SIGKILL'));
  const ended: string[] = [];
  let wake: (() => void) | undefined;
  child.stdout?.setEncoding('utf8');
  await new Promise<void>((ready, fail) => {
    child.stdout?.on('data', (chunk: string) => {
      for (const line of chunk.split('\n')) {
        if (line === 'ready') ready();
        else if (line.startsWith('end ')) ended.push(line.slice(4));
      }
      wake?.();
    });
    child.once('exit', (code) => fail(new Error(`the echo server exited (${String(code)})`)));
  });
  return async (addr) => {
    const deadline = Date.now() + 15_000;
    while (!ended.includes(addr) && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, 500);
      });
    }
    assert.ok(ended.includes(addr), `the server at ${addr} saw its connection end (ended: ${ended.join(', ')})`);
    ended.splice(ended.indexOf(addr), 1);
  };
}

// Inside the pod: one connection to each server, then for each line on stdin a round trip on both.
const CLIENT = `
import socket, sys
conns = [(name, socket.create_connection((addr, ${String(PORT)}), timeout=10)) for name, addr in (("A", sys.argv[1]), ("B", sys.argv[2]))]
# A first byte no protocol starts with: the proxy's TLS and HTTP inspectors let it through at
# once (a line such as "one" could begin an HTTP request, and they would wait for the rest).
for name, s in conns:
    s.sendall(b"\\x00hello\\n")
    s.recv(100)
print("connected", flush=True)
for line in sys.stdin:
    for name, s in conns:
        try:
            s.sendall(line.encode())
            print(name, "ok" if s.recv(100) == line.encode() else "closed", flush=True)
        except OSError as e:
            print(name, "cut", type(e).__name__, flush=True)
`;

async function allowedTcp(registry: Registry, sandbox: string): Promise<number> {
  const metric = await registry.getSingleMetric('asb_egress_decisions_total')?.get();
  return (metric?.values ?? []).filter((v) => v.labels.sandbox === sandbox && v.labels.verdict === 'allowed' && v.labels.protocol === 'tcp').reduce((sum, v) => sum + v.value, 0);
}

test('an egress policy that shrinks closes the proxied connections it forbids and keeps the ones it allows, on runc and gVisor', async (t) => {
  const ended = await serverNamespace(t);
  const dir = mkdtempSync(join(tmpdir(), 'asb-pcut-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // The listener binds the gateway, which the bridge carries; its port is fixed (LDS reloads bind it again).
  await ensureBridge(BRIDGE, parseSubnet(SUBNET));
  const proxyPort = await freePortOn(GATEWAY);
  const runtime = await startTestRuntime('asb-pcut-', BRIDGE, SUBNET, { egressProxy: { port: proxyPort }, pollIntervalMs: 100 });
  t.after(() => stopTestRuntime(runtime));
  t.after(() => releaseNetwork(DEFAULT_CLAIMS_DIR, BRIDGE, resolve(runtime.root)));
  const { rt } = runtime;

  const registry = new Registry();
  const services = await startEgressServices({
    gateway: GATEWAY,
    dnsPort: 0,
    source: rt,
    credentials: new CredentialStore(join(dir, 'egress'), systemClock),
    caDir: join(dir, 'egress', 'ca'),
    lds: { path: join(dir, 'egress', 'lds', 'egress.json'), listenPort: proxyPort },
    registry,
    log: silentLogger(),
    clock: systemClock,
  });
  t.after(() => services.close());
  const envoy = new EnvoyProcess({
    stateDir: join(dir, 'envoy'),
    logger: silentLogger(),
    concurrency: 1,
    config: {
      listenPort: 0,
      adminPort: 0,
      routerAddress: '127.0.0.1:9',
      workers: [],
      egress: { listenAddress: GATEWAY, listenPort: proxyPort, authzAddress: services.authzAddress, intercept: services.intercept, ...(services.ldsPath === undefined ? {} : { ldsPath: services.ldsPath }) },
    },
  });
  t.after(() => envoy.close());
  await envoy.start();

  for (const runtimeClassName of ['runc', 'gvisor'] as const) {
    await t.test(runtimeClassName, async () => {
      const id = `pcut-${runtimeClassName}`;
      const request: PodRequest = {
        id, uid: `uid-${id}`, namespace: 'default', hostname: id,
        spec: { ...(runtimeClassName === 'gvisor' ? { runtimeClassName } : {}), containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] },
        // The internet is open: every TCP connection to a public address goes through the proxy.
        egress: { internet: true, allow: [], deny: [] },
      };
      t.after(() => rt.remove(id));
      assert.equal((await rt.start(request)).phase, 'Running');
      const client = await rt.spawn(id, { command: ['python3', '-c', CLIENT, SERVER_A, SERVER_B] });
      t.after(() => client.kill('SIGKILL'));
      const next = lines(client);
      assert.deepEqual(await next(1), ['connected']);
      client.stdin.write('one\n');
      assert.deepEqual(await next(2), ['A ok', 'B ok']);
      assert.equal(await allowedTcp(registry, id), 2, 'both connections went through the proxy, which allowed them');

      // The policy now denies A's address: A's open connection is closed, at both ends; B's goes on.
      await rt.setEgressPolicy(id, { internet: true, allow: [], deny: [`${SERVER_A}/32`] });
      client.stdin.write('two\n');
      const [a, b] = await next(2);
      assert.equal(a, 'A cut ConnectionResetError', 'the proxied connection the new policy forbids is closed');
      assert.equal(b, 'B ok', 'the proxied connection the new policy still allows keeps working');
      await ended(SERVER_A);
      client.stdin.write('three\n');
      assert.equal((await next(2))[1], 'B ok');
      // And a new connection to A is refused, as before this change.
      const fresh = await rt.exec(id, { command: ['python3', '-c', `import socket\ntry:\n    socket.create_connection(("${SERVER_A}", ${String(PORT)}), timeout=5); print("open")\nexcept OSError as e:\n    print(type(e).__name__)`], timeoutMs: 30_000 });
      assert.equal(Buffer.from(fresh.stdout).toString().trim(), 'ConnectionRefusedError');
      client.kill('SIGKILL');
    });
  }
});
