// The router process: `node src/router/router-main.ts [--flag value]...` (flags and variables
// in router-config.ts). Prints one JSON line `{"ready":true,"listen":"127.0.0.1:9002",...}` (and
// "metrics": its host:port under --metrics-listen) on stdout once it serves gRPC (the feeds connect in the background and keep retrying); logs go
// to stderr. SIGINT/SIGTERM close it; a second signal exits at once.
import { runMain } from '../base/process-main.ts';
import { parseRouterConfig } from './router-config.ts';
import { startRouter } from './start-router.ts';

runMain({
  name: 'router',
  parse: parseRouterConfig,
  async start(config, log) {
    const router = await startRouter(config, { log });
    return {
      ready: { listen: router.address, domain: config.domain, workers: config.workers.map((w) => w.cluster), ...(router.metricsAddress === undefined ? {} : { metrics: router.metricsAddress }) },
      close: () => router.close(),
    };
  },
});
