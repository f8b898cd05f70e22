import assert from 'node:assert/strict';
import { test } from 'node:test';
import { builtinObjects } from '../src/api/builtin.ts';
import { parseQuantity } from '../src/api/quantity.ts';
import { ApiKeyType, sandboxLifecycle, SandboxClaimType, SandboxTemplateType, SandboxType, SandboxWarmPoolType } from '../src/api/types.ts';
import type { SandboxClaimSpec, SandboxSpec, SandboxWarmPoolSpec } from '../src/api/types.ts';
import { applyDefaults, MAX_WARM_POOL_REPLICAS, resourceTypeFor, validateObject } from '../src/api/validate.ts';
import { AsbError, isAsbError } from '../src/errors.ts';

/** The field → message list a user would read from the one Invalid error. */
function problems(raw: unknown, path?: string): Record<string, string> {
  try {
    validateObject(raw, path);
  } catch (err) {
    assert.ok(isAsbError(err, 'Invalid'), `expected an Invalid AsbError, got ${String(err)}`);
    assert.equal(err.status, 422);
    return Object.fromEntries(err.fields.map((f) => [f.field, f.message]));
  }
  assert.fail('expected the object to be rejected');
}

function sandbox(spec: Record<string, unknown>, metadata: Record<string, unknown> = { name: 'box' }): Record<string, unknown> {
  return { apiVersion: 'agents.x-k8s.io/v1alpha1', kind: 'Sandbox', metadata, spec };
}

function podSpec(extra: Record<string, unknown> = {}, container: Record<string, unknown> = {}): Record<string, unknown> {
  return { podTemplate: { spec: { containers: [{ name: 'main', image: 'busybox', ...container }], ...extra } } };
}

