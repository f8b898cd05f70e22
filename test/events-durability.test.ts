// Lifecycle events survive the process that recorded them: every event a kill -9'd writer had
// acknowledged is in the log when it opens again, with its delivery queued, and goes out to the
// webhook then; and a recorder that was down while objects changed reports where each ended up,
// once, and nothing twice, on the log and as Kubernetes Events.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { EventType, type KubeEvent } from '../src/api/event.ts';
import { SandboxType, type Sandbox } from '../src/api/types.ts';
import { EventLog } from '../src/events/event-log.ts';
import { KubeEventWriter } from '../src/events/kube-events.ts';
import { EventRecorder } from '../src/events/recorder.ts';
import { verify } from '../src/events/signature.ts';
import { WebhookSender } from '../src/events/webhook-sender.ts';
import { openSqliteStore } from '../src/store/sqlite.ts';
import { systemClock } from '../src/base/clock.ts';
import { silentLogger } from '../src/base/log.ts';
import { waitFor } from './support/wait.ts';
import { ManualClock } from './support/operator-harness.ts';
import type { Fact } from '../src/events/facts.ts';

const SECRET = 'durable-secret-0123456789';
const NODE = process.execPath;
const EVENT_LOG = new URL('../src/events/event-log.ts', import.meta.url).href;

const ONE = { offset: 0, limit: 100, orderAsc: true, types: [] as string[] };

test('kill -9 of the writer loses no acknowledged event; its deliveries go out when the log is opened again', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'asb-events-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const received = new Map<string, number>();
  const receiver = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const v = verify(SECRET, { signature: req.headers['asb-signature'] as string | undefined, timestamp: req.headers['asb-timestamp'] as string | undefined }, body, Math.floor(Date.now() / 1000));
      if (!v.ok) {
        res.writeHead(401).end();
        return;
      }
      const id = (JSON.parse(body) as { id: string }).id;
      received.set(id, (received.get(id) ?? 0) + 1);
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise<void>((resolve) => receiver.close(() => resolve())));
  const url = `http://127.0.0.1:${String((receiver.address() as AddressInfo).port)}/`;

  const setup = new EventLog({ dir });
  setup.addWebhook('team-a', { name: 'r', url, secret: SECRET, events: [], enabled: true });
  setup.close();

  // A writer that records as fast as it can and says each event id once its transaction is committed.
  const script = `
    import { EventLog } from ${JSON.stringify(EVENT_LOG)};
    const log = new EventLog({ dir: ${JSON.stringify(dir)} });
    for (let i = 0; i < 100000; i++) {
      const fact = { involved: { kind: 'Sandbox', apiVersion: 'agents.x-k8s.io/v1alpha1', name: 'sb' + i, namespace: 'default', uid: 'u' + i }, reason: 'SandboxCreated', type: 'Normal', message: 'sandbox created', event: 'sandbox.lifecycle.created', team: 'team-a', sandboxId: 'sb' + i };
      const [event] = log.record('Sandbox/default/sb' + i, { uid: 'u' + i, apiVersion: 'v' }, [fact]);
      process.stdout.write(event.id + '\\n');
    }`;
  const child = spawn(NODE, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  const acked: string[] = [];
  const lines = createInterface({ input: child.stdout });
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, signal) => resolve(signal)));
  await new Promise<void>((resolve) => {
    lines.on('line', (line) => {
      acked.push(line);
      if (acked.length === 200) {
        child.kill('SIGKILL');
        resolve();
      }
    });
  });
  assert.equal(await exited, 'SIGKILL');

  const log = new EventLog({ dir });
  t.after(() => log.close());
  const kept = new Set(log.teamEvents('team-a', { ...ONE, limit: 100 }).map((e) => e.id));
  const all = new Set<string>();
  for (let offset = 0; offset < 100_000; offset += 100) {
    const page = log.teamEvents('team-a', { ...ONE, offset });
    for (const e of page) all.add(e.id);
    if (page.length < 100) break;
  }
  assert.ok(kept.size > 0);
  for (const id of acked) assert.ok(all.has(id), `acknowledged event ${id} is in the log after kill -9`);
  // Each event is there once: its summary was written in the same transaction.
  assert.equal(log.summaries().size, all.size);

  // The receiver is on loopback: the sender runs as a worker with --webhook-allow-private does.
  const sender = new WebhookSender({ events: log, log: silentLogger(), backoffBaseMs: 20, concurrency: 8, allowPrivate: true });
  t.after(() => sender.close());
  sender.kick();
  await waitFor('every acknowledged event delivered', () => Promise.resolve(acked.every((id) => received.has(id)) ? true : undefined), 60_000);
});

