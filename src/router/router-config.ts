// Router configuration: parsed once from flags and environment, every problem listed at once,
// then frozen. Flags (`--name value` or `--name=value`) win over environment variables.
//
//   --listen / ASB_ROUTER_LISTEN           gRPC ext_proc + health address. Default 127.0.0.1:9002
//   --domain / ASB_DOMAIN                  sandbox domain: <port>-<id>.<domain>. Default asb.localhost
//   --worker name=url (repeatable) / ASB_ROUTER_WORKERS (comma-separated name=url)
//                                          each worker cluster's REST API; the first is the default
//                                          for API requests that name no sandbox
//   --worker-key / ASB_ROUTER_WORKER_KEY   admin API key for the workers (feed, resume, activity)
//   --worker-key-file / ASB_ROUTER_WORKER_KEY_FILE   or read it from this file
//   --hold-limit-ms / ASB_ROUTER_HOLD_LIMIT_MS       longest hold for a wake. Default 25000
//   --hub-upstream on|off / ASB_ROUTER_HUB_UPSTREAM  on: creates and lists (POST and GET
//                                          /v1/sandboxes) on the edge listener go to Envoy's `hub`
//                                          upstream (the hub places them across clusters) while a
//                                          worker reports its hub link up; off, or hub down: to the
//                                          default worker. Needs a `hub` cluster in Envoy. Default off
//   --lookup-burst / ASB_ROUTER_LOOKUP_BURST   lookups of unknown sandbox ids (GET at the worker)
//                                          one client address may make at once; past them and the
//                                          refill below the router answers 429. Default 20
//   --lookup-rate / ASB_ROUTER_LOOKUP_RATE     lookups per second a client address regains. Default 5
//                                          (lookup-limiter.ts says why; the address is the one
//                                          Envoy saw, client-address.ts)
//   --metrics-listen / ASB_ROUTER_METRICS_LISTEN   host:port ([v6]:port) of an HTTP listener serving GET
//                                          /metrics (Prometheus text of the asb_router_* series) to
//                                          the worker key as a bearer token. Default: none (off)
//   --log-level / ASB_LOG_LEVEL            Default info
import { parseFlags } from '../base/flags.ts';
import { readFileSync } from 'node:fs';
import { ConfigError } from '../base/flags.ts';
import { parseHostPort } from '../base/host-port.ts';
import { DEFAULT_LOOKUP_LIMITS } from './lookup-limiter.ts';
import { DEFAULT_HOLD_LIMIT_MS } from './waker.ts';
import type { WorkerEndpoint } from './worker-api.ts';

export interface RouterConfig {
  readonly listen: string;
  readonly domain: string;
  readonly workers: readonly WorkerEndpoint[];
  readonly holdLimitMs: number;
  /** --hub-upstream on. */
  readonly hubUpstream: boolean;
  /** --lookup-burst, --lookup-rate: each client address's budget of worker lookups. */
  readonly lookupBurst: number;
  readonly lookupRatePerS: number;
  /** --metrics-listen: where GET /metrics is served; undefined: not served. */
  readonly metricsListen: string | undefined;
  readonly logLevel: string;
}

const FLAGS = ['listen', 'domain', 'worker', 'worker-key', 'worker-key-file', 'hold-limit-ms', 'hub-upstream', 'lookup-burst', 'lookup-rate', 'metrics-listen', 'log-level'] as const;
type Flag = (typeof FLAGS)[number];
const ENV: Record<Flag, string> = {
  listen: 'ASB_ROUTER_LISTEN',
  domain: 'ASB_DOMAIN',
  worker: 'ASB_ROUTER_WORKERS',
  'worker-key': 'ASB_ROUTER_WORKER_KEY',
  'worker-key-file': 'ASB_ROUTER_WORKER_KEY_FILE',
  'hold-limit-ms': 'ASB_ROUTER_HOLD_LIMIT_MS',
  'hub-upstream': 'ASB_ROUTER_HUB_UPSTREAM',
  'lookup-burst': 'ASB_ROUTER_LOOKUP_BURST',
  'lookup-rate': 'ASB_ROUTER_LOOKUP_RATE',
  'metrics-listen': 'ASB_ROUTER_METRICS_LISTEN',
  'log-level': 'ASB_LOG_LEVEL',
};
const NAME = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

