// The floor under the warm-claim figures: the same client (bench/claims.ts `call`) sends the same
// bursts of POST /v1/sandboxes to a Node HTTP server in its own process that does nothing but read
// the JSON body and answer 201 with a ~1 KB JSON body at once: no authentication, no store, no
// claim. On a machine where the client and the server share the cores, this is what a claim
// through the HTTP API cannot go below, whatever the worker does.
//
// Run alone: `node bench/http-floor.ts` prints the 64-concurrent figures as JSON.
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createInterface } from 'node:readline';
import { performance } from 'node:perf_hooks';
import { call, round, summarize, type LatencySummary } from './claims.ts';

const REPLY = JSON.stringify({ id: 'floor0000000000000000', launchType: 'warm', padding: 'x'.repeat(1000) });

function serve(): void {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      JSON.parse(Buffer.concat(chunks).toString());
      res.writeHead(201, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(REPLY) });
      res.end(REPLY);
    });
  });
  server.listen(0, '127.0.0.1', () => process.stdout.write(`${(server.address() as AddressInfo).port}\n`));
  // Exits when the parent does: its stdin closes.
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
}

/** Bursts of `concurrency` POSTs against the do-nothing server, as warmClaims sends claims. */
export async function benchHttpFloor(concurrency: number, rounds: number): Promise<LatencySummary & { requestsPerSec: number }> {
  const child = spawn(process.execPath, [import.meta.filename, '--serve'], { stdio: ['pipe', 'pipe', 'inherit'] });
  try {
    const lines = createInterface({ input: child.stdout });
    const port = await new Promise<number>((resolve, reject) => {
      lines.once('line', (line) => resolve(Number(line)));
      child.once('exit', (code) => reject(new Error(`HTTP floor server exited (${code ?? 'signal'}) before listening`)));
    });
    lines.close();
    const target = { apiUrl: `http://127.0.0.1:${port}`, adminKey: 'floor' };
    const samples: number[] = [];
    let busyMs = 0;
    // One unmeasured burst first: warmClaims' connections are open before its measured bursts too.
    for (let r = -1; r < rounds; r++) {
      // As warmClaims: a pause between bursts (it waits for the pool there).
      await new Promise((resolve) => setTimeout(resolve, 100));
      const burstStart = performance.now();
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          const start = performance.now();
          const res = await call(target, 'POST', '/v1/sandboxes', { template: 'claimbench', wait: false, coldStart: false });
          if (res.status !== 201) throw new Error(`HTTP floor server answered ${res.status}`);
          if (r >= 0) samples.push(performance.now() - start);
        }),
      );
      if (r >= 0) busyMs += performance.now() - burstStart;
    }
    return { ...summarize(samples), requestsPerSec: round((concurrency * rounds) / (busyMs / 1000), 0) };
  } finally {
    child.stdin.end();
    child.kill();
  }
}

if (process.argv.includes('--serve')) serve();
else if (import.meta.main) console.log(JSON.stringify(await benchHttpFloor(64, 5), null, 2));
