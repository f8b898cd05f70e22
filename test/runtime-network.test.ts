// Two local runtimes on one host (two checkouts' `make up`) must not share a bridge or a pod
// subnet: when they did (asb0, 10.213.0.0/16 for everyone), one system's pods got the other's
// addresses and its edge reached the other's pods (security probe, "Two make up runs on one host
// collide"). Defaults now derive from the state dir, and a start whose bridge or subnet another
// live instance (or the host) already uses is refused, naming it. Needs root (as in CI) for the
// last test, which creates bridges with names and subnets no other test uses and deletes them.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { bridgeExists, deleteBridge, ensureBridge, ipBatch, parseSubnet } from '../src/runtime/local/network.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { claimNetwork, networkConflict, overlaps, parseCidr, type HostNetwork, type NetworkClaim } from '../src/runtime/local/network-claim.ts';
import { processStartTime } from '../src/runtime/local/rootfs.ts';
import { parseWorkerConfig } from '../src/assembly/worker-config.ts';
import { derivedNetwork, nthSubnet } from '../src/runtime/local/derived-network.ts';
import { silentLogger } from '../src/base/log.ts';
import { testImageStore } from './support/test-images.ts';
import { removeDataDir, startWorkerProcess, tempDataDir } from './support/worker-process.ts';

const cidrsOverlap = (a: string, b: string): boolean => {
  const x = parseCidr(a);
  const y = parseCidr(b);
  assert.ok(x !== undefined && y !== undefined);
  return overlaps(x, y);
};

test('two workers with different data dirs get different bridges and non-overlapping subnets; ASB_BRIDGE / ASB_SUBNET still win', () => {
  const a = parseWorkerConfig(['--data-dir', '/srv/checkout-a/.asb/data'], {});
  const b = parseWorkerConfig(['--data-dir', '/srv/checkout-b/.asb/data'], {});
  assert.notEqual(a.bridge, b.bridge);
  assert.equal(cidrsOverlap(a.subnet, b.subnet), false, `${a.subnet} vs ${b.subnet}`);
  for (const c of [a, b]) {
    assert.match(c.bridge, /^asb[0-9a-f]{8}0$/);
    assert.match(c.subnet, /^10\.(6[4-9]|[7-9]\d|1[0-8]\d|19[01])\.0\.0\/16$/, 'derived subnets stay in 10.64-10.191, clear of the tests’ 10.200+');
  }
  assert.deepEqual(parseWorkerConfig(['--data-dir', '/srv/checkout-a/.asb/data'], {}), a, 'stable across restarts: pods keep their addresses');
  const set = parseWorkerConfig(['--data-dir', '/srv/checkout-a/.asb/data', '--bridge', 'asbmine'], { ASB_SUBNET: '10.99.0.0/16' });
  assert.deepEqual([set.bridge, set.subnet], ['asbmine', '10.99.0.0/16']);
  assert.throws(() => parseWorkerConfig(['--subnet', '10.300.0.0/16'], {}), /--subnet/);
});

test('the clusters of one federation get consecutive subnets and their own bridges; ASB_SUBNET moves them together', () => {
  const [a, b] = [derivedNetwork('/srv/checkout-a/.asb', 0), derivedNetwork('/srv/checkout-a/.asb', 1)];
  assert.notEqual(a.bridge, b.bridge);
  assert.equal(cidrsOverlap(a.subnet, b.subnet), false);
  assert.equal(nthSubnet('10.100.0.0/16', 1), '10.101.0.0/16');
  assert.equal(nthSubnet('10.255.0.0/16', 1), undefined);
  assert.equal(nthSubnet('10.100.0.0/24', 0), undefined);
});

const claim = (bridge: string, subnet: string, owner: string, pid = 4242): NetworkClaim => ({ bridge, subnet, owner, pid });
const NO_HOST: HostNetwork = { routes: [], addrs: [] };

