// Hub configuration: parsed once at the edge from flags and environment, every problem listed at
// once, then frozen and passed down. Flags (`--name value` or `--name=value`) win over
// environment variables, which win over the defaults.
//
//   --data-dir / ASB_HUB_DATA_DIR            the hub's store (hub.db) lives here. Default .asb/hub
//   --host / ASB_HUB_HOST                    address the admin API and sync endpoint bind. Default 127.0.0.1
//   --port / ASB_HUB_PORT                    their port; 0 picks a free one. Default 7070
//   --admin-key-file / ASB_HUB_ADMIN_KEY_FILE  keep (or create) a hub admin key here, mode 0600
//   --log-level / ASB_LOG_LEVEL              Default info
import { resolve } from 'node:path';
import { ConfigError } from '../base/flags.ts';
import { parseFlags } from '../base/flags.ts';

export interface HubConfig {
  readonly dataDir: string;
  readonly host: string;
  readonly port: number;
  readonly adminKeyFile: string | undefined;
  readonly logLevel: string;
}

const FLAGS = ['data-dir', 'host', 'port', 'admin-key-file', 'log-level'] as const;
type Flag = (typeof FLAGS)[number];
const ENV: Record<Flag, string> = {
  'data-dir': 'ASB_HUB_DATA_DIR',
  host: 'ASB_HUB_HOST',
  port: 'ASB_HUB_PORT',
  'admin-key-file': 'ASB_HUB_ADMIN_KEY_FILE',
  'log-level': 'ASB_LOG_LEVEL',
};
const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

export function parseHubConfig(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): HubConfig {
  const problems: string[] = [];
  const flags = parseFlags(argv, problems);
  for (const name of flags.keys()) if (!(FLAGS as readonly string[]).includes(name)) problems.push(`unknown flag --${name}`);
  const one = (flag: Flag): string | undefined => flags.get(flag)?.at(-1) ?? env[ENV[flag]];
  const describe = (flag: Flag): string => `--${flag} (${ENV[flag]})`;

  const portText = one('port') ?? '7070';
  const port = Number(portText);
  if (!/^\d+$/.test(portText) || port > 65535) problems.push(`${describe('port')} must be an integer from 0 to 65535, got "${portText}"`);
  const host = one('host') ?? '127.0.0.1';
  if (host === '' || /[\s/]/.test(host)) problems.push(`${describe('host')} must be an address such as 127.0.0.1 or ::, got "${host}"`);
  const logLevel = one('log-level') ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) problems.push(`${describe('log-level')} must be one of ${LOG_LEVELS.join(', ')}, got "${logLevel}"`);
  const dataDir = one('data-dir') ?? '.asb/hub';
  if (dataDir === '') problems.push(`${describe('data-dir')} must not be empty`);
  const adminKeyFile = one('admin-key-file');
  if (adminKeyFile === '') problems.push(`${describe('admin-key-file')} must not be empty`);

  if (problems.length > 0) throw new ConfigError(problems);
  return Object.freeze({
    dataDir: resolve(dataDir),
    host,
    port,
    adminKeyFile: adminKeyFile === undefined ? undefined : resolve(adminKeyFile),
    logLevel,
  });
}