function sandbox(name: string, status: Sandbox['status'], owner = 'team-a'): Sandbox {
  return {
    apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox',
    metadata: { name, namespace: 'default', labels: { 'asb.dev/owner': owner } },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox' }] } }, operatingMode: 'Running' },
    ...(status === undefined ? {} : { status }),
  };
}

test('a recorder that was down reports where each object ended up, once; a restart repeats nothing', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'asb-events-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const store = await openSqliteStore({ path: join(dir, 'store.db') });
  t.after(() => store.close());
  const start = async (): Promise<{ log: EventLog; recorder: EventRecorder }> => {
    const log = new EventLog({ dir: join(dir, 'events') });
    const recorder = await EventRecorder.start({ store, log: silentLogger(), clock: systemClock, events: log, kube: new KubeEventWriter({ store, clock: systemClock, instance: 't' }) });
    return { log, recorder };
  };
  let { log, recorder } = await start();
  const made = await store.create<Sandbox>(SandboxType, sandbox('sb1', undefined));
  await store.create<Sandbox>(SandboxType, sandbox('sb2', undefined));
  await waitFor('created recorded', () => Promise.resolve(log.teamEvents('team-a', ONE).length === 2 ? true : undefined), 10_000);
  await recorder.close();
  log.close();

  // While it is away: sb1 becomes ready, sb2 is deleted.
  await store.updateStatus<Sandbox>(SandboxType, { ...made, status: { phase: 'Running', readyTime: new Date().toISOString(), conditions: [{ type: 'Ready', status: 'True', reason: 'DependenciesReady', lastTransitionTime: new Date().toISOString() }] } });
  await store.delete(SandboxType, 'default', 'sb2');

  ({ log, recorder } = await start());
  await recorder.settled();
  const types = (id: string): string[] => (log.sandboxEvents('team-a', id, ONE) ?? []).map((e) => e.type);
  assert.deepEqual(types('sb1'), ['sandbox.lifecycle.created', 'sandbox.lifecycle.ready']);
  assert.deepEqual(types('sb2'), ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed']);
  // Every fact is a Kubernetes Event too, once, including those whose write the first run never
  // made (it closed before its Events were due): they waited in the log's outbox.
  const kube = (await store.list<KubeEvent>(EventType)).items.map((e) => `${e.involvedObject.name} ${e.reason} ${String(e.count)}`).sort();
  assert.deepEqual(kube, ['sb1 SandboxCreated 1', 'sb1 SandboxReady 1', 'sb2 SandboxCreated 1', 'sb2 SandboxDeleted 1']);
  await recorder.close();
  log.close();

  ({ log, recorder } = await start());
  await recorder.settled();
  assert.deepEqual(types('sb1'), ['sandbox.lifecycle.created', 'sandbox.lifecycle.ready'], 'nothing told twice');
  await recorder.close();
  log.close();
});

