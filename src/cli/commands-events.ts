// `asb events <sandbox>`: a sandbox's lifecycle events, oldest first. `asb webhook`: the team's
// webhooks. A webhook's signing secret is read from stdin, never from the command line (argv
// shows in every process list), and no command prints one: the API does not return them.
import { parseCommandArgs, stringOpt, UsageError } from './args.ts';
import { EXIT, readAll, type Command } from './command.ts';
import { noArgs, oneName, subcommand } from './commands-hub.ts';
import { formatTable, writeJson } from './output.ts';

export const eventsCommand: Command = {
  name: 'events',
  summary: 'Show a sandbox\'s lifecycle events (created, ready, paused, resumed, killed, failures)',
  usage: 'asb events <sandbox-id> [--types T1,T2] [--json]',
  help: `Options:
  --types T1,T2          only these types (e.g. sandbox.lifecycle.paused,sandbox.lifecycle.resumed)
  --json                 machine-readable output (E2B's event shape)`,
  options: { json: { type: 'boolean' }, types: { type: 'string' } },
  async run(argv, ctx) {
    const parsed = parseCommandArgs(argv, this.options, this.usage);
    const id = oneName(parsed.positionals, 'sandbox id', this.usage);
    const types = stringOpt(parsed.values, 'types');
    const events = await ctx.client(parsed.global).sandboxEvents(id, types === undefined ? {} : { types });
    if (parsed.values.json === true) writeJson(ctx.io.stdout, events);
    else ctx.io.stdout.write(formatTable(['TIME', 'TYPE', 'REASON', 'MESSAGE'], events.map((e) => [e.timestamp, e.type, text(e.eventData?.reason), text(e.eventData?.message)])));
    return EXIT.ok;
  },
};

function text(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

export const webhookCommand: Command = {
  name: 'webhook',
  summary: 'Manage the team\'s lifecycle event webhooks (signed deliveries; secrets are write-only)',
  usage: 'asb webhook add <url> [--name N] [--events T1,T2] < secret | ls | rm <id> | deliveries <id>',
  help: `Subcommands:
  add <url>              register a URL (http:// or https://) each event is POSTed to; the
                         signing secret (16-512 characters) is read from stdin
  ls                     the team's webhooks (never a secret)
  rm <id>                delete a webhook and its pending deliveries
  deliveries <id>        every delivery, its state and attempts

Options:
  --name N               a name to tell webhooks apart
  --events T1,T2         only these event types (default all)
  --json                 machine-readable output

Each delivery carries asb-timestamp and asb-signature: v1=<hex HMAC-SHA256 of "<timestamp>.<body>">
keyed with the secret; see docs/events.md.

Example:
  openssl rand -hex 32 | tee hook.secret | asb webhook add https://example.com/asb-events`,
  options: { json: { type: 'boolean' }, name: { type: 'string' }, events: { type: 'string' } },
  async run(argv, ctx) {
    const parsed = parseCommandArgs(argv, this.options, this.usage);
    const { sub, args } = subcommand(parsed, this.usage, { add: ['name', 'events'], ls: [], rm: [], deliveries: [] });
    const client = ctx.client(parsed.global);
    const json = parsed.values.json === true;
    if (sub === 'ls') {
      noArgs(args, this.usage);
      const hooks = await client.listWebhooks();
      if (json) writeJson(ctx.io.stdout, hooks);
      else ctx.io.stdout.write(formatTable(['ID', 'NAME', 'URL', 'ENABLED', 'EVENTS'], hooks.map((h) => [h.id, h.name, h.url, String(h.enabled), h.events.length === 0 ? 'all' : h.events.join(',')])));
      return EXIT.ok;
    }
    if (sub === 'rm') {
      const id = oneName(args, 'webhook id', this.usage);
      await client.deleteWebhook(id);
      ctx.io.stdout.write(`webhook/${id} deleted\n`);
      return EXIT.ok;
    }
    if (sub === 'deliveries') {
      const list = await client.webhookDeliveries(oneName(args, 'webhook id', this.usage));
      if (json) writeJson(ctx.io.stdout, list);
      else ctx.io.stdout.write(formatTable(['EVENT', 'TYPE', 'SANDBOX', 'STATE', 'ATTEMPTS', 'LAST'], list.map((d) => {
        const last = d.attempts.at(-1);
        return [d.eventId, d.eventType, d.sandboxId, d.state, String(d.attempts.length), last === undefined ? '-' : last.status === undefined ? (last.error ?? '-') : `HTTP ${String(last.status)}`];
      })));
      return EXIT.ok;
    }
    const url = oneName(args, 'webhook URL', this.usage);
    if (ctx.io.stdin.isTTY === true) ctx.io.stderr.write('Reading the signing secret from stdin (end with Ctrl-D)…\n');
    const secret = (await readAll(ctx.io.stdin)).toString('utf8').replace(/\r?\n$/, '');
    if (secret === '') throw new UsageError('the signing secret comes from stdin, which was empty', this.usage);
    const name = stringOpt(parsed.values, 'name');
    const events = stringOpt(parsed.values, 'events');
    const hook = await client.createWebhook({ url, signatureSecret: secret, ...(name === undefined ? {} : { name }), ...(events === undefined ? {} : { events: events.split(',').filter((e) => e !== '') }) });
    if (json) writeJson(ctx.io.stdout, hook);
    else ctx.io.stdout.write(`webhook/${hook.id} added\n`);
    return EXIT.ok;
  },
};
