// Image references by Docker's rules (github.com/distribution/reference, `ParseNormalizedNamed`),
// so a pod's `image:` means here what it means to Docker and to the kubelet:
//   python:3.12                → docker.io/library/python:3.12
//   library/python             → docker.io/library/python:latest
//   ghcr.io/x/y:1@sha256:<64>  → registry ghcr.io, repository x/y, tag 1, digest sha256:<64>
// The first path component is a registry host when it has a dot or a port, is `localhost`, or
// has an upper-case letter; otherwise the image is on Docker Hub, and a one-component name there is
// an official image under `library/`. Pure: no I/O.
import { AsbError } from '../errors.ts';

export const DOCKER_HUB = 'docker.io';

export interface ImageReference {
  /** Registry host[:port], `docker.io` for Docker Hub. */
  readonly registry: string;
  /** Path in the registry, e.g. `library/python`. */
  readonly repository: string;
  /** The tag; `latest` when neither a tag nor a digest was given, undefined for a digest alone. */
  readonly tag: string | undefined;
  /** `algorithm:hex` when pinned; pulls by digest then, and the tag only names it. */
  readonly digest: string | undefined;
}

// The grammar of distribution/reference (regexp.go), written out once here.
const ALNUM = '[a-z0-9]+';
const SEPARATOR = '(?:[._]|__|-+)';
const PATH_COMPONENT = new RegExp(`^${ALNUM}(?:${SEPARATOR}${ALNUM})*$`);
const DOMAIN_COMPONENT = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const DOMAIN = new RegExp(`^(?:${DOMAIN_COMPONENT}(?:\\.${DOMAIN_COMPONENT})*|\\[[0-9a-fA-F:.]+\\])(?::[0-9]+)?$`);
const TAG = /^[\w][\w.-]{0,127}$/;
const DIGEST = /^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$/;
const SHA256_HEX = /^[a-f0-9]{64}$/;
const ANCHORED_HEX64 = /^[a-f0-9]{64}$/;
// distribution/reference's NameTotalLengthMax.
const NAME_MAX = 255;

/** Parses and normalises `input`; throws AsbError `Invalid` saying what is wrong with it. */
export function parseImageReference(input: string): ImageReference {
  const bad = (why: string): AsbError => new AsbError('Invalid', `image "${input}" is not a valid image reference: ${why}`, { fields: [{ field: 'image', message: why }] });
  const s = input.trim();
  if (s === '') throw bad('it is empty');
  if (s !== input) throw bad('it has leading or trailing white space');

  let rest = s;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw bad(`"${digest}" is not a digest (algorithm:hex)`);
    const [algorithm, hex] = digest.split(':') as [string, string];
    if (algorithm === 'sha256' && !SHA256_HEX.test(hex)) throw bad('a sha256 digest has 64 lower-case hex digits');
    if (algorithm !== 'sha256' && algorithm !== 'sha512') throw bad(`digest algorithm "${algorithm}" is not supported (sha256, sha512)`);
    if (algorithm === 'sha512' && !/^[a-f0-9]{128}$/.test(hex)) throw bad('a sha512 digest has 128 lower-case hex digits');
  }

  // A tag follows the last colon after the last slash (a registry port has a slash after it).
  let tag: string | undefined;
  const colon = rest.lastIndexOf(':');
  if (colon > rest.lastIndexOf('/')) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw bad(`"${tag}" is not a valid tag (letters, digits, _ . -, at most 128, not starting with . or -)`);
  }

  const [registry, repository] = splitRegistry(rest);
  if (registry !== DOCKER_HUB && !DOMAIN.test(registry)) throw bad(`"${registry}" is not a registry host`);
  if (repository === '') throw bad('the repository name is empty');
  if (repository !== repository.toLowerCase()) throw bad('the repository name must be lower case');
  for (const component of repository.split('/')) {
    if (!PATH_COMPONENT.test(component)) throw bad(`"${component}" is not a valid path component (lower-case letters and digits, separated by . _ __ or -)`);
  }
  const familiar = registry === DOCKER_HUB ? repository : `${registry}/${repository}`;
  if (familiar.length > NAME_MAX) throw bad(`the name is longer than ${NAME_MAX} characters`);
  // Docker refuses a bare 64-hex name: it reads as an image ID, never as a repository.
  if (ANCHORED_HEX64.test(rest)) throw bad('a 64-character hexadecimal string is an image ID, not a repository name');

  return Object.freeze({ registry, repository, tag: tag ?? (digest === undefined ? 'latest' : undefined), digest });
}

function splitRegistry(name: string): [string, string] {
  const slash = name.indexOf('/');
  const first = slash < 0 ? '' : name.slice(0, slash);
  let registry: string;
  let repository: string;
  if (slash < 0 || (!/[.:]/.test(first) && first !== 'localhost' && first.toLowerCase() === first)) {
    registry = DOCKER_HUB;
    repository = name;
  } else {
    registry = first;
    repository = name.slice(slash + 1);
  }
  if (registry === 'index.docker.io' || registry === 'registry-1.docker.io') registry = DOCKER_HUB;
  if (registry === DOCKER_HUB && repository !== '' && !repository.includes('/')) repository = `library/${repository}`;
  return [registry, repository];
}

/** The full form: `docker.io/library/python:3.12`, `ghcr.io/x/y:1@sha256:…`. */
export function formatReference(ref: ImageReference): string {
  return `${ref.registry}/${ref.repository}${ref.tag === undefined ? '' : `:${ref.tag}`}${ref.digest === undefined ? '' : `@${ref.digest}`}`;
}

/** The short form Docker prints: `python:3.12`, `agent-sandbox/base:latest`, `ghcr.io/x/y:1`. */
export function familiarReference(ref: ImageReference): string {
  let name = ref.registry === DOCKER_HUB ? ref.repository.replace(/^library\/(?=[^/]+$)/, '') : `${ref.registry}/${ref.repository}`;
  if (ref.tag !== undefined) name += `:${ref.tag}`;
  if (ref.digest !== undefined) name += `@${ref.digest}`;
  return name;
}

/** What the registry is asked for: the digest when pinned, else the tag. */
export function manifestSelector(ref: ImageReference): string {
  return ref.digest ?? ref.tag ?? 'latest';
}
