// Argument parsing for every command: node:util parseArgs plus the value parsers the commands
// share (durations, KEY=value pairs). Any mistake becomes a UsageError, which the entry point
// prints with the command's usage line and exits 2, the convention of POSIX utilities.
import { parseArgs, type ParseArgsOptionsConfig } from 'node:util';

export class UsageError extends Error {
  /** The usage line of the command that was misused, printed after the message. */
  readonly usage: string;

  constructor(message: string, usage: string) {
    super(message);
    this.name = 'UsageError';
    this.usage = usage;
  }
}

/** A bad flag value (duration, KEY=value); the entry point adds the command's usage line. */
export class ValueError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ValueError';
  }
}

/** Flags every command accepts: where the worker is and how to authenticate. */
export const GLOBAL_OPTIONS = {
  url: { type: 'string' },
  key: { type: 'string' },
  'env-file': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsOptionsConfig;

export interface GlobalFlags {
  url?: string;
  key?: string;
  envFile?: string;
  help: boolean;
}

export type OptionValues = Record<string, string | boolean | (string | boolean)[] | undefined>;

export interface Parsed {
  values: OptionValues;
  positionals: string[];
  global: GlobalFlags;
}

/** Parses argv against the command's options plus the global ones; strict, so typos are caught. */
export function parseCommandArgs(argv: readonly string[], options: ParseArgsOptionsConfig, usage: string): Parsed {
  let result: { values: OptionValues; positionals: string[] };
  try {
    result = parseArgs({ args: [...argv], options: { ...GLOBAL_OPTIONS, ...options }, allowPositionals: true, allowNegative: true, strict: true });
  } catch (err) {
    throw new UsageError(err instanceof Error ? cleanParseMessage(err.message) : String(err), usage);
  }
  const v = result.values;
  const global: GlobalFlags = { help: v.help === true };
  if (typeof v.url === 'string') global.url = v.url;
  if (typeof v.key === 'string') global.key = v.key;
  if (typeof v['env-file'] === 'string') global.envFile = v['env-file'];
  return { values: v, positionals: result.positionals, global };
}

/** parseArgs' messages end with advice about `--`; ours point to --help instead. */
function cleanParseMessage(message: string): string {
  const first = message.split('\n')[0] ?? message;
  return first.replace(/\. To specify a positional argument.*$/, '').replace(/^Unknown option '([^']+)'.*$/, "unknown flag '$1'");
}

export function stringOpt(values: OptionValues, name: string): string | undefined {
  const v = values[name];
  return typeof v === 'string' ? v : undefined;
}

export function stringList(values: OptionValues, name: string): string[] {
  const v = values[name];
  if (v === undefined) return [];
  return (Array.isArray(v) ? v : [v]).filter((x): x is string => typeof x === 'string');
}

export function boolOpt(values: OptionValues, name: string): boolean | undefined {
  const v = values[name];
  return typeof v === 'boolean' ? v : undefined;
}

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * Parses a duration such as 30s, 10m, 1h, 1h30m, 500ms or 2d into milliseconds. A bare number is
 * refused rather than guessed: "10" could mean seconds or minutes, and a sandbox that dies 600
 * times sooner than intended is a bad surprise.
 */
export function parseDuration(text: string, flag: string): number {
  const trimmed = text.trim();
  const hint = `use a number with a unit (ms, s, m, h, d), e.g. 30s, 10m, 1h or 1h30m`;
  if (/^\d+(\.\d+)?$/.test(trimmed)) throw new ValueError(`${flag}: "${text}" has no unit; ${hint}`);
  const part = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/gy;
  let total = 0;
  let consumed = 0;
  for (const match of trimmed.matchAll(part)) {
    total += Number(match[1]) * (UNIT_MS[match[2] ?? ''] ?? Number.NaN);
    consumed += match[0].length;
  }
  if (trimmed === '' || consumed !== trimmed.length || !Number.isFinite(total)) throw new ValueError(`${flag}: invalid duration "${text}"; ${hint}`);
  return Math.round(total);
}

/** Parses repeated KEY=value flags (labels, env) into a record; a later key wins. */
export function parseKeyValues(items: readonly string[], flag: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of items) {
    const eq = item.indexOf('=');
    if (eq <= 0) throw new ValueError(`${flag}: expected KEY=value, got "${item}"`);
    out[item.slice(0, eq)] = item.slice(eq + 1);
  }
  return out;
}
