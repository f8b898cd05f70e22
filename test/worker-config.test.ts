// The worker's store, runtime and role flags: the combinations that cannot work are refused at
// start-up, each with a message naming both flags, all problems at once; the defaults are
// today's single-process worker.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseWorkerConfig } from '../src/assembly/worker-config.ts';
import { ConfigError } from '../src/base/flags.ts';

function problems(argv: readonly string[], env: Record<string, string> = {}): readonly string[] {
  try {
    parseWorkerConfig(argv, env);
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
  return [];
}

test('by default the worker is one process on the SQLite store with the local runtime', () => {
  const config = parseWorkerConfig([], {});
  assert.equal(config.store, 'sqlite');
  assert.equal(config.runtime, 'local');
  assert.equal(config.role, 'all');
  assert.equal(config.namespace, 'default');
  assert.equal(config.podNamespace, 'default', 'sandbox Pods go where requests land unless told otherwise');
  assert.equal(config.kubeconfig, undefined);
});

test('image GC: every 10 min with a 1 h grace by default; flags and variables set them, 0 turns the periodic pass off', () => {
  const config = parseWorkerConfig([], {});
  assert.deepEqual([config.imageGcIntervalMs, config.imageGcGraceMs], [600_000, 3_600_000]);
  assert.equal(parseWorkerConfig(['--image-gc-interval-ms=0'], {}).imageGcIntervalMs, 0);
  assert.equal(parseWorkerConfig([], { ASB_IMAGE_GC_GRACE_MS: '120000' }).imageGcGraceMs, 120_000);
  assert.deepEqual(problems(['--image-gc-interval-ms=-1']), ['--image-gc-interval-ms (ASB_IMAGE_GC_INTERVAL_MS) must be an integer from 0 to 86400000, got "-1"']);
});

test('lifecycle events are kept 7 days by default; --event-retention-days (ASB_EVENT_RETENTION_DAYS) sets 1 to 365', () => {
  assert.equal(parseWorkerConfig([], {}).eventRetentionDays, 7);
  assert.equal(parseWorkerConfig(['--event-retention-days=30'], {}).eventRetentionDays, 30);
  assert.equal(parseWorkerConfig([], { ASB_EVENT_RETENTION_DAYS: '365' }).eventRetentionDays, 365);
  assert.deepEqual(problems(['--event-retention-days=0']), ['--event-retention-days (ASB_EVENT_RETENTION_DAYS) must be an integer from 1 to 365, got "0"']);
});

test('webhooks reach only public addresses by default; --webhook-allow-private (ASB_WEBHOOK_ALLOW_PRIVATE) is a switch that allows private ones', () => {
  assert.equal(parseWorkerConfig([], {}).webhookAllowPrivate, false);
  // Alone it takes no value: the next flag is still a flag.
  const on = parseWorkerConfig(['--webhook-allow-private', '--port', '0'], {});
  assert.deepEqual([on.webhookAllowPrivate, on.apiPort], [true, 0]);
  assert.equal(parseWorkerConfig(['--webhook-allow-private=false'], { ASB_WEBHOOK_ALLOW_PRIVATE: 'true' }).webhookAllowPrivate, false, 'the flag wins over the variable');
  assert.equal(parseWorkerConfig([], { ASB_WEBHOOK_ALLOW_PRIVATE: '1' }).webhookAllowPrivate, true);
  assert.deepEqual(problems([], { ASB_WEBHOOK_ALLOW_PRIVATE: 'yes please' }), ['--webhook-allow-private (ASB_WEBHOOK_ALLOW_PRIVATE) must be true or false (1 or 0), got "yes please"']);
});

test('--pod-namespace (ASB_POD_NAMESPACE) puts sandbox Pods in a namespace of their own', () => {
  assert.equal(parseWorkerConfig(['--store=kube', '--runtime=kube', '--namespace=sandboxes'], {}).podNamespace, 'sandboxes');
  assert.equal(parseWorkerConfig(['--store=kube', '--runtime=kube'], { ASB_POD_NAMESPACE: 'agent-sandboxes' }).podNamespace, 'agent-sandboxes');
  assert.deepEqual(problems(['--pod-namespace=Pods']), ['--pod-namespace (ASB_POD_NAMESPACE) must be a namespace name (lower-case letters, digits and \'-\', at most 63), got "Pods"']);
});

test('an API process passes its events API on to the operator at --events-url (ASB_EVENTS_URL); the flag is refused where it could not be read', () => {
  const kube = ['--store=kube', '--runtime=kube'];
  assert.equal(parseWorkerConfig(['--role=api', ...kube, '--events-url', 'http://operator:7080/'], {}).eventsUrl, 'http://operator:7080');
  assert.equal(parseWorkerConfig(['--role=api', ...kube], { ASB_EVENTS_URL: 'https://operator.asb.svc:7080' }).eventsUrl, 'https://operator.asb.svc:7080');
  assert.equal(parseWorkerConfig(['--role=api', ...kube], {}).eventsUrl, undefined);
  assert.deepEqual(problems(['--role=operator', ...kube, '--events-url=http://operator:7080']), [
    '--events-url (ASB_EVENTS_URL) is read only with --role (ASB_ROLE) api: a process with controllers keeps its own event log, and --role (ASB_ROLE) is operator',
  ]);
  assert.deepEqual(problems(['--role=api', ...kube, '--events-url=operator:7080/events']), [
    '--events-url (ASB_EVENTS_URL) must be an http(s) URL with no path, such as http://operator:7080, got "operator:7080/events"',
  ]);
});

test('the Kubernetes deployment\'s flags parse: operator and api roles on the kube store and runtime', () => {
  for (const role of ['operator', 'api', 'all'] as const) {
    const config = parseWorkerConfig([`--role=${role}`, '--store=kube', '--runtime=kube', '--namespace', 'sandboxes'], {});
    assert.equal(config.role, role);
    assert.equal(config.store, 'kube');
    assert.equal(config.runtime, 'kube');
    assert.equal(config.namespace, 'sandboxes');
    // No kubeconfig anywhere: the Pod's own service account (checked when the worker starts).
    assert.equal(config.kubeconfig, undefined);
  }
});

test('the kubeconfig comes from --kubeconfig, else ASB_KUBECONFIG, else KUBECONFIG (as kubectl reads it)', () => {
  assert.equal(parseWorkerConfig(['--store=kube'], { KUBECONFIG: '/etc/kube/config' }).kubeconfig, '/etc/kube/config');
  assert.equal(parseWorkerConfig(['--store=kube'], { KUBECONFIG: '/etc/kube/config', ASB_KUBECONFIG: '/a' }).kubeconfig, '/a');
  assert.equal(parseWorkerConfig(['--store=kube', '--kubeconfig', '/b'], { ASB_KUBECONFIG: '/a' }).kubeconfig, '/b');
  // A shell set up for kubectl does not stop the default worker.
  assert.equal(parseWorkerConfig([], { KUBECONFIG: '/etc/kube/config' }).store, 'sqlite');
});

test('combinations that cannot work are refused, naming both flags, all at once', () => {
  assert.deepEqual(problems(['--runtime=kube']), [
    '--runtime (ASB_RUNTIME) kube needs --store (ASB_STORE) kube: the runtime makes Pods through the API server the store talks to',
  ]);
  assert.deepEqual(problems(['--role=api']), [
    '--role (ASB_ROLE) api needs --store (ASB_STORE) kube: the SQLite store belongs to one process, so that process must be the whole worker (--role=all)',
  ]);
  assert.deepEqual(problems(['--role=operator', '--store=kube']), [
    '--role (ASB_ROLE) operator needs --runtime (ASB_RUNTIME) kube: the API\'s exec and terminals reach pods the operator started only when both are Pods',
  ]);
  assert.deepEqual(problems(['--kubeconfig=/x']), ['--kubeconfig (ASB_KUBECONFIG) is read only with --store=kube, and --store (ASB_STORE) is sqlite']);
  assert.deepEqual(problems(['--store=etcd', '--role=leader', '--runtime=docker', '--namespace=Bad_NS']), [
    '--store (ASB_STORE) must be one of sqlite, kube, got "etcd"',
    '--runtime (ASB_RUNTIME) must be one of local, kube, got "docker"',
    '--role (ASB_ROLE) must be one of all, operator, api, got "leader"',
    '--namespace (ASB_NAMESPACE) must be a namespace name (lower-case letters, digits and \'-\', at most 63), got "Bad_NS"',
  ]);
  assert.deepEqual(problems([], { ASB_ROLE: 'api', ASB_STORE: 'kube', ASB_RUNTIME: 'kube' }), []);
});

test('the egress floor: cloud metadata by default; --egress-floor / ASB_EGRESS_FLOOR replace it, none empties it, bad entries are named; the egress proxy port takes off', () => {
  const texts = (c: { egressFloor: { cidrs: readonly { text: string }[] } }): string[] => c.egressFloor.cidrs.map((x) => x.text);
  assert.deepEqual(texts(parseWorkerConfig([], {})), ['169.254.169.254', '169.254.170.2', '169.254.170.23', '100.100.100.200', 'fd00:ec2::254', 'fd00:ec2::23']);
  assert.deepEqual(texts(parseWorkerConfig(['--egress-floor=169.254.0.0/16,10.0.0.9'], {})), ['169.254.0.0/16', '10.0.0.9']);
  assert.deepEqual(texts(parseWorkerConfig([], { ASB_EGRESS_FLOOR: 'none' })), []);
  assert.deepEqual(problems(['--egress-floor=169.254.169.254,metadata.internal']), ['--egress-floor (ASB_EGRESS_FLOOR) must be comma-separated CIDRs or IPs (or none), got "metadata.internal"']);
  assert.equal(parseWorkerConfig(['--egress-proxy-port=off'], { ASB_EGRESS_PROXY_PORT: '15001' }).egressProxyPort, undefined);
  assert.equal(parseWorkerConfig([], { ASB_EGRESS_PROXY_PORT: '15001' }).egressProxyPort, 15001);
});

test('--build-egress / ASB_BUILD_EGRESS: internet by default, none, or an allow-list of CIDRs and (with the egress proxy) domains; bad entries are named', () => {
  assert.deepEqual(parseWorkerConfig([], {}).buildEgress, { internet: true, allow: [], deny: [] });
  assert.deepEqual(parseWorkerConfig(['--build-egress=internet'], {}).buildEgress, { internet: true, allow: [], deny: [] });
  assert.deepEqual(parseWorkerConfig([], { ASB_BUILD_EGRESS: 'none' }).buildEgress, { internet: false, allow: [], deny: [] });
  assert.deepEqual(parseWorkerConfig(['--build-egress', '203.0.113.0/24, 198.51.100.7'], {}).buildEgress, { internet: false, allow: ['203.0.113.0/24', '198.51.100.7'], deny: [] });
  assert.deepEqual(parseWorkerConfig(['--build-egress=pypi.org,*.debian.org'], { ASB_EGRESS_PROXY_PORT: '15001' }).buildEgress, { internet: false, allow: ['pypi.org', '*.debian.org'], deny: [] });
  assert.deepEqual(problems(['--build-egress=pypi.org,10.0.0.0/8']), ['--build-egress (ASB_BUILD_EGRESS) names domains (pypi.org), which only the egress proxy can decide, and the proxy is off (--egress-proxy-port): use CIDRs, or turn the proxy on']);
  const bad = problems(['--build-egress=10.0.0.0/33']);
  assert.equal(bad.length, 1);
  assert.match(bad[0] ?? '', /^--build-egress \(ASB_BUILD_EGRESS\) must be internet, none or comma-separated CIDRs, IPs and domains: "10\.0\.0\.0\/33" is not a CIDR/);
});
