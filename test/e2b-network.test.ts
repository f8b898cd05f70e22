// The unmodified E2B SDK's network options through the real data plane: a worker with real
// sandboxes behind Envoy and the router, and a stand-in internet in a network namespace this file
// makes (test/support/egress-world.ts). Sandbox.create with `network: {denyOut, allowOut}` and with
// `allowInternetAccess: false`, then `updateNetwork` while it runs and pause/connect, and templates
// that turn the internet off (spec.network and the kubernetes-sigs networkPolicy): each checked
// from inside the sandbox with curl, and in the worker's metrics (asb_egress_connections_total).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as e2bLatest from 'e2b';
import * as e2b250 from 'e2b-2-50';
import { PUBLIC_A, PUBLIC_B, startWorld } from './support/egress-world.ts';
import { startTestSystem } from './support/local-system.ts';

type Sandbox = e2bLatest.Sandbox;

/** curl's exit code and body, inside the sandbox (7: could not connect). */
async function curl(sbx: Sandbox, url: string): Promise<{ exit: string; body: string; seconds: number }> {
  const r = await sbx.commands.run(`rm -f /tmp/b; curl -sS -o /tmp/b -w '%{time_total}' --max-time 5 ${url} 2>/dev/null; echo " exit=$?"; cat /tmp/b 2>/dev/null; true`);
  const [first = '', ...rest] = r.stdout.split('\n');
  const m = /^([\d.]+) exit=(\d+)$/.exec(first.trim());
  return { seconds: Number(m?.[1] ?? 'NaN'), exit: m?.[2] ?? '', body: rest.join('\n').trim() };
}

async function assertReaches(sbx: Sandbox, url: string, body: string): Promise<void> {
  const r = await curl(sbx, url);
  assert.deepEqual([r.exit, r.body], ['0', body], `${url} from ${sbx.sandboxId}`);
}

async function assertRefused(sbx: Sandbox, url: string): Promise<void> {
  const r = await curl(sbx, url);
  assert.equal(r.exit, '7', `${url} from ${sbx.sandboxId} should be refused: ${JSON.stringify(r)}`);
  assert.ok(r.seconds < 2, `refused after ${String(r.seconds)} s`);
}

test('E2B SDK network options: allowOut/denyOut and allowInternetAccess at create, updateNetwork while running, kept across pause and connect, templates that turn the internet off, counted', async (t) => {
  const system = await startTestSystem('np01', 237, 'local', 1);
  t.after(() => system.cleanup());
  const world = await startWorld({ bridge: 'asbnp01', netns: 'asbnp-world2', veth: 'asbnpw1', table: 2362, link: '10.20.254.0/30' });
  t.after(() => world.close());
  const opts = { apiUrl: system.edgeUrl, sandboxUrl: system.edgeUrl, apiKey: system.adminKey };
  const A = `http://${PUBLIC_A}/`;
  const B = `http://${PUBLIC_B}/`;

  const listed = await e2bLatest.Sandbox.create('base', { ...opts, network: { denyOut: ['0.0.0.0/0'], allowOut: [PUBLIC_B] } });
  t.after(() => e2bLatest.Sandbox.kill(listed.sandboxId, opts).catch(() => false));
  await assertReaches(listed, B, `world ${PUBLIC_B}`);
  await assertRefused(listed, A);
  const info = await listed.getInfo();
  assert.deepEqual([info.allowInternetAccess, info.network?.allowOut, info.network?.denyOut], [true, [PUBLIC_B], ['0.0.0.0/0']]);

  // The 2.50 SDK's create (POST /sandboxes, allow_internet_access always sent).
  const offline = await (e2b250 as unknown as typeof e2bLatest).Sandbox.create('base', { ...opts, allowInternetAccess: false });
  t.after(() => e2bLatest.Sandbox.kill(offline.sandboxId, opts).catch(() => false));
  await assertRefused(offline, A);
  await assertRefused(offline, B);

  await listed.updateNetwork({ denyOut: [`${PUBLIC_B}/32`] });
  await assertReaches(listed, A, `world ${PUBLIC_A}`);
  await assertRefused(listed, B);

  await listed.pause();
  const woken = await e2bLatest.Sandbox.connect(listed.sandboxId, opts);
  await assertReaches(woken, A, `world ${PUBLIC_A}`);
  await assertRefused(woken, B);

  // A template turns the internet off: ours (spec.network) and the kubernetes-sigs form (networkPolicy.egress).
  const admin = { authorization: `Bearer ${system.adminKey}`, 'content-type': 'application/json' };
  const base = (await (await fetch(`${system.apiUrl}/v1/templates/base`, { headers: admin })).json()) as { spec: Record<string, unknown> };
  const templates: [string, Record<string, unknown>][] = [
    ['offline', { network: { internet: false, allow: ['198.51.100.0/24'] } }],
    ['sigs-offline', { networkPolicy: { egress: [{ to: [{ ipBlock: { cidr: '198.51.100.0/24' } }] }] } }],
  ];
  for (const [name, spec] of templates) {
    const put = await fetch(`${system.apiUrl}/v1/templates/${name}`, { method: 'PUT', headers: admin, body: JSON.stringify({ apiVersion: 'extensions.agents.x-k8s.io/v1alpha1', kind: 'SandboxTemplate', metadata: { name, namespace: 'default' }, spec: { ...base.spec, ...spec } }) });
    assert.equal(put.status, 201, await put.text());
    const sbx = await e2bLatest.Sandbox.create(name, opts);
    t.after(() => e2bLatest.Sandbox.kill(sbx.sandboxId, opts).catch(() => false));
    await assertRefused(sbx, A);
    await assertReaches(sbx, B, `world ${PUBLIC_B}`);
  }

  const metrics = await (await fetch(`${system.apiUrl}/metrics`, { headers: { authorization: `Bearer ${system.adminKey}` } })).text();
  const line = new RegExp(`^asb_egress_connections_total\\{sandbox="${listed.sandboxId}",rule="198\\.51\\.100\\.10",verdict="denied"\\} ([1-9]\\d*)$`, 'm');
  assert.match(metrics, line, metrics.split('\n').filter((l) => l.startsWith('asb_egress')).join('\n'));
  assert.match(metrics, new RegExp(`^asb_egress_connections_total\\{sandbox="${offline.sandboxId}",rule="default-no-internet",verdict="denied"\\} [1-9]`, 'm'));
});
