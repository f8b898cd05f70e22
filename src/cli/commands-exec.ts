// Working inside a sandbox: exec and files (get, put, ls).
import { readFileSync, writeFileSync } from 'node:fs';
import { constants } from 'node:os';
import { resolve } from 'node:path';
import type { ExecRequest } from '../client/api-client.ts';
import { parseCommandArgs, parseDuration, parseKeyValues, stringList, stringOpt, UsageError } from './args.ts';
import { EXIT, readAll, type Command } from './command.ts';
import { formatTable, writeJson } from './output.ts';

/** What a shell reports for a command killed by its time limit (as coreutils `timeout` does). */
const EXIT_TIMED_OUT = 124;

export const execCommand: Command = {
  name: 'exec',
  summary: 'Run a command in a sandbox',
  usage: 'asb exec <id> [--cwd DIR] [-e K=V]... [--timeout DUR] -- <command> [args...]',
  help: `Prints the command's stdout to stdout and its stderr to stderr, and exits with its exit code
(124 when it hit --timeout). When stdin is not a terminal it is passed to the command.
A single argument containing spaces is run with sh -c, so pipes work: asb exec ID -- 'ls | wc -l'

Options:
  --cwd DIR              working directory inside the sandbox
  -e, --env K=V          environment variable; repeatable
  --timeout DUR          kill the command after this long (30s, 10m)
  --no-stdin             do not pass stdin on, even when it is not a terminal

Examples:
  asb exec loc1abc -- echo hello
  echo data | asb exec loc1abc -- wc -c`,
  options: {
    cwd: { type: 'string' },
    env: { type: 'string', short: 'e', multiple: true },
    timeout: { type: 'string' },
    stdin: { type: 'boolean', default: true },
  },
  async run(argv, ctx) {
    // Everything after the first `--` is the command, untouched: its flags are not ours.
    const dashes = argv.indexOf('--');
    const ours = dashes === -1 ? argv : argv.slice(0, dashes);
    const { values, positionals, global } = parseCommandArgs(ours, this.options, this.usage);
    const [id, ...rest] = positionals;
    if (id === undefined) throw new UsageError('missing sandbox id', this.usage);
    const command = dashes === -1 ? rest : [...rest, ...argv.slice(dashes + 1)];
    if (command.length === 0) throw new UsageError('missing command (put it after --)', this.usage);
    const env = parseKeyValues(stringList(values, 'env'), '--env');
    const cwd = stringOpt(values, 'cwd');
    const timeout = stringOpt(values, 'timeout');
    const only = command.length === 1 ? command[0] : undefined;
    const req: ExecRequest = {
      command: only !== undefined && /\s/.test(only) ? only : command,
      ...(Object.keys(env).length === 0 ? {} : { env }),
      ...(cwd === undefined ? {} : { cwd }),
      ...(timeout === undefined ? {} : { timeoutMs: parseDuration(timeout, '--timeout') }),
    };
    const client = ctx.client(global);
    if (values.stdin !== false && ctx.io.stdin.isTTY !== true) req.stdin = (await readAll(ctx.io.stdin)).toString('utf8');
    const result = await client.exec(id, req);
    ctx.io.stdout.write(result.stdout);
    ctx.io.stderr.write(result.stderr);
    if (result.truncated === true) ctx.io.stderr.write('asb: output was truncated by the worker (over 8 MiB on a stream)\n');
    if (result.timedOut) {
      ctx.io.stderr.write(`asb: command timed out${timeout === undefined ? '' : ` after ${timeout}`}\n`);
      return EXIT_TIMED_OUT;
    }
    if (result.signal !== undefined) {
      ctx.io.stderr.write(`asb: command killed by ${result.signal}\n`);
      // The shell's convention: 128 + the signal number.
      const signo = (constants.signals as Record<string, number | undefined>)[result.signal];
      if (signo !== undefined) return 128 + signo;
    }
    // Process exit statuses are 0-255; anything else is reported as a plain failure.
    return Number.isInteger(result.exitCode) && result.exitCode >= 0 && result.exitCode <= 255 ? result.exitCode : EXIT.failed;
  },
};

export const filesCommand: Command = {
  name: 'files',
  summary: 'Copy files in and out of a sandbox, list directories',
  usage: 'asb files get <id> <path> [local|-] | asb files put <id> <local|-> <path> | asb files ls <id> [dir] [--json]',
  help: `Subcommands:
  get <id> <path> [local]   copy a file out (to stdout when local is - or absent)
  put <id> <local> <path>   copy a file in (from stdin when local is -)
  ls <id> [dir]             list a directory (default /)

Options:
  --json                 ls: print {entries: [...]} as JSON`,
  options: { json: { type: 'boolean' } },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    const [sub, id, a, b, extra] = positionals;
    if (sub === undefined) throw new UsageError('missing subcommand: get, put or ls', this.usage);
    if (id === undefined) throw new UsageError('missing sandbox id', this.usage);
    if (extra !== undefined) throw new UsageError(`unexpected argument "${extra}"`, this.usage);
    const client = ctx.client(global);
    if (sub === 'get') {
      if (a === undefined) throw new UsageError('missing path inside the sandbox', this.usage);
      const data = await client.readFile(id, a);
      if (b === undefined || b === '-') ctx.io.stdout.write(data);
      else writeFileSync(resolve(ctx.io.cwd, b), data);
      return EXIT.ok;
    }
    if (sub === 'put') {
      if (a === undefined || b === undefined) throw new UsageError('put needs a local file (or -) and a path inside the sandbox', this.usage);
      const data = a === '-' ? await readAll(ctx.io.stdin) : readFileSync(resolve(ctx.io.cwd, a));
      await client.writeFile(id, b, data);
      return EXIT.ok;
    }
    if (sub === 'ls') {
      if (b !== undefined) throw new UsageError(`unexpected argument "${b}"`, this.usage);
      const { entries } = await client.listFiles(id, a ?? '/');
      if (values.json === true) writeJson(ctx.io.stdout, { entries });
      else ctx.io.stdout.write(formatTable(['TYPE', 'SIZE', 'MODIFIED', 'NAME'], entries.map((e) => [e.type, String(e.size), e.mtime, e.type === 'dir' ? `${e.name}/` : e.name])));
      return EXIT.ok;
    }
    throw new UsageError(`unknown files subcommand "${sub}": use get, put or ls`, this.usage);
  },
};
