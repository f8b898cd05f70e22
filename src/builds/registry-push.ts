// Pushes a built image to the registry the worker's pods pull from, by the registry's HTTP API
// (distribution's /v2/), not `skopeo copy`: a rebuild served from the cache pushes only a
// manifest whose blobs the registry already has (a HEAD each), a few milliseconds, where a skopeo
// process took ~0.3 s to start. A blob the repository lacks is mounted from the base image's
// repository when the registry holds it there, else uploaded from its file in one PUT.
import { createReadStream } from 'node:fs';
import { Readable } from 'node:stream';
import { AsbError } from '../errors.ts';

export interface PushBlob {
  digest: string;
  size: number;
  /** The blob's file here, for an upload; or `url`, where it is read from for one (another registry's blob). */
  path?: string;
  url?: string;
  /** A repository of the same registry that may hold it already (cross-repository mount). */
  mountFrom?: string;
  /** The `Authorization` header a GET of `url` needs (the source registry's credentials). */
  urlAuthorization?: string;
}

export interface PushTarget {
  /** host:port; plain HTTP (a registry on this machine, or one the worker reaches without TLS) unless https. */
  registry: string;
  https?: boolean;
  repository: string;
  tag: string;
  /** The `Authorization` header every request to the registry carries (its credentials), if it needs one. */
  authorization?: string;
}

export const OCI_MANIFEST = 'application/vnd.oci.image.manifest.v1+json';

/** Pushes the blobs it lacks, then the manifest under the tag; resolves with the manifest's digest. */
export async function pushImage(target: PushTarget, blobs: readonly PushBlob[], manifest: Buffer, manifestDigest: string, signal: AbortSignal): Promise<void> {
  const base = `${target.https === true ? 'https' : 'http'}://${target.registry}/v2/${target.repository}`;
  const auth: Record<string, string> = target.authorization === undefined ? {} : { authorization: target.authorization };
  for (const blob of blobs) {
    signal.throwIfAborted();
    const head = await fetch(`${base}/blobs/${blob.digest}`, { method: 'HEAD', signal, headers: auth });
    if (head.ok) continue;
    let location: string | undefined;
    if (blob.mountFrom !== undefined && blob.mountFrom !== target.repository) {
      const mount = await fetch(`${base}/blobs/uploads/?mount=${encodeURIComponent(blob.digest)}&from=${encodeURIComponent(blob.mountFrom)}`, { method: 'POST', signal, headers: auth });
      await mount.body?.cancel();
      if (mount.status === 201) continue;
      if (mount.status === 202) location = mount.headers.get('location') ?? undefined;
    }
    if (location === undefined) {
      const started = await fetch(`${base}/blobs/uploads/`, { method: 'POST', signal, headers: auth });
      await started.body?.cancel();
      location = started.headers.get('location') ?? undefined;
      if (started.status !== 202 || location === undefined) throw await registryError(`start an upload to ${target.repository}`, started);
    }
    const url = new URL(location, `${base}/`);
    url.searchParams.set('digest', blob.digest);
    // Streamed from its file (a layer may be gigabytes): undici needs duplex 'half' for a stream body.
    const init: RequestInit & { duplex: 'half' } = {
      method: 'PUT', signal, duplex: 'half',
      headers: { ...auth, 'content-type': 'application/octet-stream', 'content-length': String(blob.size) },
      body: await blobBody(blob, signal),
    };
    const put = await fetch(url, init);
    if (put.status !== 201) throw await registryError(`upload blob ${blob.digest} to ${target.repository}`, put);
    await put.body?.cancel();
  }
  const put = await fetch(`${base}/manifests/${target.tag}`, { method: 'PUT', signal, headers: { ...auth, 'content-type': OCI_MANIFEST }, body: manifest });
  if (put.status !== 201) throw await registryError(`push the manifest of ${target.repository}:${target.tag}`, put);
  await put.body?.cancel();
  const said = put.headers.get('docker-content-digest');
  if (said !== null && said !== manifestDigest) throw new AsbError('Internal', `the registry stored the manifest as ${said}, not ${manifestDigest}`);
}

/** The blob's bytes: its file, or a GET of the registry that has it. */
async function blobBody(blob: PushBlob, signal: AbortSignal): Promise<ReadableStream<Uint8Array>> {
  if (blob.path !== undefined) return Readable.toWeb(createReadStream(blob.path)) as ReadableStream<Uint8Array>;
  if (blob.url === undefined) throw new AsbError('Internal', `blob ${blob.digest} has neither a file nor a source`);
  const got = await fetch(blob.url, { signal, ...(blob.urlAuthorization === undefined ? {} : { headers: { authorization: blob.urlAuthorization } }) });
  if (!got.ok || got.body === null) throw await registryError(`give blob ${blob.digest} (${blob.url})`, got);
  return got.body;
}

async function registryError(what: string, res: Response): Promise<AsbError> {
  const text = (await res.text().catch(() => '')).slice(0, 300);
  return new AsbError('Unavailable', `the registry refused to ${what}: HTTP ${String(res.status)} ${text}`);
}
