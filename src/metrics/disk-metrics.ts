// The file system under the worker's data directory (store, image cache, sandbox volumes,
// checkpoints), read at each scrape with one statfs: asb_data_disk_free_bytes and
// asb_data_disk_size_bytes. A full data disk fails pulls, checkpoints and store commits at once,
// so an alert on what is left (clusters/components/dashboards/alerts.yaml) fires before that.
import { statfsSync } from 'node:fs';
import { Gauge, type Registry } from 'prom-client';

export function registerDiskMetrics(registry: Registry, dataDir: string, onError: (err: unknown) => void): void {
  const registers = [registry];
  // Both gauges read one statfs per scrape: the size's collect runs first (registration order).
  let last: { free: number; size: number } | undefined;
  new Gauge({
    name: 'asb_data_disk_size_bytes',
    help: 'Size of the file system holding the worker\'s data directory.',
    registers,
    collect() {
      try {
        const s = statfsSync(dataDir);
        last = { free: s.bavail * s.bsize, size: s.blocks * s.bsize };
        this.set(last.size);
      } catch (err) {
        // A scrape still answers (the other metrics); the failure is logged, not thrown.
        last = undefined;
        onError(err);
      }
    },
  });
  new Gauge({
    name: 'asb_data_disk_free_bytes',
    help: 'Space left to unprivileged writers on the file system holding the worker\'s data directory.',
    registers,
    collect() {
      if (last !== undefined) this.set(last.free);
    },
  });
}
