// Drives the burst client (tools/bench/burst, a Go program `make bench-tools` builds): one
// kept-alive connection per concurrent request, every request of a burst sent at the same
// instant. The benchmarks' bursts go through it so that a latency is the server's answer time,
// not the time a Node client on the same two cores needs to send 64 requests and read 64
// answers (6-10 ms of its own event loop at 64 concurrent).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface, type Interface } from 'node:readline';

export const BURST_BIN = join(import.meta.dirname, '..', '.tools', 'bench', 'bin', 'burst');

export interface BurstRequest {
  url: string;
  method: string;
  headers: Record<string, string>;
  body?: string;
  /** Requests per burst, each on its own connection. */
  concurrency: number;
}

/** One request of a burst; status 0 means it failed, with the error as the body. */
export interface BurstResult {
  ms: number;
  status: number;
  body: string;
}

export interface Burst {
  /** From the moment the requests were released to the last answer. */
  wallMs: number;
  results: BurstResult[];
}

export interface BurstClient {
  burst(): Promise<Burst>;
  close(): void;
}

/** Starts a burst client with its connections open; each burst() sends one request on each. */
export async function startBurstClient(req: BurstRequest): Promise<BurstClient> {
  if (!existsSync(BURST_BIN)) throw new Error(`${BURST_BIN} is missing: run \`make bench-tools\` (make bench does)`);
  const args = ['-url', req.url, '-method', req.method, '-conns', String(req.concurrency)];
  for (const [name, value] of Object.entries(req.headers)) args.push('-header', `${name}: ${value}`);
  if (req.body !== undefined) args.push('-body', req.body);
  const child = spawn(BURST_BIN, args, { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout });
  const exited = new Promise<never>((_, reject) => child.once('exit', (code) => reject(new Error(`burst client exited (${code ?? 'signal'})`))));
  exited.catch(() => {});
  const next = (): Promise<string> => Promise.race([nextLine(lines), exited]);
  const ready = await next();
  if (ready !== 'ready') throw new Error(`burst client said ${JSON.stringify(ready)} instead of ready`);
  return {
    async burst() {
      child.stdin.write('burst\n');
      return JSON.parse(await next()) as Burst;
    },
    close() {
      lines.close();
      child.stdin.end();
      child.kill();
    },
  };
}

function nextLine(lines: Interface): Promise<string> {
  return new Promise((resolve) => lines.once('line', resolve));
}
