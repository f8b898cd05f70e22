// Federation sync with real separate processes: a hub (src/hub/hub-main.ts) and two worker
// clusters (src/assembly/worker-main.ts), each worker reaching the hub through a TCP relay this
// test controls, so a link can be black-holed (packets vanish, nothing closes: only heartbeats
// notice) and healed, and the hub can be SIGKILLed and restarted on another port behind it.
//
// Bounds are stated in heartbeats (HEARTBEAT_MS from the contract), never as latencies.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { WebSocket } from 'ws';
import { createApiKey } from '../src/auth/keys.ts';
import { generateClusterCredential } from '../src/hub/cluster-credential.ts';
import { ClusterType, HEARTBEAT_MS, type Cluster } from '../src/api/hub-contract.ts';
import { createSyncMetrics, createSyncServer } from '../src/hub/sync-server.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { waitFor } from './support/wait.ts';
import { hubStoreWithCluster, serveUpgrades } from './support/hub-unit.ts';
import { hubAdminKey, hubCall, startHubProcess, type HubView } from './support/hub-process.ts';
import { api, startWorkerProcess, type WorkerProcess } from './support/worker-process.ts';

/** A live link carries a change at once; 3 heartbeats is the bound the design promises. */
const PROPAGATION_BOUND_MS = 3 * HEARTBEAT_MS;
/** A dead link is noticed within 3 silent heartbeats, plus one to act and one status flush. */
const DEAD_PEER_BOUND_MS = 5 * HEARTBEAT_MS;
/** After a link heals: the longest reconnect backoff (10 s) plus the propagation bound. */
const RECONNECT_BOUND_MS = 10_000 + PROPAGATION_BOUND_MS;

/** A TCP relay: forwards to `target` port until black-holed, then drops every byte both ways. */
interface Relay {
  port: number;
  target: number;
  blackhole(): void;
  /** Forwards again; the black-holed connections are closed (their streams lost bytes). */
  heal(): void;
  close(): void;
}

async function startRelay(target: number): Promise<Relay> {
  const pairs = new Set<[Socket, Socket]>();
  let dark = false;
  const relay: Relay = {
    port: 0,
    target,
    blackhole: () => (dark = true),
    heal() {
      dark = false;
      for (const [a, b] of pairs) {
        a.destroy();
        b.destroy();
      }
      pairs.clear();
    },
    close() {
      relay.heal();
      server.close();
    },
  };
  const server: Server = createServer((client) => {
    const upstream = connect(relay.target, '127.0.0.1');
    const pair: [Socket, Socket] = [client, upstream];
    pairs.add(pair);
    const forward = (from: Socket, to: Socket): void => {
      from.on('data', (chunk: Buffer) => {
        if (!dark) to.write(chunk);
      });
      from.on('close', () => {
        to.destroy();
        pairs.delete(pair);
      });
      from.on('error', () => to.destroy());
    };
    forward(client, upstream);
    forward(upstream, client);
  });
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
  relay.port = (server.address() as { port: number }).port;
  return relay;
}

function portOf(url: string): number {
  return Number(new URL(url).port);
}

interface SyncView {
  connected: boolean;
  appliedVersion: number;
}

async function syncOf(w: WorkerProcess): Promise<SyncView> {
  const res = await api<{ sync?: SyncView }>(w, 'GET', '/v1/status');
  assert.equal(res.status, 200);
  assert.ok(res.body.sync !== undefined, '/v1/status reports sync when the worker has a hub');
  return res.body.sync;
}

/** Status code a worker answers for `key`. */
async function statusWith(w: WorkerProcess, key: string): Promise<number> {
  return (await api(w, 'GET', '/v1/status', undefined, key)).status;
}

async function until(what: string, boundMs: number, fn: () => Promise<boolean>): Promise<void> {
  await waitFor(what, async () => ((await fn()) ? true : undefined), boundMs, 50);
}

interface ClusterView {
  metadata: { name: string };
  status?: { connected?: boolean; appliedVersion?: number; lag?: number };
}

async function clusterStatus(hub: HubView, name: string): Promise<ClusterView['status']> {
  const listed = await hubCall<{ items: ClusterView[] }>(hub, 'GET', '/v1/clusters');
  return listed.items.find((c) => c.metadata.name === name)?.status;
}

const TEMPLATE = {
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name: 'synced', namespace: 'default' },
  spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['sleep', 'infinity'] }] } } },
};

