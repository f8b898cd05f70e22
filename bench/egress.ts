// Egress through the proxy against direct egress, in the same run. A sandbox namespace reaches the
// same public servers two ways: through the kernel redirect, the cluster Envoy's egress listener
// and the decision service (the production path), or over a direct link (egress-net.ts
// addDirectLink: one veth hop, no NAT: direct egress at its cheapest, so the ratios are
// conservative). Direct and proxied alternate, 3 rounds each, on the same 2 cores; each side keeps
// its best round (other work on a shared machine only ever slows a round down). The bulk row also
// measures a floor in the same rounds: the same Envoy binary as a bare TCP proxy (one listener,
// tcp_proxy to the server; no original_dst, no inspectors, no ext_authz), so a ratio below target
// can be read as "Envoy's own cost" or "ours on top of it".
import { spawn } from 'node:child_process';
import { connect } from 'node:net';
import { join } from 'node:path';
import { round } from './claims.ts';
import { findEnvoyBinary } from '../src/edge/envoy-binary.ts';
import { run, type Cleanup } from '../test/support/egress-net.ts';
import { freePortOn, PUBLIC_DOMAIN, startEgressProxy } from '../test/support/egress-proxy-fixture.ts';

interface Load {
  requests: number;
  errors: number;
  perSec: number;
  mbPerSec: number;
  p50Ms: number;
  p99Ms: number;
}

export interface EgressPair {
  direct: Load;
  proxied: Load;
  /** proxied / direct throughput (requests/s, or MB/s for bulk). */
  ratio: number;
  /** proxied p99 − direct p99, ms. */
  addedP99Ms: number;
}

export interface EgressFigures {
  http: EgressPair;
  httpsPassthrough: EgressPair;
  httpsNewConnections: EgressPair;
  httpsBulk: EgressPair & {
    /** The same transfer through a bare Envoy tcp_proxy (same binary, same workers), best round. */
    floor: Load;
    /** floor / direct MB/s. */
    floorRatio: number;
    /** proxied / floor MB/s: 1 = our egress path costs nothing beyond Envoy's own relaying. */
    ofFloor: number;
  };
}

const LOAD = join(import.meta.dirname, 'egress-load.ts');

const ROUNDS = 3;

export async function benchEgress(durationMs = 2000): Promise<EgressFigures> {
  const cleanups: (() => unknown)[] = [];
  const t: Cleanup = { after: (fn) => void cleanups.push(fn as () => unknown) };
  try {
    const name = `bench.${PUBLIC_DOMAIN}`;
    // Two Envoy workers, as on a 2-core node.
    const f = await startEgressProxy(t, { directLink: true, concurrency: 2, hosts: ([a = '']) => ({ [name]: [a] }) });
    f.setPolicy({ internet: true, allow: [], deny: [] });
    const [proxiedIp = ''] = f.net.publicIps;
    const floorPort = await startBareEnvoy(t, f.net.gateway, `${proxiedIp}:443`);
    const load = async (scheme: 'http' | 'https', ip: string, mode: string, connections: number, bytes = 0, port?: number): Promise<Load> => {
      const job = { scheme, ip, name, caPath: f.publicCa.caCertPath, mode, connections, durationMs, bytes, port };
      const r = await run('ip', ['netns', 'exec', f.net.clientNs, process.execPath, LOAD, JSON.stringify(job)], { timeoutMs: durationMs + 60_000 });
      if (r.code !== 0) throw new Error(`egress load failed: ${r.stderr}`);
      const out = JSON.parse(r.stdout) as Load;
      if (out.errors > 0 || out.requests === 0) throw new Error(`egress load ${scheme} ${mode} via ${ip}: ${out.errors} errors, ${out.requests} requests`);
      return out;
    };
    const better = (a: Load | undefined, b: Load): Load => (a === undefined || b.mbPerSec + b.perSec > a.mbPerSec + a.perSec ? b : a);
    const pair = async (scheme: 'http' | 'https', mode: string, connections: number, bytes = 0, withFloor = false): Promise<EgressPair & { floor?: Load }> => {
      let direct: Load | undefined;
      let proxied: Load | undefined;
      let floor: Load | undefined;
      for (let i = 0; i < ROUNDS; i++) {
        direct = better(direct, await load(scheme, f.net.directIp, mode, connections, bytes));
        proxied = better(proxied, await load(scheme, proxiedIp, mode, connections, bytes));
        if (withFloor) floor = better(floor, await load(scheme, f.net.gateway, mode, connections, bytes, floorPort));
      }
      if (direct === undefined || proxied === undefined) throw new Error('no rounds');
      const ratio = mode === 'bulk' ? proxied.mbPerSec / direct.mbPerSec : proxied.perSec / direct.perSec;
      return { direct, proxied, ratio: round(ratio, 2), addedP99Ms: round(proxied.p99Ms - direct.p99Ms, 2), ...(floor === undefined ? {} : { floor }) };
    };
    const { floor, ...bulk } = await pair('https', 'bulk', 1, 16 * 1024 * 1024, true);
    if (floor === undefined) throw new Error('no floor rounds');
    return {
      http: await pair('http', 'requests', 16),
      httpsPassthrough: await pair('https', 'requests', 16),
      httpsNewConnections: await pair('https', 'connections', 16),
      httpsBulk: { ...bulk, floor, floorRatio: round(floor.mbPerSec / bulk.direct.mbPerSec, 2), ofFloor: round(bulk.proxied.mbPerSec / floor.mbPerSec, 2) },
    };
  } finally {
    for (const fn of cleanups.reverse()) await fn();
  }
}

/**
 * The floor: the same Envoy binary with the same worker count, one listener on the gateway doing
 * nothing but tcp_proxy to `upstream` (a static address: no original_dst, no TLS/HTTP inspector,
 * no ext_authz). The sandbox reaches it at gateway:port (traffic to the gateway is not
 * redirected). Resolves with the port once it accepts.
 */
async function startBareEnvoy(t: Cleanup, gateway: string, upstream: string): Promise<number> {
  const port = await freePortOn(gateway);
  const [host = '', upstreamPort = ''] = upstream.split(':');
  const config = {
    static_resources: {
      listeners: [
        {
          name: 'floor',
          address: { socket_address: { address: gateway, port_value: port } },
          filter_chains: [{ filters: [{ name: 'envoy.filters.network.tcp_proxy', typed_config: { '@type': 'type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy', stat_prefix: 'floor', cluster: 'upstream' } }] }],
        },
      ],
      clusters: [{ name: 'upstream', type: 'STATIC', connect_timeout: '5s', load_assignment: { cluster_name: 'upstream', endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: host, port_value: Number(upstreamPort) } } } }] }] } }],
    },
  };
  const child = spawn(findEnvoyBinary(), ['--config-yaml', JSON.stringify(config), '--disable-hot-restart', '--concurrency', '2', '--log-level', 'warn'], { stdio: 'ignore' });
  t.after(() => {
    child.kill('SIGTERM');
  });
  // Bounded: 200 × 50 ms = 10 s for Envoy to bind.
  for (let i = 0; i < 200; i++) {
    if (child.exitCode !== null) throw new Error(`bare Envoy exited with ${child.exitCode}`);
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect(port, gateway, () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (ok) return port;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('bare Envoy did not listen within 10 s');
}

if (import.meta.main) {
  const figures = await benchEgress(Number(process.argv[2] ?? '5000'));
  process.stdout.write(`${JSON.stringify(figures, null, 2)}\n`);
}
