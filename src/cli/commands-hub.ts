// Commands that talk to the hub, the federation's source of truth: `asb cluster`, `asb key` and
// `asb template` (whose `build` talks to the worker API instead: commands-build.ts). Each takes
// a subcommand; the hub is found through --hub-url/--hub-key,
// ASB_HUB_URL/ASB_HUB_KEY or .asb/env (hub-client.ts).
import { resolve } from 'node:path';
import type { KubeObject } from '../api/meta.ts';
import { AsbError } from '../errors.ts';
import { hostPortProblem } from '../hub/clusters.ts';
import { boolOpt, parseCommandArgs, parseKeyValues, stringList, stringOpt, UsageError, ValueError, type OptionValues, type Parsed } from './args.ts';
import { parseOrExplain, readSource } from './commands-apply.ts';
import { EXIT, readAll, type Command, type CommandContext } from './command.ts';
import { BUILD_FLAGS, BUILD_HELP, builtTemplatesTable, listBuiltTemplates, runTemplateBuild } from './commands-build.ts';
import { ClientConfigError } from './env-file.ts';
import { createHubClient, resolveHubClientConfig, type ClusterView, type HubClient } from './hub-client.ts';
import { formatAge, formatTable, writeJson } from './output.ts';

const HUB_OPTIONS = {
  'hub-url': { type: 'string' },
  'hub-key': { type: 'string' },
  json: { type: 'boolean' },
} as const;

const HUB_HELP = `Hub flags (any subcommand):
  --hub-url URL          the hub's admin API (else $ASB_HUB_URL, else .asb/env)
  --hub-key KEY          a hub admin key (else $ASB_HUB_KEY, else .asb/env)
  --json                 print the result as JSON`;

function hubOf(parsed: Parsed, ctx: CommandContext): HubClient {
  const config = resolveHubClientConfig({
    flags: { hubUrl: stringOpt(parsed.values, 'hub-url'), hubKey: stringOpt(parsed.values, 'hub-key'), envFile: parsed.global.envFile },
    env: ctx.io.env,
    cwd: ctx.io.cwd,
  });
  return createHubClient(config);
}

/** The subcommand and its arguments; flags that belong to another subcommand are refused. */
export function subcommand(parsed: Parsed, usage: string, allowed: Record<string, readonly string[]>): { sub: string; args: string[] } {
  const [sub, ...args] = parsed.positionals;
  if (sub === undefined) throw new UsageError(`missing subcommand: one of ${Object.keys(allowed).join(', ')}`, usage);
  const flags = allowed[sub];
  if (flags === undefined) throw new UsageError(`unknown subcommand "${sub}": use one of ${Object.keys(allowed).join(', ')}`, usage);
  const common = new Set(['hub-url', 'hub-key', 'json', 'url', 'key', 'env-file', 'help']);
  for (const name of Object.keys(parsed.values)) {
    if (!common.has(name) && !flags.includes(name) && parsed.values[name] !== undefined) throw new UsageError(`--${name} does not apply to "${sub}"`, usage);
  }
  return { sub, args };
}

export function oneName(args: readonly string[], what: string, usage: string): string {
  if (args.length !== 1 || args[0] === undefined) throw new UsageError(args.length === 0 ? `missing ${what}` : `unexpected argument "${args[1] ?? ''}"`, usage);
  return args[0];
}

export function noArgs(args: readonly string[], usage: string): void {
  if (args.length > 0) throw new UsageError(`unexpected argument "${args[0] ?? ''}"`, usage);
}

function show(value: number | boolean | undefined): string {
  return value === undefined ? '-' : String(value);
}

export function clusterTable(items: readonly ClusterView[]): string {
  return formatTable(
    ['NAME', 'REGION', 'CONNECTED', 'VERSION', 'LAG', 'DRAIN'],
    items.map((c) => [c.metadata.name, c.spec.region, String(c.status.connected === true), show(c.status.appliedVersion), show(c.status.lag), String(c.spec.drain === true)]),
  );
}

