// The world a network test's sandboxes see, in a network namespace the test makes and removes:
// behind one veth, a stand-in internet (203.0.113.10, 198.51.100.10), a stand-in metadata
// endpoint (169.254.169.254) and a private-range server (10.239.0.10), all answering HTTP on port
// 80 with `world <address reached>`. Only packets arriving from the test's own bridge are routed
// there (an `ip rule` on iif, its own routing table): the host's own traffic to those addresses is
// untouched. The bridge forwards, as every Kubernetes node does, so that what stops a packet is
// the policy and not an unrouted host.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { writeFile } from 'node:fs/promises';
import { run } from './oci-fixture.ts';

export const PUBLIC_A = '203.0.113.10';
export const PUBLIC_B = '198.51.100.10';
export const METADATA = '169.254.169.254';
export const PRIVATE = '10.239.0.10';

export interface WorldOptions {
  /** The test's bridge (packets from it are routed into the world). */
  bridge: string;
  /** Network namespace name (asbnp-…). */
  netns: string;
  /** Host side of the veth (asbnp…, ≤ 15 bytes). */
  veth: string;
  /** Routing table and rule preference, unused on the host. */
  table: number;
  /** A /30 for the veth, from the test's own range: host .1, namespace .2. */
  link: string;
}

export interface World {
  /** The host's address on the world's veth (a host address a sandbox must not reach). */
  hostAddress: string;
  /** `curl` run inside the world namespace (a control: the server is up). */
  curlInside(url: string): Promise<string>;
  close(): Promise<void>;
}

const SERVER = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('world ' + self.connection.getsockname()[0]).encode()
        self.send_response(200); self.send_header('content-length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(('0.0.0.0', 80), H)
print('ready', flush=True)
s.serve_forever()
`;

export async function startWorld(o: WorldOptions): Promise<World> {
  const ip = (...args: string[]): Promise<unknown> => run('ip', args);
  const quiet = (p: Promise<unknown>): Promise<unknown> => p.catch(() => undefined);
  const base = o.link.split('/')[0]?.split('.').map(Number) ?? [];
  const host = [...base.slice(0, 3), (base[3] ?? 0) + 1].join('.');
  const inside = [...base.slice(0, 3), (base[3] ?? 0) + 2].join('.');
  const table = String(o.table);
  const teardown = async (): Promise<void> => {
    await quiet(ip('rule', 'del', 'pref', table));
    await quiet(ip('route', 'flush', 'table', table));
    await quiet(ip('link', 'del', o.veth));
    await quiet(ip('netns', 'del', o.netns));
  };
  await teardown();
  await ip('netns', 'add', o.netns);
  await ip('link', 'add', o.veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', o.netns);
  await ip('addr', 'add', `${host}/30`, 'dev', o.veth);
  await ip('link', 'set', o.veth, 'up');
  // Replies come back in on this veth: it forwards (its own setting, not the host's).
  await writeFile(`/proc/sys/net/ipv4/conf/${o.veth}/forwarding`, '1\n');
  await writeFile(`/proc/sys/net/ipv4/conf/${o.bridge}/forwarding`, '1\n');
  await ip('-n', o.netns, 'link', 'set', 'lo', 'up');
  await ip('-n', o.netns, 'addr', 'add', `${inside}/30`, 'dev', 'eth0');
  await ip('-n', o.netns, 'link', 'set', 'eth0', 'up');
  for (const a of [PUBLIC_A, PUBLIC_B, METADATA, PRIVATE]) await ip('-n', o.netns, 'addr', 'add', `${a}/32`, 'dev', 'lo');
  await ip('-n', o.netns, 'route', 'add', 'default', 'via', host);
  for (const dst of ['203.0.113.0/24', '198.51.100.0/24', `${METADATA}/32`, '10.239.0.0/24']) await ip('route', 'add', dst, 'via', inside, 'table', table);
  await ip('rule', 'add', 'iif', o.bridge, 'lookup', table, 'pref', table);
  const server = spawn('ip', ['netns', 'exec', o.netns, 'python3', '-c', SERVER], { stdio: ['ignore', 'pipe', 'inherit'] });
  const [line] = (await Promise.race([once(server.stdout, 'data'), once(server, 'exit')])) as unknown[];
  assert.match(String(line), /ready/, 'the world server did not start');
  return {
    hostAddress: host,
    curlInside: async (url) => (await run('ip', ['netns', 'exec', o.netns, 'curl', '-sS', '--max-time', '5', url])).stdout,
    close: async () => {
      server.kill('SIGKILL');
      await teardown();
    },
  };
}
