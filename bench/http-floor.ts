// The floors under the warm-claim figures: the same client (the burst client, burst.ts) sends the
// same bursts of POST /v1/sandboxes to a Node HTTP server in its own process that does nothing
// but read the JSON body and answer 201 with a ~1 KB JSON body: no authentication, no claim.
// On a machine where the client and the server share the cores, this is what a claim through
// the HTTP API cannot go below, whatever the worker does. Two modes:
//   at-once  answers each request as soon as its body is read;
//   durable  answers only once the request's body is in SQLite (WAL, synchronous=FULL), one
//            transaction per event-loop turn for every request that turn read: the least a
//            server does that never acknowledges what a kill -9 could lose, as the worker does.
//
// Run alone: `node bench/http-floor.ts` prints the 64-concurrent figures of both as JSON.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { DatabaseSync } from 'node:sqlite';
import type { BurstClient } from './burst.ts';
import { round, startClaimBursts, summarize, type LatencySummary } from './claims.ts';

export type FloorMode = 'at-once' | 'durable';

const REPLY = JSON.stringify({ id: 'floor0000000000000000', launchType: 'warm', padding: 'x'.repeat(1000) });

function answer(res: ServerResponse): void {
  res.writeHead(201, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(REPLY) });
  res.end(REPLY);
}

/** Group commit: the bodies read in one event-loop turn go into SQLite in one transaction. */
function durableLog(): (body: string, res: ServerResponse) => void {
  const dir = mkdtempSync(join(tmpdir(), 'asb-floor-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  const db = new DatabaseSync(join(dir, 'floor.db'));
  db.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; CREATE TABLE log (id INTEGER PRIMARY KEY, body TEXT NOT NULL)');
  const insert = db.prepare('INSERT INTO log (body) VALUES (?)');
  let queued: [string, ServerResponse][] = [];
  const flush = (): void => {
    const batch = queued;
    queued = [];
    db.exec('BEGIN IMMEDIATE');
    for (const [body] of batch) insert.run(body);
    db.exec('COMMIT');
    for (const [, res] of batch) answer(res);
  };
  return (body, res) => {
    if (queued.push([body, res]) === 1) setImmediate(flush);
  };
}

function serve(mode: FloorMode): void {
  const record = mode === 'durable' ? durableLog() : undefined;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString();
      JSON.parse(body);
      if (record === undefined) answer(res);
      else record(body, res);
    });
  });
  server.listen(0, '127.0.0.1', () => process.stdout.write(`${(server.address() as AddressInfo).port}\n`));
  // Exits when the parent does: its stdin closes.
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
}

/** Bursts of `concurrency` POSTs against the do-nothing server, as warmClaims sends claims. */
export async function benchHttpFloor(concurrency: number, rounds: number, mode: FloorMode = 'at-once'): Promise<LatencySummary & { requestsPerSec: number }> {
  const child = spawn(process.execPath, [import.meta.filename, '--serve', mode], { stdio: ['pipe', 'pipe', 'inherit'] });
  let client: BurstClient | undefined;
  try {
    const lines = createInterface({ input: child.stdout });
    const port = await new Promise<number>((resolve, reject) => {
      lines.once('line', (line) => resolve(Number(line)));
      child.once('exit', (code) => reject(new Error(`HTTP floor server exited (${code ?? 'signal'}) before listening`)));
    });
    lines.close();
    client = await startClaimBursts({ apiUrl: `http://127.0.0.1:${port}`, adminKey: 'floor' }, 'claimbench', concurrency);
    const samples: number[] = [];
    let busyMs = 0;
    // One unmeasured burst first: the server's first requests pay for its JIT warming up.
    for (let r = -1; r < rounds; r++) {
      // As warmClaims: a pause between bursts (it waits for the pool there).
      await new Promise((resolve) => setTimeout(resolve, 100));
      const burst = await client.burst();
      for (const res of burst.results) if (res.status !== 201) throw new Error(`HTTP floor server answered ${res.status}: ${res.body}`);
      if (r < 0) continue;
      busyMs += burst.wallMs;
      samples.push(...burst.results.map((res) => res.ms));
    }
    return { ...summarize(samples), requestsPerSec: round((concurrency * rounds) / (busyMs / 1000), 0) };
  } finally {
    client?.close();
    child.stdin.end();
    child.kill();
  }
}

const serveAt = process.argv.indexOf('--serve');
if (serveAt >= 0) serve(process.argv[serveAt + 1] === 'durable' ? 'durable' : 'at-once');
else if (import.meta.main) {
  const atOnce = await benchHttpFloor(64, 5);
  const durable = await benchHttpFloor(64, 5, 'durable');
  console.log(JSON.stringify({ atOnce, durable }, null, 2));
}
