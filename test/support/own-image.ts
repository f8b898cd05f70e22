// The project's own image (the Dockerfile, built by scripts/build-own-image.sh into
// .tools/own-image): pushed to a registry at the reference clusters/ would name it by, and a
// kustomize overlay that points a clusters/ kustomization at it, as a user's overlay does
// (clusters/README.md: `images:`).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { readSeedImages, seedRegistry } from '../../src/images/seed.ts';

const repoRoot = resolve(import.meta.dirname, '../..');

export interface OwnImage {
  /** `<registry>/library/agent-sandbox`: what an overlay's images: newName is. */
  name: string;
  /** `<version>-<hash of the inputs>`, the build's own tag. */
  tag: string;
  /** name:tag */
  reference: string;
}

/** Where `make own-image` writes it: .tools/own-image, or ASB_OWN_IMAGE_DIR. */
export function ownImageDir(): string {
  return process.env.ASB_OWN_IMAGE_DIR ?? join(repoRoot, '.tools/own-image');
}

/**
 * Pushes the built image to the registry at `address` (127.0.0.1:<port>) as
 * library/agent-sandbox:<tag> (a blob the registry has is not sent again: ~1 s after the first).
 */
export async function pushOwnImage(address: string): Promise<OwnImage> {
  const built = readSeedImages(ownImageDir());
  const first = built.tags['agent-sandbox']?.[0];
  const tag = first?.slice(first.lastIndexOf(':') + 1);
  if (first === undefined || tag === undefined) throw new Error(`${ownImageDir()}/seed.json names no agent-sandbox image: run make own-image`);
  const tmpDir = mkdtempSync(join(tmpdir(), 'asb-own-image-push-'));
  try {
    await seedRegistry(address, built, { tmpDir, only: [first], timeoutMs: 300_000 });
  } finally {
    rmSync(tmpDir, { recursive: true, force: true });
  }
  const name = `${address}/library/agent-sandbox`;
  return { name, tag, reference: `${name}:${tag}` };
}

/** What an overlay adds besides the image and patches: objects of its own, and ConfigMaps generated from files in its directory. */
export interface OverlayExtras {
  /** Whole objects, written next to the kustomization and listed as its resources. */
  resources?: readonly object[];
  /** configMapGenerator entries: name, behavior (merge/replace), and env or plain files in the overlay's directory. */
  configMaps?: readonly { name: string; behavior: 'merge' | 'replace'; envs?: string[]; files?: string[] }[];
}

/**
 * Writes a kustomization under `dir` that takes clusters/<base> and renames the image
 * `agent-sandbox` to `image` (and applies `patches`, adds `extras`); returns its path relative to
 * the repository (what cluster-manifests.ts's kustomize() and kubectl apply -k take).
 */
export function writeImageOverlay(dir: string, base: string, image: Pick<OwnImage, 'name' | 'tag'>, patches: readonly object[] = [], extras: OverlayExtras = {}): string {
  mkdirSync(dir, { recursive: true });
  const own = (extras.resources ?? []).map((r, i) => {
    writeFileSync(join(dir, `own-${i}.yaml`), JSON.stringify(r)); // JSON is YAML
    return `  - own-${i}.yaml`;
  });
  const configMaps = extras.configMaps ?? [];
  writeFileSync(join(dir, 'kustomization.yaml'), [
    'apiVersion: kustomize.config.k8s.io/v1beta1',
    'kind: Kustomization',
    'resources:',
    `  - ${relative(dir, join(repoRoot, base))}`,
    ...own,
    'images:',
    '  - name: agent-sandbox',
    `    newName: ${image.name}`,
    `    newTag: ${image.tag}`,
    ...(configMaps.length === 0 ? [] : ['configMapGenerator:', ...configMaps.map((c) => `  - ${JSON.stringify(c)}`)]),
    // Strategic-merge patches, each a whole object's identity plus the fields it changes (JSON is YAML).
    ...(patches.length === 0 ? [] : ['patches:', ...patches.map((p) => `  - patch: ${JSON.stringify(JSON.stringify(p))}`)]),
    '',
  ].join('\n'));
  return relative(repoRoot, dir);
}