function printCredential(ctx: CommandContext, values: OptionValues, name: string, cluster: ClusterView, credential: string | undefined, verb: string): void {
  if (values.json === true) {
    writeJson(ctx.io.stdout, credential === undefined ? { cluster } : { cluster, credential });
    return;
  }
  ctx.io.stdout.write(`cluster/${name} ${verb}\n`);
  if (credential !== undefined) {
    ctx.io.stdout.write(`credential: ${credential}\n`);
    ctx.io.stderr.write('This credential is shown only once: give it to the cluster\'s worker now (its sync agent presents it to the hub).\n');
  }
}

export const clusterCommand: Command = {
  name: 'cluster',
  summary: 'List, register, drain and remove worker clusters at the hub',
  usage: 'asb cluster ls | add <name> --region R --ingress HOST:PORT --tag ABCD [--api-url URL] [--label K=V]... | drain <name> [--off] | rotate <name> | rm <name>',
  help: `Subcommands:
  ls                     every cluster: NAME REGION CONNECTED VERSION LAG DRAIN
  add <name>             register a cluster (or change one); prints its sync credential once
    --region R           its region, a DNS label (e.g. region-a)
    --ingress HOST:PORT  where other edges send its sandbox traffic
    --tag ABCD           4 characters [a-z0-9] prefixed to its sandbox ids; fixed once registered
    --api-url URL        its worker API, for the hub's own calls
    --label K=V          repeatable
  drain <name> [--off]   stop (or resume) placing new sandboxes there; existing ones stay
  rotate <name>          replace its sync credential (printed once); the old one stops working
  rm <name>              remove it from the registry

${HUB_HELP}

Example:
  asb cluster add region-a --region region-a --ingress 127.0.0.1:10001 --tag rga1`,
  options: {
    ...HUB_OPTIONS,
    region: { type: 'string' },
    ingress: { type: 'string' },
    tag: { type: 'string' },
    'api-url': { type: 'string' },
    label: { type: 'string', multiple: true },
    off: { type: 'boolean' },
  },
  async run(argv, ctx) {
    const parsed = parseCommandArgs(argv, this.options, this.usage);
    const { sub, args } = subcommand(parsed, this.usage, {
      ls: [],
      add: ['region', 'ingress', 'tag', 'api-url', 'label'],
      drain: ['off'],
      rotate: [],
      rm: [],
    });
    const { values } = parsed;
    if (sub === 'ls') {
      noArgs(args, this.usage);
      const { items } = await hubOf(parsed, ctx).listClusters();
      if (values.json === true) writeJson(ctx.io.stdout, { items });
      else ctx.io.stdout.write(clusterTable(items));
      return EXIT.ok;
    }
    const name = oneName(args, 'cluster name', this.usage);
    if (sub === 'add') {
      const ingress = stringOpt(values, 'ingress');
      if (ingress !== undefined) {
        const problem = hostPortProblem(ingress);
        if (problem !== undefined) throw new ValueError(`--ingress ${problem}`);
      }
      const labels = stringList(values, 'label');
      const result = await hubOf(parsed, ctx).putCluster(name, {
        region: stringOpt(values, 'region'),
        ingressAddress: ingress,
        tag: stringOpt(values, 'tag'),
        apiUrl: stringOpt(values, 'api-url'),
        labels: labels.length === 0 ? undefined : parseKeyValues(labels, '--label'),
      });
      printCredential(ctx, values, name, result.cluster, result.credential, result.credential === undefined ? 'configured' : 'registered');
      return EXIT.ok;
    }
    if (sub === 'drain') {
      const { cluster } = await hubOf(parsed, ctx).putCluster(name, { drain: boolOpt(values, 'off') !== true });
      if (values.json === true) writeJson(ctx.io.stdout, { cluster });
      else ctx.io.stdout.write(`cluster/${name} ${cluster.spec.drain === true ? 'drained: no new sandboxes go there' : 'undrained: it takes new sandboxes again'}\n`);
      return EXIT.ok;
    }
    if (sub === 'rotate') {
      const { cluster, credential } = await hubOf(parsed, ctx).rotateCredential(name);
      printCredential(ctx, values, name, cluster, credential, 'credential rotated');
      return EXIT.ok;
    }
    const removed = await hubOf(parsed, ctx).deleteCluster(name);
    if (values.json === true) writeJson(ctx.io.stdout, removed);
    else ctx.io.stdout.write(`cluster/${name} removed\n`);
    return EXIT.ok;
  },
};

