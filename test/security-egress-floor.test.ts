// The worker's egress floor (src/network/egress-floor.ts): cloud metadata stays unreachable
// whatever a sandbox's policy allows. Before the floor an `allow: ["169.254.0.0/16"]` (a create
// override any tenant can send) reached the stand-in metadata server at 169.254.169.254, that is,
// on a cloud node, the node's credentials. Real sandboxes of the local runtime (runc, and gVisor
// where it runs), the world in a network namespace this file makes (test/support/egress-world.ts).
import assert from 'node:assert/strict';
import { after } from 'node:test';
import { parseEgressPolicy, type EgressPolicy } from '../src/network/egress-policy.ts';
import type { Attack, LabPod } from './support/attack-lab.ts';
import { AttackLab, fields, run } from './support/attack-lab.ts';
import { METADATA, PUBLIC_A, startWorld } from './support/egress-world.ts';

// This file's subnet: 10.233.0.0/16 (bridge asbe2flr0); the world's link takes its last /30.
const BRIDGE = 'asbe2flr0';
const lab = await AttackLab.create({ bridge: BRIDGE, subnet: '10.233.0.0/16' });
const TABLE = '2331';
const world = await startWorld({ bridge: BRIDGE, netns: 'asbe2-world', veth: 'asbe2w0', table: Number(TABLE), link: '10.233.255.252/30' });
after(() => world.close());
// Another link-local address in the world, served by the same server: what an allow of
// 169.254.0.0/16 does open, so the denial below is the floor's and not an unrouted address.
const LINK_LOCAL = '169.254.1.1';
await run('ip', ['-n', 'asbe2-world', 'addr', 'add', `${LINK_LOCAL}/32`, 'dev', 'lo']);
await run('ip', ['route', 'add', `${LINK_LOCAL}/32`, 'via', '10.233.255.254', 'table', TABLE]);

const policy = (p: Partial<EgressPolicy>): EgressPolicy => parseEgressPolicy(p, 'egress');

async function curl(p: LabPod, url: string): Promise<{ exit: string; body: string; t: number; raw: string }> {
  const r = await p.sh(`curl -sS -o /tmp/b -w 't=%{time_total}\\n' --max-time 5 '${url}' 2>/tmp/e; echo exit=$?; echo body=$(cat /tmp/b 2>/dev/null)`, { timeoutMs: 30_000 });
  const f = fields(r.out);
  return { exit: f.get('exit') ?? '', body: f.get('body') ?? '', t: Number(f.get('t') ?? 'NaN'), raw: `${r.out}${r.err}` };
}

/** Refused at once (curl exit 7, well under its 5 s limit), never served. */
async function assertRefused(p: LabPod, url: string): Promise<void> {
  const r = await curl(p, url);
  assert.notEqual(r.body, `world ${METADATA}`, `${p.id} reached the metadata server at ${url}:\n${r.raw}`);
  assert.equal(r.exit, '7', `${p.id} to ${url} should be refused (exit 7):\n${r.raw}`);
  assert.ok(r.t < 2, `the refusal took ${String(r.t)} s:\n${r.raw}`);
}

const metadataFloor: Attack = {
  name: 'no policy opens the cloud metadata address: allow 169.254.0.0/16, the address itself, or 0.0.0.0/0, at start or set while running',
  timeoutMs: 120_000,
  async run(a) {
    assert.equal(await world.curlInside(`http://${METADATA}/`), `world ${METADATA}`, 'the stand-in metadata server is not up');
    const wide = await a.pod('flr-wide', {}, { egress: policy({ allow: ['169.254.0.0/16'] }) });
    const control = await curl(wide, `http://${LINK_LOCAL}/`);
    assert.equal(control.body, `world ${LINK_LOCAL}`, `the allow CIDR opens the rest of 169.254/16:\n${control.raw}`);
    await assertRefused(wide, `http://${METADATA}/latest/meta-data/iam/security-credentials/`);
    const exact = await a.pod('flr-exact', {}, { egress: policy({ internet: false, allow: ['169.254.169.254'] }) });
    await assertRefused(exact, `http://${METADATA}/`);
    const all = await a.pod('flr-all', {}, { egress: policy({ allow: ['0.0.0.0/0'] }) });
    await assertRefused(all, `http://${METADATA}/`);
    // Replaced while running: the new allow does not open it either.
    const later = await a.pod('flr-later');
    await assertRefused(later, `http://${METADATA}/`);
    await a.rt.setEgressPolicy(later.id, policy({ allow: ['169.254.169.254/32', '169.254.0.0/16'] }));
    assert.equal((await curl(later, `http://${LINK_LOCAL}/`)).body, `world ${LINK_LOCAL}`, 'the new policy applies');
    await assertRefused(later, `http://${METADATA}/`);
    const counts = await a.rt.egressCounts();
    const floor = counts.filter((c) => c.rule === 'floor' && c.verdict === 'denied' && [wide.id, exact.id, all.id, later.id].includes(c.pod));
    assert.equal(new Set(floor.filter((c) => c.count > 0).map((c) => c.pod)).size, 4, `each refusal is counted under rule floor: ${JSON.stringify(counts)}`);
  },
};

const denyDomainNoProxy: Attack = {
  name: 'with no egress proxy, a policy denying a domain beside the internet fails closed: nothing outside opens, allowed CIDRs do',
  async run(a) {
    // A template may carry one (the API refuses it in a request when the proxy is off).
    const p = await a.pod('flr-domain', {}, { egress: policy({ deny: ['evil.example'], allow: ['169.254.1.1'] }) });
    const open = await curl(p, `http://${PUBLIC_A}/`);
    assert.equal(open.exit, '7', `the internet is open, so evil.example would be too:\n${open.raw}`);
    assert.equal((await curl(p, `http://${LINK_LOCAL}/`)).body, `world ${LINK_LOCAL}`);
  },
};

lab.register([metadataFloor, denyDomainNoProxy]);