test('federation sync between a hub and two worker processes', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-sync-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));

  let hubProc = await startHubProcess(dir);
  t.after(() => hubProc.stop());
  const hub: HubView = { url: hubProc.ready.url, adminKey: hubAdminKey(dir) };

  const relays = { a: await startRelay(portOf(hub.url)), b: await startRelay(portOf(hub.url)) };
  t.after(() => {
    relays.a.close();
    relays.b.close();
  });

  const workers: Record<'a' | 'b', WorkerProcess> = {} as Record<'a' | 'b', WorkerProcess>;
  for (const [side, tag, octet] of [['a', 'syna', 202], ['b', 'synb', 11]] as const) {
    const name = `region-${side}`;
    const registered = await hubCall<{ credential: string }>(hub, 'PUT', `/v1/clusters/${name}`, { region: name, ingressAddress: `127.0.0.1:1000${octet % 10}`, tag });
    const credentialFile = join(dir, `${name}.credential`);
    writeFileSync(credentialFile, `${registered.credential}\n`, { mode: 0o600 });
    const w = await startWorkerProcess({
      clusterTag: tag,
      subnetOctet: octet,
      basePool: 0,
      extraArgs: ['--cluster', name, '--hub-url', `http://127.0.0.1:${relays[side].port}`, '--hub-credential-file', credentialFile],
    });
    t.after(async () => {
      await w.stop();
      rmSync(w.dataDir, { recursive: true, force: true });
    });
    workers[side] = w;
  }
  const both = [workers.a, workers.b];
  for (const w of both) await until('the worker to sync from the hub', 30_000, async () => (await syncOf(w)).connected && (await syncOf(w)).appliedVersion > 0);

  let tenantKey = '';
  await t.test('a key created at the hub authenticates at every worker within the bound', async () => {
    tenantKey = (await hubCall<{ key: string }>(hub, 'POST', '/v1/keys', { team: 'team-a' })).key;
    for (const w of both) await until('the new key to work at the worker', PROPAGATION_BOUND_MS, async () => (await statusWith(w, tenantKey)) === 200);
  });

  await t.test('a revoked key is refused at every worker within the bound', async () => {
    const doomed = (await hubCall<{ key: string; prefix: string }>(hub, 'POST', '/v1/keys', { team: 'team-b' }));
    for (const w of both) await until('the key to work', PROPAGATION_BOUND_MS, async () => (await statusWith(w, doomed.key)) === 200);
    await hubCall(hub, 'POST', `/v1/keys/${doomed.prefix}/revoke`);
    for (const w of both) await until('the revoked key to be refused', PROPAGATION_BOUND_MS, async () => (await statusWith(w, doomed.key)) === 401);
  });

  await t.test('a template applied at the hub reaches the worker and a warm pool there uses it', async () => {
    await hubCall(hub, 'POST', '/v1/apply', { objects: [TEMPLATE] });
    for (const w of both) await until('the template at the worker', PROPAGATION_BOUND_MS, async () => (await api(w, 'GET', '/v1/templates/synced?namespace=default')).status === 200);
    const tpl = await api<{ metadata: { annotations?: Record<string, string> } }>(workers.a, 'GET', '/v1/templates/synced?namespace=default');
    assert.equal(tpl.body.metadata.annotations?.['asb.dev/synced-from'], 'hub');
    const pool = { apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxWarmPool', metadata: { name: 'synced', namespace: 'default' }, spec: { replicas: 1, sandboxTemplateRef: { name: 'synced' } } };
    const applied = await api(workers.a, 'POST', '/v1/apply', { objects: [pool] });
    assert.equal(applied.status, 200, JSON.stringify(applied.body));
    await waitFor('a ready member of the pool built from the synced template', async () => {
      const s = await api<{ pools: { name: string; readyReplicas: number }[] }>(workers.a, 'GET', '/v1/status');
      return (s.body.pools.find((p) => p.name === 'synced')?.readyReplicas ?? 0) >= 1 ? true : undefined;
    });
  });

  await t.test("the hub shows each cluster's applied version and lag", async () => {
    for (const [name, w] of [['region-a', workers.a], ['region-b', workers.b]] as const) {
      const applied = (await syncOf(w)).appliedVersion;
      await until(`${name}'s ack recorded at the hub`, PROPAGATION_BOUND_MS, async () => {
        const s = await clusterStatus(hub, name);
        return s?.connected === true && s.appliedVersion === applied && s.lag === 0;
      });
    }
  });

  await t.test('a worker cut off from the hub keeps serving, is seen as gone, and resyncs when healed', async () => {
    relays.a.blackhole();
    await until('region-a to notice the dead link', DEAD_PEER_BOUND_MS, async () => !(await syncOf(workers.a)).connected);
    await until('the hub to see region-a gone', DEAD_PEER_BOUND_MS, async () => (await clusterStatus(hub, 'region-a'))?.connected === false);
    assert.equal(await statusWith(workers.a, tenantKey), 200, 'keys applied before the cut still work');

    const during = (await hubCall<{ key: string }>(hub, 'POST', '/v1/keys', { team: 'team-c' })).key;
    await until('region-b (still linked) to take the new key', PROPAGATION_BOUND_MS, async () => (await statusWith(workers.b, during)) === 200);
    assert.equal(await statusWith(workers.a, during), 401, 'region-a cannot know a key made while it was cut off');

    relays.a.heal();
    await until('region-a to take the key after healing', RECONNECT_BOUND_MS, async () => (await statusWith(workers.a, during)) === 200);
    const hubVersion = (await syncOf(workers.b)).appliedVersion;
    await until('region-a to catch up with the hub', PROPAGATION_BOUND_MS, async () => (await syncOf(workers.a)).appliedVersion >= hubVersion);
  });

  await t.test('kill -9 the hub: workers go on serving; changes before and after are applied exactly once', async () => {
    const before = (await hubCall<{ key: string }>(hub, 'POST', '/v1/keys', { team: 'team-d' })).key;
    for (const w of both) await until('the pre-crash key at the worker', PROPAGATION_BOUND_MS, async () => (await statusWith(w, before)) === 200);
    const tplBefore = await api<{ metadata: { resourceVersion: string; annotations: Record<string, string> } }>(workers.a, 'GET', '/v1/templates/synced?namespace=default');
    const appliedBefore = (await syncOf(workers.a)).appliedVersion;

    await hubProc.kill();
    for (const w of both) await until('the worker to notice the hub is gone', DEAD_PEER_BOUND_MS, async () => !(await syncOf(w)).connected);
    for (const w of both) {
      assert.equal(await statusWith(w, before), 200, 'keys keep working while the hub is away');
      assert.equal(await statusWith(w, tenantKey), 200);
      assert.equal((await api(w, 'GET', '/v1/templates/synced?namespace=default')).status, 200, 'templates stay while the hub is away');
    }

    hubProc = await startHubProcess(dir);
    hub.url = hubProc.ready.url;
    relays.a.target = portOf(hub.url);
    relays.b.target = portOf(hub.url);
    const after = (await hubCall<{ key: string }>(hub, 'POST', '/v1/keys', { team: 'team-e' })).key;
    for (const w of both) {
      await until('the post-restart key at the worker', RECONNECT_BOUND_MS, async () => (await statusWith(w, after)) === 200);
      assert.equal(await statusWith(w, before), 200, 'the pre-crash key survives the resync');
    }
    const appliedAfter = (await syncOf(workers.a)).appliedVersion;
    assert.ok(appliedAfter > appliedBefore, `applied version moves forward (${appliedBefore} → ${appliedAfter})`);
    const tplAfter = await api<{ metadata: { resourceVersion: string; annotations: Record<string, string> } }>(workers.a, 'GET', '/v1/templates/synced?namespace=default');
    assert.equal(tplAfter.body.metadata.resourceVersion, tplBefore.body.metadata.resourceVersion, 'an unchanged template is not written again by the resync');
    assert.equal(tplAfter.body.metadata.annotations['asb.dev/synced-version'], tplBefore.body.metadata.annotations['asb.dev/synced-version']);
  });
});