test('conflicts: a live holder of the bridge or an overlapping subnet is named; dead holders, the same owner and unrelated routes are not', () => {
  const want = claim('asbnew0', '10.100.0.0/16', '/srv/b/.asb/data/runtime', process.pid);
  const other = claim('asbold0', '10.100.0.0/16', '/srv/a/.asb/data/runtime', 1234);
  const live = (): boolean => true;
  const dead = (): boolean => false;
  const subnet = networkConflict(want, [other], NO_HOST, live);
  assert.match(subnet ?? '', /subnet 10\.100\.0\.0\/16 overlaps 10\.100\.0\.0\/16 of bridge asbold0, held by the Agent Sandbox runtime of \/srv\/a\/\.asb\/data\/runtime \(pid 1234\)/);
  assert.match(subnet ?? '', /ASB_SUBNET/);
  const bridge = networkConflict(claim('asbold0', '10.101.0.0/16', want.owner), [other], NO_HOST, live);
  assert.match(bridge ?? '', /bridge asbold0 is held by the Agent Sandbox runtime of \/srv\/a\/\.asb\/data\/runtime \(pid 1234\) with subnet 10\.100\.0\.0\/16/);
  assert.match(networkConflict(claim('asbnew0', '10.100.128.0/17', want.owner), [other], NO_HOST, live) ?? '', /overlaps/, 'a part of their subnet is theirs too');
  assert.equal(networkConflict(want, [other], NO_HOST, dead), undefined, 'a dead holder holds nothing');
  assert.equal(networkConflict(want, [{ ...other, owner: want.owner }], NO_HOST, live), undefined, 'the same state dir restarting');
  assert.equal(networkConflict(claim('asbnew0', '10.101.0.0/16', want.owner), [other], NO_HOST, live), undefined);

  // The host's own view: an older worker without a claim, docker, a VPN.
  const host: HostNetwork = {
    routes: [
      { dst: 'default', dev: 'eth0' },
      { dst: '192.0.2.0/24', dev: 'eth0' },
      { dst: '10.100.0.0/16', dev: 'asb0' },
    ],
    addrs: [{ cidr: '10.100.0.1/16', dev: 'asb0' }],
  };
  assert.match(networkConflict(want, [], host, live) ?? '', /subnet 10\.100\.0\.0\/16 overlaps address 10\.100\.0\.1\/16 on asb0/);
  assert.match(networkConflict(want, [], { routes: host.routes, addrs: [] }, live) ?? '', /overlaps the host's route to 10\.100\.0\.0\/16 via asb0/);
  assert.match(networkConflict(want, [claim('asb0', '10.100.0.0/16', '/srv/a', 1)], { routes: host.routes, addrs: [] }, dead) ?? '', /whose runtime is not running: `ip link del asb0`/);
  assert.equal(networkConflict(want, [], { routes: [{ dst: '10.100.0.0/16', dev: 'asbnew0' }], addrs: [{ cidr: '10.100.0.1/16', dev: 'asbnew0' }] }, live), undefined, 'our own bridge from the last run');
  assert.match(networkConflict(want, [], { routes: [], addrs: [{ cidr: '10.213.0.1/16', dev: 'asbnew0' }] }, live) ?? '', /bridge asbnew0 already exists with address 10\.213\.0\.1\/16/);
  assert.equal(networkConflict(claim('asbnew0', '10.101.0.0/16', want.owner), [], host, live), undefined, 'the default route and other subnets are no conflict');
});

test('a claim counts while its owner process lives: a dead pid, or a reused one with another start time, holds nothing', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'asb-claims-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const host = (): Promise<HostNetwork> => Promise.resolve(NO_HOST);
  const want = claim('asbwant0', '10.100.0.0/16', '/srv/b', process.pid);
  const write = async (c: NetworkClaim): Promise<void> => {
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, `${c.bridge}.json`), JSON.stringify(c));
  };
  const started = await processStartTime(process.pid);
  assert.ok(started !== undefined);
  await write({ ...claim('asbheld0', '10.100.0.0/16', '/srv/a', process.pid), pidStart: started });
  await assert.rejects(claimNetwork(want, { claimsDir: dir, host }), /held by the Agent Sandbox runtime of \/srv\/a/);
  await write({ ...claim('asbheld0', '10.100.0.0/16', '/srv/a', process.pid), pidStart: '1' });
  assert.deepEqual(await claimNetwork(want, { claimsDir: dir, host }), [], 'the pid was reused: the claim is stale');
  const ours = JSON.parse(await readFile(join(dir, 'asbwant0.json'), 'utf8')) as NetworkClaim;
  assert.equal(ours.pidStart, started);
  // pid_max is at most 2^22: this pid cannot be running.
  await write(claim('asbgone0', '10.101.0.0/16', '/srv/c', 2 ** 22 + 1));
  assert.deepEqual(await claimNetwork({ ...want, owner: '/srv/d', bridge: 'asbwant1', subnet: '10.101.0.0/16' }, { claimsDir: dir, host: () => Promise.reject(new Error('no ip')) }).then((w) => w.length), 1, 'a dead owner holds nothing; a host that cannot be read is a warning, not a refusal');
});

interface Instance {
  root: string;
  bridge: string;
  subnet: string;
}

