// The Kubernetes manifests under clusters/ hold together the way a user deploying them would
// notice: every kustomization builds (kubectl's built-in kustomize), every pod's command line,
// environment and mounted files pass our real configuration parsers, Envoy accepts the generated
// configuration, Services reach their pods, every ServiceAccount exists, one image runs
// everything, pods meet the restricted Pod Security Standard the namespace enforces, and the
// Secrets clusters/secrets.sh makes are the ones the pods read. No cluster is needed here;
// test/k8s/manifests.test.ts applies the same builds to a real kube-apiserver.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, before, test } from 'node:test';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import { hashApiKey, parseApiKey } from '../src/auth/keys.ts';
import { findEnvoyBinary } from '../src/edge/envoy-binary.ts';
import { ensureFederationTls } from '../src/edge/tls.ts';
import { parseHubConfig } from '../src/hub/hub-config.ts';
import { parseRouterConfig } from '../src/router/router-config.ts';
import { parseWorkerConfig } from '../src/assembly/worker-config.ts';
import { ConfigError } from '../src/base/flags.ts';
import { validateObject } from '../src/api/validate.ts';
import { ENVOY_TARGETS, INGRESS_POD, readEnvFiles, renderEnvoyFiles } from '../scripts/gen-envoy-configs.ts';
import { CrdSchemas } from './support/crd-ajv.ts';
import {
  dataOf, kustomize, ofKind, viewContainer, type ContainerSpec, type Deployment, type Manifest, type PodSpec,
} from './support/cluster-manifests.ts';

const repoRoot = resolve(import.meta.dirname, '..');
const WORKER_CLUSTERS = ['clusters/base', 'clusters/overlays/region-a', 'clusters/overlays/region-b'];
const BUILDS = [...WORKER_CLUSTERS, 'clusters/hub', 'clusters/overlays/hub'];
/** The one image; `images:` in a kustomization (or `kustomize edit set image`) points it at a registry. */
const IMAGE = 'agent-sandbox';

type Parse = (argv: readonly string[], env: Readonly<Record<string, string | undefined>>) => unknown;
const ENTRYPOINTS: Readonly<Record<string, Parse>> = {
  'src/assembly/worker-main.ts': parseWorkerConfig,
  'src/router/router-main.ts': parseRouterConfig,
  'src/hub/hub-main.ts': parseHubConfig,
};

const builds = new Map<string, Manifest[]>();
let root: string;
let secrets: Record<string, Record<string, string>>;
let scriptOutput: Manifest[];

function run(file: string, args: readonly string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolvePromise) => {
    execFile(file, args, { timeout: 60_000, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      resolvePromise({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, stdout, stderr });
    });
  });
}

before(async () => {
  for (const dir of BUILDS) builds.set(dir, await kustomize(dir));
  root = mkdtempSync(join(tmpdir(), 'asb-manifests-'));
  const script = await run('bash', [join(repoRoot, 'clusters/secrets.sh')]);
  assert.equal(script.code, 0, script.stderr);
  scriptOutput = parseAllDocuments(script.stdout).map((d) => d.toJS() as Manifest);
  // What a user creates by hand (clusters/README.md): the hub credential and the federation TLS.
  const tls = await ensureFederationTls(join(root, 'pki'));
  secrets = {
    ...Object.fromEntries(ofKind(scriptOutput, 'Secret').map((s) => [s.metadata.name, dataOf(s)])),
    'asb-hub-credential': { credential: `asbc_${'a'.repeat(32)}` },
    'asb-federation-tls': { 'ca.crt': readFileSync(tls.caCertPath, 'utf8'), 'tls.crt': readFileSync(tls.certChainPath, 'utf8'), 'tls.key': readFileSync(tls.privateKeyPath, 'utf8') },
  };
});

after(() => {
  rmSync(root, { recursive: true, force: true });
});

function build(dir: string): Manifest[] {
  const manifests = builds.get(dir);
  assert.ok(manifests !== undefined, dir);
  return manifests;
}

function kustomizations(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(join(repoRoot, dir), { withFileTypes: true })) {
    if (entry.isDirectory()) out.push(...kustomizations(`${dir}/${entry.name}`));
    else if (entry.name === 'kustomization.yaml') out.push(`${dir}/${entry.name}`);
  }
  return out;
}

