// The image a build makes, as bytes: the base image's config with the build's Env, WorkingDir and
// User, its diff IDs and history extended by the new layers, and an OCI manifest naming the base's
// layers then the new ones. Pure and deterministic (no timestamps of its own): the same base and
// layers give the same digest, so a rebuild served from the cache gives the image it gave before.
import { createHash } from 'node:crypto';
import { OCI_MANIFEST } from './registry-push.ts';
import type { BuildConfig } from './steps.ts';
import type { LayerBlob } from './layer-writer.ts';

export const OCI_CONFIG = 'application/vnd.oci.image.config.v1+json';
export const OCI_LAYER_GZIP = 'application/vnd.oci.image.layer.v1.tar+gzip';
/** Docker's media types and OCI's name the same bytes. */
const AS_OCI: Record<string, string> = {
  'application/vnd.docker.image.rootfs.diff.tar.gzip': OCI_LAYER_GZIP,
  'application/vnd.docker.image.rootfs.diff.tar': 'application/vnd.oci.image.layer.v1.tar',
};

export interface Descriptor { mediaType: string; digest: string; size: number }

export interface BaseImage {
  manifest: { layers: Descriptor[] };
  /** The base's image config JSON, as pulled. */
  config: Record<string, unknown>;
}

/** One built step as the image records it: its layer (if it made one) and what made it. */
export interface BuiltStep { layer?: LayerBlob; createdBy: string }

export interface AssembledImage {
  config: Buffer;
  configDigest: string;
  manifest: Buffer;
  manifestDigest: string;
  /** The new layers, bottom first. */
  layers: LayerBlob[];
}

export function assembleImage(base: BaseImage, steps: readonly BuiltStep[], final: BuildConfig): AssembledImage {
  const layers = steps.flatMap((s) => (s.layer === undefined ? [] : [s.layer]));
  const baseConfig = (base.config.config ?? {}) as Record<string, unknown>;
  const config: Record<string, unknown> = { ...baseConfig, Env: final.env };
  if (final.workingDir === undefined) delete config.WorkingDir;
  else config.WorkingDir = final.workingDir;
  if (final.user === undefined) delete config.User;
  else config.User = final.user;
  const rootfs = (base.config.rootfs ?? {}) as { diff_ids?: string[] };
  const out: Record<string, unknown> = { ...base.config, config, rootfs: { type: 'layers', diff_ids: [...(rootfs.diff_ids ?? []), ...layers.map((l) => l.diffId)] } };
  if (Array.isArray(base.config.history)) {
    out.history = [...(base.config.history as unknown[]), ...steps.map((s) => (s.layer === undefined ? { created_by: s.createdBy, empty_layer: true } : { created_by: s.createdBy }))];
  }
  const configBytes = Buffer.from(JSON.stringify(out));
  const configDigest = sha256(configBytes);
  const manifest = {
    schemaVersion: 2,
    mediaType: OCI_MANIFEST,
    config: { mediaType: OCI_CONFIG, digest: configDigest, size: configBytes.length },
    layers: [
      ...base.manifest.layers.map((l) => ({ mediaType: AS_OCI[l.mediaType] ?? l.mediaType, digest: l.digest, size: l.size })),
      ...layers.map((l) => ({ mediaType: OCI_LAYER_GZIP, digest: l.digest, size: l.size })),
    ],
  };
  const manifestBytes = Buffer.from(JSON.stringify(manifest));
  return { config: configBytes, configDigest, manifest: manifestBytes, manifestDigest: sha256(manifestBytes), layers };
}

function sha256(b: Buffer): string {
  return `sha256:${createHash('sha256').update(b).digest('hex')}`;
}
