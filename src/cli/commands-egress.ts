// `asb egress`: the worker's egress secrets and credential injection rules (admin keys). A
// secret's value is read from stdin, never from the command line (argv shows in every process
// list), and no command ever prints one: the API does not return them.
import { parseCommandArgs, stringOpt, UsageError } from './args.ts';
import { EXIT, readAll, type Command } from './command.ts';
import { noArgs, oneName, subcommand } from './commands-hub.ts';
import { formatTable, writeJson } from './output.ts';

export const egressCommand: Command = {
  name: 'egress',
  summary: 'Manage egress secrets and credential injection rules (values are write-only)',
  usage: 'asb egress secret set <name> < value | secret ls | secret rm <name> | rule set <id> --host H --header X --secret S [--path-prefix P] | rule ls | rule rm <id>',
  help: `Subcommands:
  secret set <name>      store a secret; its value is read from stdin (one trailing newline dropped)
  secret ls              secret names and when each was set (never a value)
  secret rm <name>       delete a secret (refused while a rule uses it)
  rule set <id>          for requests from sandboxes to --host (api.example.com or *.example.com),
                         under --path-prefix if given, set header --header to secret --secret;
                         the egress proxy opens TLS for that host only
  rule ls                every rule
  rule rm <id>           delete a rule

Options:
  --json                 machine-readable output

Example:
  printf %s "Bearer $OPENAI_API_KEY" | asb egress secret set openai
  asb egress rule set openai --host api.openai.com --header authorization --secret openai`,
  options: { json: { type: 'boolean' }, host: { type: 'string' }, header: { type: 'string' }, secret: { type: 'string' }, 'path-prefix': { type: 'string' } },
  async run(argv, ctx) {
    const parsed = parseCommandArgs(argv, this.options, this.usage);
    const [kind, ...rest] = parsed.positionals;
    if (kind !== 'secret' && kind !== 'rule') throw new UsageError(kind === undefined ? 'missing "secret" or "rule"' : `unknown egress object "${kind}": use secret or rule`, this.usage);
    const { values } = parsed;
    const client = ctx.client(parsed.global);
    const json = values.json === true;
    if (kind === 'secret') {
      const { sub, args } = subcommand({ ...parsed, positionals: rest }, this.usage, { set: [], ls: [], rm: [] });
      if (sub === 'ls') {
        noArgs(args, this.usage);
        const { items } = await client.listEgressSecrets();
        if (json) writeJson(ctx.io.stdout, { items });
        else ctx.io.stdout.write(formatTable(['NAME', 'UPDATED'], items.map((s) => [s.name, s.updatedAt])));
        return EXIT.ok;
      }
      const name = oneName(args, 'secret name', this.usage);
      if (sub === 'rm') {
        await client.deleteEgressSecret(name);
        ctx.io.stdout.write(`secret/${name} deleted\n`);
        return EXIT.ok;
      }
      if (ctx.io.stdin.isTTY === true) ctx.io.stderr.write('Reading the secret from stdin (end with Ctrl-D)…\n');
      const value = (await readAll(ctx.io.stdin)).toString('utf8').replace(/\r?\n$/, '');
      if (value === '') throw new UsageError('the secret value comes from stdin, which was empty', this.usage);
      const info = await client.putEgressSecret(name, value);
      if (json) writeJson(ctx.io.stdout, info);
      else ctx.io.stdout.write(`secret/${info.name} set\n`);
      return EXIT.ok;
    }
    const { sub, args } = subcommand({ ...parsed, positionals: rest }, this.usage, { set: ['host', 'header', 'secret', 'path-prefix'], ls: [], rm: [] });
    if (sub === 'ls') {
      noArgs(args, this.usage);
      const { items } = await client.listCredentialRules();
      if (json) writeJson(ctx.io.stdout, { items });
      else ctx.io.stdout.write(formatTable(['ID', 'HOST', 'PATH', 'HEADER', 'SECRET'], items.map((r) => [r.id, r.host, r.pathPrefix ?? '/', r.header, r.secret])));
      return EXIT.ok;
    }
    const id = oneName(args, 'rule id', this.usage);
    if (sub === 'rm') {
      await client.deleteCredentialRule(id);
      ctx.io.stdout.write(`rule/${id} deleted\n`);
      return EXIT.ok;
    }
    const host = stringOpt(values, 'host');
    const header = stringOpt(values, 'header');
    const secret = stringOpt(values, 'secret');
    const pathPrefix = stringOpt(values, 'path-prefix');
    if (host === undefined || header === undefined || secret === undefined) throw new UsageError('rule set needs --host, --header and --secret', this.usage);
    const rule = await client.putCredentialRule(id, { host, header, secret, ...(pathPrefix === undefined ? {} : { pathPrefix }) });
    if (json) writeJson(ctx.io.stdout, rule);
    else ctx.io.stdout.write(`rule/${rule.id} set: ${rule.host}${rule.pathPrefix ?? ''} gets ${rule.header} from secret ${rule.secret}\n`);
    return EXIT.ok;
  },
};