test('every file or directory a kustomization.yaml names exists', () => {
  const files = kustomizations('clusters');
  assert.ok(files.length >= 10, files.join(', '));
  const missing: string[] = [];
  for (const file of files) {
    const k = parseYaml(readFileSync(join(repoRoot, file), 'utf8')) as Record<string, unknown>;
    const named: string[] = [...((k.resources ?? []) as string[]), ...((k.components ?? []) as string[])];
    for (const gen of [...((k.configMapGenerator ?? []) as Record<string, string[]>[]), ...((k.secretGenerator ?? []) as Record<string, string[]>[])]) {
      named.push(...(gen.envs ?? []), ...(gen.files ?? []).map((f) => f.slice(f.indexOf('=') + 1)));
    }
    for (const patch of (k.patches ?? []) as { path?: string }[]) if (patch.path !== undefined) named.push(patch.path);
    for (const name of named) {
      const path = join(repoRoot, dirname(file), name);
      const ok = existsSync(path) && (!statSync(path).isDirectory() || existsSync(join(path, 'kustomization.yaml')));
      if (!ok) missing.push(`${file}: ${name}`);
    }
  }
  assert.deepEqual(missing, []);
});

test('each kustomization builds, every object has apiVersion, kind and a name, and worker clusters carry every CRD', () => {
  for (const dir of BUILDS) {
    for (const m of build(dir)) assert.ok(typeof m.apiVersion === 'string' && typeof m.kind === 'string' && typeof m.metadata.name === 'string' && m.metadata.name !== '', `${dir}: ${JSON.stringify(m).slice(0, 120)}`);
  }
  for (const dir of WORKER_CLUSTERS) {
    const crds = ofKind(build(dir), 'CustomResourceDefinition').map((c) => c.metadata.name);
    assert.ok(crds.includes('sandboxes.agents.x-k8s.io') && crds.includes('sandboxwarmpools.extensions.agents.x-k8s.io') && crds.length === 8, `${dir}: ${crds.join(', ')}`);
  }
  // The hub's cluster has no sandboxes: no CRDs, no roles.
  assert.deepEqual(build('clusters/overlays/hub').filter((m) => /CustomResourceDefinition|Role/.test(m.kind)), []);
});

test('every namespaced object names its namespace, so `kubectl apply -k` puts nothing in whatever namespace the user\'s context has', () => {
  const clusterScoped = new Set(['Namespace', 'CustomResourceDefinition', 'ClusterRole', 'ClusterRoleBinding', 'PersistentVolume', 'StorageClass', 'RuntimeClass']);
  const unplaced: string[] = [];
  for (const dir of BUILDS) {
    for (const m of build(dir)) {
      if (!clusterScoped.has(m.kind) && (m.metadata.namespace ?? '') === '') unplaced.push(`${dir}: ${m.kind}/${m.metadata.name}`);
    }
  }
  // Found by deploying region-a onto a real node: its federation-ingress Service landed in "default".
  assert.deepEqual(unplaced, []);
});

test('Envoy\'s configurations are generated from envoy/edge.yaml and each cluster.env, and each cluster runs its own', () => {
  const files = renderEnvoyFiles();
  for (const [path, text] of files) {
    assert.ok(readFileSync(join(repoRoot, path), 'utf8') === text, `${path} differs from envoy/edge.yaml and its cluster.env: run node scripts/gen-envoy-configs.ts`);
  }
  for (const [i, dir] of WORKER_CLUSTERS.entries()) {
    const target = ENVOY_TARGETS[i]!;
    const envoyMap = ofKind(build(dir), 'ConfigMap').find((cm) => cm.metadata.name.startsWith('asb-envoy-'));
    assert.equal(envoyMap === undefined ? undefined : dataOf(envoyMap)['envoy.yaml'], files.get(target.out), dir);
    const cluster = dataOf(ofKind(build(dir), 'ConfigMap').find((cm) => cm.metadata.name.startsWith('asb-cluster-'))!);
    for (const [k, v] of readEnvFiles(target.envFiles)) assert.equal(cluster[k], v, `${dir}: ${k} in the ConfigMap is not what ${target.envFiles.join(' + ')} says`);
    // The router names this upstream for the cluster's own API (src/edge/envoy-config.ts apiClusterName).
    const envoy = parseYaml(files.get(target.out)!) as { static_resources: { clusters: { name: string }[]; listeners: { name: string }[] } };
    assert.ok(envoy.static_resources.clusters.some((c) => c.name === `api-${cluster.ASB_CLUSTER_NAME ?? ''}`), dir);
    const federated = cluster.ASB_HUB_URL !== undefined;
    assert.equal(envoy.static_resources.listeners.some((l) => l.name === 'ingress'), federated, `${dir}: ingress listener iff the cluster has a hub`);
    assert.equal(envoy.static_resources.clusters.some((c) => c.name === 'hub'), federated, dir);
  }
});