function pool(spec: Record<string, unknown>): Record<string, unknown> {
  return { apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxWarmPool', metadata: { name: 'pool' }, spec };
}

function claim(spec: Record<string, unknown>, apiVersion = 'extensions.agents.x-k8s.io/v1beta1'): Record<string, unknown> {
  return { apiVersion, kind: 'SandboxClaim', metadata: { name: 'claim-1' }, spec };
}

test('both served versions of every k8s-sigs kind map to one resource type; ApiKey only to asb.dev/v1alpha1', () => {
  assert.equal(resourceTypeFor('agents.x-k8s.io/v1alpha1', 'Sandbox'), SandboxType);
  assert.equal(resourceTypeFor('agents.x-k8s.io/v1beta1', 'Sandbox'), SandboxType);
  assert.equal(resourceTypeFor('extensions.agents.x-k8s.io/v1beta1', 'SandboxTemplate'), SandboxTemplateType);
  assert.equal(resourceTypeFor('extensions.agents.x-k8s.io/v1alpha1', 'SandboxClaim'), SandboxClaimType);
  assert.equal(resourceTypeFor('extensions.agents.x-k8s.io/v1beta1', 'SandboxWarmPool'), SandboxWarmPoolType);
  assert.equal(resourceTypeFor('asb.dev/v1alpha1', 'ApiKey'), ApiKeyType);
  assert.equal(resourceTypeFor('asb.dev/v1beta1', 'ApiKey'), undefined);
  assert.equal(resourceTypeFor('agents.x-k8s.io/v1alpha1', 'SandboxTemplate'), undefined);
  assert.equal(resourceTypeFor('v1', 'Pod'), undefined);
});

test('a valid object comes back as given, not rewritten', () => {
  const raw = sandbox(podSpec(), { name: 'box', namespace: 'team-a', labels: { app: 'demo' } });
  const copy = structuredClone(raw);
  assert.equal(validateObject(raw), raw);
  assert.deepEqual(raw, copy);
});

test('the built-in base template and pool validate, and the template keeps home on a persistent volume', () => {
  const [template, basePool] = builtinObjects();
  assert.ok(template !== undefined && basePool !== undefined);
  validateObject(template);
  validateObject(basePool);
  const spec = template.spec as SandboxSpec;
  const main = spec.podTemplate.spec.containers[0]!;
  assert.equal(main.name, 'main');
  assert.deepEqual(main.volumeMounts, [{ name: 'home', mountPath: '/home/user' }]);
  assert.equal(spec.volumeClaimTemplates?.[0]?.metadata.name, 'home');
  assert.equal((basePool.spec as SandboxWarmPoolSpec).replicas, 3);
  assert.equal((basePool.spec as SandboxWarmPoolSpec).sandboxTemplateRef.name, template.metadata.name);
  // Each call hands out fresh objects, so one caller's defaults never leak into another's.
  (builtinObjects()[1]?.spec as SandboxWarmPoolSpec).replicas = 99;
  assert.equal((builtinObjects()[1]?.spec as SandboxWarmPoolSpec).replicas, 3);
});

test('every problem is listed at once with its field path, in one Invalid error', () => {
  const found = problems(sandbox({
    replicas: 2,
    shutdownTime: 'tomorrow',
    podTemplate: {
      spec: {
        containers: [
          { name: 'main', image: 7, ports: [{ containerPort: 0 }, { containerPort: 65536 }], command: 'sleep 1' },
          { image: 'busybox' },
        ],
      },
    },
  }));
  assert.deepEqual(found, {
    'spec.replicas': 'must be 0 (suspended) or 1 (running), got 2',
    'spec.shutdownTime': 'must be an RFC 3339 time such as 2026-12-31T23:59:59Z, got "tomorrow"',
    'spec.podTemplate.spec.containers[0].image': 'must be a string, got number',
    'spec.podTemplate.spec.containers[0].command': 'must be an array, got string',
    'spec.podTemplate.spec.containers[0].ports[0].containerPort': 'must be at least 1, got 0',
    'spec.podTemplate.spec.containers[0].ports[1].containerPort': 'must be at most 65535, got 65536',
    'spec.podTemplate.spec.containers[1].name': 'is required',
  });
});

test('the error message names the kind and object, and the path prefix places it in a batch', () => {
  try {
    validateObject(sandbox({ podTemplate: { spec: { containers: [] } } }), 'objects[2]');
    assert.fail('expected a rejection');
  } catch (err) {
    assert.ok(err instanceof AsbError);
    assert.equal(err.code, 'Invalid');
    assert.equal(err.message, 'Sandbox "box" is invalid: objects[2].spec.podTemplate.spec.containers: must list at least one container');
  }
});

test('unknown fields are rejected at the levels we define, with a suggestion for typos', () => {
  const found = problems({
    ...sandbox({ ...podSpec(), lifecycle: { shutdownPolicy: 'Delete', ttl: 5 }, replica: 1 }, { name: 'box', labelz: {} }),
    extra: true,
  });
  assert.equal(found.extra, 'unknown field; known fields: apiVersion, kind, metadata, spec, status');
  assert.equal(found['metadata.labelz'], 'unknown field; did you mean "labels"?');
  assert.equal(found['spec.replica'], 'unknown field; did you mean "replicas"?');
  assert.match(found['spec.lifecycle.ttl'] ?? '', /^unknown field/);
  assert.equal(Object.keys(found).length, 4);

  const poolFound = problems(pool({ sandboxTemplateRef: { name: 't', namespace: 'x' }, updateStrategy: { type: 'Recreate', maxSurge: 1 } }));
  assert.deepEqual(Object.keys(poolFound).sort(), ['spec.sandboxTemplateRef.namespace', 'spec.updateStrategy.maxSurge']);
  // The pre-v0.1 template layout (spec.sandboxSpec.podTemplate) is refused, not silently emptied.
  const old = problems({ apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxTemplate', metadata: { name: 't' }, spec: { sandboxSpec: podSpec() } });
  assert.match(old['spec.sandboxSpec'] ?? '', /^unknown field/);
  assert.equal(old['spec.podTemplate'], 'is required');
});

test('PodSpec and Container keep Kubernetes fields we do not enumerate, but type-check the ones we use', () => {
  validateObject(sandbox(podSpec({ nodeSelector: { disk: 'ssd' }, tolerations: [] }, { imagePullPolicy: 'IfNotPresent', stdin: true })));
  const found = problems(sandbox(podSpec({ automountServiceAccountToken: 'no' }, { workingDir: 5, env: [{ value: 'x' }] })));
  assert.deepEqual(found, {
    'spec.podTemplate.spec.automountServiceAccountToken': 'must be a boolean, got string',
    'spec.podTemplate.spec.containers[0].workingDir': 'must be a string, got number',
    'spec.podTemplate.spec.containers[0].env[0].name': 'is required',
  });
});

test('a pod without containers, or containers without names, is refused', () => {
  assert.deepEqual(problems(sandbox({ podTemplate: { spec: {} } })), { 'spec.podTemplate.spec.containers': 'is required: at least one container' });
  assert.deepEqual(problems(sandbox({})), { 'spec.podTemplate': 'is required' });
});

test('duplicate container and volume names, and mounts of undeclared volumes, are refused', () => {
  const found = problems(sandbox({
    podTemplate: {
      spec: {
        containers: [
          { name: 'main', volumeMounts: [{ name: 'scratch', mountPath: '/tmp' }, { name: 'data', mountPath: '/data' }, { name: 'ghost', mountPath: '/g' }] },
          { name: 'main' },
        ],
        volumes: [{ name: 'scratch', emptyDir: {} }, { name: 'scratch', emptyDir: {} }, { name: 'data', emptyDir: {} }],
      },
    },
    volumeClaimTemplates: [{ metadata: { name: 'data' }, spec: { resources: { requests: { storage: '1Gi' } } } }],
  }));
  assert.deepEqual(found, {
    'spec.podTemplate.spec.volumes[1].name': 'duplicate name "scratch": spec.podTemplate.spec.volumes[0].name already uses it',
    'spec.podTemplate.spec.volumes[2].name': 'duplicate name "data": a volumeClaimTemplate already uses it',
    'spec.podTemplate.spec.containers[0].volumeMounts[2].name': 'must name a volume or volumeClaimTemplate of this pod, got "ghost" (declared: scratch, data)',
    'spec.podTemplate.spec.containers[1].name': 'duplicate name "main": spec.podTemplate.spec.containers[0].name already uses it',
  });
});

test('volumeClaimTemplates need a name and a valid storage request', () => {
  const vct = (metadata: unknown, requests: unknown): unknown => ({ metadata, spec: { resources: { requests } } });
  const found = problems(sandbox({
    ...podSpec(),
    volumeClaimTemplates: [vct({}, { storage: '1Gi' }), vct({ name: 'a' }, { storage: 'lots' }), vct({ name: 'b' }, {}), vct({ name: 'c' }, { storage: '0' })],
  }));
  assert.deepEqual(found, {
    'spec.volumeClaimTemplates[0].metadata.name': 'is required',
    'spec.volumeClaimTemplates[1].spec.resources.requests.storage': 'must be a quantity such as 1Gi, 500Mi or 0.5, got "lots"',
    'spec.volumeClaimTemplates[2].spec.resources.requests.storage': 'is required: the size of the volume, e.g. 1Gi',
    'spec.volumeClaimTemplates[3].spec.resources.requests.storage': 'must be greater than zero, got "0"',
  });
});

test('probes must have exactly one well-formed handler', () => {
  const found = problems(sandbox(podSpec({}, {
    readinessProbe: { httpGet: { port: 'Not A Port' }, exec: { command: ['true'] }, periodSeconds: 0 },
    livenessProbe: { tcpSocket: { port: 8080 }, successThreshold: 2 },
    startupProbe: { exec: { command: [] } },
  })));
  const c = 'spec.podTemplate.spec.containers[0]';
  assert.deepEqual(found, {
    [`${c}.readinessProbe`]: 'must set exactly one of exec, httpGet, tcpSocket, grpc, got exec and httpGet',
    [`${c}.readinessProbe.httpGet.port`]: 'must be an IANA service name: lower-case letters, digits and single \'-\', with at least one letter, got "Not A Port"',
    [`${c}.readinessProbe.periodSeconds`]: 'must be at least 1, got 0',
    [`${c}.livenessProbe.successThreshold`]: 'must be at most 1, got 2',
    [`${c}.startupProbe.exec.command`]: 'must list the command to run',
  });
  validateObject(sandbox(podSpec({}, { readinessProbe: { httpGet: { path: '/health', port: 'http' } }, ports: [{ name: 'http', containerPort: 8080 }] })));
});

test('names: DNS labels for sandboxes and claims, subdomains elsewhere, generateName allowed instead', () => {
  assert.match(problems(sandbox(podSpec(), { name: 'My_Box' }))['metadata.name'] ?? '', /^must be a DNS label/);
  assert.match(problems(sandbox(podSpec(), { name: 'a.b' }))['metadata.name'] ?? '', /^must be a DNS label/);
  assert.equal(problems(sandbox(podSpec(), { name: 'x'.repeat(64) }))['metadata.name'], 'must be at most 63 characters, got 64');
  assert.equal(problems(sandbox(podSpec(), {}))['metadata.name'], 'is required (or set metadata.generateName)');
  assert.match(problems(sandbox(podSpec(), { name: 'box', namespace: 'Team A' }))['metadata.namespace'] ?? '', /^must be a DNS label/);
  validateObject(sandbox(podSpec(), { generateName: 'pool-' }));
  validateObject({ apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxTemplate', metadata: { name: 'python.v3' }, spec: podSpec() });
});

test('labels and annotations must be string maps with valid keys and values', () => {
  const found = problems(sandbox(podSpec(), {
    name: 'box',
    labels: { 'ok/key': 'v', 'bad key': 'v', n: 1, long: 'v'.repeat(64) },
    annotations: { '/empty-prefix': 'x', free: 'any text: is fine here!' },
  }));
  assert.deepEqual(Object.keys(found).sort(), ['metadata.annotations["/empty-prefix"]', 'metadata.labels.long', 'metadata.labels.n', 'metadata.labels["bad key"]']);
  assert.equal(found['metadata.labels.n'], 'must be a string, got number');
  assert.equal(found['metadata.labels.long'], 'value must be at most 63 characters, got 64');
});

test('pod template labels may not use the controller\'s reserved prefixes', () => {
  const labels = { 'agents.x-k8s.io/warm-pool-sandbox': 'p', 'asb.dev/owner': 't', app: 'x' };
  const found = problems(sandbox({ podTemplate: { metadata: { labels }, spec: { containers: [{ name: 'main' }] } } }));
  const message = 'label keys under agents.x-k8s.io/, extensions.agents.x-k8s.io/, asb.dev/ are reserved for the controller';
  assert.deepEqual(found, {
    'spec.podTemplate.metadata.labels["agents.x-k8s.io/warm-pool-sandbox"]': message,
    'spec.podTemplate.metadata.labels["asb.dev/owner"]': message,
  });
});

test('sandbox lifecycle: inline (k8s-sigs) or nested (ours), not both; enums and times checked', () => {
  const inline = validateObject(sandbox({ ...podSpec(), shutdownTime: '2026-12-31T23:59:59Z', shutdownPolicy: 'Delete', operatingMode: 'Suspended' }));
  assert.deepEqual(sandboxLifecycle(inline.spec as SandboxSpec), { shutdownTime: '2026-12-31T23:59:59Z', shutdownPolicy: 'Delete' });
  const found = problems(sandbox({
    ...podSpec(), shutdownTime: '2026-02-30T00:00:00Z', operatingMode: 'Paused', lifecycle: { shutdownPolicy: 'DeleteForeground' },
  }));
  assert.deepEqual(found, {
    'spec.operatingMode': 'must be one of Running, Suspended, got "Paused"',
    'spec.shutdownTime': 'must be an RFC 3339 time such as 2026-12-31T23:59:59Z, got "2026-02-30T00:00:00Z"',
    'spec.lifecycle.shutdownPolicy': 'must be one of Delete, Retain, Suspend, got "DeleteForeground"',
    'spec.lifecycle': 'set either spec.lifecycle or spec.shutdownTime/spec.shutdownPolicy, not both',
  });
});

test('warm pool replicas: a non-negative integer, capped against pod storms (k8s-sigs #251)', () => {
  validateObject(pool({ replicas: 0, sandboxTemplateRef: { name: 't' } }));
  validateObject(pool({ replicas: MAX_WARM_POOL_REPLICAS, sandboxTemplateRef: { name: 't' } }));
  assert.deepEqual(problems(pool({ replicas: -1, sandboxTemplateRef: { name: 't' } })), { 'spec.replicas': 'must be at least 0, got -1' });
  assert.deepEqual(problems(pool({ replicas: 1.5, sandboxTemplateRef: { name: 't' } })), { 'spec.replicas': 'must be an integer, got 1.5' });
  const huge = problems(pool({ replicas: 1_000_000, sandboxTemplateRef: { name: 't' } }))['spec.replicas'] ?? '';
  assert.match(huge, /^must be at most 1000, got 1000000/);
  assert.match(huge, /agent-sandbox#251/);
  assert.deepEqual(problems(pool({ replicas: '3', sandboxTemplateRef: { name: 't' } })), { 'spec.replicas': 'must be an integer, got string' });
  assert.deepEqual(problems(pool({ replicas: 1 })), { 'spec.sandboxTemplateRef': 'is required' });
  assert.deepEqual(problems(pool({ sandboxTemplateRef: { name: '' }, updateStrategy: { type: 'Rolling' } })), {
    'spec.sandboxTemplateRef.name': 'is required',
    'spec.updateStrategy.type': 'must be one of Recreate, OnReplenish, got "Rolling"',
  });
});

test('claims need a pool or template ref; v1alpha1 and v1beta1 shapes both accepted', () => {
  validateObject(claim({ warmPoolRef: { name: 'pool' }, lifecycle: { shutdownPolicy: 'DeleteForeground', ttlSecondsAfterFinished: 60 } }));
  validateObject(claim({ sandboxTemplateRef: { name: 'tpl' }, warmpool: 'none' }, 'extensions.agents.x-k8s.io/v1alpha1'));
  assert.deepEqual(problems(claim({})), { 'spec.warmPoolRef': 'is required: set warmPoolRef.name (v1beta1) or sandboxTemplateRef.name (v1alpha1)' });
  assert.deepEqual(problems(claim({
    warmPoolRef: { name: 'pool' },
    warmpool: 'Fast_Pool',
    lifecycle: { shutdownTime: '31/12/2026' },
    env: [{ name: 'A' }],
    additionalPodMetadata: { labels: { 'agents.x-k8s.io/claim-uid': 'x' } },
  })), {
    'spec.warmpool': 'must be "none", "default" or a warm pool name; must be a DNS subdomain: lower-case letters, digits, \'-\' and \'.\', starting and ending with a letter or digit, got "Fast_Pool"',
    'spec.lifecycle.shutdownTime': 'must be an RFC 3339 time such as 2026-12-31T23:59:59Z, got "31/12/2026"',
    'spec.additionalPodMetadata.labels["agents.x-k8s.io/claim-uid"]': 'label keys under agents.x-k8s.io/, extensions.agents.x-k8s.io/, asb.dev/ are reserved for the controller',
    'spec.env[0].value': 'is required',
  });
});

test('api keys: cluster-scoped, a team usable as a label value, a sha256 hash', () => {
  const key = (spec: Record<string, unknown>, metadata: Record<string, unknown> = { name: 'ci-key' }): unknown => ({ apiVersion: 'asb.dev/v1alpha1', kind: 'ApiKey', metadata, spec });
  validateObject(key({ team: 'acme', hash: 'a'.repeat(64), prefix: 'asb_ab12cd34', admin: true }));
  assert.deepEqual(problems(key({ team: 'Acme Corp', hash: 'xyz', admin: 'yes' }, { name: 'k', namespace: 'default' })), {
    'metadata.namespace': 'must not be set: ApiKey is cluster-scoped',
    'spec.team': 'must be alphanumerics, \'-\', \'_\' or \'.\', starting and ending with an alphanumeric, got "Acme Corp"',
    'spec.hash': 'must be a hex SHA-256 digest: 64 lower-case hex characters',
    'spec.prefix': 'is required',
    'spec.admin': 'must be a boolean, got string',
  });
});

test('unknown kinds and versions say what is served', () => {
  assert.deepEqual(problems({ apiVersion: 'agents.x-k8s.io/v2', kind: 'Sandbox', metadata: { name: 'x' }, spec: {} }), {
    apiVersion: 'Sandbox is served as agents.x-k8s.io/v1alpha1 or agents.x-k8s.io/v1beta1, got "agents.x-k8s.io/v2"',
  });
  assert.match(problems({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'x' } }).kind ?? '', /^unknown kind "Pod"; known kinds: Sandbox/);
  assert.deepEqual(problems('just text', 'objects[0]'), { 'objects[0]': 'must be an object, got string' });
  assert.deepEqual(problems([]), { '(object)': 'must be an object, got array' });
});

test('defaults: namespace, shutdownPolicy Retain, pool replicas 1 and OnReplenish; the input is untouched', () => {
  const raw = validateObject(sandbox(podSpec()));
  const box = applyDefaults(raw);
  assert.equal(box.metadata.namespace, 'default');
  assert.equal(sandboxLifecycle(box.spec as SandboxSpec).shutdownPolicy, 'Retain');
  assert.equal(raw.metadata.namespace, undefined);

  const inline = applyDefaults(validateObject(sandbox({ ...podSpec(), shutdownTime: '2026-01-01T00:00:00Z' })));
  assert.equal((inline.spec as SandboxSpec).shutdownPolicy, 'Retain');
  assert.equal((inline.spec as SandboxSpec).lifecycle, undefined);

  const p = applyDefaults(validateObject(pool({ sandboxTemplateRef: { name: 't' } })));
  assert.deepEqual(p.spec, { sandboxTemplateRef: { name: 't' }, replicas: 1, updateStrategy: { type: 'OnReplenish' } });
  const kept = applyDefaults(validateObject(pool({ replicas: 0, sandboxTemplateRef: { name: 't' }, updateStrategy: { type: 'Recreate' } })));
  assert.deepEqual(kept.spec, { replicas: 0, sandboxTemplateRef: { name: 't' }, updateStrategy: { type: 'Recreate' } });

  const c = applyDefaults(validateObject(claim({ warmPoolRef: { name: 'p' }, lifecycle: { shutdownTime: '2026-01-01T00:00:00Z' } })));
  assert.equal((c.spec as SandboxClaimSpec).lifecycle?.shutdownPolicy, 'Retain');

  const key = applyDefaults(validateObject({ apiVersion: 'asb.dev/v1alpha1', kind: 'ApiKey', metadata: { name: 'k' }, spec: { team: 't', hash: '0'.repeat(64), prefix: 'asb_0' } }));
  assert.equal(key.metadata.namespace, undefined);
});

test('quantities follow the Kubernetes grammar', () => {
  assert.equal(parseQuantity('1Gi'), 2 ** 30);
  assert.equal(parseQuantity('500M'), 5e8);
  assert.equal(parseQuantity('250m'), 0.25);
  assert.equal(parseQuantity('1e3'), 1000);
  assert.equal(parseQuantity(2), 2);
  for (const bad of ['', '1 Gi', '1GB', 'Gi', '1.2.3', ' 1Gi']) assert.equal(parseQuantity(bad), undefined, bad);
});
