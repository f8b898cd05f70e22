// What a user does with clusters/ on a cluster, for test/k8s/own-deployment.test.ts: an overlay of
// their own over one of ours (our image by its registry name, their cluster.env, the Envoy
// configuration generated from it, a few patches), `kubectl apply -k`, and waits that print what
// the cluster says when a Deployment never becomes Available.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { clusterEnvoyYaml, readEnvFiles } from '../../scripts/gen-envoy-configs.ts';
import type { KubeApiServer } from './kube-apiserver.ts';
import { writeImageOverlay, type OwnImage } from './own-image.ts';

const repoRoot = resolve(import.meta.dirname, '../..');
/** clusters/base's namespace, and the hub's. */
export const SYSTEM_NS = 'agent-sandbox-system';
/** Pull (~140 MB through containerd from loopback) and unpack, then start: ~10 s idle, minutes on a loaded 2-core machine. */
const AVAILABLE_TIMEOUT_S = 300;
/** Each kubectl wait within the fixture's 60 s kubectl timeout. */
const WAIT_STEP_S = 50;

export interface RegionOverlay {
  /** clusters/overlays/<name>, which the overlay builds on. */
  base: string;
  image: Pick<OwnImage, 'name' | 'tag'>;
  /** ASB_* merged over the base's cluster.env files, as a user's overlay does. */
  env: Record<string, string>;
  /** The cluster.env files the base merges, in order (for the Envoy configuration generated from them plus env). */
  baseEnvFiles: string[];
  /** Strategic-merge patches (each a whole object's identity plus the fields it changes). */
  patches: readonly object[];
  /** Objects of the user's own, added to the base's. */
  resources?: readonly object[];
}

/**
 * Writes, under dir, the overlay a user writes for a worker cluster of their own: the image, their
 * cluster.env, and envoy.yaml generated from it (what `node scripts/gen-envoy-configs.ts` does for
 * our overlays). Returns the directory, for `kubectl apply -k`.
 */
export function writeRegionOverlay(dir: string, o: RegionOverlay): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'cluster.env'), Object.entries(o.env).map(([k, v]) => `${k}=${v}\n`).join(''));
  const merged = readEnvFiles(o.baseEnvFiles);
  for (const [k, v] of Object.entries(o.env)) merged.set(k, v);
  writeFileSync(join(dir, 'envoy.yaml'), clusterEnvoyYaml(merged));
  return join(repoRoot, writeImageOverlay(dir, o.base, o.image, o.patches, {
    ...(o.resources === undefined ? {} : { resources: o.resources }),
    configMaps: [{ name: 'asb-cluster', behavior: 'merge', envs: ['cluster.env'] }, { name: 'asb-envoy', behavior: 'replace', files: ['envoy.yaml'] }],
  }));
}

/** A patch setting a Deployment's replicas. */
export function replicasPatch(name: string, replicas: number): object {
  return { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name }, spec: { replicas } };
}

/** Waits for each Deployment to be Available; on a timeout, fails with the pods, their events and the containers' last logs. */
export async function waitAvailable(kube: KubeApiServer, deployments: readonly string[]): Promise<void> {
  for (const name of deployments) {
    for (let waited = 0; ; waited += WAIT_STEP_S) {
      try {
        await kube.kubectl(['-n', SYSTEM_NS, 'wait', '--for=condition=Available', `deploy/${name}`, `--timeout=${String(WAIT_STEP_S)}s`]);
        break;
      } catch (err) {
        if (waited + WAIT_STEP_S < AVAILABLE_TIMEOUT_S) continue;
        throw new Error(`deploy/${name} never became Available: ${(err as Error).message}\n${await clusterReport(kube)}`);
      }
    }
  }
}

/** Pods, claims, events and every container's log tail in the system namespace: what a failure message needs. */
export async function clusterReport(kube: KubeApiServer): Promise<string> {
  const safe = (args: string[]): Promise<string> => kube.kubectl(args).catch((e: unknown) => String(e));
  const parts = [
    await safe(['-n', SYSTEM_NS, 'get', 'pods,pvc,svc', '-o', 'wide']),
    await safe(['-n', SYSTEM_NS, 'get', 'events', '--sort-by=.lastTimestamp']),
  ];
  const pods = JSON.parse(await kube.kubectl(['-n', SYSTEM_NS, 'get', 'pods', '-o', 'json']).catch(() => '{"items":[]}')) as {
    items: { metadata: { name: string }; spec: { containers: { name: string }[] } }[];
  };
  for (const pod of pods.items) {
    for (const c of pod.spec.containers) {
      parts.push(`--- ${pod.metadata.name}/${c.name}\n${await safe(['-n', SYSTEM_NS, 'logs', pod.metadata.name, '-c', c.name, '--tail=25'])}`);
    }
  }
  return parts.join('\n');
}