/** Cleanups that run last-registered first, as resources nest (t.after runs hooks in registration order). */
function deferrer(t: TestContext): (fn: () => unknown) => void {
  const fns: (() => unknown)[] = [];
  t.after(async () => {
    for (const fn of fns.reverse()) await fn();
  });
  return (fn) => fns.push(fn);
}

/** Starts a local runtime on its own root; its pods are removed, it is closed and its bridge deleted after the test. */
async function start(defer: (fn: () => unknown) => void, inst: Instance, claimsDir: string): Promise<LocalRuntime> {
  defer(() => deleteBridge(inst.bridge));
  const rt = await createLocalRuntime({ root: inst.root, log: silentLogger(), images: await testImageStore(), bridge: inst.bridge, subnet: inst.subnet, claimsDir });
  defer(async () => {
    for (const id of rt.list()) await rt.remove(id);
    await rt.close();
  });
  return rt;
}

test('a runtime whose bridge or subnet another live instance holds is refused at start, naming the bridge, its subnet and the holder', async (t) => {
  const defer = deferrer(t);
  const dir = await mkdtemp(join(tmpdir(), 'asb-netclaim-'));
  defer(() => rm(dir, { recursive: true, force: true }));
  const claimsDir = join(dir, 'claims');
  const tag = randomBytes(2).toString('hex');
  // 10.225 and 10.226: used by no other test file.
  const first: Instance = { root: join(dir, 'a'), bridge: `asbnc${tag}a`, subnet: '10.225.0.0/16' };
  const rtA = await start(defer, first, claimsDir);
  assert.equal(await rtA.hasPodNetwork(), true);
  assert.equal(await bridgeExists(first.bridge), true);
  const held = JSON.parse(await readFile(join(claimsDir, `${first.bridge}.json`), 'utf8')) as NetworkClaim;
  assert.deepEqual({ ...held, pidStart: undefined }, { bridge: first.bridge, subnet: first.subnet, owner: first.root, pid: process.pid, pidStart: undefined });
  assert.match(held.pidStart ?? '', /^\d+$/, 'the owner’s start time: a reused pid does not hold a dead owner’s claim');

  const refused = async (inst: Instance, claims: string, expected: RegExp): Promise<void> => {
    await assert.rejects(start(defer, inst, claims), (err: unknown) => {
      assert.ok(isAsbError(err, 'Unavailable'), String(err));
      assert.match(err.message, expected);
      return true;
    });
    if (inst.bridge !== first.bridge) assert.equal(await bridgeExists(inst.bridge), false, 'no bridge was made for the refused instance');
  };
  // Another checkout, derived (by bad luck) the same subnet: refused, the holder named.
  const owner = first.root.replaceAll('.', '\\.');
  await refused({ root: join(dir, 'b'), bridge: `asbnc${tag}b`, subnet: first.subnet }, claimsDir, new RegExp(`subnet 10\\.225\\.0\\.0/16 overlaps 10\\.225\\.0\\.0/16 of bridge ${first.bridge}, held by the Agent Sandbox runtime of ${owner} \\(pid ${process.pid}\\)`));
  // The same bridge name with another subnet: refused.
  await refused({ root: join(dir, 'c'), bridge: first.bridge, subnet: '10.226.0.0/16' }, claimsDir, new RegExp(`bridge ${first.bridge} is held by the Agent Sandbox runtime of ${owner} \\(pid ${process.pid}\\) with subnet 10\\.225\\.0\\.0/16`));
  // An instance that left no claim (an older worker): the host's routes and addresses still tell.
  await refused({ root: join(dir, 'd'), bridge: `asbnc${tag}d`, subnet: first.subnet }, join(dir, 'no-claims'), new RegExp(`subnet 10\\.225\\.0\\.0/16 overlaps address 10\\.225\\.0\\.1/16 on ${first.bridge}`));

  // A subnet of its own starts, and the first instance restarting on its own state dir is no conflict.
  const third = await start(defer, { root: join(dir, 'e'), bridge: `asbnc${tag}e`, subnet: '10.226.0.0/16' }, claimsDir);
  assert.equal(await third.hasPodNetwork(), true);
  await rtA.close();
  const again = await start(defer, first, claimsDir);
  assert.equal(await again.hasPodNetwork(), true);
});

