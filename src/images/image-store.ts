// The local image cache: pulls an image by reference with skopeo, unpacks it once with umoci, and
// hands the runtime a read-only root filesystem to use as an overlayfs lowerdir (each sandbox then
// has only its own upper dir). Maintained tools do the registry protocol and the layer
// extraction; this file only decides names, order, timeouts and clean-up.
//
// Why skopeo + umoci and not containerd (research/runtime.md §2a, §3b, and docs/images.md's
// figures): both are Debian packages (no build, ~7 s to install), need no daemon, and pull and
// unpack the images here in seconds (docs/images.md); containerd 2.x needs a 92 s Go build on these 2
// cores and a long-running daemon with its own root, state and socket to supervise, for the same
// result (its overlayfs snapshotter gives the same lowerdirs). The Kubernetes tier gets containerd
// through the kubelet; this file serves the local runtime.
//
// On disk under `root` (0700):
//   oci/                   one OCI image layout for every image: a blob (layer, config, manifest)
//                          is stored once however many references share it; skopeo fetches
//                          only the blobs it lacks
//   images/<key>.json      one record per pulled reference (key = the layout tag, a hash of the
//                          reference): manifest and config digests, layer chain, image config
//   rootfs/<chain>/rootfs  the image unpacked once per layer chain (the chain ID of its diff IDs,
//                          as Docker names it), shared by every reference and every sandbox with
//                          that chain; the sandbox's own writable layer lives with the sandbox
//   rootfs/<chain>_u<host id>-<size>/rootfs
//                          the same, owned through a user-namespace id map (umoci --uid-map and
//                          --gid-map), for sandboxes that run as root in a user namespace: their
//                          uid 0 is host uid <host id>
//   tmp/                   skopeo's temporary files and unpacks in progress
//   pins/                  which pod uses which reference and tree (pins.ts): GC (image-gc.ts)
//                          keeps those, in every process sharing the cache
// Outside it, skopeo run as root keeps /var/lib/containers/cache/blob-info-cache-v1.boltdb (which
// blobs a registry has; a cache, no credentials); skopeo 1.9 has no flag to move it.
// Sharing is per chain, not per layer: umoci 0.4.7 applies whiteouts when it unpacks, so a single
// layer cannot be unpacked on its own as an overlayfs layer. Two images that share their
// layers (agent-sandbox/base and python:3.11 here) share the unpacked tree; two that share only a
// first layer share its blob but not its files.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { AsbError, type ErrorCode } from '../errors.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { privateDir } from '../base/private-files.ts';
import { acquireOwnerLockWaiting } from '../store/owner-lock.ts';
import { formatReference, manifestSelector, parseImageReference, type ImageReference } from './reference.ts';
import { chainDirOf } from './gc-decision.ts';
import { collectGarbage, DEFAULT_GC_GRACE_MS, type GcOptions, type GcResult } from './image-gc.ts';
import { addPin, removePins } from './pins.ts';
import { authFileJson, pullSources, type PullSource, type RegistriesConfig, type RegistryAuth } from './registries.ts';
import { runTool, SKOPEO, toolMessage, UMOCI } from './tool.ts';

/** What the runtime needs from an image's configuration (OCI image config `config`). */
export interface ImageConfig {
  readonly user: string | undefined;
  readonly env: readonly string[];
  readonly entrypoint: readonly string[];
  readonly cmd: readonly string[];
  readonly workingDir: string | undefined;
}

export interface CachedImage {
  /** Full reference as asked for: `docker.io/library/python:3.11`. */
  readonly reference: string;
  /** Digest of the manifest in the local layout: what a wake must use even if the tag moved. */
  readonly manifestDigest: string;
  readonly configDigest: string;
  /** Uncompressed layer digests, bottom first. */
  readonly diffIds: readonly string[];
  /** Chain ID of diffIds: names the unpacked tree. */
  readonly chainId: string;
  /** Read-only root filesystem: the overlayfs lowerdir (the id-mapped one when pulled with idMap). */
  readonly rootfs: string;
  readonly config: ImageConfig;
  /** Host it came from (a mirror or the registry). */
  readonly source: string;
  readonly pulledAt: string;
}

