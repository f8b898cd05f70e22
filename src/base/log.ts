// The logger is injected everywhere (pino); components take a child with `component` set.
//
// Secrets never reach a log line (the security probe found them in a world-readable log): a URL's
// query string carries signed /files URLs' `signature=` and terminal `?token=`, and request headers
// carry API keys (Authorization), sandbox tokens (X-Access-Token, the asb_access cookie). Every
// logger made here drops the query of a logged `url` and redacts those headers wherever a log call
// puts them, so a future `log.error({ err, url: req.url, headers: req.headers })` stays safe.
import { pino, type Logger } from 'pino';

export type { Logger };

export interface LogOptions {
  level?: string;
  /** Where JSON lines go; default stderr. */
  destination?: number | string;
}

/** What a redacted value is replaced by. */
export const REDACTED = '[redacted]';

/** Header names (lower case) whose values are credentials. */
const SECRET_HEADERS = ['authorization', 'cookie', 'set-cookie', 'x-access-token', 'proxy-authorization'];

/** pino redact paths: the secret headers under `headers` (and `req.headers`), at the top or one object down. */
const REDACT_PATHS = SECRET_HEADERS.flatMap((name) => [`headers["${name}"]`, `*.headers["${name}"]`, `req.headers["${name}"]`]);

/** A URL or request target without its query string and fragment (`/files?signature=…` → `/files?[redacted]`). */
export function redactUrl(url: unknown): unknown {
  if (typeof url !== 'string') return url;
  const cut = url.search(/[?#]/);
  return cut === -1 ? url : `${url.slice(0, cut)}?${REDACTED}`;
}

export function createLogger(opts: LogOptions = {}): Logger {
  return pino(
    {
      level: opts.level ?? 'info',
      base: null,
      serializers: { url: redactUrl },
      redact: { paths: REDACT_PATHS, censor: REDACTED },
    },
    pino.destination({ dest: opts.destination ?? 2, sync: false }),
  );
}

/** A logger that drops everything, for tests that do not look at logs. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