test('a pod hibernated under another subnet wakes with an address in the new one, and its /etc/hosts says so', async (t) => {
  const defer = deferrer(t);
  const dir = await mkdtemp(join(tmpdir(), 'asb-netmove-'));
  defer(() => rm(dir, { recursive: true, force: true }));
  const claimsDir = join(dir, 'claims');
  const root = join(dir, 'runtime');
  const tag = randomBytes(2).toString('hex');
  const spec = { containers: [{ name: 'main', image: 'agent-sandbox/base' }] };
  const req: PodRequest = { id: 'mv1', uid: 'uid-mv1', namespace: 'default', hostname: 'mv1-host', spec };
  const before = await start(defer, { root, bridge: `asbmv${tag}a`, subnet: '10.225.0.0/16' }, claimsDir);
  const first = await before.start(req);
  assert.match(first.ip ?? '', /^10\.225\./);
  await before.stop('mv1');
  await before.close();
  // The state dir's next run uses another subnet (as after the upgrade from the shared 10.213/16).
  const after = await start(defer, { root, bridge: `asbmv${tag}b`, subnet: '10.226.0.0/16' }, claimsDir);
  const woken = await after.start(req);
  assert.equal(woken.phase, 'Running');
  assert.match(woken.ip ?? '', /^10\.226\./, `woke with ${woken.ip ?? '?'}`);
  const hosts = await after.exec('mv1', { command: ['sh', '-c', 'cat /etc/hosts'] });
  assert.match(Buffer.from(hosts.stdout).toString('utf8'), new RegExp(`^${(woken.ip ?? '').replaceAll('.', '\\.')}\\tmv1-host$`, 'm'), 'its /etc/hosts names the new address');
});

test('a second worker process on another data dir whose subnet the first holds exits before ready, and says which bridge, subnet and state dir hold it', async (t) => {
  // Own tags, bridges (asbncwa, asbncwb) and subnet (10.223/16): no other test uses them.
  const defer = deferrer(t);
  const firstDir = tempDataDir('ncwa');
  const secondDir = tempDataDir('ncwb');
  defer(() => {
    removeDataDir(firstDir);
    removeDataDir(secondDir);
  });
  defer(() => deleteBridge('asbncwa'));
  defer(() => deleteBridge('asbncwb'));
  const first = await startWorkerProcess({ dataDir: firstDir, clusterTag: 'ncwa', subnetOctet: 223, basePool: 0 });
  defer(() => first.stop());
  await assert.rejects(startWorkerProcess({ dataDir: secondDir, clusterTag: 'ncwb', subnetOctet: 223, basePool: 0 }), (err: unknown) => {
    assert.ok(err instanceof Error);
    assert.match(err.message, /^worker ncwb exited \(1\) before it was ready: cannot set up pod networking: subnet 10\.223\.0\.0\/16 overlaps 10\.223\.0\.0\/16 of bridge asbncwa, held by the Agent Sandbox runtime of /);
    assert.ok(err.message.includes(`${firstDir}/data/runtime (pid ${String(first.proc.pid)})`), err.message);
    return true;
  });
  assert.equal(await bridgeExists('asbncwb'), false, 'the refused worker made no bridge');
});

test("a port joining or leaving the pod bridge leaves the bridge's MAC address, the gateway every pod has cached, as it was (regression: 200 terminals opened while the warm pool refilled all waited ~53 s for their connections)", async (t) => {
  // Own bridge (asbttmac), ports (asbttmac0/1) and subnet (10.254/16): no other test uses them.
  const [bridge, port, peer] = ['asbttmac', 'asbttmac0', 'asbttmac1'];
  const subnet = parseSubnet('10.254.0.0/16');
  const mac = async (): Promise<string> => (await readFile(`/sys/class/net/${bridge}/address`, 'utf8')).trim();
  // A port whose address is below any the kernel draws at random: a bridge whose own address was
  // never set takes the lowest of its ports' (that is what moved the gateway under the pods).
  const joinPort = (): Promise<string> => ipBatch([`link add ${port} address 02:00:00:00:00:00 type veth peer name ${peer}`, `link set ${port} master ${bridge} up`]);
  const leavePort = (): Promise<string> => ipBatch([`link del ${port}`]);
  t.after(async () => {
    await leavePort();
    await deleteBridge(bridge);
  });
  await leavePort();
  await deleteBridge(bridge);
  await ensureBridge(bridge, subnet);
  const first = await mac();
  assert.equal(await joinPort(), '');
  assert.equal(await mac(), first, 'a pod joining');
  assert.equal(await leavePort(), '');
  assert.equal(await mac(), first, 'a pod leaving');
  // A worker starting again finds the bridge there: it keeps the address its pods have cached.
  await ensureBridge(bridge, subnet);
  assert.equal(await mac(), first, 'a worker restart');
  assert.equal(await joinPort(), '');
  assert.equal(await mac(), first, 'a pod joining after the restart');
});
