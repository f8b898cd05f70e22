// The `asb` command line: dispatches to a command and turns every failure into one clear line
// and an exit code (0 ok, 1 failed, 2 wrong usage). `bin/asb` runs this file with Node 24.
import { realpathSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { ApiError, ApiUnreachableError, createApiClient } from '../client/api-client.ts';
import { isAsbError } from '../errors.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import { GLOBAL_OPTIONS, UsageError, ValueError } from './args.ts';
import { EXIT, type CliIo, type Command, type CommandContext } from './command.ts';
import { applyCommand } from './commands-apply.ts';
import { egressCommand } from './commands-egress.ts';
import { eventsCommand, webhookCommand } from './commands-events.ts';
import { execCommand, filesCommand } from './commands-exec.ts';
import { mcpCommand } from './commands-mcp.ts';
import { shellCommand } from './commands-shell.ts';
import { clusterCommand, keyCommand, templateCommand } from './commands-hub.ts';
import { createCommand, getCommand, lsCommand, pauseCommand, resumeCommand, rmCommand, urlCommand } from './commands-sandbox.ts';
import { statusCommand, upCommand } from './commands-system.ts';
import { forkCommand, snapshotCommand } from './commands-snapshot.ts';
import { ClientConfigError, resolveClientConfig } from './env-file.ts';
import { formatError } from './output.ts';

export const COMMANDS: readonly Command[] = [
  upCommand,
  statusCommand,
  applyCommand,
  createCommand,
  lsCommand,
  getCommand,
  urlCommand,
  execCommand,
  shellCommand,
  pauseCommand,
  resumeCommand,
  snapshotCommand,
  forkCommand,
  rmCommand,
  filesCommand,
  clusterCommand,
  keyCommand,
  templateCommand,
  egressCommand,
  mcpCommand,
  eventsCommand,
  webhookCommand,
];

const USAGE = 'asb <command> [flags]';

function topHelp(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length));
  return `asb: the Agent Sandbox command line

Usage: ${USAGE}

Commands:
${COMMANDS.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`).join('\n')}

Global flags (any command):
  --url URL          worker API URL (else $ASB_API_URL, else .asb/env)
  --key KEY          API key (else $ASB_API_KEY, else .asb/env)
  --env-file PATH    read ASB_API_URL / ASB_API_KEY from this file instead of .asb/env
  -h, --help         help; \`asb <command> --help\` for a command's flags

Start the system with \`asb up\` (or \`make up\`) in another terminal, then e.g.:
  asb create --template base
  asb exec <id> -- echo hello
`;
}

function commandHelp(cmd: Command): string {
  return `${cmd.summary}\n\nUsage: ${cmd.usage}\n\n${cmd.help}\n`;
}

/** Global flags given before the command name are moved after it, where every command takes them. */
function splitGlobal(argv: readonly string[]): { globals: string[]; rest: string[] } {
  const globals: string[] = [];
  let i = 0;
  while (i < argv.length) {
    const arg = argv[i] ?? '';
    const name = arg.startsWith('--') ? arg.slice(2).split('=')[0] ?? '' : '';
    if (arg === '-h' || arg === '--help') {
      globals.push(arg);
      i++;
    } else if (name !== '' && name !== 'help' && Object.hasOwn(GLOBAL_OPTIONS, name)) {
      globals.push(arg);
      if (!arg.includes('=') && i + 1 < argv.length) globals.push(argv[i + 1] ?? '');
      i += arg.includes('=') ? 1 : 2;
    } else break;
  }
  return { globals, rest: argv.slice(i) };
}

/** Runs one CLI invocation; returns the exit code. Never throws. */
export async function runCli(argv: readonly string[], io: CliIo, clock: Clock = systemClock): Promise<number> {
  const { globals, rest } = splitGlobal(argv);
  const [name, ...args] = rest;
  if (name === undefined || name === 'help') {
    const target = name === 'help' ? COMMANDS.find((c) => c.name === args[0]) : undefined;
    if (name === undefined && !globals.includes('-h') && !globals.includes('--help')) {
      io.stderr.write(topHelp());
      return EXIT.usage;
    }
    io.stdout.write(target === undefined ? topHelp() : commandHelp(target));
    return EXIT.ok;
  }
  const cmd = COMMANDS.find((c) => c.name === name);
  if (cmd === undefined) {
    io.stderr.write(`error: unknown command "${name}"\nusage: ${USAGE}\nRun 'asb --help' for the list of commands.\n`);
    return EXIT.usage;
  }
  if (globals.includes('-h') || globals.includes('--help') || args.slice(0, args.includes('--') ? args.indexOf('--') : undefined).some((a) => a === '-h' || a === '--help')) {
    io.stdout.write(commandHelp(cmd));
    return EXIT.ok;
  }
  const ctx: CommandContext = {
    io,
    clock,
    delay: (ms) => sleep(ms),
    client(global) {
      const config = resolveClientConfig({ flags: global, env: io.env, cwd: io.cwd });
      return createApiClient({ url: config.url, ...(config.key === undefined ? {} : { key: config.key }) });
    },
  };
  try {
    return await cmd.run([...globals, ...args], ctx);
  } catch (err) {
    io.stderr.write(describeFailure(err, cmd));
    return err instanceof UsageError || err instanceof ValueError ? EXIT.usage : EXIT.failed;
  }
}

function describeFailure(err: unknown, cmd: Command): string {
  if (err instanceof UsageError) return `error: ${err.message}\nusage: ${err.usage}\nRun 'asb ${cmd.name} --help' for more.\n`;
  if (err instanceof ValueError) return `error: ${err.message}\nusage: ${cmd.usage}\n`;
  if (err instanceof ClientConfigError) return formatError(err.message);
  if (err instanceof ApiUnreachableError) {
    const reason = err.message.slice(err.message.lastIndexOf(': ') + 2);
    return formatError(`cannot reach the worker at ${err.url}: is \`make up\` running? (${reason})`);
  }
  if (err instanceof ApiError) {
    const hint = err.code === 'Unauthorized' ? '\nhint: set ASB_API_KEY, pass --key, or run `make up` (it writes the admin key to .asb/env)\n' : '';
    return formatError(err.detail, err.fields) + hint;
  }
  if (isAsbError(err)) return formatError(err.message, err.fields);
  return formatError(err instanceof Error ? err.message : String(err));
}

async function main(): Promise<void> {
  // `asb ls | head` closes the pipe early; that is not an error worth a stack trace.
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(process.exitCode ?? 0);
    throw err;
  });
  const io: CliIo = {
    stdout: process.stdout,
    stderr: process.stderr,
    // A getter: only commands that read stdin should open it.
    get stdin() {
      return process.stdin;
    },
    env: process.env,
    cwd: process.cwd(),
  };
  process.exitCode = await runCli(process.argv.slice(2), io);
}

// Run only as the entry point (bin/asb), not when a test imports runCli.
if (process.argv[1] !== undefined && realpathSync(fileURLToPath(import.meta.url)) === realpathSync(process.argv[1])) {
  await main();
}
