// The benchmark's stand-in for a sandbox server, in its own process so it never shares an event
// loop with the router it is measured against: answers every request with a 2-byte body and
// prints `{"port":N}` once it listens on 127.0.0.1:<N>. Exits when its stdin closes (the parent died).
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

const server = createServer((_req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 2 });
  res.end('ok');
});
// Longer than a benchmark run: wrk's connections are never closed under it.
server.keepAliveTimeout = 120_000;
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`);
});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