test('one image runs everything, every ServiceAccount exists, and every pod meets the restricted Pod Security Standard', () => {
  for (const dir of BUILDS) {
    const accounts = new Set(ofKind(build(dir), 'ServiceAccount').map((sa) => sa.metadata.name));
    for (const d of ofKind<Deployment>(build(dir), 'Deployment')) {
      const pod = d.spec.template.spec;
      const at = `${dir}: deployment/${d.metadata.name}`;
      assert.ok(pod.serviceAccountName !== undefined && accounts.has(pod.serviceAccountName), `${at}: serviceAccountName ${String(pod.serviceAccountName)} has no ServiceAccount`);
      assert.equal(pod.securityContext?.runAsNonRoot, true, at);
      assert.deepEqual(pod.securityContext.seccompProfile, { type: 'RuntimeDefault' }, at);
      for (const c of pod.containers) {
        assert.equal(c.image, IMAGE, `${at}: container ${c.name}`);
        assert.equal(c.securityContext?.allowPrivilegeEscalation, false, `${at}: container ${c.name}`);
        assert.deepEqual(c.securityContext.capabilities, { drop: ['ALL'] }, `${at}: container ${c.name}`);
      }
      // Its selector picks its own pods.
      for (const [k, v] of Object.entries(d.spec.selector.matchLabels)) assert.equal(d.spec.template.metadata.labels[k], v, at);
    }
  }
});

test('sandbox Pods run in a namespace of their own that enforces the restricted Pod Security Standard', () => {
  for (const dir of WORKER_CLUSTERS) {
    const cluster = Object.assign({}, ...ofKind(build(dir), 'ConfigMap').filter((cm) => cm.metadata.name.startsWith('asb-cluster')).map(dataOf)) as Record<string, string>;
    const podNamespace = cluster.ASB_POD_NAMESPACE;
    assert.ok(podNamespace !== undefined && podNamespace !== 'agent-sandbox-system', `${dir}: sandboxes stay out of our own namespace (and its Secrets)`);
    const ns = ofKind(build(dir), 'Namespace').find((n) => n.metadata.name === podNamespace);
    assert.ok(ns !== undefined, `${dir}: the build makes namespace ${podNamespace}`);
    assert.equal(ns.metadata.labels?.['pod-security.kubernetes.io/enforce'], 'restricted', dir);
  }
});

test('every Service selects the pods of a Deployment that has its target port', () => {
  for (const dir of BUILDS) {
    const deployments = ofKind<Deployment>(build(dir), 'Deployment');
    for (const svc of ofKind<Manifest & { spec: { selector: Record<string, string>; ports: { targetPort: string | number }[] } }>(build(dir), 'Service')) {
      const pods = deployments.filter((d) => Object.entries(svc.spec.selector).every(([k, v]) => d.spec.template.metadata.labels[k] === v));
      assert.equal(pods.length, 1, `${dir}: service/${svc.metadata.name} selects ${pods.length} deployments`);
      const ports = pods[0]!.spec.template.spec.containers.flatMap((c) => c.ports ?? []);
      for (const { targetPort } of svc.spec.ports) {
        assert.ok(ports.some((p) => p.name === targetPort || p.containerPort === targetPort), `${dir}: service/${svc.metadata.name} targets port ${String(targetPort)}, which its pods do not have`);
      }
    }
  }
});

/**
 * `envoy --mode validate`, its output in a file: the configuration opens /dev/stdout for the
 * access log, which a socket (Node's child stdio) cannot be opened as.
 */
