// The router process: `node src/router/router-main.ts [--flag value]...` (flags and variables
// in router-config.ts). Prints one JSON line `{"ready":true,"listen":"127.0.0.1:9002",...}` on
// stdout once it serves gRPC (the feeds connect in the background and keep retrying); logs go
// to stderr. SIGINT/SIGTERM close it; a second signal exits at once.
import { ConfigError } from '../system/config.ts';
import { createLogger } from '../system/log.ts';
import { parseRouterConfig } from './router-config.ts';
import { startRouter } from './start-router.ts';

async function main(): Promise<void> {
  let config;
  try {
    config = parseRouterConfig(process.argv.slice(2), process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(err.message);
      process.exit(2);
    }
    throw err;
  }
  const log = createLogger({ level: config.logLevel });
  const router = await startRouter(config, { log });
  process.stdout.write(`${JSON.stringify({ ready: true, listen: router.address, domain: config.domain, workers: config.workers.map((w) => w.cluster) })}\n`);

  let stopping = false;
  const stop = (sig: string): void => {
    if (stopping) {
      log.warn({ sig }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    log.info({ sig }, 'shutting down');
    router.close().then(
      () => process.exit(0),
      (err: unknown) => {
        log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

main().catch((err: unknown) => {
  console.error('router failed to start:', err instanceof Error ? err.message : err);
  process.exit(1);
});