export const keyCommand: Command = {
  name: 'key',
  summary: 'Create, list and revoke API keys at the hub (synced to every cluster)',
  usage: 'asb key create --team TEAM [--admin] [--description TEXT] | ls | revoke <prefix>',
  help: `Subcommands:
  create --team TEAM     mint a key for a team; printed once, only its hash is kept
    --admin              an admin key (may change templates, pools, keys and clusters)
    --description TEXT   a note shown in listings
  ls                     every key: PREFIX TEAM ADMIN REVOKED AGE (never the key or its hash)
  revoke <prefix>        refuse the key from now on, at the hub and every cluster

${HUB_HELP}

Example:
  asb key create --team data-science`,
  options: { ...HUB_OPTIONS, team: { type: 'string' }, admin: { type: 'boolean' }, description: { type: 'string' } },
  async run(argv, ctx) {
    const parsed = parseCommandArgs(argv, this.options, this.usage);
    const { sub, args } = subcommand(parsed, this.usage, { create: ['team', 'admin', 'description'], ls: [], revoke: [] });
    const { values } = parsed;
    if (sub === 'create') {
      noArgs(args, this.usage);
      const team = stringOpt(values, 'team');
      if (team === undefined) throw new UsageError('missing --team', this.usage);
      const description = stringOpt(values, 'description');
      const created = await hubOf(parsed, ctx).createKey({ team, admin: boolOpt(values, 'admin') === true, ...(description === undefined ? {} : { description }) });
      if (values.json === true) writeJson(ctx.io.stdout, created);
      else {
        ctx.io.stdout.write(`${created.key}\n`);
        ctx.io.stderr.write(`Key ${created.prefix} for team "${created.team}"${created.admin ? ' (admin)' : ''}: shown only once, store it now.\n`);
      }
      return EXIT.ok;
    }
    if (sub === 'ls') {
      noArgs(args, this.usage);
      const { items } = await hubOf(parsed, ctx).listKeys();
      if (values.json === true) writeJson(ctx.io.stdout, { items });
      else {
        const now = ctx.clock.now();
        ctx.io.stdout.write(formatTable(['PREFIX', 'TEAM', 'ADMIN', 'REVOKED', 'AGE'], items.map((k) => [k.prefix, k.team, String(k.admin), String(k.revoked), formatAge(k.created, now)])));
      }
      return EXIT.ok;
    }
    const revoked = await hubOf(parsed, ctx).revokeKey(oneName(args, 'key prefix (asb_xxxxxxxx)', this.usage));
    if (values.json === true) writeJson(ctx.io.stdout, revoked);
    else ctx.io.stdout.write(`key/${revoked.prefix} revoked\n`);
    return EXIT.ok;
  },
};

