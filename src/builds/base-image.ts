// The image a build starts from: its manifest and config (the new image extends them) and how each
// of its layers reaches the registry the build pushes to. Two ways to it:
// - cachedBase: the local runtime's image cache (the pods of this worker pull into it anyway); its
//   layers are uploaded from their files, or mounted when the registry has them already.
// - registryBase: the registry's HTTP API only, for a worker whose pods' images are a node's
//   (Kubernetes): the manifest and config are read from the first source that has them (the
//   worker's --registries mirrors, as the local runtime's pulls use), and each layer is mounted
//   from that repository when it is the push registry, else copied through this process. A
//   registry is read with the credentials the worker has for it (--registries `auths`, the
//   `auths` of a pull secret's .dockerconfigjson as is), as basic auth; a registry that wants a
//   token exchange (an identity token, or anonymous tokens as Docker Hub's) is not read this way.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { AsbError } from '../errors.ts';
import type { ImageStore } from '../images/image-store.ts';
import { parseImageReference, manifestSelector } from '../images/reference.ts';
import { basicAuthorization, pullSources, type RegistriesConfig } from '../images/registries.ts';
import { ROOT_ID_MAP } from '../runtime/oci/spec.ts';
import type { BaseImage } from './image-assembly.ts';
import type { PushBlob } from './registry-push.ts';

export interface ResolvedBase {
  base: BaseImage;
  /** The digest of the (platform) manifest: the cache keys of the first step start from it. */
  manifestDigest: string;
  /** The base's layers as the push needs them. */
  layers: PushBlob[];
}

export interface BaseImages {
  /** Resolves `reference`; `work` names this build (a pin while it runs, where there is a cache). */
  resolve(reference: string, work: string, signal: AbortSignal): Promise<ResolvedBase>;
  /** The build is over: what resolve kept for it may go. */
  release(work: string): Promise<void>;
}

/** From the local runtime's image cache; `registry` is where builds push (blobs there are mounted). */
export function cachedBase(images: ImageStore, registry: string): BaseImages {
  return {
    async resolve(reference, work) {
      // Pinned for the build: the image GC keeps the base's blobs while they are pushed.
      await images.pin(work, { reference });
      const pulled = await images.pull(reference, { idMap: ROOT_ID_MAP });
      const manifest = JSON.parse(await readFile(images.blobPath(pulled.manifestDigest), 'utf8')) as BaseImage['manifest'];
      const config = JSON.parse(await readFile(images.blobPath(pulled.configDigest), 'utf8')) as Record<string, unknown>;
      const ref = parseImageReference(reference);
      const mountFrom = ref.registry === registry || ref.registry === 'docker.io' ? ref.repository : undefined;
      return {
        base: { manifest, config },
        manifestDigest: pulled.manifestDigest,
        layers: manifest.layers.map((l) => ({ digest: l.digest, size: l.size, path: images.blobPath(l.digest), ...(mountFrom === undefined ? {} : { mountFrom }) })),
      };
    },
    release: (work) => images.unpin(work),
  };
}

const MANIFEST_ACCEPT = [
  'application/vnd.oci.image.index.v1+json',
  'application/vnd.oci.image.manifest.v1+json',
  'application/vnd.docker.distribution.manifest.list.v2+json',
  'application/vnd.docker.distribution.manifest.v2+json',
].join(', ');

/** A manifest or config may not pass this: real ones are a few KiB. */
const MAX_JSON = 4 * 2 ** 20;

interface Platform { architecture?: string; os?: string }
interface IndexJson { manifests?: { digest: string; platform?: Platform }[] }

/** The node's architecture as images name it. */
function goArch(): string {
  return ({ x64: 'amd64', arm64: 'arm64', arm: 'arm', ppc64: 'ppc64le', s390x: 's390x' } as Record<string, string>)[process.arch] ?? process.arch;
}

async function getJson(url: string, accept: string, signal: AbortSignal, authorization: string | undefined): Promise<{ bytes: Buffer; json: unknown }> {
  const res = await fetch(url, { headers: { accept, ...(authorization === undefined ? {} : { authorization }) }, signal });
  if (!res.ok) {
    await res.body?.cancel();
    throw new AsbError(res.status === 404 ? 'NotFound' : res.status === 401 || res.status === 403 ? 'Forbidden' : 'Unavailable', `HTTP ${String(res.status)}`);
  }
  const bytes = Buffer.from(await res.arrayBuffer());
  if (bytes.length > MAX_JSON) throw new AsbError('Unavailable', `${url} answered ${String(bytes.length)} bytes, more than a manifest or config has`);
  return { bytes, json: JSON.parse(bytes.toString('utf8')) as unknown };
}

function sha256(b: Buffer): string {
  return `sha256:${createHash('sha256').update(b).digest('hex')}`;
}

/** From the registries' HTTP API; `registry` is where builds push (host:port). */
export function registryBase(registries: RegistriesConfig, registry: string): BaseImages {
  return {
    async resolve(reference, _work, signal) {
      const ref = parseImageReference(reference);
      const answers: string[] = [];
      for (const source of pullSources(ref, registries)) {
        const base = `${source.insecure ? 'http' : 'https'}://${source.host}/v2/${source.repository}`;
        const authorization = basicAuthorization(source.auth);
        try {
          let got = await getJson(`${base}/manifests/${manifestSelector(ref)}`, MANIFEST_ACCEPT, signal, authorization);
          const index = got.json as IndexJson;
          if (Array.isArray(index.manifests)) {
            const arch = goArch();
            const pick = index.manifests.find((m) => m.platform?.os === 'linux' && m.platform.architecture === arch);
            if (pick === undefined) throw new AsbError('NotFound', `no linux/${arch} image in its index`);
            got = await getJson(`${base}/manifests/${pick.digest}`, MANIFEST_ACCEPT, signal, authorization);
          }
          const manifest = got.json as BaseImage['manifest'] & { config?: { digest?: string } };
          const configDigest = manifest.config?.digest;
          if (!Array.isArray(manifest.layers) || typeof configDigest !== 'string') throw new AsbError('Unavailable', 'its manifest has no config or layers');
          const config = await getJson(`${base}/blobs/${configDigest}`, '*/*', signal, authorization);
          if (sha256(config.bytes) !== configDigest) throw new AsbError('Unavailable', `its config is not ${configDigest}`);
          const mountFrom = source.host === registry ? source.repository : undefined;
          return {
            base: { manifest: { layers: manifest.layers }, config: config.json as Record<string, unknown> },
            manifestDigest: sha256(got.bytes),
            layers: manifest.layers.map((l) => ({ digest: l.digest, size: l.size, url: `${base}/blobs/${l.digest}`, ...(mountFrom === undefined ? {} : { mountFrom }), ...(authorization === undefined ? {} : { urlAuthorization: authorization }) })),
          };
        } catch (err) {
          signal.throwIfAborted();
          answers.push(`${source.host}: ${err instanceof Error ? err.message : String(err)}`);
        }
      }
      throw new AsbError('BuildFailed', `the base image "${reference}" could not be read: ${answers.join('; ')}`);
    },
    release: () => Promise.resolve(),
  };
}