test('events are kept for the retention (7 days by default, or as configured), then dropped with their deliveries', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'asb-events-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  let now = Date.parse('2026-11-01T00:00:00Z');
  const fact = (id: string) => ({ involved: { kind: 'Sandbox', apiVersion: 'agents.x-k8s.io/v1alpha1', name: id, namespace: 'default', uid: id }, reason: 'SandboxCreated', type: 'Normal' as const, message: 'sandbox created', event: 'sandbox.lifecycle.created', team: 'team-a', sandboxId: id });
  for (const [retentionMs, keptAfter8Days] of [[undefined, false], [30 * 86_400_000, true]] as const) {
    const log = new EventLog({ dir: join(dir, String(retentionMs)), now: () => now, ...(retentionMs === undefined ? {} : { retentionMs }) });
    log.addWebhook('team-a', { name: 'r', url: 'http://127.0.0.1:9/', secret: SECRET, events: [], enabled: true });
    const hook = log.webhooks('team-a')[0]?.id ?? '';
    now = Date.parse('2026-11-01T00:00:00Z');
    log.record('Sandbox/default/old', { uid: 'old', apiVersion: 'v' }, [fact('old')]);
    now += 6 * 86_400_000;
    log.record('Sandbox/default/new', { uid: 'new', apiVersion: 'v' }, [fact('new')]);
    assert.deepEqual(log.prune(), { events: 0 }, 'six days old: kept');
    now += 2 * 86_400_000;
    log.prune();
    assert.equal(log.sandboxEvents('team-a', 'old', ONE) !== undefined, keptAfter8Days);
    assert.equal(log.sandboxEvents('team-a', 'new', ONE)?.length, 1);
    assert.equal(log.deliveries('team-a', hook, { offset: 0, limit: 10 })?.length, keptAfter8Days ? 2 : 1);
    log.close();
  }
});

test('Kubernetes Events are bounded: past the bound by a tenth the oldest of ours go, a fact that recurs counts on its Event, and Events others wrote are never touched', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'asb-kube-events-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const store = await openSqliteStore({ path: join(dir, 'store.db') });
  t.after(() => store.close());
  const clock = new ManualClock();
  // The kubelet's, say: not ours to count or trim.
  await store.create<KubeEvent>(EventType, {
    apiVersion: 'v1', kind: 'Event', metadata: { name: 'pod.kubelet', namespace: 'default' },
    involvedObject: { apiVersion: 'v1', kind: 'Pod', name: 'pod', namespace: 'default', uid: 'u-pod' },
    reason: 'Pulled', message: 'image pulled', type: 'Normal', count: 1, firstTimestamp: '2026-01-01T00:00:00Z', lastTimestamp: '2026-01-01T00:00:00Z', source: { component: 'kubelet' }, reportingComponent: 'kubelet', reportingInstance: 'node',
  });
  const writer = new KubeEventWriter({ store, clock, instance: 't', max: 10 });
  const fact = (i: number): Fact => ({ involved: { kind: 'Sandbox', apiVersion: 'agents.x-k8s.io/v1alpha1', name: `s${String(i)}`, namespace: 'default', uid: `u${String(i)}` }, reason: 'SandboxReady', type: 'Normal', message: 'pod is ready' });
  for (let i = 0; i < 11; i++) {
    await writer.write(fact(i));
    clock.advance(1000);
  }
  await writer.write(fact(3)); // again: counted on its Event, which is now the newest
  clock.advance(1000);
  const names = async (): Promise<string[]> => (await store.list<KubeEvent>(EventType, {})).items.map((e) => e.involvedObject.name).sort();
  assert.equal((await names()).length, 12, 'within the bound and its tenth: nothing dropped');
  await writer.write(fact(11));
  const left = await names();
  assert.deepEqual(left, ['pod', ...[3, 4, 5, 6, 7, 8, 9, 10, 11, 2].map((i) => `s${String(i)}`)].sort(), 'the two oldest of ours went; s3 recurred, so it stays');
  const s3 = (await store.list<KubeEvent>(EventType, {})).items.find((e) => e.involvedObject.name === 's3');
  assert.equal(s3?.count, 2);
});
