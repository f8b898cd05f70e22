// Where an image is pulled from, decided from worker configuration: registry mirrors, plain-HTTP
// (insecure) registries and pull credentials. Pure: the puller (image-store.ts) tries the
// sources in order and stops at the first that answers.
//
// Shapes follow the tools people already configure:
// - mirrors: containerd's hosts.toml / Docker's `registry-mirrors`, per registry host. A mirror
//   is tried before the registry itself; `upstream: false` never contacts the registry itself
//   (a machine with no way out, like ours: docker.io is served by the local registry only).
// - insecure: Docker's `insecure-registries`; plain HTTP (or TLS without verification). Loopback
//   hosts are insecure without being listed, as in Docker (127.0.0.0/8 is trusted there too).
// - auths: a `kubernetes.io/dockerconfigjson` secret's `auths` (the format of ~/.docker/config.json),
//   keyed by the host actually contacted, so a mirror has its own credentials.
import { AsbError, type FieldProblem } from '../errors.ts';
import { DOCKER_HUB, type ImageReference } from './reference.ts';

export interface RegistryAuth {
  readonly username?: string;
  readonly password?: string;
  /** base64 of `username:password`, as `docker login` writes it. */
  readonly auth?: string;
  /** An OAuth2 refresh token (`docker login` with a token). */
  readonly identitytoken?: string;
}

export interface MirrorConfig {
  /** `host[:port]` endpoints tried in order, each serving the same repository paths. */
  readonly endpoints: readonly string[];
  /** Whether the registry itself is tried after its mirrors; default true. */
  readonly upstream: boolean;
}

export interface RegistriesConfig {
  /** Registry host (`docker.io`, `ghcr.io`…) → its mirrors. */
  readonly mirrors: Readonly<Record<string, MirrorConfig>>;
  /** Hosts reached over plain HTTP; loopback hosts always are. */
  readonly insecure: readonly string[];
  /** Credentials by host, from worker configuration. */
  readonly auths: Readonly<Record<string, RegistryAuth>>;
}

export const EMPTY_REGISTRIES: RegistriesConfig = Object.freeze({ mirrors: {}, insecure: [], auths: {} });

/** One place to ask for the image: host (registry or mirror), the repository there, how to talk to it. */
export interface PullSource {
  readonly host: string;
  readonly repository: string;
  readonly insecure: boolean;
  readonly auth: RegistryAuth | undefined;
  /** True when this is a mirror of `ref.registry`. */
  readonly mirror: boolean;
}

/**
 * The sources to try for `ref`, in order. `podAuths` are the pod's imagePullSecrets, merged
 * (theirs first) over the worker's; the API server already decoded them.
 */
export function pullSources(ref: ImageReference, config: RegistriesConfig, podAuths: readonly Readonly<Record<string, RegistryAuth>>[] = []): PullSource[] {
  const mirror = config.mirrors[ref.registry];
  const hosts: { host: string; mirror: boolean }[] = (mirror?.endpoints ?? []).map((host) => ({ host, mirror: true }));
  if (mirror?.upstream !== false) hosts.push({ host: ref.registry === DOCKER_HUB ? 'registry-1.docker.io' : ref.registry, mirror: false });
  return hosts.map(({ host, mirror: isMirror }) => ({
    host,
    repository: ref.repository,
    insecure: isInsecure(host, config),
    auth: authFor(host, ref.registry, config, podAuths),
    mirror: isMirror,
  }));
}

export function isInsecure(host: string, config: RegistriesConfig): boolean {
  return isLoopbackHost(host) || config.insecure.includes(host) || config.insecure.includes(hostWithoutPort(host));
}

/** The worker's credentials for `host` (a registry it pushes to), as pullSources finds them. */
export function authForHost(host: string, config: RegistriesConfig): RegistryAuth | undefined {
  return authFor(host, host, config, []);
}

/**
 * The `Authorization` header of basic credentials, sent with the first request (what a
 * registry with htpasswd or a cloud registry's password login asks for); undefined for none, or
 * for an identity token alone (it is exchanged by a token flow, which only skopeo's pulls do).
 */
export function basicAuthorization(auth: RegistryAuth | undefined): string | undefined {
  const basic = auth === undefined ? undefined : basicCredential(auth);
  return basic === undefined ? undefined : `Basic ${basic}`;
}

/** base64 of `user:password` (docker's `auth` field, kept as given when the file has it); undefined without a user. */
function basicCredential(auth: RegistryAuth): string | undefined {
  return auth.auth ?? (auth.username === undefined ? undefined : Buffer.from(`${auth.username}:${auth.password ?? ''}`).toString('base64'));
}

