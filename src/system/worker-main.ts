// The worker process: `node src/system/worker-main.ts [--flag value]...` (flags and ASB_*
// variables in src/system/config.ts). Prints one JSON line `{"ready":true,...}` on stdout when
// it serves; logs go to stderr. SIGINT/SIGTERM shut it down in order; a second signal exits.
import { ConfigError, parseWorkerConfig } from './config.ts';
import { createLogger } from './log.ts';
import { startWorker } from './worker.ts';

async function main(): Promise<void> {
  let config;
  try {
    config = parseWorkerConfig(process.argv.slice(2), process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(err.message);
      process.exit(2);
    }
    throw err;
  }
  const log = createLogger({ level: config.logLevel });
  const worker = await startWorker(config, { log });
  process.stdout.write(`${JSON.stringify({ ready: true, apiUrl: worker.apiUrl, clusterName: config.clusterName, clusterTag: config.clusterTag })}\n`);

  let stopping = false;
  const stop = (sig: string): void => {
    if (stopping) {
      log.warn({ sig }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    log.info({ sig }, 'shutting down');
    worker.close({ hibernate: true }).then(
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
  console.error('worker failed to start:', err instanceof Error ? err.message : err);
  process.exit(1);
});
