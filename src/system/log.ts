// The logger is injected everywhere (pino); components take a child with `component` set.
import { pino, type Logger } from 'pino';

export type { Logger };

export interface LogOptions {
  level?: string;
  /** Where JSON lines go; default stderr. */
  destination?: number | string;
}

export function createLogger(opts: LogOptions = {}): Logger {
  return pino({ level: opts.level ?? 'info', base: null }, pino.destination({ dest: opts.destination ?? 2, sync: false }));
}

/** A logger that drops everything, for tests that do not look at logs. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