// The hub end on its own, in this process: what a worker that speaks the protocol by hand sees.
test('sync server: credential checked before upgrade, snapshot then deltas, resume without a snapshot, no deltas for status writes', async (t) => {
  type Msg = { type: string; version: number; items?: { kind: string; object?: { spec?: Record<string, unknown> } }[]; item?: { kind: string; name: string } };

  const { store, credential } = await hubStoreWithCluster(t);
  await createApiKey(store, { team: 'one' });
  const sync = createSyncServer({ store, log: silentLogger(), clock: systemClock, statusFlushMs: 10 });
  const url = `ws://127.0.0.1:${await serveUpgrades(t, sync)}/v1/sync`;

  const refusedWith = (auth: string | undefined): Promise<number> =>
    new Promise((res) => {
      const ws = new WebSocket(url, auth === undefined ? {} : { headers: { authorization: auth } });
      ws.on('unexpected-response', (_req, r) => res(r.statusCode ?? 0));
      ws.on('open', () => res(101));
      ws.on('error', () => undefined);
    });
  assert.equal(await refusedWith(undefined), 401, 'no credential');
  assert.equal(await refusedWith(`Bearer ${generateClusterCredential()}`), 401, 'unknown credential');

  /** Connects as c1 from `lastVersion`, collecting every frame; next() waits for one that matches. */
  const session = (lastVersion: number): { frames: Msg[]; next: (pred: (m: Msg) => boolean) => Promise<Msg>; ws: WebSocket } => {
    const frames: Msg[] = [];
    const waiters: { pred: (m: Msg) => boolean; res: (m: Msg) => void }[] = [];
    const ws = new WebSocket(url, { headers: { authorization: `Bearer ${credential}` } });
    ws.on('open', () => ws.send(JSON.stringify({ type: 'hello', cluster: 'c1', lastVersion })));
    ws.on('message', (data: Buffer) => {
      const m = JSON.parse(data.toString()) as Msg;
      frames.push(m);
      for (const w of [...waiters]) {
        if (!w.pred(m)) continue;
        waiters.splice(waiters.indexOf(w), 1);
        w.res(m);
      }
    });
    t.after(() => ws.terminate());
    const next = (pred: (m: Msg) => boolean): Promise<Msg> => {
      const seen = frames.find(pred);
      return seen !== undefined ? Promise.resolve(seen) : new Promise((res) => waiters.push({ pred, res }));
    };
    return { frames, next, ws };
  };

  const first = session(0);
  const snap = await first.next((m) => m.type === 'snapshot');
  const items = snap.items ?? [];
  assert.deepEqual(items.map((i) => i.kind).sort(), ['ApiKey', 'Cluster']);
  const cluster = items.find((i) => i.kind === 'Cluster');
  assert.equal(cluster?.object?.spec?.credentialHash, undefined, 'workers never see credential hashes');

  first.ws.send(JSON.stringify({ type: 'ack', version: snap.version }));
  await until('the ack recorded in the Cluster status', 5000, async () => (await store.get<Cluster>(ClusterType, '', 'c1')).status?.appliedVersion === snap.version);
  const { object: second } = await createApiKey(store, { team: 'two' });
  const delta = await first.next((m) => m.type === 'delta');
  assert.equal(delta.version, Number(second.metadata.resourceVersion));
  assert.equal(delta.item?.name, second.metadata.name);
  assert.ok(!first.frames.some((m) => m.type === 'delta' && m.item?.kind === 'Cluster'), 'status writes from acks are not deltas');

  // A reconnect from the snapshot's version gets just the change since, not a snapshot, and
  // replaces the first connection.
  const resumed = session(snap.version);
  const beat = await resumed.next((m) => m.type === 'heartbeat');
  assert.deepEqual(resumed.frames.filter((m) => m.type !== 'heartbeat').map((m) => [m.type, m.version]), [['delta', delta.version]]);
  assert.equal(beat.version, delta.version, 'the heartbeat tells the worker the version it is current at');
  assert.deepEqual(sync.connections().map((c) => c.cluster), ['c1'], 'one connection per cluster');
});

test('the hub tells Prometheus which clusters are linked: asb_hub_cluster_connected is 0 before hello, 1 while linked, 0 once the link ends', async (t) => {
  const { store, credential } = await hubStoreWithCluster(t);
  const registry = new Registry();
  const sync = createSyncServer({ store, log: silentLogger(), clock: systemClock, statusFlushMs: 10, metrics: createSyncMetrics(registry) });
  const url = `ws://127.0.0.1:${await serveUpgrades(t, sync)}/v1/sync`;
  const linked = async (): Promise<string | undefined> => /^asb_hub_cluster_connected\{cluster="c1"\} (\d)$/m.exec(await registry.metrics())?.[1];
  await until('c1 known to the hub and reported down', 5000, async () => (await linked()) === '0');

  const ws = new WebSocket(url, { headers: { authorization: `Bearer ${credential}` } });
  t.after(() => ws.terminate());
  ws.on('open', () => ws.send(JSON.stringify({ type: 'hello', cluster: 'c1', lastVersion: 0 })));
  await until('c1 reported linked after its hello', 5000, async () => (await linked()) === '1');
  ws.close();
  await until('c1 reported down once its link closed', 5000, async () => (await linked()) === '0');
});