export function parseRouterConfig(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): RouterConfig {
  const problems: string[] = [];
  const flags = parseFlags(argv, problems);
  for (const name of flags.keys()) if (!(FLAGS as readonly string[]).includes(name)) problems.push(`unknown flag --${name}`);
  const one = (flag: Flag): string | undefined => flags.get(flag)?.at(-1) ?? env[ENV[flag]];

  const listen = one('listen') ?? '127.0.0.1:9002';
  if (!isHostPort(listen)) problems.push(`--listen (ASB_ROUTER_LISTEN) must be host:port, got "${listen}"`);
  const metricsListen = one('metrics-listen');
  if (metricsListen !== undefined && !isHostPort(metricsListen)) problems.push(`--metrics-listen (ASB_ROUTER_METRICS_LISTEN) must be host:port, got "${metricsListen}"`);
  const domain = (one('domain') ?? 'asb.localhost').toLowerCase();
  if (!DOMAIN.test(domain)) problems.push(`--domain (ASB_DOMAIN) must be a DNS name, got "${domain}"`);
  const holdText = one('hold-limit-ms') ?? String(DEFAULT_HOLD_LIMIT_MS);
  const holdLimitMs = Number(holdText);
  if (!Number.isInteger(holdLimitMs) || holdLimitMs < 100 || holdLimitMs > 600_000) problems.push(`--hold-limit-ms (ASB_ROUTER_HOLD_LIMIT_MS) must be an integer from 100 to 600000, got "${holdText}"`);
  const burstText = one('lookup-burst') ?? String(DEFAULT_LOOKUP_LIMITS.burst);
  const lookupBurst = Number(burstText);
  if (!Number.isInteger(lookupBurst) || lookupBurst < 1 || lookupBurst > 100_000) problems.push(`--lookup-burst (ASB_ROUTER_LOOKUP_BURST) must be an integer from 1 to 100000, got "${burstText}"`);
  const rateText = one('lookup-rate') ?? String(DEFAULT_LOOKUP_LIMITS.ratePerS);
  const lookupRatePerS = Number(rateText);
  if (rateText.trim() === '' || !Number.isFinite(lookupRatePerS) || lookupRatePerS < 0.001 || lookupRatePerS > 100_000) problems.push(`--lookup-rate (ASB_ROUTER_LOOKUP_RATE) must be a number of lookups per second from 0.001 to 100000, got "${rateText}"`);
  const hubText = one('hub-upstream') ?? 'off';
  if (hubText !== 'on' && hubText !== 'off') problems.push(`--hub-upstream (ASB_ROUTER_HUB_UPSTREAM) must be on or off, got "${hubText}"`);

  let key = one('worker-key');
  const keyFile = one('worker-key-file');
  if (key === undefined && keyFile !== undefined) {
    try {
      key = readFileSync(keyFile, 'utf8').trim();
    } catch (err) {
      problems.push(`--worker-key-file (ASB_ROUTER_WORKER_KEY_FILE): cannot read "${keyFile}": ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  const specs = flags.get('worker') ?? (env.ASB_ROUTER_WORKERS ?? '').split(',').filter((s) => s.trim() !== '');
  const workers: WorkerEndpoint[] = [];
  for (const spec of specs) {
    const eq = spec.indexOf('=');
    const cluster = spec.slice(0, eq).trim();
    const url = spec.slice(eq + 1).trim();
    if (eq <= 0 || !NAME.test(cluster)) {
      problems.push(`--worker must be name=http://host:port with a DNS-label name, got "${spec}"`);
      continue;
    }
    if (!URL.canParse(url) || !/^https?:$/.test(new URL(url).protocol)) {
      problems.push(`--worker ${cluster}: "${url}" is not an http(s) URL`);
      continue;
    }
    if (workers.some((w) => w.cluster === cluster)) problems.push(`--worker ${cluster} given twice`);
    workers.push({ cluster, url, key: key ?? '' });
  }
  if (workers.length === 0) problems.push('at least one --worker name=http://host:port (ASB_ROUTER_WORKERS) is required');
  if (key === undefined || key === '') problems.push('--worker-key (ASB_ROUTER_WORKER_KEY) or --worker-key-file is required: the route feed needs an admin key');

  if (problems.length > 0) throw new ConfigError(problems);
  return Object.freeze({ listen, domain, workers: Object.freeze(workers), holdLimitMs, hubUpstream: hubText === 'on', lookupBurst, lookupRatePerS, metricsListen, logLevel: one('log-level') ?? 'info' });
}

const isHostPort = (text: string): boolean => parseHostPort(text) !== undefined;
