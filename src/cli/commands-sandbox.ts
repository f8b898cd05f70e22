// Sandbox lifecycle commands: create, ls, get, url, pause, resume, rm.
import { ApiUnreachableError, sandboxUrlFor, type ApiClient, type SandboxView } from '../client/api-client.ts';
import { AsbError, isAsbError } from '../errors.ts';
import { boolOpt, parseCommandArgs, parseDuration, parseKeyValues, stringList, stringOpt, UsageError } from './args.ts';
import { EXIT, type Command, type CommandContext } from './command.ts';
import { formatAge, formatError, formatFields, formatTable, writeJson } from './output.ts';
import { withSpinner } from './progress.ts';

const JSON_FLAG = { json: { type: 'boolean' } } as const;

export const createCommand: Command = {
  name: 'create',
  summary: 'Create a sandbox from a template (claims a warm one when the pool has it)',
  usage: 'asb create [--template NAME] [--region R] [--cluster C] [--label K=V]... [--timeout DUR] [--idle-timeout DUR] [--no-wait] [--json]',
  help: `Options:
  -t, --template NAME    template to start from (server default: base)
  -n, --namespace NS     namespace (default: default)
  --region R             prefer a cluster in region R (through an edge or the hub; other
                         regions are the failover)
  --cluster C            only cluster C (through an edge or the hub; no failover)
  --label K=V            label the sandbox; repeatable
  --timeout DUR          shut the sandbox down this long after creation (30s, 10m, 1h)
  --idle-timeout DUR     hibernate after this long without activity
  --no-wait              return at once instead of when the sandbox is Ready
  --no-cold-start        fail instead of starting a cold sandbox when the pool is empty
  --json                 print the sandbox as JSON (has "id", "url" and "accessToken")

The output names the cluster that holds the sandbox.

Example:
  asb create --template base --region eu-west --label task=demo --timeout 1h`,
  options: {
    ...JSON_FLAG,
    template: { type: 'string', short: 't' },
    namespace: { type: 'string', short: 'n' },
    region: { type: 'string' },
    cluster: { type: 'string' },
    label: { type: 'string', multiple: true },
    timeout: { type: 'string' },
    'idle-timeout': { type: 'string' },
    wait: { type: 'boolean', default: true },
    'cold-start': { type: 'boolean', default: true },
  },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0] ?? ''}"`, this.usage);
    const template = stringOpt(values, 'template');
    const namespace = stringOpt(values, 'namespace');
    const region = stringOpt(values, 'region');
    const cluster = stringOpt(values, 'cluster');
    const timeout = stringOpt(values, 'timeout');
    const idle = stringOpt(values, 'idle-timeout');
    const labels = parseKeyValues(stringList(values, 'label'), '--label');
    const wait = boolOpt(values, 'wait') ?? true;
    const req = {
      ...(template === undefined ? {} : { template }),
      ...(namespace === undefined ? {} : { namespace }),
      ...(region === undefined ? {} : { region }),
      ...(cluster === undefined ? {} : { cluster }),
      ...(Object.keys(labels).length === 0 ? {} : { labels }),
      ...(timeout === undefined ? {} : { timeoutMs: parseDuration(timeout, '--timeout') }),
      ...(idle === undefined ? {} : { idleTimeoutMs: parseDuration(idle, '--idle-timeout') }),
      wait,
      coldStart: boolOpt(values, 'cold-start') ?? true,
    };
    const client = ctx.client(global);
    const label = `creating a sandbox from ${template ?? 'the default template'}`;
    const sb = wait ? await withSpinner(ctx.io.stderr, ctx.clock, label, () => client.createSandbox(req)) : await client.createSandbox(req);
    if (values.json === true) writeJson(ctx.io.stdout, sb);
    else ctx.io.stdout.write(`${sb.id}  ${sb.phase}${sb.ready ? ' (ready)' : ''}  ${sb.launchType}${sb.cluster === undefined ? '' : `  cluster ${sb.cluster}`}\n`);
    return EXIT.ok;
  },
};

