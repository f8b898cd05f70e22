// The route table's version rules (no delta lost, duplicated or applied out of order; a
// reconnect resyncs), the negative cache, and the feed client against a real WebSocket server.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { WebSocketServer, type WebSocket } from 'ws';
import type { FeedMessage } from '../src/router/contract.ts';
import { FeedClient } from '../src/router/feed-client.ts';
import { RouteTable } from '../src/router/route-table.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { entry, ManualClock, until } from './support/router-fixture.ts';

test('deltas apply only in version order after a snapshot; duplicates and stale ones are refused', () => {
  const table = new RouteTable({ clock: new ManualClock() });
  assert.equal(table.apply('c1', { type: 'upsert', version: 5, entry: entry('a') }), 'unsynced', 'no delta before a snapshot');
  assert.equal(table.apply('c1', { type: 'snapshot', version: 10, cluster: 'c1', entries: [entry('a'), entry('b')] }), 'applied');
  assert.equal(table.size, 2);
  assert.equal(table.apply('c1', { type: 'upsert', version: 11, entry: entry('a', { state: 'hibernated', podIp: undefined }) }), 'applied');
  assert.equal(table.get('a')?.state, 'hibernated');
  assert.equal(table.apply('c1', { type: 'upsert', version: 11, entry: entry('a') }), 'stale', 'a duplicate is ignored');
  assert.equal(table.apply('c1', { type: 'upsert', version: 9, entry: entry('a') }), 'stale', 'an older delta is ignored');
  assert.equal(table.get('a')?.state, 'hibernated');
  assert.equal(table.apply('c1', { type: 'delete', version: 12, id: 'b' }), 'applied');
  assert.equal(table.get('b'), undefined);
  assert.equal(table.apply('c1', { type: 'upsert', version: 13, entry: entry('x', { cluster: 'c2' }) }), 'foreign', 'a worker speaks only for its cluster');

  // Another cluster's entries are untouched by c1's resync; c1's snapshot replaces c1's entries.
  table.apply('c2', { type: 'snapshot', version: 3, cluster: 'c2', entries: [entry('z', { cluster: 'c2' })] });
  table.setConnected('c1', false);
  assert.equal(table.isSynced('c1'), false);
  assert.equal(table.get('a')?.state, 'hibernated', 'entries stay while the feed is down');
  assert.equal(table.apply('c1', { type: 'upsert', version: 14, entry: entry('q') }), 'unsynced', 'after a drop only a snapshot is accepted');
  table.apply('c1', { type: 'snapshot', version: 4, cluster: 'c1', entries: [entry('c')] });
  assert.deepEqual([table.get('a'), table.get('c')?.id, table.get('z')?.id], [undefined, 'c', 'z']);
  assert.equal(table.version('c1'), 4, 'a resync starts the version sequence afresh');
});

test('ids confirmed missing are remembered for the TTL, and forgotten when they appear', () => {
  const clock = new ManualClock();
  const table = new RouteTable({ clock, negativeTtlMs: 5_000 });
  table.apply('c1', { type: 'snapshot', version: 1, cluster: 'c1', entries: [] });
  table.rememberMissing('gone');
  assert.equal(table.isKnownMissing('gone'), true);
  clock.advance(5_001);
  assert.equal(table.isKnownMissing('gone'), false);
  table.rememberMissing('late');
  table.apply('c1', { type: 'upsert', version: 2, entry: entry('late') });
  assert.equal(table.isKnownMissing('late'), false);
});

test('feed client: snapshot, deltas, then a dropped connection resyncs from a fresh snapshot', async (t) => {
  const http = createServer();
  const wss = new WebSocketServer({ noServer: true });
  const sockets: WebSocket[] = [];
  const auths: (string | undefined)[] = [];
  http.on('upgrade', (req, socket, head) => {
    auths.push(req.headers.authorization);
    wss.handleUpgrade(req, socket, head, (ws) => {
      sockets.push(ws);
      const connection = sockets.length;
      const send = (m: FeedMessage): void => ws.send(JSON.stringify(m));
      if (connection === 1) {
        send({ type: 'snapshot', version: 100, cluster: 'c1', entries: [entry('a'), entry('b')] });
        send({ type: 'upsert', version: 101, entry: entry('a', { state: 'hibernated', podIp: undefined }) });
        send({ type: 'upsert', version: 101, entry: entry('a') }); // duplicate: ignored
        send({ type: 'delete', version: 102, id: 'b' });
        ws.send('not json');
      } else {
        send({ type: 'snapshot', version: 200, cluster: 'c1', entries: [entry('c')] });
      }
    });
  });
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  const table = new RouteTable({ clock: systemClock });
  const feed = new FeedClient({ worker: { cluster: 'c1', url, key: 'admin-key' }, table, clock: systemClock, log: silentLogger(), baseBackoffMs: 10, random: () => 0 });
  t.after(() => {
    feed.close();
    wss.close();
    http.closeAllConnections();
    http.close();
  });

  await feed.synced();
  await until(() => table.version('c1') === 102, 5_000, 'the deltas');
  assert.equal(auths[0], 'Bearer admin-key');
  assert.equal(table.get('a')?.state, 'hibernated', 'the duplicate at version 101 did not undo the first');
  assert.equal(table.get('b'), undefined);
  assert.equal(feed.status().connected, true);

  sockets[0]?.terminate();
  await until(() => table.version('c1') === 200, 5_000, 'the resync after reconnect');
  assert.deepEqual([table.get('a'), table.get('c')?.id], [undefined, 'c']);
  assert.equal(feed.status().connects, 2);

  // Worker gone for good: the cluster is marked unreachable, entries stay.
  wss.close();
  for (const s of sockets) s.terminate();
  http.close();
  await until(() => !table.isConnected('c1'), 5_000, 'the drop');
  assert.equal(table.get('c')?.id, 'c');
});
