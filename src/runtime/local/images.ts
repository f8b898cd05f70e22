// No image registry is reachable from the local runtime, so a container's `image` is mapped to a
// root filesystem this machine can provide. Today there is one: the host's own /usr and /etc,
// read-only underneath a private writable layer per pod (bash, coreutils and python3 included).
// Resolution ignores the registry host, a `library/` prefix, the tag and the digest, so
// `docker.io/library/python:3.12` and `python` are the same image here.

export type RootfsKind = 'host';

/** Image names (without registry, tag or digest) that resolve to the host root filesystem. */
export const HOST_IMAGES: readonly string[] = ['busybox', 'debian', 'ubuntu', 'python', 'alpine', 'agent-sandbox/base'];

export type ImageResolution = { ok: true; rootfs: RootfsKind } | { ok: false; message: string };

/** The bare repository name: `ghcr.io/x/y:1@sha256:..` → `x/y`, `docker.io/library/python:3` → `python`. */
export function imageRepository(image: string): string {
  let name = image.trim();
  const at = name.indexOf('@');
  if (at >= 0) name = name.slice(0, at);
  const parts = name.split('/');
  const first = parts[0] ?? '';
  // A first component with a dot or a port, or `localhost`, is a registry host (docker's rule).
  if (parts.length > 1 && (first.includes('.') || first.includes(':') || first === 'localhost')) parts.shift();
  if (parts[0] === 'library' && parts.length > 1) parts.shift();
  const last = parts.pop() ?? '';
  const colon = last.indexOf(':');
  parts.push(colon >= 0 ? last.slice(0, colon) : last);
  return parts.join('/').toLowerCase();
}

export function resolveImage(image: string | null | undefined): ImageResolution {
  if (image === undefined || image === null || image.trim() === '') return { ok: true, rootfs: 'host' };
  const repo = imageRepository(image);
  if (HOST_IMAGES.includes(repo)) return { ok: true, rootfs: 'host' };
  return {
    ok: false,
    message: `image "${image}" cannot be provided by the local runtime (no registry is reachable); ` +
      `resolvable images: the empty image, ${HOST_IMAGES.join(', ')} (any tag)`,
  };
}