/** How long a pull waits for another process's pull or unpack into the same cache (base unpacks in ~4 s; a slow registry may take minutes). */
const LOCK_WAIT_MS = 10 * 60_000;

export type PullPolicy = 'Always' | 'IfNotPresent' | 'Never';

export interface PullOptions {
  /** Kubernetes' rule when absent: Always for `:latest` (or no tag), else IfNotPresent. */
  policy?: PullPolicy;
  /** The pod's imagePullSecrets (`auths` of each dockerconfigjson), before the worker's. */
  auths?: readonly Readonly<Record<string, RegistryAuth>>[];
  /** Unpack owned through this user-namespace map (container ids 0..size-1 → hostId..): rootfs is that tree. */
  idMap?: IdMap;
}

export interface IdMap {
  readonly hostId: number;
  readonly size: number;
}

export interface ImageStoreOptions {
  root: string;
  registries: RegistriesConfig;
  logger: Logger;
  clock?: Clock;
  /** Deadline for one source's copy; default 5 min (base is 88 MB compressed). */
  pullTimeoutMs?: number;
  /** Deadline for one unpack; default 5 min (145 MB took 4.1 s here). */
  unpackTimeoutMs?: number;
}

export class ImageStore {
  readonly #opts: ImageStoreOptions;
  readonly #clock: Clock;
  readonly #log: Logger;
  // skopeo and umoci both rewrite oci/index.json: one writer at a time.
  #queue: Promise<unknown> = Promise.resolve();
  readonly #inFlight = new Map<string, Promise<CachedImage>>();
  readonly #pulledListeners = new Set<() => void>();