function authFor(host: string, registry: string, config: RegistriesConfig, podAuths: readonly Readonly<Record<string, RegistryAuth>>[]): RegistryAuth | undefined {
  // Docker Hub credentials are stored under several names; the host contacted comes first.
  const names = host === 'registry-1.docker.io' ? [host, registry, 'index.docker.io', 'https://index.docker.io/v1/'] : [host, `https://${host}`, `http://${host}`];
  for (const auths of [...podAuths, config.auths]) {
    for (const name of names) {
      const found = auths[name];
      if (found !== undefined) return found;
    }
  }
  return undefined;
}

function hostWithoutPort(host: string): string {
  if (host.startsWith('[')) return host.slice(0, host.indexOf(']') + 1);
  const colon = host.lastIndexOf(':');
  return colon < 0 ? host : host.slice(0, colon);
}

export function isLoopbackHost(host: string): boolean {
  const name = hostWithoutPort(host);
  return name === 'localhost' || name === '[::1]' || /^127(?:\.\d{1,3}){3}$/.test(name);
}

/** A `docker config.json` for skopeo's `--authfile`: only the entry for `host`. */
export function authFileJson(host: string, auth: RegistryAuth): string {
  const entry: Record<string, string> = {};
  const basic = basicCredential(auth);
  if (basic !== undefined) entry.auth = basic;
  if (auth.identitytoken !== undefined) entry.identitytoken = auth.identitytoken;
  return JSON.stringify({ auths: { [host]: entry } });
}

/**
 * Checks worker configuration (`registries:` in the worker's config file, or flags) once at
 * start-up; lists every problem at once.
 */
export function parseRegistriesConfig(input: unknown, field = 'registries'): RegistriesConfig {
  if (input === undefined || input === null) return EMPTY_REGISTRIES;
  const problems: FieldProblem[] = [];
  const obj = asRecord(input);
  if (obj === undefined) throw new AsbError('Invalid', `${field} must be an object`, { fields: [{ field, message: 'must be an object' }] });
  for (const key of Object.keys(obj)) if (!['mirrors', 'insecure', 'auths'].includes(key)) problems.push({ field: `${field}.${key}`, message: 'unknown field (mirrors, insecure, auths)' });

  const mirrors: Record<string, MirrorConfig> = {};
  const rawMirrors = obj.mirrors === undefined ? {} : asRecord(obj.mirrors);
  if (rawMirrors === undefined) problems.push({ field: `${field}.mirrors`, message: 'must be an object of registry host → { endpoints, upstream }' });
  for (const [registry, value] of Object.entries(rawMirrors ?? {})) {
    const at = `${field}.mirrors["${registry}"]`;
    const m = asRecord(value);
    const endpoints = m?.endpoints;
    if (m === undefined || !Array.isArray(endpoints) || endpoints.length === 0 || !endpoints.every((e) => typeof e === 'string' && validHost(e))) {
      problems.push({ field: `${at}.endpoints`, message: 'must be a non-empty list of host[:port]' });
      continue;
    }
    if (m.upstream !== undefined && typeof m.upstream !== 'boolean') problems.push({ field: `${at}.upstream`, message: 'must be true or false' });
    mirrors[registry] = Object.freeze({ endpoints: Object.freeze([...(endpoints as string[])]), upstream: m.upstream !== false });
  }

  const insecure = obj.insecure ?? [];
  if (!Array.isArray(insecure) || !insecure.every((h) => typeof h === 'string' && validHost(h))) problems.push({ field: `${field}.insecure`, message: 'must be a list of host[:port]' });

  const auths: Record<string, RegistryAuth> = {};
  const rawAuths = obj.auths === undefined ? {} : asRecord(obj.auths);
  if (rawAuths === undefined) problems.push({ field: `${field}.auths`, message: 'must be an object of host → { username, password } or { auth }' });
  for (const [host, value] of Object.entries(rawAuths ?? {})) {
    const a = asRecord(value);
    const strings = a !== undefined && Object.entries(a).every(([k, v]) => ['username', 'password', 'auth', 'identitytoken', 'email'].includes(k) && typeof v === 'string');
    if (a === undefined || !strings || (a.auth === undefined && a.username === undefined && a.identitytoken === undefined)) {
      problems.push({ field: `${field}.auths["${host}"]`, message: 'must have username and password, auth (base64 user:password) or identitytoken, all strings' });
      continue;
    }
    auths[host] = Object.freeze({ ...(a as Record<string, string>) });
  }
  if (problems.length > 0) {
    throw new AsbError('Invalid', `registry configuration is invalid: ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}`, { fields: problems });
  }
  return Object.freeze({ mirrors: Object.freeze(mirrors), insecure: Object.freeze([...(insecure as string[])]), auths: Object.freeze(auths) });
}

function asRecord(v: unknown): Record<string, unknown> | undefined {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

function validHost(h: string): boolean {
  return /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])(?::\d{1,5})?$/.test(h);
}