export const templateCommand: Command = {
  name: 'template',
  summary: 'Build templates from a Dockerfile; list your team\'s built templates; apply and list templates at the hub (synced to every cluster)',
  usage: 'asb template build NAME[:TAG] [-f Dockerfile] [--build-arg K=V]... [--no-cache] [CONTEXT] | apply -f <file.yaml|-> [-f ...] | ls [--json]',
  help: `Subcommands:
${BUILD_HELP}
  apply -f FILE          create or update the SandboxTemplates in FILE (- reads stdin; repeatable);
                         every object is checked first, and if any is invalid nothing is applied
  ls                     your team's built templates (name, id, tags and the builds they name,
                         latest build, its status, updated), from the worker API, then every
                         template at the hub; each part when it is configured. --json prints
                         {"built": [...], "items": [hub templates]}

build and ls talk to the worker API (--url/--key, ASB_API_URL/ASB_API_KEY, .asb/env), as asb create
does; apply and ls to the hub:
${HUB_HELP}

Examples:
  asb template build myapp -f Dockerfile --build-arg VERSION=1.2 .
  asb template build myapp --egress pypi.org,files.pythonhosted.org .
  asb template apply -f examples/python-template.yaml`,
  options: {
    ...HUB_OPTIONS,
    filename: { type: 'string', short: 'f', multiple: true },
    'build-arg': { type: 'string', multiple: true },
    cache: { type: 'boolean' },
    timeout: { type: 'string' },
    egress: { type: 'string' },
  },
  async run(argv, ctx) {
    const parsed = parseCommandArgs(argv, this.options, this.usage);
    const { sub, args } = subcommand(parsed, this.usage, { build: BUILD_FLAGS, apply: ['filename'], ls: [] });
    const { values } = parsed;
    if (sub === 'build') return runTemplateBuild(parsed, args, ctx, this.usage);
    noArgs(args, this.usage);
    if (sub === 'ls') {
      // Each source that is configured; an error from one that is configured fails the command.
      const built = await listBuiltTemplates(parsed, ctx);
      let hub: HubClient | undefined;
      try {
        hub = hubOf(parsed, ctx);
      } catch (err) {
        if (!(err instanceof ClientConfigError) || built === undefined) throw err;
      }
      const items = hub === undefined ? undefined : (await hub.listTemplates()).items;
      if (values.json === true) writeJson(ctx.io.stdout, { ...(built === undefined ? {} : { built }), ...(items === undefined ? {} : { items }) });
      else {
        const now = ctx.clock.now();
        if (built !== undefined) ctx.io.stdout.write(built.length === 0 ? 'No templates built by your team.\n' : builtTemplatesTable(built, now));
        if (built !== undefined && items !== undefined) ctx.io.stdout.write('\n');
        if (items !== undefined) ctx.io.stdout.write(formatTable(['NAMESPACE', 'NAME', 'AGE'], items.map((t) => [t.metadata.namespace ?? 'default', t.metadata.name, formatAge(t.metadata.creationTimestamp, now)])));
      }
      return EXIT.ok;
    }
    const files = stringList(values, 'filename');
    if (files.length === 0) throw new UsageError('missing -f <file>', this.usage);
    if (files.filter((f) => f === '-').length > 1) throw new UsageError('stdin (-f -) can be read only once', this.usage);
    const objects: KubeObject[] = [];
    for (const file of files) {
      const source = file === '-' ? '<stdin>' : file;
      const text = file === '-' ? (await readAll(ctx.io.stdin)).toString('utf8') : readSource(resolve(ctx.io.cwd, file), file);
      objects.push(...parseOrExplain(text, source));
    }
    if (objects.length === 0) throw new UsageError(`no objects in ${files.join(', ')}`, this.usage);
    const others = objects.filter((o) => o.kind !== 'SandboxTemplate');
    if (others.length > 0) {
      throw new AsbError('Invalid', `the hub holds SandboxTemplates only; apply ${others.map((o) => `${o.kind}/${o.metadata.name}`).join(', ')} to a cluster with \`asb apply\`; nothing was applied`);
    }
    const { results } = await hubOf(parsed, ctx).apply(objects);
    if (values.json === true) writeJson(ctx.io.stdout, { results });
    else for (const r of results) ctx.io.stdout.write(`${r.kind.toLowerCase()}/${r.name} ${r.action}\n`);
    return EXIT.ok;
  },
};
