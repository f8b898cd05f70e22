// The contract between the entry point and each command: a command parses its own argv, talks to
// the worker through the context's client, writes to the context's streams and returns an exit
// code. Nothing here touches process globals, so commands are testable in-process too.
import type { ParseArgsOptionsConfig } from 'node:util';
import type { ApiClient } from '../client/api-client.ts';
import type { Clock } from '../base/clock.ts';
import type { GlobalFlags } from './args.ts';
import type { ProgressStream } from './progress.ts';

export interface InputStream extends AsyncIterable<unknown> {
  isTTY?: boolean;
}

export interface CliIo {
  stdout: { write(chunk: string | Uint8Array): unknown };
  stderr: ProgressStream;
  stdin: InputStream;
  env: Readonly<Record<string, string | undefined>>;
  cwd: string;
}

export interface CommandContext {
  io: CliIo;
  clock: Clock;
  /** Waits ms, keeping the process alive (Clock timers are unref'd, which would let a poll exit). */
  delay: (ms: number) => Promise<void>;
  /** Builds the API client from flags, environment and .asb/env; throws ClientConfigError. */
  client(global: GlobalFlags): ApiClient;
}

export interface Command {
  name: string;
  /** One line for `asb --help`. */
  summary: string;
  /** `asb <name> ...`, printed with usage errors. */
  usage: string;
  /** Option descriptions and examples for `asb <name> --help`. */
  help: string;
  options: ParseArgsOptionsConfig;
  run(argv: readonly string[], ctx: CommandContext): Promise<number>;
}

/** Exit codes: 0 success, 1 the operation failed, 2 the command line was wrong. */
export const EXIT = { ok: 0, failed: 1, usage: 2 } as const;

/** Reads all of stdin (bytes), for `apply -f -`, `exec` and `files put -`. */
export async function readAll(stream: InputStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) {
    chunks.push(typeof chunk === 'string' ? Buffer.from(chunk) : Buffer.from(chunk as Uint8Array));
  }
  return Buffer.concat(chunks);
}