  constructor(opts: ImageStoreOptions) {
    this.#opts = opts;
    this.#clock = opts.clock ?? systemClock;
    this.#log = opts.logger.child({ component: 'images' });
    privateDir(opts.root);
    for (const dir of ['images', 'rootfs', 'tmp', 'registries.d', 'pins']) mkdirSync(join(opts.root, dir), { recursive: true });
    // Signature policy: accept what the registry serves (the registry is the trust boundary, as
    // for the kubelet); our own files so a host /etc/containers does not change behaviour.
    writeFileSync(this.#policyPath, JSON.stringify({ default: [{ type: 'insecureAcceptAnything' }] }));
    // Mirrors and blocks come from our configuration only (registries.ts), never from a host
    // /etc/containers/registries.conf: skopeo reads this file instead (CONTAINERS_REGISTRIES_CONF).
    writeFileSync(join(opts.root, 'registries.conf'), '# Written by agent-sandbox: no mirrors, no search registries (see src/images/registries.ts).\n');
  }

  get root(): string {
    return this.#opts.root;
  }

  /** Where a blob of the cache's layout is (a pulled image's manifest, config or layer), by digest. */
  blobPath(digest: string): string {
    return this.#blob(digest);
  }

  get #layout(): string {
    return join(this.#opts.root, 'oci');
  }

  get #policyPath(): string {
    return join(this.#opts.root, 'policy.json');
  }

  /** The cached image for `image`, without any network; undefined if it was never pulled. */
  get(image: string, idMap?: IdMap): CachedImage | undefined {
    return this.#read(layoutTag(formatReference(parseImageReference(image))), idMap);
  }

  list(): CachedImage[] {
    return readdirSync(join(this.#opts.root, 'images'))
      .filter((f) => f.endsWith('.json'))
      .map((f) => this.#read(f.slice(0, -'.json'.length)))
      .filter((i): i is CachedImage => i !== undefined);
  }

  /**
   * Makes `image` available locally and returns it. Throws AsbError naming the image and each
   * source's answer: `Invalid` for a bad reference, `NotFound` when no source has it,
   * `Timeout` past the deadline, `Forbidden` when refused credentials, else `Unavailable`.
   */
  pull(image: string, opts: PullOptions = {}): Promise<CachedImage> {
    // Concurrent pulls of one image with the same options share one: a warm pool's refill starts
    // hundreds of pods of `agent-sandbox/base` (`:latest`, so Always) at once, and each asked the
    // registry in turn behind the cache's lock (300 starts: ~5 s of manifest checks, one by one).
    const key = JSON.stringify([image, opts.policy, opts.idMap, opts.auths]);
    const inFlight = this.#inFlight.get(key);
    if (inFlight !== undefined) return inFlight;
    const pulling = this.#pull(image, opts).finally(() => this.#inFlight.delete(key));
    this.#inFlight.set(key, pulling);
    return pulling;
  }

  async #pull(image: string, opts: PullOptions): Promise<CachedImage> {
    const ref = parseImageReference(image);
    const reference = formatReference(ref);
    const tag = layoutTag(reference);
    const policy = opts.policy ?? (ref.digest === undefined && ref.tag === 'latest' ? 'Always' : 'IfNotPresent');
    const idMap = opts.idMap;
    if (idMap !== undefined && !(Number.isSafeInteger(idMap.hostId) && Number.isSafeInteger(idMap.size) && idMap.hostId > 0 && idMap.size > 0 && idMap.hostId + idMap.size <= 2 ** 32)) {
      throw new AsbError('Invalid', `id map ${JSON.stringify(idMap)} is not a range of host ids above 0`);
    }
    const cached = this.#read(tag, idMap);
    if (cached !== undefined && policy !== 'Always' && existsSync(cached.rootfs)) return cached;
    if (policy === 'Never') {
      if (cached !== undefined) return this.#serial(() => this.#unpack(cached, idMap));
      throw new AsbError('NotFound', `image "${image}" is not present and its pull policy is Never`);
    }
    const pulled = this.#serial(async () => {
      // Looked up again behind the lock: a GC may have held it and moved the image out of reach
      // for an instant (gc()), or another process pulled it meanwhile.
      const present = this.#read(tag, idMap);
      if (present !== undefined && policy !== 'Always' && existsSync(present.rootfs)) return present;
      const sources = pullSources(ref, this.#opts.registries, opts.auths ?? []);
      const answers: string[] = [];
      let code: ErrorCode = 'NotFound';
      for (const source of sources) {
        const outcome = await this.#copy(ref, source, tag);
        if (outcome.ok) {
          const record = this.#record(reference, tag, source.host, idMap);
          this.#log.info({ image: reference, source: source.host, manifest: record.manifestDigest }, 'image pulled');
          return this.#unpack(record, idMap);
        }
        answers.push(`${source.host}${source.mirror ? ' (mirror)' : ''}: ${outcome.message}`);
        // The most telling failure wins: NotFound only when every source said so.
        if (outcome.code !== 'NotFound') code = outcome.code;
      }
      throw new AsbError(code, `image "${image}" (${reference}) could not be pulled: ${answers.join('; ')}`);
    });
    void pulled.then(() => {
      for (const listener of this.#pulledListeners) listener();
    }, () => undefined);
    return pulled;
  }

  /**
   * Records that the pod whose directory is podDir uses `image` (a reference as the pod names it)
   * and, once known, its unpacked tree: GC keeps both while that directory exists, in every
   * process sharing this cache (pins.ts). Call it before looking the image up (pull), and again
   * with the tree the pod will mount.
   */
  async pin(podDir: string, image: { reference: string; rootfs?: string | undefined }): Promise<void> {
    const reference = formatReference(parseImageReference(image.reference));
    const tree = image.rootfs === undefined ? undefined : this.#treeOf(image.rootfs);
    await addPin(this.#opts.root, podDir, [reference], tree === undefined ? [] : [tree]);
    this.#touch([reference], tree === undefined ? [] : [tree]);
  }

  /** The pod is gone: what it used becomes collectable once unused for the grace (from now). */
  async unpin(podDir: string): Promise<void> {
    const pins = await removePins(this.#opts.root, podDir);
    this.#touch(pins.flatMap((p) => p.references), pins.flatMap((p) => p.trees));
  }

  /** Called after every pull that went to the registry or unpacked (the GC loop checks the disk then). */
  onPulled(listener: () => void): () => void {
    this.#pulledListeners.add(listener);
    return () => this.#pulledListeners.delete(listener);
  }

  /**
   * Removes the images nothing uses (gc-decision.ts has the rules, image-gc.ts the steps): records
   * no live pin or `keep` names and not used within the grace, then their blobs and the trees
   * nothing kept uses. Under the cache's lock: never during a pull, in any process.
   */
  gc(opts: GcOptions = {}): Promise<GcResult> {
    const keep = new Set<string>();
    for (const image of opts.keep ?? []) keep.add(formatReference(parseImageReference(image)));
    const graceMs = opts.graceMs ?? DEFAULT_GC_GRACE_MS;
    return this.#serial(() => collectGarbage({ root: this.#opts.root, layout: this.#layout, clock: this.#clock, log: this.#log, umoci: (args, what) => this.#umoci(args, what) }, keep, graceMs));
  }

  /** rootfs/<dir>/rootfs → dir; undefined for a tree outside this cache. */
  #treeOf(rootfs: string): string | undefined {
    const rel = relative(join(this.#opts.root, 'rootfs'), rootfs).split('/');
    return rel.length === 2 && rel[1] === 'rootfs' && rel[0] !== undefined && rel[0] !== '..' ? rel[0] : undefined;
  }

  /** Marks records and trees as used now: the grace of an image no pod pins runs from its last use. */
  #touch(references: readonly string[], trees: readonly string[]): void {
    const now = new Date(this.#clock.now());
    const paths = [...references.map((r) => join(this.#opts.root, 'images', `${layoutTag(r)}.json`)), ...trees.map((t) => join(this.#opts.root, 'rootfs', t))];
    for (const path of paths) {
      try {
        utimesSync(path, now, now);
      } catch {
        // not pulled yet, or removed: nothing to mark
      }
    }
  }

  /**
   * One writer at a time: in this process by the queue, across processes (two workers of `make
   * up`, test files) by a lock file whose holder is a live pid; a holder that died is taken over.
   */
  #serial<T>(fn: () => Promise<T>): Promise<T> {
    const locked = async (): Promise<T> => {
      const lock = await acquireOwnerLockWaiting(join(this.#opts.root, 'cache'), LOCK_WAIT_MS);
      try {
        return await fn();
      } finally {
        lock.release();
      }
    };
    const run = this.#queue.then(locked, locked);
    this.#queue = run.catch(() => undefined);
    return run;
  }

  async #copy(ref: ImageReference, source: PullSource, tag: string): Promise<{ ok: true } | { ok: false; code: ErrorCode; message: string }> {
    const timeoutMs = this.#opts.pullTimeoutMs ?? 300_000;
    const tmp = join(this.#opts.root, 'tmp');
    const selector = manifestSelector(ref);
    const from = `docker://${source.host}/${source.repository}${selector.includes(':') ? `@${selector}` : `:${selector}`}`;
    const args = [
      '--policy', this.#policyPath, '--registries.d', join(this.#opts.root, 'registries.d'), '--tmpdir', tmp,
      // skopeo's own deadline first; ours (below, 2 s later) kills it if it does not honour it.
      '--command-timeout', `${Math.ceil(timeoutMs / 1000)}s`,
      'copy', '--retry-times', '0', `--src-tls-verify=${String(!source.insecure)}`,
    ];
    let authFile: string | undefined;
    if (source.auth === undefined) {
      // Never the host's own credentials (~/.docker/config.json, /run/containers/0/auth.json).
      args.push('--src-no-creds');
    } else {
      authFile = join(tmp, `auth-${tag}-${process.pid}.json`);
      writeFileSync(authFile, authFileJson(source.host, source.auth), { mode: 0o600 });
      args.push('--src-authfile', authFile);
    }
    args.push(from, `oci:${this.#layout}:${tag}`);
    const started = this.#clock.now();
    try {
      const result = await runTool(SKOPEO, args, { timeoutMs: timeoutMs + 2000, clock: this.#clock, env: { HOME: tmp, XDG_RUNTIME_DIR: tmp, XDG_CONFIG_HOME: tmp, CONTAINERS_REGISTRIES_CONF: join(this.#opts.root, 'registries.conf') } });
      if (result.code === 0) {
        this.#log.debug({ from, ms: this.#clock.now() - started }, 'skopeo copy');
        return { ok: true };
      }
      const message = result.timedOut ? `no answer within ${timeoutMs} ms` : toolMessage(result.stderr);
      return { ok: false, code: result.timedOut || /context deadline exceeded|timeout/i.test(message) ? 'Timeout' : classify(message), message };
    } finally {
      if (authFile !== undefined) rmSync(authFile, { force: true });
    }
  }

  /** Reads what skopeo wrote for `tag` and records it. */
  #record(reference: string, tag: string, source: string, idMap: IdMap | undefined): CachedImage {
    const index = readJson(join(this.#layout, 'index.json')) as { manifests?: { digest: string; annotations?: Record<string, string> }[] };
    const entry = index.manifests?.find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === tag);
    if (entry === undefined) throw new AsbError('Internal', `skopeo copied ${reference} but the layout has no tag ${tag}`);
    const manifest = readJson(this.#blob(entry.digest)) as { config?: { digest?: string } };
    const configDigest = manifest.config?.digest;
    if (configDigest === undefined) throw new AsbError('Unavailable', `image ${reference}: its manifest ${entry.digest} names no config (an index of no platform for this machine?)`);
    const config = readJson(this.#blob(configDigest)) as {
      rootfs?: { diff_ids?: string[] };
      config?: { User?: string; Env?: string[] | null; Entrypoint?: string[] | null; Cmd?: string[] | null; WorkingDir?: string };
    };
    const diffIds = config.rootfs?.diff_ids ?? [];
    const chainId = chainIdOf(diffIds);
    const c = config.config ?? {};
    const record: StoredImage = {
      reference,
      manifestDigest: entry.digest,
      configDigest,
      diffIds,
      chainId,
      config: {
        user: c.User === '' ? undefined : c.User,
        env: c.Env ?? [],
        entrypoint: c.Entrypoint ?? [],
        cmd: c.Cmd ?? [],
        workingDir: c.WorkingDir === '' ? undefined : c.WorkingDir,
      },
      source,
      pulledAt: new Date(this.#clock.now()).toISOString(),
    };
    const path = join(this.#opts.root, 'images', `${tag}.json`);
    writeFileSync(`${path}.tmp`, JSON.stringify(record, null, 2));
    renameSync(`${path}.tmp`, path);
    // Its mtime is its last use for GC, on this store's clock.
    const now = new Date(this.#clock.now());
    utimesSync(path, now, now);
    return { ...record, rootfs: this.#rootfsPath(chainId, idMap) };
  }

  #rootfsPath(chainId: string, idMap: IdMap | undefined): string {
    return join(this.#opts.root, 'rootfs', rootfsDir(chainId, idMap), 'rootfs');
  }

  /** Unpacks the image's chain unless an earlier pull (of this or another reference) did. */
  async #unpack(image: CachedImage, idMap: IdMap | undefined): Promise<CachedImage> {
    if (existsSync(image.rootfs)) return image;
    const final = join(this.#opts.root, 'rootfs', rootfsDir(image.chainId, idMap));
    const work = join(this.#opts.root, 'tmp', `unpack-${rootfsDir(image.chainId, idMap)}`);
    rmSync(work, { recursive: true, force: true });
    const started = this.#clock.now();
    const maps = idMap === undefined ? [] : ['--uid-map', `0:${idMap.hostId}:${idMap.size}`, '--gid-map', `0:${idMap.hostId}:${idMap.size}`];
    // `raw unpack`: the tree alone. `unpack` then walked it to write an mtree manifest, opening
    // every file for reading: a tenant image with a FIFO in it hung there until the deadline,
    // holding the cache's lock and every other pull with it.
    mkdirSync(work, { recursive: true, mode: 0o700 });
    const args = ['raw', 'unpack', ...(process.getuid?.() === 0 ? [] : ['--rootless']), ...maps, '--image', `${this.#layout}:${layoutTag(image.reference)}`, join(work, 'rootfs')];
    await this.#umoci(args, `unpack ${image.reference}`, this.#opts.unpackTimeoutMs ?? 300_000);
    // Complete or absent: a crash mid-unpack leaves only tmp/, which gc clears.
    rmSync(final, { recursive: true, force: true });
    renameSync(work, final);
    const now = new Date(this.#clock.now());
    utimesSync(final, now, now);
    this.#log.info({ image: image.reference, chainId: image.chainId, ms: this.#clock.now() - started }, 'image unpacked');
    return image;
  }

  async #umoci(args: string[], what: string, timeoutMs = 60_000): Promise<void> {
    const result = await runTool(UMOCI, args, { timeoutMs, clock: this.#clock });
    if (result.code !== 0) {
      throw new AsbError(result.timedOut ? 'Timeout' : 'Internal', `umoci could not ${what}: ${result.timedOut ? `not done within ${timeoutMs} ms` : toolMessage(result.stderr)}`);
    }
  }

  #blob(digest: string): string {
    const [algorithm, hex] = digest.split(':');
    return join(this.#layout, 'blobs', algorithm ?? '', hex ?? '');
  }

  #read(tag: string, idMap?: IdMap): CachedImage | undefined {
    let stored: StoredImage;
    try {
      stored = readJson(join(this.#opts.root, 'images', `${tag}.json`)) as StoredImage;
    } catch (err) {
      // Never pulled, or removed by a GC (in this or another process) since the caller looked.
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw err;
    }
    return { ...stored, rootfs: this.#rootfsPath(stored.chainId, idMap) };
  }
}

/** The layout tag of a reference: umoci tags allow no `/` or `:`, so a hash names it. */
export function layoutTag(reference: string): string {
  return `r${createHash('sha256').update(reference).digest('hex').slice(0, 32)}`;
}

/** Docker's chain ID: chain(L1) = diffID(L1); chain(L1..n) = sha256(chain(L1..n-1) + " " + diffID(Ln)). */
export function chainIdOf(diffIds: readonly string[]): string {
  let chain: string | undefined;
  for (const diffId of diffIds) chain = chain === undefined ? diffId : `sha256:${createHash('sha256').update(`${chain} ${diffId}`).digest('hex')}`;
  return chain ?? `sha256:${createHash('sha256').update('').digest('hex')}`;
}

function rootfsDir(chainId: string, idMap: IdMap | undefined): string {
  return idMap === undefined ? chainDirOf(chainId) : `${chainDirOf(chainId)}_u${idMap.hostId}-${idMap.size}`;
}

/** images/<key>.json: the rootfs path is not stored, so the cache can move. */
type StoredImage = Omit<CachedImage, 'rootfs'>;

/** The registry's answer, sorted into our codes. */
function classify(message: string): ErrorCode {
  if (/manifest unknown|name unknown|not found|does not exist/i.test(message)) return 'NotFound';
  if (/unauthorized|authentication required|denied|forbidden/i.test(message)) return 'Forbidden';
  return 'Unavailable';
}

function readJson(path: string): unknown {
  return JSON.parse(readFileSync(path, 'utf8'));
}
