// Where the CLI finds the worker: `.asb/env`, written by `make up`, holds sourceable KEY=value
// lines (ASB_API_URL, ASB_API_KEY, ...). Precedence, most specific first:
//   --url / --key flags  >  ASB_API_URL / ASB_API_KEY in the environment  >  the env file.
// The env file is --env-file when given (it must exist), else $ASB_STATE_DIR/env (the same
// variable `make up` honours), else the first `.asb/env` found walking up from the working
// directory, else the one in the repository this CLI lives in.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface ClientConfig {
  url: string;
  key: string | undefined;
  /** The env file that was read, if any (shown in error messages). */
  envFile: string | undefined;
}

export interface ConfigSources {
  flags: { url?: string; key?: string; envFile?: string };
  env: Readonly<Record<string, string | undefined>>;
  cwd: string;
  /** Last fallback for the env file; default the repository that holds this CLI. */
  repoRoot?: string;
}

export class ClientConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ClientConfigError';
  }
}

/**
 * Parses sourceable shell assignments: `KEY=value`, `export KEY=value`, single- or double-quoted
 * values, `#` comments and blank lines. Anything else is ignored rather than fatal, since the
 * file may be hand-edited and the CLI only needs two keys from it.
 */
export function parseEnvFile(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const rawLine of text.split(/\r?\n/)) {
    const line = rawLine.trim();
    if (line === '' || line.startsWith('#')) continue;
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line);
    if (m === null) continue;
    const key = m[1] ?? '';
    out[key] = unquote((m[2] ?? '').trim());
  }
  return out;
}

function unquote(value: string): string {
  if (value.length >= 2 && value.startsWith("'") && value.endsWith("'")) return value.slice(1, -1);
  if (value.length >= 2 && value.startsWith('"') && value.endsWith('"')) return value.slice(1, -1).replace(/\\(["\\$`])/g, '$1');
  // Unquoted: a trailing ` # comment` is a comment to the shell.
  return value.replace(/\s+#.*$/, '');
}

export function defaultRepoRoot(): string {
  return resolve(dirname(fileURLToPath(import.meta.url)), '../..');
}

/** The env file to read, or undefined when there is none. */
export function findEnvFile(src: ConfigSources): string | undefined {
  if (src.flags.envFile !== undefined) {
    const path = resolve(src.cwd, src.flags.envFile);
    if (!existsSync(path)) throw new ClientConfigError(`--env-file ${src.flags.envFile}: no such file`);
    return path;
  }
  const stateDir = src.env.ASB_STATE_DIR;
  if (stateDir !== undefined && stateDir !== '') {
    const path = join(resolve(src.cwd, stateDir), 'env');
    return existsSync(path) ? path : undefined;
  }
  for (let dir = resolve(src.cwd); ; dir = dirname(dir)) {
    const path = join(dir, '.asb', 'env');
    if (existsSync(path)) return path;
    if (dirname(dir) === dir) break;
  }
  const fallback = join(src.repoRoot ?? defaultRepoRoot(), '.asb', 'env');
  return existsSync(fallback) ? fallback : undefined;
}

export function resolveClientConfig(src: ConfigSources): ClientConfig {
  const envFile = findEnvFile(src);
  const fromFile = envFile === undefined ? {} : parseEnvFile(readFileSync(envFile, 'utf8'));
  const pick = (flag: string | undefined, name: string): string | undefined => {
    const envValue = src.env[name];
    return flag ?? (envValue === undefined || envValue === '' ? undefined : envValue) ?? fromFile[name];
  };
  const url = pick(src.flags.url, 'ASB_API_URL');
  if (url === undefined || url === '') {
    const where = envFile === undefined ? 'no .asb/env was found' : `${envFile} has no ASB_API_URL`;
    throw new ClientConfigError(`no worker URL: ${where}. Run \`make up\` (it writes .asb/env), or set ASB_API_URL, or pass --url`);
  }
  if (!/^https?:\/\//.test(url)) throw new ClientConfigError(`worker URL must start with http:// or https://, got "${url}"`);
  return { url, key: pick(src.flags.key, 'ASB_API_KEY'), envFile };
}