export const lsCommand: Command = {
  name: 'ls',
  summary: 'List sandboxes',
  usage: 'asb ls [-l SELECTOR] [--template NAME] [--phase PHASE] [--all-pages] [--json]',
  help: `Options:
  -l, --selector SEL     label selector, e.g. task=demo,team!=ops
  --template NAME        only sandboxes from this template
  --phase PHASE          only sandboxes in this phase (Running, Hibernated, Failed, ...)
  --limit N              page size
  --all-pages            follow continue tokens until the list is complete
  --json                 print {items: [...]} as JSON

REASON says why a Failed or Expired sandbox stopped (ErrImagePull, OOMKilled, ...);
asb get <id> shows its message too.`,
  options: {
    ...JSON_FLAG,
    selector: { type: 'string', short: 'l' },
    template: { type: 'string' },
    phase: { type: 'string' },
    limit: { type: 'string' },
    'all-pages': { type: 'boolean' },
  },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0] ?? ''}"`, this.usage);
    const limitText = stringOpt(values, 'limit');
    const limit = limitText === undefined ? undefined : Number(limitText);
    if (limit !== undefined && (!Number.isInteger(limit) || limit <= 0)) throw new UsageError(`--limit must be a positive integer, got "${limitText ?? ''}"`, this.usage);
    const base = {
      ...(limit === undefined ? {} : { limit }),
      ...optional('labelSelector', stringOpt(values, 'selector')),
      ...optional('template', stringOpt(values, 'template')),
      ...optional('phase', stringOpt(values, 'phase')),
    };
    const client = ctx.client(global);
    const items: SandboxView[] = [];
    let token: string | undefined;
    do {
      const page = await client.listSandboxes({ ...base, ...optional('continue', token) });
      items.push(...page.items);
      token = page.continue === '' ? undefined : page.continue;
    } while (token !== undefined && values['all-pages'] === true);

    if (values.json === true) {
      writeJson(ctx.io.stdout, token === undefined ? { items } : { items, continue: token });
      return EXIT.ok;
    }
    if (items.length === 0) ctx.io.stderr.write('No sandboxes.\n');
    else ctx.io.stdout.write(sandboxTable(items, ctx.clock.now()));
    if (token !== undefined) ctx.io.stderr.write('(more sandboxes: pass --all-pages to list them all)\n');
    return EXIT.ok;
  },
};

/**
 * REASON (last, as it may be long) is why a Failed or Expired sandbox stopped; `asb get` adds its
 * message. MEMORY, for a Hibernated sandbox: whether its memory and processes were kept.
 */
export function sandboxTable(items: readonly SandboxView[], nowMs: number): string {
  const rows = items.map((s) => [s.id, s.template, s.phase, s.ready ? 'true' : 'false', s.memory ?? '-', formatAge(s.createdAt, nowMs), s.owner === '' ? '-' : s.owner, s.reason ?? '']);
  return formatTable(['ID', 'TEMPLATE', 'PHASE', 'READY', 'MEMORY', 'AGE', 'OWNER', 'REASON'], rows);
}

export const getCommand: Command = {
  name: 'get',
  summary: 'Show one sandbox',
  usage: 'asb get <id> [--json]',
  help: 'Options:\n  --json                 print the sandbox as JSON',
  options: { ...JSON_FLAG },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    const id = singleId(positionals, this.usage);
    const client = ctx.client(global);
    const sb = values['rotate-token'] === true ? await client.rotateAccessToken(id) : await client.getSandbox(id);
    if (values.json === true) writeJson(ctx.io.stdout, sb);
    else ctx.io.stdout.write(describeSandbox(sb, ctx.clock.now()));
    return EXIT.ok;
  },
};

