// What the hub takes in when a cluster sends the templates its builds made (src/hub/built-templates.ts):
// that cluster's own team templates, and nothing that would let one cluster replace another's
// templates or an admin's.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LABEL, SandboxTemplateType, type SandboxTemplate } from '../src/api/types.ts';
import { builtTemplateObject } from '../src/builds/template-object.ts';
import { acceptBuiltTemplates, BUILT_ON_LABEL } from '../src/hub/built-templates.ts';
import { silentLogger } from '../src/base/log.ts';
import { SYNC_ANNOTATION } from '../src/api/hub-contract.ts';
import { hubStoreWithCluster } from './support/hub-unit.ts';

function built(templateId: string, team: string, name: string): SandboxTemplate {
  return builtTemplateObject({ namespace: 'default', templateId, team, name, buildId: 'b1', image: 'reg:5000/templates/x@sha256:' + '0'.repeat(64), config: { env: [] }, cpuCount: 1, memoryMB: 512 });
}

async function names(store: Awaited<ReturnType<typeof hubStoreWithCluster>>['store']): Promise<string[]> {
  return (await store.list<SandboxTemplate>(SandboxTemplateType)).items.map((t) => t.metadata.name).sort();
}

test('the hub takes in a cluster\'s built templates as synced templates, and refuses names of another tag and unowned ones', async (t) => {
  const { store } = await hubStoreWithCluster(t);
  const mine = built('cccc0000000000000001', 'team-a', 'env');
  mine.metadata.annotations = { ...mine.metadata.annotations, [SYNC_ANNOTATION.from]: 'hub', [SYNC_ANNOTATION.version]: '7' };
  const otherTag = built('dddd0000000000000001', 'team-a', 'env2');
  const unowned = built('cccc0000000000000002', 'team-a', 'env3');
  delete unowned.metadata.labels?.[LABEL.owner];
  assert.equal(await acceptBuiltTemplates(store, 'c1', [mine, otherTag, unowned], silentLogger()), 1);
  assert.deepEqual(await names(store), ['cccc0000000000000001']);
  const held = await store.get<SandboxTemplate>(SandboxTemplateType, 'default', 'cccc0000000000000001');
  assert.equal(held.metadata.labels?.[BUILT_ON_LABEL], 'c1');
  assert.equal(held.metadata.labels[LABEL.owner], 'team-a');
  assert.equal(held.metadata.annotations?.[SYNC_ANNOTATION.from], undefined, 'the worker\'s sync marks are not the hub\'s');
  // The same set again writes nothing.
  assert.equal(await acceptBuiltTemplates(store, 'c1', [mine], silentLogger()), 0);
});

test('a cluster\'s next set deletes what it no longer has, and never touches an admin\'s template of the same name', async (t) => {
  const { store } = await hubStoreWithCluster(t);
  const admin = built('cccc0000000000000009', 'team-a', 'admins');
  delete admin.metadata.labels?.[LABEL.owner];
  await store.create(SandboxTemplateType, admin);
  const first = built('cccc0000000000000001', 'team-a', 'env');
  const clash = built('cccc0000000000000009', 'team-a', 'env9');
  await acceptBuiltTemplates(store, 'c1', [first, clash], silentLogger());
  const kept = await store.get<SandboxTemplate>(SandboxTemplateType, 'default', 'cccc0000000000000009');
  assert.equal(kept.metadata.labels?.[BUILT_ON_LABEL], undefined, 'the admin\'s template stays the admin\'s');
  assert.deepEqual(await names(store), ['cccc0000000000000001', 'cccc0000000000000009']);
  assert.equal(await acceptBuiltTemplates(store, 'c1', [], silentLogger()), 1);
  assert.deepEqual(await names(store), ['cccc0000000000000009']);
});
