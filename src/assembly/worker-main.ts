// The worker process: `node src/assembly/worker-main.ts [--flag value]...` (flags and ASB_*
// variables in src/assembly/worker-config.ts). Prints one JSON line `{"ready":true,...}` on stdout when
// it serves; logs go to stderr. SIGINT/SIGTERM hibernate its sandboxes and close it in order.
import { parseWorkerConfig } from './worker-config.ts';
import { runMain } from '../base/process-main.ts';
import { startWorker } from './worker.ts';

runMain({
  name: 'worker',
  parse: parseWorkerConfig,
  async start(config, log) {
    const worker = await startWorker(config, { log });
    return {
      ready: { apiUrl: worker.apiUrl, clusterName: config.clusterName, clusterTag: config.clusterTag, ...(worker.egress === undefined ? {} : { egress: worker.egress }) },
      close: () => worker.close({ hibernate: true }),
    };
  },
});
