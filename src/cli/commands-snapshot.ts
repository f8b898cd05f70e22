// Snapshots and fork: `asb snapshot` (take, ls, get, rm, start) and `asb fork`.
import type { SandboxView, SnapshotView } from '../client/api-client.ts';
import { parseCommandArgs, parseDuration, parseKeyValues, stringList, stringOpt, UsageError } from './args.ts';
import { EXIT, type Command } from './command.ts';
import { formatAge, formatTable, writeJson } from './output.ts';
import { withSpinner } from './progress.ts';

const JSON_FLAG = { json: { type: 'boolean' } } as const;

function mib(bytes: number | undefined): string {
  return bytes === undefined ? '-' : `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

function describe(s: SnapshotView): string {
  return `${s.id}${s.name === undefined ? '' : ` (${s.name})`}  ${s.phase}  ${s.memory ? 'memory, processes and files' : 'files only'}  ${mib(s.bytes)}  of ${s.sandbox}`;
}

export const snapshotCommand: Command = {
  name: 'snapshot',
  summary: 'Snapshot a sandbox (memory and files), list, delete, or start sandboxes from one',
  usage: 'asb snapshot <id> [--name N] [--files-only|--memory] | asb snapshot ls | get <snap> | rm <snap> | start <snap> [--timeout DUR] [--label K=V]... [--json]',
  help: `Subcommands:
  asb snapshot <sandbox-id>      take a snapshot; the sandbox pauses for it, then runs on
  asb snapshot ls                your team's snapshots
  asb snapshot get <snap>        one snapshot, by id or by the name you gave it
  asb snapshot rm <snap>         delete it (sandboxes started from it are not affected)
  asb snapshot start <snap>      start a new sandbox from it

Options:
  --name N               a name for the snapshot (you can use it instead of its id)
  --memory               keep memory and processes (gVisor sandboxes); an error where they cannot be kept
  --files-only           keep the files only
                         neither: memory where the sandbox can keep it, else files only
  --timeout DUR          (start) shut the new sandbox down this long after it starts
  --label K=V            (start) label the new sandbox; repeatable
  --json                 print JSON

A snapshot lives on the worker that took it; sandboxes started from it run there too.

Example:
  asb snapshot sbx123 --name after-setup && asb snapshot start after-setup`,
  options: {
    ...JSON_FLAG,
    name: { type: 'string' },
    memory: { type: 'boolean' },
    'files-only': { type: 'boolean' },
    timeout: { type: 'string' },
    label: { type: 'string', multiple: true },
  },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    const [first, second, extra] = positionals;
    if (first === undefined) throw new UsageError('missing sandbox id or subcommand', this.usage);
    const client = ctx.client(global);
    const json = values.json === true;
    const one = (what: string): string => {
      if (second === undefined) throw new UsageError(`missing snapshot id for ${what}`, this.usage);
      if (extra !== undefined) throw new UsageError(`unexpected argument "${extra}"`, this.usage);
      return second;
    };
    if (first === 'ls') {
      const { items } = await client.listSnapshots();
      if (json) writeJson(ctx.io.stdout, { items });
      else {
        const rows = items.map((s) => [s.id, s.name ?? '', s.sandbox, s.phase, s.memory ? 'yes' : 'no', mib(s.bytes), s.createdAt === undefined ? '' : formatAge(s.createdAt, ctx.clock.now())]);
        ctx.io.stdout.write(formatTable(['ID', 'NAME', 'SANDBOX', 'PHASE', 'MEMORY', 'SIZE', 'AGE'], rows));
      }
      return EXIT.ok;
    }
    if (first === 'get' || first === 'rm') {
      const id = one(first);
      const s = first === 'get' ? await client.getSnapshot(id) : await client.deleteSnapshot(id);
      if (json) writeJson(ctx.io.stdout, s);
      else ctx.io.stdout.write(first === 'get' ? `${describe(s)}\n${s.message === undefined ? '' : `${s.message}\n`}` : `${s.id}  deleted\n`);
      return EXIT.ok;
    }
    if (first === 'start') {
      const id = one('start');
      const timeout = stringOpt(values, 'timeout');
      const labels = parseKeyValues(stringList(values, 'label'), '--label');
      const sb: SandboxView = await withSpinner(ctx.io.stderr, ctx.clock, `starting a sandbox from ${id}`, () => client.startFromSnapshot(id, {
        ...(timeout === undefined ? {} : { timeoutMs: parseDuration(timeout, '--timeout') }),
        ...(Object.keys(labels).length === 0 ? {} : { labels }),
      }));
      if (json) writeJson(ctx.io.stdout, sb);
      else ctx.io.stdout.write(`${sb.id}  ${sb.phase}${sb.ready ? ' (ready)' : ''}  from ${id}\n`);
      return EXIT.ok;
    }
    if (second !== undefined) throw new UsageError(`unexpected argument "${second}"`, this.usage);
    if (values.memory === true && values['files-only'] === true) throw new UsageError('--memory and --files-only contradict each other', this.usage);
    const name = stringOpt(values, 'name');
    const memory = values.memory === true ? true : values['files-only'] === true ? false : undefined;
    const s = await withSpinner(ctx.io.stderr, ctx.clock, `snapshotting ${first}`, () => client.createSnapshot(first, { ...(name === undefined ? {} : { name }), ...(memory === undefined ? {} : { memory }) }));
    if (json) writeJson(ctx.io.stdout, s);
    else ctx.io.stdout.write(`${describe(s)}\n`);
    return EXIT.ok;
  },
};

export const forkCommand: Command = {
  name: 'fork',
  summary: 'Fork a running sandbox N times: each copy has its memory, processes and files',
  usage: 'asb fork <id> [-n COUNT] [--timeout DUR] [--json]',
  help: `The sandbox pauses while one snapshot of it is taken, then runs on; COUNT new sandboxes
start from that snapshot, each on its own (one failing does not fail the others), with its own
id, address, access token and files. Forks share what was in memory: a PRNG seeded before the
fork draws the same numbers in each, and the machine id is the same.

Options:
  -n, --count COUNT      how many forks (1-20, default 1)
  --timeout DUR          shut each fork down this long after it starts
  --json                 print {forks: [{sandbox} | {error}]} as JSON

Exit status 1 when any fork failed.`,
  options: { ...JSON_FLAG, count: { type: 'string', short: 'n' }, timeout: { type: 'string' } },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    const [id, extra] = positionals;
    if (id === undefined) throw new UsageError('missing sandbox id', this.usage);
    if (extra !== undefined) throw new UsageError(`unexpected argument "${extra}"`, this.usage);
    const countText = stringOpt(values, 'count');
    const count = countText === undefined ? 1 : Number(countText);
    if (!Number.isInteger(count) || count < 1 || count > 20) throw new UsageError(`--count must be an integer from 1 to 20, got "${countText ?? ''}"`, this.usage);
    const timeout = stringOpt(values, 'timeout');
    const client = ctx.client(global);
    const { forks } = await withSpinner(ctx.io.stderr, ctx.clock, `forking ${id} ×${String(count)}`, () => client.fork(id, { count, ...(timeout === undefined ? {} : { timeoutMs: parseDuration(timeout, '--timeout') }) }));
    if (values.json === true) writeJson(ctx.io.stdout, { forks });
    else for (const f of forks) ctx.io.stdout.write('sandbox' in f ? `${f.sandbox.id}  ${f.sandbox.phase}${f.sandbox.ready ? ' (ready)' : ''}\n` : `error  ${f.error.code}: ${f.error.message}\n`);
    return forks.every((f) => 'sandbox' in f) ? EXIT.ok : EXIT.failed;
  },
};
