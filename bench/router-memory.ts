// Router memory per route: fills a RouteTable with N entries shaped like the feed's (20-char
// ids, 64-hex token hashes, pod IPs) through the same apply() path, and reports heap growth.
// Run alone with `node --expose-gc bench/router-memory.ts [N]`; bench/run.ts may import it.
import { createHash } from 'node:crypto';
import type { RouteEntry } from '../src/router/contract.ts';
import { RouteTable } from '../src/router/route-table.ts';
import { systemClock } from '../src/base/clock.ts';

export interface RouteMemory {
  routes: number;
  heapMB: number;
  bytesPerRoute: number;
}

export function benchRouteMemory(n: number): RouteMemory {
  const gc = (globalThis as { gc?: () => void }).gc;
  gc?.();
  const before = process.memoryUsage().heapUsed;
  const table = new RouteTable({ clock: systemClock });
  table.apply('bench', { type: 'snapshot', version: 1, cluster: 'bench', entries: [] });
  for (let i = 0; i < n; i++) {
    const id = `bnch${i.toString(36).padStart(16, '0')}`;
    // JSON.parse per entry, as the feed client does, so strings are not shared by accident.
    const entry = JSON.parse(
      JSON.stringify({
        id,
        cluster: 'bench',
        podIp: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`,
        state: 'running',
        defaultPort: 49983,
        publicPorts: [],
        tokenHash: createHash('sha256').update(id).digest('hex'),
        owner: 'team-a',
      } satisfies RouteEntry),
    ) as RouteEntry;
    table.apply('bench', { type: 'upsert', version: i + 2, entry });
  }
  gc?.();
  const grown = process.memoryUsage().heapUsed - before;
  if (table.size !== n) throw new Error(`expected ${n} routes, table holds ${table.size}`);
  return { routes: n, heapMB: Math.round(grown / 1048576), bytesPerRoute: Math.round(grown / n) };
}

if (import.meta.main) {
  console.log(JSON.stringify(benchRouteMemory(Number(process.argv[2] ?? 1_000_000))));
}