export const urlCommand: Command = {
  name: 'url',
  summary: "Print a sandbox's URL through the edge (for its default port or --port)",
  usage: 'asb url <id> [--port N] [--rotate-token] [--json]',
  help: `Sandboxes answer at <port>-<id>.<domain> through the edge; requests must carry the
sandbox's access token in an X-Access-Token header unless the template made the port public.

Options:
  -p, --port N           the port inside the sandbox (default: the template's first port, else 49983)
  --rotate-token         give the sandbox a new access token first: every earlier one stops working
  --json                 print {url, port, accessToken}

Example:
  curl -H "X-Access-Token: $(asb url <id> --json | jq -r .accessToken)" "$(asb url <id> --port 8080)"`,
  options: { ...JSON_FLAG, port: { type: 'string', short: 'p' }, 'rotate-token': { type: 'boolean' } },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    const id = singleId(positionals, this.usage);
    const portText = stringOpt(values, 'port');
    const port = portText === undefined ? undefined : Number(portText);
    if (port !== undefined && (!/^\d+$/.test(portText ?? '') || port < 1 || port > 65535)) throw new UsageError(`--port must be a port number from 1 to 65535, got "${portText ?? ''}"`, this.usage);
    const client = ctx.client(global);
    const sb = values['rotate-token'] === true ? await client.rotateAccessToken(id) : await client.getSandbox(id);
    if (sb.url === undefined || sb.defaultPort === undefined) throw new AsbError('Unavailable', `the worker did not return a URL for ${id}; it predates the data plane, upgrade it`);
    const url = sandboxUrlFor(sb.url, sb.defaultPort, port ?? sb.defaultPort);
    if (values.json === true) writeJson(ctx.io.stdout, { url, port: port ?? sb.defaultPort, ...(sb.accessToken === undefined ? {} : { accessToken: sb.accessToken }) });
    else ctx.io.stdout.write(`${url}\n`);
    return EXIT.ok;
  },
};

export function describeSandbox(sb: SandboxView, nowMs: number): string {
  const labels = Object.entries(sb.labels).map(([k, v]) => `${k}=${v}`).join(',');
  return formatFields([
    ['id', sb.id],
    ['cluster', sb.cluster],
    ['namespace', sb.namespace],
    ['template', sb.template],
    ['phase', sb.phase],
    ['ready', String(sb.ready)],
    ['launch', sb.launchType],
    ['owner', sb.owner === '' ? '-' : sb.owner],
    ['ip', sb.ip],
    ['age', formatAge(sb.createdAt, nowMs)],
    ['shutdown', sb.shutdownTime],
    ['idle timeout', sb.idleTimeoutMs === undefined ? undefined : `${sb.idleTimeoutMs}ms`],
    ['labels', labels === '' ? undefined : labels],
    ['url', sb.url],
    ['public ports', sb.publicPorts === undefined || sb.publicPorts.length === 0 ? undefined : sb.publicPorts.join(',')],
    ['reason', sb.reason],
    ['message', sb.message],
    ['suspends', sb.suspensionStrategy === undefined ? undefined : sb.suspensionStrategy === 'Hibernate' ? 'Hibernate (memory, processes and files)' : 'Stop (files)'],
    ['memory', sb.memory],
    ['suspension', sb.suspension === undefined ? undefined : `${sb.suspension.reason}: ${sb.suspension.message}`],
    ['restore', sb.memoryRestored === undefined ? undefined : `${sb.memoryRestored.reason}: ${sb.memoryRestored.message}`],
  ]);
}

export const pauseCommand: Command = {
  name: 'pause',
  summary: 'Hibernate a sandbox (keeps its files; with --memory its processes too)',
  usage: 'asb pause <id> [--memory | --filesystem] [--no-wait] [--json]',
  help:
    'Waits until the sandbox is Hibernated (at most 2 minutes). Without --memory or --filesystem the\n' +
    'sandbox\'s suspensionStrategy decides (its template\'s; Stop, files only, unless it says Hibernate).\n\n' +
    'Options:\n' +
    '  --memory               keep memory and processes too, or fail and leave it running\n' +
    '                         (gVisor pods: runtimeClassName gvisor; runc pods cannot yet)\n' +
    '  --filesystem           keep files and volumes only; processes end\n' +
    '  --no-wait              return once the request is accepted\n' +
    '  --json                 print the sandbox as JSON',
  options: { ...JSON_FLAG, wait: { type: 'boolean', default: true }, memory: { type: 'boolean' }, filesystem: { type: 'boolean' } },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    const id = singleId(positionals, this.usage);
    if (values.memory === true && values.filesystem === true) throw new UsageError('--memory and --filesystem exclude each other', this.usage);
    const memory = values.memory === true ? true : values.filesystem === true ? false : undefined;
    const client = ctx.client(global);
    // A pause with memory waits at the API, which alone can say why a save failed.
    let sb = memory === true
      ? await withSpinner(ctx.io.stderr, ctx.clock, `saving ${id}`, () => client.pause(id, { memory, wait: true }))
      : await client.pause(id, memory === undefined ? undefined : { memory, wait: false });
    if (values.wait !== false && sb.phase !== 'Hibernated') {
      sb = await withSpinner(ctx.io.stderr, ctx.clock, `hibernating ${id}`, () => waitForPhase(client, ctx, id, 'Hibernated', PAUSE_WAIT_MS));
    }
    if (values.json === true) writeJson(ctx.io.stdout, sb);
    else ctx.io.stdout.write(`${sb.id}  ${sb.phase}${sb.memory === undefined ? '' : `  memory ${sb.memory}`}\n`);
    return EXIT.ok;
  },
};

