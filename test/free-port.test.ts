// freePort (src/assembly/local-system.ts) picks the port of a server another part must know before
// it binds: Envoy's edge, a supervised worker's or router's. A test run failed with Envoy's
// "cannot bind '127.0.0.1:37955': Address already in use": the kernel had given that port, from its
// ephemeral range, and an outgoing connection of the other test lane took it as its source before
// Envoy bound it.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { test } from 'node:test';
import { freePort } from '../src/assembly/local-system.ts';

test('freePort gives a port outside the range the kernel lends to outgoing connections, above our fixed ports, and free to bind', async () => {
  const [low = 0] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
  const ports = new Set<number>();
  for (let i = 0; i < 20; i++) {
    const port = await freePort();
    // A host whose ephemeral range starts below 21000 leaves too few ports under it: the kernel picks.
    if (low >= 21_000) assert.ok(port >= 20_000 && port < low, `port ${String(port)} is not in [20000, ${String(low)})`);
    ports.add(port);
    // Free: a server binds it.
    await new Promise<void>((res, rej) => {
      const server = createServer().once('error', rej);
      server.listen(port, '127.0.0.1', () => server.close(() => res()));
    });
  }
  // Random, not one port handed to every caller (two lanes start systems at once).
  assert.ok(ports.size >= 15, `20 calls gave ${String(ports.size)} ports`);
});
