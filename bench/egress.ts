// Egress through the proxy against direct egress, in the same run (issue 17, point 6). A sandbox
// namespace reaches the same public servers two ways: through the kernel redirect, the cluster
// Envoy's egress listener and the decision service (the production path), or over a direct
// link (egress-net.ts addDirectLink: one veth hop, no NAT: direct egress at its cheapest, so
// the ratios are conservative). Direct and proxied alternate, 3 rounds each, on the same 2 cores;
// each side keeps its best round (other work on a shared machine only ever slows a round down).
import { join } from 'node:path';
import { round } from './claims.ts';
import { run, type Cleanup } from '../test/support/egress-net.ts';
import { PUBLIC_DOMAIN, startEgressProxy } from '../test/support/egress-proxy-fixture.ts';

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
  httpsBulk: EgressPair;
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
    const load = async (scheme: 'http' | 'https', ip: string, mode: string, connections: number, bytes = 0): Promise<Load> => {
      const job = { scheme, ip, name, caPath: f.publicCa.caCertPath, mode, connections, durationMs, bytes };
      const r = await run('ip', ['netns', 'exec', f.net.clientNs, process.execPath, LOAD, JSON.stringify(job)], { timeoutMs: durationMs + 60_000 });
      if (r.code !== 0) throw new Error(`egress load failed: ${r.stderr}`);
      const out = JSON.parse(r.stdout) as Load;
      if (out.errors > 0 || out.requests === 0) throw new Error(`egress load ${scheme} ${mode} via ${ip}: ${out.errors} errors, ${out.requests} requests`);
      return out;
    };
    const better = (a: Load | undefined, b: Load): Load => (a === undefined || b.mbPerSec + b.perSec > a.mbPerSec + a.perSec ? b : a);
    const pair = async (scheme: 'http' | 'https', mode: string, connections: number, bytes = 0): Promise<EgressPair> => {
      let direct: Load | undefined;
      let proxied: Load | undefined;
      for (let i = 0; i < ROUNDS; i++) {
        direct = better(direct, await load(scheme, f.net.directIp, mode, connections, bytes));
        proxied = better(proxied, await load(scheme, proxiedIp, mode, connections, bytes));
      }
      if (direct === undefined || proxied === undefined) throw new Error('no rounds');
      const ratio = mode === 'bulk' ? proxied.mbPerSec / direct.mbPerSec : proxied.perSec / direct.perSec;
      return { direct, proxied, ratio: round(ratio, 2), addedP99Ms: round(proxied.p99Ms - direct.p99Ms, 2) };
    };
    return {
      http: await pair('http', 'requests', 16),
      httpsPassthrough: await pair('https', 'requests', 16),
      httpsNewConnections: await pair('https', 'connections', 16),
      httpsBulk: await pair('https', 'bulk', 1, 16 * 1024 * 1024),
    };
  } finally {
    for (const fn of cleanups.reverse()) await fn();
  }
}

if (import.meta.main) {
  const figures = await benchEgress(Number(process.argv[2] ?? '5000'));
  process.stdout.write(`${JSON.stringify(figures, null, 2)}\n`);
}
