// The shape every long-running process of ours shares (worker, router): parse the
// configuration (exit 2 listing every problem), start, print one ready JSON line on stdout, and
// on SIGINT/SIGTERM close in order and exit; a second signal exits at once.
import { ConfigError } from './flags.ts';
import { createLogger, type Logger } from './log.ts';

export interface MainOptions<C extends { logLevel: string }> {
  /** e.g. "worker": used in messages. */
  name: string;
  parse(argv: readonly string[], env: NodeJS.ProcessEnv): C;
  /** Starts the process; resolves with the ready line's fields and how to close. */
  start(config: C, log: Logger): Promise<{ ready: Record<string, unknown>; close(): Promise<void> }>;
}

export function runMain<C extends { logLevel: string }>(opts: MainOptions<C>): void {
  main(opts).catch((err: unknown) => {
    console.error(`${opts.name} failed to start:`, err instanceof Error ? err.message : err);
    process.exit(1);
  });
}

async function main<C extends { logLevel: string }>(opts: MainOptions<C>): Promise<void> {
  let config: C;
  try {
    config = opts.parse(process.argv.slice(2), process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(err.message);
      process.exit(2);
    }
    throw err;
  }
  const log = createLogger({ level: config.logLevel });
  const running = await opts.start(config, log);
  process.stdout.write(`${JSON.stringify({ ready: true, ...running.ready })}\n`);

  let stopping = false;
  const stop = (sig: string): void => {
    if (stopping) {
      log.warn({ sig }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    log.info({ sig }, 'shutting down');
    running.close().then(
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