async function validateEnvoy(envoy: string, config: string, log: string): Promise<{ code: number | null; output: string }> {
  const fd = openSync(log, 'w');
  try {
    const child = spawn(envoy, ['--mode', 'validate', '-c', config, '--log-level', 'error'], { stdio: ['ignore', fd, fd], timeout: 60_000 });
    const [code] = (await once(child, 'exit')) as [number | null];
    return { code, output: readFileSync(log, 'utf8') };
  } finally {
    closeSync(fd);
  }
}

interface Run { dir: string; deployment: string; container: ContainerSpec; pod: PodSpec }

function containers(dir: string): Run[] {
  return ofKind<Deployment>(build(dir), 'Deployment').flatMap((d) => d.spec.template.spec.containers.map((container) => ({ dir, deployment: d.metadata.name, container, pod: d.spec.template.spec })));
}

test('every container runs an entrypoint of ours whose parser accepts its flags, environment and files', () => {
  for (const dir of BUILDS) {
    // ConfigMap key → whether some container's parser read it.
    const read = new Map<string, boolean>();
    for (const { deployment, container, pod } of containers(dir)) {
      const at = `${dir}: deployment/${deployment} container ${container.name}`;
      const view = viewContainer(build(dir), pod, container, secrets, join(root, dir.replaceAll('/', '-'), deployment));
      assert.deepEqual(view.problems, [], at);
      if (view.argv[0] === 'envoy') continue;
      const [node, entry, ...argv] = view.argv;
      assert.equal(node, 'node', at);
      const parse = ENTRYPOINTS[entry ?? ''];
      assert.ok(parse !== undefined, `${at}: ${String(entry)} is not an entrypoint of ours`);
      for (const from of container.envFrom ?? []) {
        const cm = ofKind(build(dir), 'ConfigMap').find((m) => m.metadata.name === from.configMapRef?.name);
        for (const key of Object.keys(cm === undefined ? {} : dataOf(cm))) if (!read.has(key)) read.set(key, false);
      }
      // A variable the process reads is checked like a flag: a path it names must be mounted.
      const env = new Proxy(view.env, {
        get(target, key) {
          if (typeof key !== 'string') return undefined;
          if (read.has(key)) read.set(key, true);
          const value = target[key];
          return value === undefined ? undefined : view.path(value);
        },
      });
      let problems: readonly string[] = [];
      let config: Record<string, unknown> = {};
      try {
        config = parse(argv, env) as Record<string, unknown>;
      } catch (err) {
        if (!(err instanceof ConfigError)) throw err;
        problems = err.problems;
      }
      assert.deepEqual(problems, [], at);
      assert.deepEqual(view.problems, [], `${at}, after parsing`);
      // Files the configuration names are there in the pod (read-only Secrets), or can be made (the hub's admin key).
      for (const key of ['hubCredentialFile'] as const) {
        const file = config[key];
        if (typeof file === 'string') assert.ok(existsSync(file), `${at}: ${key} ${file} is not in any mounted Secret`);
      }
      if (typeof config.adminKeyFile === 'string') assert.ok(existsSync(dirname(config.adminKeyFile)), `${at}: the admin key's directory is not mounted`);
    }
    const unread = [...read].filter(([, seen]) => !seen).map(([key]) => key);
    assert.deepEqual(unread, [], `${dir}: ConfigMap keys no container reads`);
  }
  // Worth seeing in the output: what the deployment waits for.
});

test('Envoy accepts each worker cluster\'s configuration as its pod sees it (envoy --mode validate)', async () => {
  const envoy = findEnvoyBinary();
  for (const dir of WORKER_CLUSTERS) {
    for (const { deployment, container, pod } of containers(dir).filter((r) => r.container.name === 'envoy')) {
      const view = viewContainer(build(dir), pod, container, secrets, join(root, `${dir.replaceAll('/', '-')}-validate`, deployment));
      const config = view.argv[view.argv.indexOf('-c') + 1] ?? '';
      const text = readFileSync(config, 'utf8');
      // Files the configuration names (the federation certificates) as the pod has them.
      const federation = INGRESS_POD.federationTlsDir;
      if (text.includes(federation)) writeFileSync(config, text.replaceAll(federation, view.path(federation)));
      assert.deepEqual(view.problems, [], dir);
      const result = await validateEnvoy(envoy, config, join(root, `${dir.replaceAll('/', '-')}-envoy.log`));
      assert.equal(result.code, 0, `${dir}: envoy --mode validate: ${result.output}`);
      // Its listeners are the container's ports.
      const listeners = (parseYaml(text) as { static_resources: { listeners: { name: string; address: { socket_address: { port_value: number } } }[] } }).static_resources.listeners;
      const ports = new Map((container.ports ?? []).map((p) => [p.containerPort, p.name]));
      for (const l of listeners) assert.ok(ports.has(l.address.socket_address.port_value), `${dir}: listener ${l.name} on a port the container does not expose`);
    }
  }
});

