// When the worker collects unused images: the kubelet's image GC, scaled to one cache.
// - A pass every intervalMs (default 10 min; the kubelet checks every 5 min, and a cache only
//   grows by pulls, which the trigger below watches): it removes images nobody pins and nobody
//   pulled or used for graceMs (default 1 h, image-store.ts DEFAULT_GC_GRACE_MS).
// - Disk pressure: when the filesystem holding the cache is at least highUsagePercent full
//   (default 85, the kubelet's imageGCHighThresholdPercent), a pass removes every unpinned image
//   unused for pressureGraceMs (default 2 min, the kubelet's imageMinimumGCAge: an image pulled for
//   a sandbox that is about to start is pinned already; this covers other callers of pull). The
//   usage is checked at each pass and after every pull, so a burst of pulls does not wait 10 min.
// A pinned image (a running or hibernated pod's, in any process sharing the cache) is never
// removed, whatever the pressure.
import { statfs } from 'node:fs/promises';
import { systemClock, type Clock, type Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { DEFAULT_GC_GRACE_MS, type GcResult } from './image-gc.ts';
import type { ImageStore } from './image-store.ts';

export const DEFAULT_GC_INTERVAL_MS = 10 * 60_000;
export const DEFAULT_PRESSURE_GRACE_MS = 2 * 60_000;
export const DEFAULT_HIGH_USAGE_PERCENT = 85;

export interface ImageGcLoopOptions {
  images: ImageStore;
  log: Logger;
  clock?: Clock;
  /** Between passes; 0: no periodic pass (pressure after a pull still triggers one). */
  intervalMs?: number;
  graceMs?: number;
  pressureGraceMs?: number;
  highUsagePercent?: number;
  /** Percent of the filesystem holding `path` in use; default statfs. */
  diskUsage?: (path: string) => Promise<number>;
  metrics?: Pick<Metrics, 'imageGcRemovedTotal' | 'imageGcFreedBytesTotal' | 'imageGcRunsTotal'>;
  /** Caches collected in every pass after the images (the build layer cache), told whether the disk is under pressure. */
  alsoCollect?: readonly { collect(pressure: boolean): Promise<unknown> }[];
}

export interface ImageGcLoop {
  /** One pass now (after any pass in progress); undefined once closed. */
  runNow(): Promise<GcResult | undefined>;
  /** Stops the timer and waits for a pass in progress. Idempotent. */
  close(): Promise<void>;
}

export async function statfsUsagePercent(path: string): Promise<number> {
  const st = await statfs(path);
  return st.blocks === 0 ? 0 : (100 * (st.blocks - st.bavail)) / st.blocks;
}

/** A collection pass run every intervalMs (0: only when asked), one at a time. */
export interface Passes<T> {
  /** One pass now (after any pass in progress); undefined once closed. */
  runNow(): Promise<T | undefined>;
  /** Stops the timer and waits for a pass in progress. Idempotent. */
  close(): Promise<void>;
}

export function startPasses<T>(clock: Clock, intervalMs: number, pass: () => Promise<T | undefined>): Passes<T> {
  let closed = false;
  let timer: Timer | undefined;
  let running: Promise<T | undefined> = Promise.resolve(undefined);
  const runNow = (): Promise<T | undefined> => {
    running = running.then(() => (closed ? undefined : pass()));
    return running;
  };
  const schedule = (): void => {
    if (closed || intervalMs === 0) return;
    timer = clock.after(intervalMs, () => {
      void runNow().then(schedule);
    });
  };
  schedule();
  return {
    runNow,
    async close() {
      closed = true;
      timer?.cancel();
      await running;
    },
  };
}

export function startImageGc(opts: ImageGcLoopOptions): ImageGcLoop {
  const log = opts.log.child({ component: 'image-gc' });
  const high = opts.highUsagePercent ?? DEFAULT_HIGH_USAGE_PERCENT;
  const usage = opts.diskUsage ?? statfsUsagePercent;
  let closed = false;
  let pressureCheck = false;

  const passes = startPasses<GcResult>(opts.clock ?? systemClock, opts.intervalMs ?? DEFAULT_GC_INTERVAL_MS, async () => {
    try {
      const percent = await usage(opts.images.root);
      const pressure = percent >= high;
      const result = await opts.images.gc({ graceMs: pressure ? (opts.pressureGraceMs ?? DEFAULT_PRESSURE_GRACE_MS) : (opts.graceMs ?? DEFAULT_GC_GRACE_MS) });
      opts.metrics?.imageGcRunsTotal.inc({ result: 'ok' });
      opts.metrics?.imageGcRemovedTotal.inc({ kind: 'image' }, result.removedImages.length);
      opts.metrics?.imageGcRemovedTotal.inc({ kind: 'rootfs' }, result.removedRootfs);
      opts.metrics?.imageGcFreedBytesTotal.inc(result.blobBytes + result.treeBytes);
      if (pressure) log.warn({ percent: Math.round(percent), ...result }, 'image cache filesystem over its threshold: collected every image unused past the minimum age');
      for (const cache of opts.alsoCollect ?? []) await cache.collect(pressure);
      return result;
    } catch (err) {
      opts.metrics?.imageGcRunsTotal.inc({ result: 'error' });
      log.error({ err }, 'image gc failed');
      return undefined;
    }
  });
  const unsubscribe = opts.images.onPulled(() => {
    if (pressureCheck || closed) return;
    pressureCheck = true;
    void usage(opts.images.root).then(
      async (percent) => {
        if (percent >= high) await passes.runNow();
      },
      (err: unknown) => log.warn({ err }, 'cannot read the image cache filesystem usage'),
    ).finally(() => (pressureCheck = false));
  });
  return {
    runNow: () => passes.runNow(),
    async close() {
      closed = true;
      unsubscribe();
      await passes.close();
    },
  };
}
