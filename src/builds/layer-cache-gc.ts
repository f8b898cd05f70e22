// The build layer cache's collection on a worker with no image cache of its own (Kubernetes: the
// images are the kubelet's, and so is their GC, so gc-loop.ts does not run there). The image
// cache's policy, applied to the layer cache alone:
// - a pass every intervalMs (the worker's --image-gc-interval-ms, default 10 min) removes the
//   entries unused past the age bound (layer-cache.ts: 7 days), never one a live template's build
//   was made of, then the blobs no entry names;
// - disk pressure: when the filesystem holding the cache is at least highUsagePercent full
//   (default 85, as gc-loop.ts), the pass uses the short bound (1 hour), checked at each pass.
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { DEFAULT_GC_INTERVAL_MS, DEFAULT_HIGH_USAGE_PERCENT, startPasses, statfsUsagePercent } from '../images/gc-loop.ts';

export interface CollectedCache {
  readonly root: string;
  collect(pressure: boolean): Promise<{ entries: number; blobs: number }>;
}

export interface LayerCacheGcOptions {
  cache: CollectedCache;
  log: Logger;
  clock?: Clock;
  /** Between passes; 0: no periodic pass. */
  intervalMs?: number;
  highUsagePercent?: number;
  /** Percent of the filesystem holding `path` in use; default statfs. */
  diskUsage?: (path: string) => Promise<number>;
}

export interface LayerCacheGc {
  /** One pass now (after any pass in progress); undefined once closed or when the pass failed. */
  runNow(): Promise<{ entries: number; blobs: number; pressure: boolean } | undefined>;
  /** Stops the timer and waits for a pass in progress. Idempotent. */
  close(): Promise<void>;
}

export function startLayerCacheGc(opts: LayerCacheGcOptions): LayerCacheGc {
  const log = opts.log.child({ component: 'layer-cache-gc' });
  const high = opts.highUsagePercent ?? DEFAULT_HIGH_USAGE_PERCENT;
  const usage = opts.diskUsage ?? statfsUsagePercent;
  return startPasses(opts.clock ?? systemClock, opts.intervalMs ?? DEFAULT_GC_INTERVAL_MS, async () => {
    try {
      const pressure = (await usage(opts.cache.root)) >= high;
      const removed = await opts.cache.collect(pressure);
      if (removed.entries > 0 || removed.blobs > 0) log.info({ ...removed, pressure }, 'collected the build layer cache');
      return { ...removed, pressure };
    } catch (err) {
      log.error({ err }, 'build layer cache gc failed');
      return undefined;
    }
  });
}
