// How a SandboxClaim's env and volumeClaimTemplates change its template (applyClaimChanges in
// src/operator/blueprint.ts), under the template's envVarsInjectionPolicy and
// volumeClaimTemplatesPolicy, as kubernetes-sigs' claim controller merges them. Pure: no store.
// The controller suite (test/support/controller-suite.ts) covers the claims end to end.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { SandboxTemplate, SandboxTemplateSpec, VolumeClaimTemplate } from '../src/api/types.ts';
import { applyClaimChanges, hasClaimChanges, type ClaimChanges } from '../src/operator/blueprint.ts';

function tpl(extra: Partial<SandboxTemplateSpec> = {}): SandboxTemplate {
  return {
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
    kind: 'SandboxTemplate',
    metadata: { name: 'py', namespace: 'default' },
    spec: {
      podTemplate: {
        spec: {
          initContainers: [{ name: 'setup', image: 'busybox' }],
          containers: [
            { name: 'main', image: 'python', env: [{ name: 'MODE', value: 'prod' }] },
            { name: 'side', image: 'busybox', envFrom: [{ configMapRef: { name: 'x' } }] },
          ],
          volumes: [{ name: 'scratch', emptyDir: {} }],
        },
      },
      volumeClaimTemplates: [vct('work', '1Gi')],
      ...extra,
    },
  };
}

function vct(name: string, storage: string): VolumeClaimTemplate {
  return { metadata: { name }, spec: { resources: { requests: { storage } } } };
}

function applied(template: SandboxTemplate, changes: ClaimChanges): SandboxTemplateSpec {
  const out = applyClaimChanges(template, changes);
  if ('refused' in out) throw new Error(`refused: ${out.refused.reason}: ${out.refused.message}`);
  return out.template.spec;
}

function refusal(template: SandboxTemplate, changes: ClaimChanges): string {
  const out = applyClaimChanges(template, changes);
  assert.ok('refused' in out, 'expected a refusal');
  return `${out.refused.reason}: ${out.refused.message}`;
}

test('a claim without env or volumes leaves the template as it is (no copy on the common path)', () => {
  const t = tpl();
  assert.equal(hasClaimChanges({ env: [], volumeClaimTemplates: [] }), false);
  const out = applyClaimChanges(t, {});
  assert.ok('template' in out && out.template === t);
});

test('env: Disallowed (the default) refuses; Allowed adds to the first container or the one named, init containers included', () => {
  assert.match(refusal(tpl(), { env: [{ name: 'A', value: '1' }] }), /^EnvVarsInjectionRejected: .*envVarsInjectionPolicy is Disallowed/);
  const spec = applied(tpl({ envVarsInjectionPolicy: 'Allowed' }), { env: [{ name: 'A', value: '1' }, { name: 'B', value: '2', containerName: 'setup' }] });
  assert.deepEqual(spec.podTemplate.spec.containers[0]?.env, [{ name: 'MODE', value: 'prod' }, { name: 'A', value: '1' }]);
  assert.deepEqual(spec.podTemplate.spec.initContainers?.[0]?.env, [{ name: 'B', value: '2' }]);
});

test('env: Allowed refuses to override a variable or to add beside envFrom; Overrides replaces; an unknown container is refused', () => {
  const allowed = tpl({ envVarsInjectionPolicy: 'Allowed' });
  assert.match(refusal(allowed, { env: [{ name: 'MODE', value: 'dev' }] }), /already sets it/);
  assert.match(refusal(allowed, { env: [{ name: 'A', value: '1', containerName: 'side' }] }), /envFrom/);
  assert.match(refusal(allowed, { env: [{ name: 'A', value: '1', containerName: 'nope' }] }), /no container named "nope"/);
  const t = tpl({ envVarsInjectionPolicy: 'Overrides' });
  const spec = applied(t, { env: [{ name: 'MODE', value: 'dev' }, { name: 'A', value: '1', containerName: 'side' }] });
  assert.deepEqual(spec.podTemplate.spec.containers[0]?.env, [{ name: 'MODE', value: 'dev' }]);
  assert.deepEqual(spec.podTemplate.spec.containers[1]?.env, [{ name: 'A', value: '1' }]);
  assert.deepEqual(t.spec.podTemplate.spec.containers[0]?.env, [{ name: 'MODE', value: 'prod' }], 'the template itself is untouched');
});

test('volumeClaimTemplates: Disallowed refuses; Allowed appends and refuses a name the template has; Overrides replaces by name', () => {
  assert.match(refusal(tpl(), { volumeClaimTemplates: [vct('data', '2Gi')] }), /^VolumeClaimTemplatesError: .*volumeClaimTemplatesPolicy is Disallowed/);
  const allowed = tpl({ volumeClaimTemplatesPolicy: 'Allowed' });
  assert.deepEqual(applied(allowed, { volumeClaimTemplates: [vct('data', '2Gi')] }).volumeClaimTemplates, [vct('work', '1Gi'), vct('data', '2Gi')]);
  assert.match(refusal(allowed, { volumeClaimTemplates: [vct('work', '5Gi')] }), /has one of that name/);
  assert.match(refusal(allowed, { volumeClaimTemplates: [vct('scratch', '5Gi')] }), /already has a volume of that name/);
  const overrides = tpl({ volumeClaimTemplatesPolicy: 'Overrides' });
  assert.deepEqual(applied(overrides, { volumeClaimTemplates: [vct('data', '2Gi'), vct('work', '5Gi')] }).volumeClaimTemplates, [vct('work', '5Gi'), vct('data', '2Gi')]);
});