// Hibernation stops the pod and syncs its writable layer; on the local runtime that takes about
// a second, on Kubernetes up to the pod's 30 s grace period. Two minutes leaves room for both.
const PAUSE_WAIT_MS = 120_000;
// 250 ms between polls: a pause takes seconds, so a quarter-second of lag is not noticed.
const POLL_MS = 250;

/** Polls the sandbox until it reaches `phase`; fails on Failed/Terminating or after `timeoutMs`. */
async function waitForPhase(client: ApiClient, { clock, delay }: CommandContext, id: string, phase: SandboxView['phase'], timeoutMs: number): Promise<SandboxView> {
  const deadline = clock.now() + timeoutMs;
  for (;;) {
    const sb = await client.getSandbox(id);
    if (sb.phase === phase) return sb;
    if (sb.phase === 'Failed' || sb.phase === 'Terminating') throw new AsbError('Conflict', `sandbox ${id} is ${sb.phase}${sb.message === undefined ? '' : `: ${sb.message}`}`);
    if (clock.now() >= deadline) throw new AsbError('Timeout', `sandbox ${id} is still ${sb.phase} after ${timeoutMs / 1000} s`);
    await delay(POLL_MS);
  }
}

export const resumeCommand: Command = {
  name: 'resume',
  summary: 'Wake a hibernated sandbox',
  usage: 'asb resume <id> [--no-wait] [--json]',
  help: 'Options:\n  --no-wait              return at once instead of when the sandbox is Ready\n  --json                 print the sandbox as JSON',
  options: { ...JSON_FLAG, wait: { type: 'boolean', default: true } },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    const id = singleId(positionals, this.usage);
    const wait = boolOpt(values, 'wait') ?? true;
    const client = ctx.client(global);
    const sb = wait ? await withSpinner(ctx.io.stderr, ctx.clock, `waking ${id}`, () => client.resume(id, { wait })) : await client.resume(id, { wait });
    if (values.json === true) writeJson(ctx.io.stdout, sb);
    else ctx.io.stdout.write(`${sb.id}  ${sb.phase}${sb.ready ? ' (ready)' : ''}\n`);
    return EXIT.ok;
  },
};

export const rmCommand: Command = {
  name: 'rm',
  summary: 'Delete sandboxes',
  usage: 'asb rm <id>... [--json]',
  help: 'Deletes every sandbox named; keeps going past failures and exits 1 if any failed.\n\nOptions:\n  --json                 print the deleted sandboxes as JSON',
  options: { ...JSON_FLAG },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    if (positionals.length === 0) throw new UsageError('missing sandbox id', this.usage);
    const client = ctx.client(global);
    const deleted: SandboxView[] = [];
    let failed = false;
    for (const id of positionals) {
      try {
        const sb = await client.deleteSandbox(id);
        deleted.push(sb);
        if (values.json !== true) ctx.io.stdout.write(`${id} deleted\n`);
      } catch (err) {
        // Unreachable worker: every other id would fail the same way, so stop here.
        if (!isAsbError(err) || err instanceof ApiUnreachableError) throw err;
        failed = true;
        ctx.io.stderr.write(formatError(`${id}: ${err.message}`, err.fields));
      }
    }
    if (values.json === true) writeJson(ctx.io.stdout, { items: deleted });
    return failed ? EXIT.failed : EXIT.ok;
  },
};

function singleId(positionals: readonly string[], usage: string): string {
  const [id, extra] = positionals;
  if (id === undefined) throw new UsageError('missing sandbox id', usage);
  if (extra !== undefined) throw new UsageError(`unexpected argument "${extra}"`, usage);
  return id;
}

function optional<K extends string>(key: K, value: string | undefined): Partial<Record<K, string>> {
  return value === undefined ? {} : ({ [key]: value } as Record<K, string>);
}