test('RBAC: the router and the hub get no Kubernetes access; only the worker API enters pods; bindings name real accounts and roles', () => {
  for (const dir of WORKER_CLUSTERS) {
    const m = build(dir);
    const accounts = new Set(ofKind(m, 'ServiceAccount').map((sa) => `${sa.metadata.namespace ?? ''}/${sa.metadata.name}`));
    const roles = new Map([...ofKind(m, 'Role'), ...ofKind(m, 'ClusterRole')].map((r) => [`${r.kind}/${r.metadata.name}`, r as Manifest & { rules: { resources: string[]; verbs: string[] }[] }]));
    const grants = new Map<string, { resources: string[]; verbs: string[] }[]>();
    for (const b of [...ofKind(m, 'RoleBinding'), ...ofKind(m, 'ClusterRoleBinding')] as (Manifest & { roleRef: { kind: string; name: string }; subjects: { kind: string; name: string; namespace: string }[] })[]) {
      const role = roles.get(`${b.roleRef.kind}/${b.roleRef.name}`);
      assert.ok(role !== undefined, `${dir}: ${b.kind}/${b.metadata.name} binds missing ${b.roleRef.kind}/${b.roleRef.name}`);
      for (const s of b.subjects) {
        assert.ok(accounts.has(`${s.namespace}/${s.name}`), `${dir}: ${b.kind}/${b.metadata.name} binds missing ServiceAccount ${s.namespace}/${s.name}`);
        grants.set(s.name, [...(grants.get(s.name) ?? []), ...role.rules]);
      }
    }
    assert.deepEqual([...grants.keys()].sort(), ['operator', 'worker-api'], `${dir}: accounts with any role`);
    const can = (account: string, resource: string, verb: string): boolean => (grants.get(account) ?? []).some((r) => r.resources.includes(resource) && r.verbs.includes(verb));
    assert.ok(can('worker-api', 'pods/exec', 'create') && !can('operator', 'pods/exec', 'create'));
    assert.ok(can('operator', 'pods', 'create') && !can('worker-api', 'pods', 'create'));
    assert.ok(can('operator', 'sandboxes/status', 'update') && can('operator', 'leases', 'update'));
    // No wildcards anywhere, and no access to Secrets.
    for (const rules of grants.values()) for (const r of rules) assert.ok(!r.resources.includes('*') && !r.verbs.includes('*') && !r.resources.includes('secrets'), JSON.stringify(r));
  }
});

test('clusters/secrets.sh makes the Secrets the pods read and an admin ApiKey that matches its key', async () => {
  const secret = (name: string): Record<string, string> => dataOf(ofKind(scriptOutput, 'Secret').find((s) => s.metadata.name === name)!);
  const key = secret('asb-admin-key').key ?? '';
  assert.ok(parseApiKey(key) !== undefined, key);
  const apiKey = ofKind(scriptOutput, 'ApiKey')[0]!;
  validateObject(apiKey);
  assert.deepEqual(new CrdSchemas().problems(apiKey), []);
  const spec = apiKey.spec as { hash: string; prefix: string; admin: boolean };
  assert.equal(spec.hash, hashApiKey(key));
  assert.equal(`${spec.prefix}_`, key.slice(0, 13));
  assert.equal(spec.admin, true);
  const clusterSecret = ofKind(scriptOutput, 'Secret').find((s) => s.metadata.name === 'asb-cluster-secret')!;
  assert.equal(Buffer.from((clusterSecret.data as Record<string, string>)['cluster.secret'] ?? '', 'base64').length, 32);
  // A second run makes a different key.
  const again = await run('bash', [join(repoRoot, 'clusters/secrets.sh')]);
  assert.ok(!again.stdout.includes(key));
});
