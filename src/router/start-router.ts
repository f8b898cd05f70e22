// The router's composition root: route table and cluster registry → feeds (one per worker) →
// waker and activity → ext_proc server. Closed in the reverse order: stop taking streams, flush
// activity, drop feeds, stop the registry's DNS refreshes (one shutdown(), also for a start that
// fails part way). The metrics listener (--metrics-listen) starts after the ext_proc server and
// closes right after it.
import { Registry } from 'prom-client';
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { ActivityReporter } from './activity.ts';
import { ExtProcServer } from './extproc-server.ts';
import { FeedClient, type FeedStatus } from './feed-client.ts';
import type { RouterConfig } from './router-config.ts';
import { ClusterRegistry } from './registry.ts';
import { LookupLimiter } from './lookup-limiter.ts';
import { startMetricsServer, type MetricsServer } from './metrics-server.ts';
import { createRouterMetrics } from './router-metrics.ts';
import { RouteTable } from './route-table.ts';
import { Waker } from './waker.ts';
import type { WorkerEndpoint } from './worker-api.ts';

export interface RouterDeps {
  log: Logger;
  clock?: Clock;
  registry?: Registry;
  /** Activity flush interval (tests shorten it). Default 5 s. */
  activityFlushMs?: number;
}

export interface RunningRouter {
  /** host:port of the gRPC server. */
  readonly address: string;
  readonly table: RouteTable;
  /** The federation from the feeds' clusters messages. */
  readonly federation: ClusterRegistry;
  readonly server: ExtProcServer;
  readonly registry: Registry;
  /** host:port of GET /metrics (--metrics-listen), undefined when not served. */
  readonly metricsAddress: string | undefined;
  feeds(): FeedStatus[];
  /** Resolves once every worker's feed delivered its first snapshot. */
  synced(): Promise<void>;
  close(): Promise<void>;
}

export async function startRouter(config: RouterConfig, deps: RouterDeps): Promise<RunningRouter> {
  const clock = deps.clock ?? systemClock;
  const registry = deps.registry ?? new Registry();
  const log = deps.log;
  const table = new RouteTable({ clock });
  const metrics = createRouterMetrics(registry, table);
  const federation = new ClusterRegistry({ clock, log: log.child({ component: 'registry' }), onResolveError: () => metrics.ingressResolveErrorsTotal.inc() });
  const workers = new Map<string, WorkerEndpoint>(config.workers.map((w) => [w.cluster, w]));
  const first = config.workers[0];
  if (first === undefined) throw new Error('router needs at least one worker');

  const feeds = config.workers.map(
    (worker) =>
      new FeedClient({
        worker,
        table,
        federation,
        clock,
        log: log.child({ component: 'feed' }),
        onMessage: (type, result) => metrics.feedMessagesTotal.inc({ type, result }),
      }),
  );
  const limiter = new LookupLimiter({ clock, limits: { burst: config.lookupBurst, ratePerS: config.lookupRatePerS } });
  const waker = new Waker({
    table,
    workers,
    clock,
    log: log.child({ component: 'waker' }),
    holdLimitMs: config.holdLimitMs,
    limiter,
    onWake: (_id, result) => metrics.wakesTotal.inc({ result }),
    onLookup: (result) => metrics.lookupsTotal.inc({ result }),
  });
  const activity = new ActivityReporter({ workers, clock, log: log.child({ component: 'activity' }), ...(deps.activityFlushMs === undefined ? {} : { flushMs: deps.activityFlushMs }) });
  // The shutdown order, for a start that fails part way and for close(): stop taking streams and
  // scrapes, flush activity, drop feeds, stop the registry's DNS refreshes.
  let server: ExtProcServer | undefined;
  let metricsServer: MetricsServer | undefined;
  const shutdown = async (): Promise<void> => {
    await server?.close();
    await metricsServer?.close();
    await activity.close();
    for (const f of feeds) f.close();
    federation.close();
  };
  try {
    server = await ExtProcServer.start({
      table,
      domain: config.domain,
      clusters: new Set(workers.keys()),
      defaultCluster: first.cluster,
      federation,
      hubUpstream: config.hubUpstream,
      waker,
      activity,
      metrics,
      log: log.child({ component: 'extproc' }),
      listen: config.listen,
    });
    if (config.metricsListen !== undefined) metricsServer = await startMetricsServer({ listen: config.metricsListen, registry, key: first.key, log: log.child({ component: 'metrics' }) });
  } catch (err) {
    await shutdown();
    throw err;
  }
  log.info({ address: server.address, metrics: metricsServer?.address, domain: config.domain, hubUpstream: config.hubUpstream, workers: config.workers.map((w) => `${w.cluster}=${w.url}`) }, 'router listening');

  let closing: Promise<void> | undefined;
  return {
    address: server.address,
    table,
    federation,
    server,
    registry,
    metricsAddress: metricsServer?.address,
    feeds: () => feeds.map((f) => f.status()),
    synced: async () => {
      await Promise.all(feeds.map((f) => f.synced()));
    },
    close() {
      closing ??= shutdown();
      return closing;
    },
  };
}
