// Commands about the whole system: `up` runs it, `status` reports on it.
import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import type { StatusView } from '../client/api-client.ts';
import { parseCommandArgs, UsageError } from './args.ts';
import { EXIT, type Command } from './command.ts';
import { ClientConfigError, defaultRepoRoot } from './env-file.ts';
import { createHubClient, resolveHubClientConfig, type FederationView } from './hub-client.ts';
import { formatFields, formatTable, writeJson } from './output.ts';

export const upCommand: Command = {
  name: 'up',
  summary: 'Run the local system in the foreground (same as `make up`); Ctrl-C stops it',
  usage: 'asb up',
  help: `Runs \`make up\` in the repository root with this terminal attached. It writes .asb/env, which
every other asb command reads. Ctrl-C (or SIGTERM) stops it cleanly; a second Ctrl-C forces it.
Worker settings come from the environment, e.g. ASB_BASE_POOL_REPLICAS=5 asb up.`,
  options: {},
  async run(argv, ctx) {
    const { positionals } = parseCommandArgs(argv, this.options, this.usage);
    if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0] ?? ''}"`, this.usage);
    return runForeground('make', ['up'], defaultRepoRoot(), ctx.io.env);
  },
};

/**
 * Runs a child with our terminal, forwarding SIGINT and SIGTERM exactly once each. The child gets
 * its own process group: otherwise a Ctrl-C reaches it twice (once from the terminal, once from
 * us), and the supervisor behind `make up` reads a second signal as "force stop now".
 * SIGINT goes to the whole group, as a terminal would send it, because make does not pass SIGINT
 * on to its recipe; SIGTERM goes to make alone, because make does pass that one on.
 */
function runForeground(cmd: string, args: string[], cwd: string, env: Readonly<Record<string, string | undefined>>): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { cwd, env, stdio: 'inherit', detached: true });
    const onInt = (): void => {
      if (child.pid !== undefined) signalQuietly(-child.pid, 'SIGINT');
    };
    const onTerm = (): void => {
      if (child.pid !== undefined) signalQuietly(child.pid, 'SIGTERM');
    };
    process.on('SIGINT', onInt);
    process.on('SIGTERM', onTerm);
    const done = (code: number): void => {
      process.off('SIGINT', onInt);
      process.off('SIGTERM', onTerm);
      resolve(code);
    };
    child.on('error', (err) => {
      process.stderr.write(`error: cannot run ${cmd}: ${err.message}\n`);
      done(EXIT.failed);
    });
    child.on('exit', (code, signal) => {
      // Killed by a signal: report it the way a shell does, 128 + the signal number.
      done(code ?? 128 + (signal === null ? 0 : constants.signals[signal]));
    });
  });
}

function signalQuietly(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // ESRCH: it already exited; the exit handler reports that.
  }
}

export const statusCommand: Command = {
  name: 'status',
  summary: 'Show the cluster, its warm pools and sandboxes by phase, and with a hub every cluster of the federation',
  usage: 'asb status [--json] [--hub-url URL --hub-key KEY]',
  help: `Options:
  --json                 print the status as JSON ({ ...worker status, federation: { hub, clusters } })
  --hub-url URL          the hub (else $ASB_HUB_URL, else .asb/env); without one, only the worker is shown
  --hub-key KEY          a key the hub accepts (else $ASB_HUB_KEY, else .asb/env)

With a hub, each cluster's health (healthy, unhealthy, down; drained), the hub version it has
applied and its lag behind the hub are listed.`,
  options: { json: { type: 'boolean' }, 'hub-url': { type: 'string' }, 'hub-key': { type: 'string' } },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0] ?? ''}"`, this.usage);
    const client = ctx.client(global);
    const status = await client.status();
    const federation = await federationOf(values, global.envFile, ctx.io);
    if (values.json === true) writeJson(ctx.io.stdout, federation === undefined ? status : { ...status, federation });
    else ctx.io.stdout.write(formatStatus(status, client.url) + (federation === undefined ? '' : formatFederation(federation.hub, federation.clusters)));
    return EXIT.ok;
  },
};

/** The hub's view of every cluster, when a hub is configured (flags, environment or .asb/env). */
async function federationOf(
  values: Record<string, unknown>,
  envFile: string | undefined,
  io: { env: Readonly<Record<string, string | undefined>>; cwd: string },
): Promise<{ hub: string; clusters: FederationView['clusters'] } | undefined> {
  const text = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);
  let config;
  try {
    config = resolveHubClientConfig({ flags: { hubUrl: text(values['hub-url']), hubKey: text(values['hub-key']), envFile }, env: io.env, cwd: io.cwd });
  } catch (err) {
    // No hub configured: a single cluster. Any other problem (a bad URL) is the user's to see.
    if (err instanceof ClientConfigError && err.message.startsWith('no hub URL')) return undefined;
    throw err;
  }
  const { clusters } = await createHubClient(config).federation();
  return { hub: config.url, clusters };
}

/** The hub's own view (GET /v1/federation): health as placement sees it, so both always agree. */
export function formatFederation(hub: string, clusters: FederationView['clusters']): string {
  const rows = clusters.map((c) => [c.name, c.region, c.drained ? `${c.health}, drained` : c.health, String(c.appliedVersion), String(c.lag)]);
  return `\nFederation (hub ${hub})\n${formatTable(['CLUSTER', 'REGION', 'HEALTH', 'SYNC VERSION', 'LAG'], rows)}`;
}

export function formatStatus(s: StatusView, url: string): string {
  const phases = Object.entries(s.sandboxes).filter(([, n]) => n > 0);
  const total = phases.reduce((sum, [, n]) => sum + n, 0);
  const head = formatFields([
    ['cluster', `${s.cluster.name} (id tag ${s.cluster.tag})`],
    ['worker', url],
    ['version', s.version],
    ['sandboxes', total === 0 ? '0' : `${total} (${phases.map(([p, n]) => `${p} ${n}`).join(', ')})`],
  ]);
  if (s.pools.length === 0) return `${head}\nNo warm pools.\n`;
  const rows = s.pools.map((p) => [`${p.namespace}/${p.name}`, p.template, `${p.readyReplicas}/${p.replicas}`]);
  return `${head}\n${formatTable(['POOL', 'TEMPLATE', 'READY'], rows)}`;
}
