// The line between a client's settings and a server's. `make up` writes `.asb/env` for clients
// (the CLI, kubectl, E2B programs) and its banner tells users to source it. Four of its keys are
// also the worker's own settings (config.ts: ASB_KUBECONFIG, ASB_HUB_URL, ASB_EDGE_URL,
// ASB_EDGE_TLS_URL), so a `make up` run again in that shell handed them to its workers as their
// configuration, and the worker refused to start (--kubeconfig with --store=sqlite, exit 2).
//
// `make up` is the one program that both writes that file and starts servers, so it draws the
// line: no process it starts sees a key the file sets. The exception is ASB_DOMAIN, which is
// also `make up`'s own setting and which the file holds at the value `make up` was given.
// A worker started by hand reads its environment as documented in config.ts.

/** Every key `.asb/env` sets that is a client's setting only. */
export const CLIENT_SETTINGS = [
  'ASB_API_URL',
  'ASB_API_KEY',
  'ASB_HUB_URL',
  'ASB_HUB_KEY',
  'ASB_CLUSTER',
  'ASB_EDGE_URL',
  'ASB_EDGE_TLS_URL',
  'ASB_CA_CERT',
  'ASB_KUBECONFIG',
  'E2B_API_URL',
  'E2B_SANDBOX_URL',
  'E2B_API_KEY',
  'E2B_DOMAIN',
] as const;

export type ClientSetting = (typeof CLIENT_SETTINGS)[number];

/** What `.asb/env` may hold: the client settings, and the domain, which `make up` reads too. */
export type EnvFileKey = ClientSetting | 'ASB_DOMAIN';

/**
 * Removes every client setting from `env` (make up's own process environment, which each process
 * it starts inherits) and returns those that were set, for the console.
 */
export function dropClientSettings(env: Record<string, string | undefined>): ClientSetting[] {
  const present = CLIENT_SETTINGS.filter((key) => env[key] !== undefined);
  for (const key of present) Reflect.deleteProperty(env, key);
  return present;
}
