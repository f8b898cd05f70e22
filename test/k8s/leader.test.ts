// Leader election over a real Lease (src/operator/leader.ts) on a real kube-apiserver: of several
// candidates exactly one leads and the Lease names it; a graceful close hands over at once; a
// leader cut off from the API server stops leading before anyone else starts (the safety of the
// whole scheme: never two operators at once); a Lease another holder keeps renewing is never
// taken. Durations are shortened (lease 2 s, renew every 200 ms, deadline 1.2 s) so the test is
// quick; the ratios are the production ones' (10 s, 2 s, 7 s) in spirit: deadline < lease.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { LeaderElector, type LeaseTransport } from '../../src/operator/leader.ts';
import { KubeHttp, loadKubeConfig } from '../../src/store/kube-http.ts';
import { AsbError } from '../../src/errors.ts';
import { systemClock } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';
import { startKubeApiServer, type KubeApiServer } from '../support/kube-apiserver.ts';

let kube: KubeApiServer;
let http: KubeHttp;

before(async () => {
  kube = await startKubeApiServer({ etcdUnsafeNoFsync: true });
  http = await KubeHttp.open(loadKubeConfig(kube.kubeconfigPath));
});

after(async () => {
  http.close();
  await kube.stop();
});

/** Who led when, in the order it happened, across every candidate of a test. */
type Event = { who: string; what: 'start' | 'stop' };

/** A transport that can be cut: every request then fails as an unreachable server would. */
function cuttable(inner: LeaseTransport): LeaseTransport & { cut: boolean } {
  const t = {
    cut: false,
    request(method: string, path: string, body?: string) {
      if (t.cut) return Promise.reject(new AsbError('Unavailable', 'cut by the test'));
      return inner.request(method, path, body);
    },
  };
  return t;
}

function candidate(name: string, lease: string, events: Event[], transport: LeaseTransport = http, leaseDurationMs = 2_000): LeaderElector {
  return new LeaderElector({
    http: transport,
    namespace: 'default',
    name: lease,
    identity: name,
    leaseDurationMs,
    renewIntervalMs: 200,
    renewDeadlineMs: 1_200,
    clock: systemClock,
    log: silentLogger(),
    onStartedLeading: () => {
      events.push({ who: name, what: 'start' });
      return Promise.resolve();
    },
    onStoppedLeading: () => {
      events.push({ who: name, what: 'stop' });
      return Promise.resolve();
    },
  });
}

async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function holderOf(lease: string): Promise<string> {
  const res = await kube.request<{ spec?: { holderIdentity?: string } }>('GET', `/apis/coordination.k8s.io/v1/namespaces/default/leases/${lease}`);
  return res.body.spec?.holderIdentity ?? '';
}

/** Never two leaders at once: replaying the events, at most one has started and not stopped. */
function assertNoOverlap(events: readonly Event[]): void {
  const leading = new Set<string>();
  for (const e of events) {
    if (e.what === 'start') {
      assert.equal(leading.size, 0, `${e.who} started leading while ${[...leading].join(', ')} still led: ${JSON.stringify(events)}`);
      leading.add(e.who);
    } else leading.delete(e.who);
  }
}

test('of three candidates exactly one leads, the Lease names it, and closing it hands over without waiting out the Lease', async () => {
  const events: Event[] = [];
  // A 60 s lease: a handover within the test's patience can only be the release.
  const all = ['a', 'b', 'c'].map((n) => candidate(n, 'three', events, http, 60_000));
  try {
    for (const c of all) c.start();
    await until('a leader', () => all.some((c) => c.isLeader()));
    // A few renewal rounds: still one, the same one.
    await new Promise((r) => setTimeout(r, 800));
    const leaders = all.filter((c) => c.isLeader());
    assert.equal(leaders.length, 1);
    const first = leaders[0] as LeaderElector;
    assert.equal(await holderOf('three'), first.identity);
    for (const c of all) if (c !== first) assert.equal(c.holder(), first.identity);

    await first.close();
    // Released: the next try of another candidate takes it.
    await until('a second leader', () => all.some((c) => c !== first && c.isLeader()));
    const second = all.find((c) => c.isLeader()) as LeaderElector;
    assert.equal(await holderOf('three'), second.identity);
    assertNoOverlap(events);
  } finally {
    await Promise.all(all.map((c) => c.close()));
  }
});

test('a leader cut off from the API server stops leading before another candidate takes the Lease', async () => {
  const events: Event[] = [];
  const link = cuttable(http);
  const a = candidate('a', 'cut', events, link);
  const b = candidate('b', 'cut', events);
  try {
    a.start();
    await until('a leads', () => a.isLeader());
    b.start();
    await until('b has seen a holding the Lease', () => b.holder() === 'a');
    link.cut = true;
    await until('b leads', () => b.isLeader());
    assert.equal(a.isLeader(), false);
    assert.deepEqual(events, [
      { who: 'a', what: 'start' },
      { who: 'a', what: 'stop' },
      { who: 'b', what: 'start' },
    ]);
    assert.equal(await holderOf('cut'), 'b');
    // The Lease changed hands once.
    const lease = await kube.request<{ spec: { leaseTransitions: number } }>('GET', '/apis/coordination.k8s.io/v1/namespaces/default/leases/cut');
    assert.equal(lease.body.spec.leaseTransitions, 1);
  } finally {
    link.cut = false;
    await Promise.all([a.close(), b.close()]);
  }
});

test('a candidate never takes a Lease its holder keeps renewing, however long it waits', async () => {
  const events: Event[] = [];
  const a = candidate('a', 'held', events);
  const b = candidate('b', 'held', events);
  try {
    a.start();
    await until('a leads', () => a.isLeader());
    b.start();
    // Three lease durations.
    await new Promise((r) => setTimeout(r, 6_000));
    assert.equal(a.isLeader(), true);
    assert.equal(b.isLeader(), false);
    assert.deepEqual(events, [{ who: 'a', what: 'start' }]);
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});

test('a Lease the operator may not write is reported as Forbidden, and nobody leads', async () => {
  const limited = await KubeHttp.open((() => {
    const kc = loadKubeConfig(kube.kubeconfigPath);
    kc.setCurrentContext('asb-limited');
    return kc;
  })());
  const errors: unknown[] = [];
  const transport: LeaseTransport = {
    async request(method, path, body) {
      const res = await limited.request(method, path, body);
      if (res.status === 403) errors.push(res.body);
      return res;
    },
  };
  const events: Event[] = [];
  const a = candidate('a', 'forbidden', events, transport);
  try {
    a.start();
    await until('a refusal', () => errors.length > 0);
    assert.equal(a.isLeader(), false);
    assert.deepEqual(events, []);
  } finally {
    await a.close();
    limited.close();
  }
});
