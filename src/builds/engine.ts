// The template build engine (contract.ts's BuildEngine): steps → an image in the registry the
// worker's pods pull from. One engine for both runtimes; what differs is how a step's changes are
// read and where the base image comes from:
// - Isolation: RUN, COPY and WORKDIR run in a build sandbox (build-pod.ts), a pod of the worker's
//   own runtime with a sandbox's own isolation, never on the host; a USER step is checked there
//   against the image's passwd and group files (build-pod.ts resolveUser), so an unknown name
//   fails that step. On the local runtime the host reads the sandbox's writable layer, while its
//   disk is frozen, without following a link (layer-diff.ts, layer-writer.ts); on Kubernetes the
//   Pod's disk is a node's, so the Pod lists and archives its own changes and this process reads
//   that archive as hostile input (pod-layers.ts). The base image: the local runtime's image
//   cache, or the registry's HTTP API (base-image.ts).
// - Layers: after each such step, what it changed in the pod's overlay upper dir (and, locally,
//   in the directories the runtime binds over the image's: gVisor's /tmp) becomes an OCI layer (a
//   step that changed nothing makes none). ENV, WORKDIR and USER change the config.
// - Cache (layer-cache.ts): each step's key names its parent, itself, its files and the config it
//   runs with (steps.ts); the first steps found in the team's cache run nothing. When every step
//   is found no sandbox starts; when the first k are, the sandbox starts from their image (pushed
//   by digest, no tag). `force` on a step and `noCache` rebuild from there on.
// - Failure: a step that fails, passes a limit or is cancelled rejects with BuildFailed naming it;
//   the sandbox is removed and neither a tag nor that step's cache entry is left.
// Why a sandbox per build rather than buildah: buildah runs RUN steps with its own (weaker,
// rootless or host-root) isolation, not a sandbox's runtime class, seccomp, egress and limits;
// here the same runtime runs both, so a build step escapes no more than a sandbox does.
import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AsbError, isAsbError } from '../errors.ts';
import type { ImageStore } from '../images/image-store.ts';
import { parseImageReference } from '../images/reference.ts';
import { authForHost, basicAuthorization, type RegistriesConfig } from '../images/registries.ts';
import type { PodRuntime } from '../runtime/runtime.ts';
import { ensureCBinary } from '../base/c-binary.ts';
import { privateDir } from '../base/private-files.ts';
import { copyInPod, resolveUser, runInPod, startBuildPod, type StepRun } from './build-pod.ts';
import type { BuildEngine, BuildStep, EngineRequest, EngineResult } from './contract.ts';
import { cachedBase, registryBase, type BaseImages } from './base-image.ts';
import { assembleImage, type BuiltStep } from './image-assembly.ts';
import { LayerCache } from './layer-cache.ts';
import { diffUpper, opaqueReader, walkUpper, type LayerFiles, type UpperNode, type UpperState } from './layer-diff.ts';
import { writeLayer, type LayerBlob } from './layer-writer.ts';
import { openPodLayers, type PodLayers } from './pod-layers.ts';
import { pushImage, type PushBlob } from './registry-push.ts';
import { nextConfig, stepKey, stepName, validateSteps, type BuildConfig } from './steps.ts';

export interface LocalBuildEngineOptions {
  runtime: PodRuntime;
  /** The image cache the runtime pulls into: the base image's manifest, config and layers are read from it. */
  images: ImageStore;
  /** host:port of the registry `target.repository` is in, reached over plain HTTP (a registry on this machine). */
  registry: string;
  /** The engine's own 0700 directory under the worker's state dir: the layer cache and its helper live here. */
  stateDir: string;
}

export interface KubeBuildEngineOptions {
  /** The Kubernetes runtime: build sandboxes are Pods of the cluster, like any sandbox. */
  runtime: PodRuntime;
  /** Where base images are read (the worker's --registries: mirrors, plain-HTTP hosts), and the credentials of those and of `registry` (its `auths`). */
  registries: RegistriesConfig;
  /** host:port images are pushed to (--build-registry). */
  registry: string;
  /** The registry as the cluster's nodes name it in a Pod's image (--build-registry-pull); default `registry`. */
  pullRegistry?: string;
  /** Push over HTTPS; default plain HTTP (a registry in the cluster's own network). */
  https?: boolean;
  stateDir: string;
}

interface EngineOptions {
  runtime: PodRuntime;
  base: BaseImages;
  registry: string;
  pullRegistry: string;
  https: boolean;
  /** The `Authorization` header of the push registry (its credentials in the worker's --registries), if any. */
  pushAuthorization?: string;
  stateDir: string;
  /** How a step's changes are read: the pod's upper dir on this host, or the pod's own listing and archive. */
  layers: 'upper-dir' | 'in-pod';
}

const TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const REPOSITORY = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;

export function createLocalBuildEngine(opts: LocalBuildEngineOptions): SandboxBuildEngine {
  return new SandboxBuildEngine({ runtime: opts.runtime, base: cachedBase(opts.images, opts.registry), registry: opts.registry, pullRegistry: opts.registry, https: false, stateDir: opts.stateDir, layers: 'upper-dir' });
}

/**
 * On the Kubernetes runtime: build sandboxes are Pods on the cluster (its RuntimeClass, user
 * namespace, seccomp, limits and NetworkPolicy egress, as every sandbox there), their layers read
 * from inside them, the image pushed to --build-registry and named as the nodes pull it.
 */
export function createKubeBuildEngine(opts: KubeBuildEngineOptions): SandboxBuildEngine {
  const pushAuthorization = basicAuthorization(authForHost(opts.registry, opts.registries));
  return new SandboxBuildEngine({ runtime: opts.runtime, base: registryBase(opts.registries, opts.registry), registry: opts.registry, pullRegistry: opts.pullRegistry ?? opts.registry, https: opts.https ?? false, ...(pushAuthorization === undefined ? {} : { pushAuthorization }), stateDir: opts.stateDir, layers: 'in-pod' });
}

export type LocalBuildEngine = SandboxBuildEngine;

export class SandboxBuildEngine implements BuildEngine {
  readonly #opts: EngineOptions;
  readonly cache: LayerCache;

  constructor(opts: EngineOptions) {
    this.#opts = opts;
    privateDir(opts.stateDir);
    privateDir(join(opts.stateDir, 'layer-cache'));
    // A worker that died mid-build left its work dirs, and their pins would keep base images for ever.
    rmSync(join(opts.stateDir, 'work'), { recursive: true, force: true });
    this.cache = new LayerCache(join(opts.stateDir, 'layer-cache'));
  }

  async build(req: EngineRequest): Promise<EngineResult> {
    checkRequest(req);
    const timeout = AbortSignal.timeout(req.limits.timeoutMs);
    const signal = AbortSignal.any([req.signal, timeout]);
    let current = -1;
    try {
      return await this.#build(req, signal, (i) => (current = i));
    } catch (err) {
      const at = current >= 0 ? `${stepName(current, req.steps[current] as BuildStep)}: ` : '';
      if (timeout.aborted) throw new AsbError('BuildFailed', `${at}the build passed its time limit of ${String(req.limits.timeoutMs / 1000)} s`, { cause: err });
      if (req.signal.aborted) throw new AsbError('BuildFailed', `${at}the build was cancelled`, { cause: err });
      if (isAsbError(err, 'BuildFailed') && current >= 0 && !err.message.startsWith('step ')) throw new AsbError('BuildFailed', `${at}${err.message}`, { cause: err });
      throw err;
    }
  }

  async #build(req: EngineRequest, signal: AbortSignal, at: (step: number) => void): Promise<EngineResult> {
    const { team, steps } = req;
    const work = join(this.#opts.stateDir, 'work', randomBytes(8).toString('hex'));
    await mkdir(work, { recursive: true, mode: 0o700 });
    let pod: string | undefined;
    try {
      const resolved = await this.#opts.base.resolve(req.baseImage, work, signal);
      const base = resolved.base;
      const baseConfig = (base.config.config ?? {}) as { Env?: string[] | null; WorkingDir?: string; User?: string };
      let config: BuildConfig = {
        env: baseConfig.Env ?? [],
        ...(baseConfig.WorkingDir === undefined || baseConfig.WorkingDir === '' ? {} : { workingDir: baseConfig.WorkingDir }),
        ...(baseConfig.User === undefined || baseConfig.User === '' ? {} : { user: baseConfig.User }),
      };
      const blobsDir = await this.cache.blobsDir(team);
      const push = async (built: BuiltStep[], final: BuildConfig, reference: string): Promise<string> => {
        const image = assembleImage(base, built, final);
        const configPath = join(blobsDir, image.configDigest.replace('sha256:', ''));
        await writeFile(configPath, image.config, { mode: 0o600 });
        const blobs: PushBlob[] = [
          ...resolved.layers,
          ...image.layers.map((l) => ({ digest: l.digest, size: l.size, path: this.cache.blobPath(team, l.digest) })),
          { digest: image.configDigest, size: image.config.length, path: configPath },
        ];
        await pushImage({ registry: this.#opts.registry, https: this.#opts.https, repository: req.target.repository, tag: reference === '' ? image.manifestDigest : reference, ...(this.#opts.pushAuthorization === undefined ? {} : { authorization: this.#opts.pushAuthorization }) }, blobs, image.manifest, image.manifestDigest, signal);
        return image.manifestDigest;
      };
      /** The image as the runtime's pods pull it. */
      const pullName = (digest: string): string => `${this.#opts.pullRegistry}/${req.target.repository}@${digest}`;

      const built: BuiltStep[] = [];
      let parent = resolved.manifestDigest;
      let cached = 0;
      const keys: string[] = [];
      let missed = req.noCache;
      let upper: UpperState | undefined;
      let podLayers: PodLayers | undefined;
      for (const [i, step] of steps.entries()) {
        at(i);
        signal.throwIfAborted();
        const key = stepKey(parent, step, config, req.egress);
        keys.push(key);
        parent = key;
        const createdBy = describe(step);
        if (step.force === true) missed = true;
        const hit = missed ? undefined : await this.cache.get(team, key);
        if (hit !== undefined) {
          req.log({ level: 'info', step: i + 1, message: `CACHED ${createdBy}` });
          built.push({ ...(hit.layer === undefined ? {} : { layer: hit.layer }), createdBy });
          config = hit.config;
          cached++;
          continue;
        }
        missed = true;
        req.log({ level: 'info', step: i + 1, message: createdBy });
        let layer: LayerBlob | undefined;
        const after = nextConfig(config, step);
        if (step.type !== 'ENV') {
          if (pod === undefined) {
            // On Kubernetes the node pulls the base by the digest this process read, never a tag
            // that may have moved since (its layers are the ones the new layers go on).
            const baseAsPulled = this.#opts.layers === 'in-pod' ? byDigest(req.baseImage, resolved.manifestDigest) : req.baseImage;
            const from = built.length === 0 ? baseAsPulled : pullName(await push(built, config, ''));
            pod = await startBuildPod(this.#opts.runtime, from, req.runtimeClassName, req.limits, req.egress, signal);
            if (this.#opts.layers === 'upper-dir') upper = await this.#readUpper(pod, (state) => Promise.resolve(state));
            else podLayers = await openPodLayers(this.#opts.runtime, pod, signal);
          }
          if (step.type === 'USER') {
            // Checked against the image as it is now: a name or group it lacks fails this step, not a later one or the sandbox's start.
            await resolveUser(this.#opts.runtime, pod, after.user);
          } else {
            await this.#runStep(req, pod, i, step, config, after, signal);
            const ended = this.#opts.runtime.state(pod);
            // A step that killed the sandbox's own process (`kill -9 -1` as root) ended the sandbox: its layer is gone with it.
            if (ended.phase !== 'Running') throw new AsbError('BuildFailed', `${stepName(i, step)} ended the build sandbox (${ended.phase}${ended.reason === undefined ? '' : `, ${ended.reason}`}): a step must leave the sandbox's own processes running`);
            if (podLayers !== undefined) {
              layer = await podLayers.next(blobsDir, req.limits.diskBytes, signal);
            } else {
              const before: UpperState = upper ?? new Map<string, UpperNode>();
              const result = await this.#readUpper(pod, async (state, dir, ids) => {
                const changes = diffUpper(before, state);
                return { state, layer: changes.length === 0 ? undefined : await writeLayer(changes, dir, ids, blobsDir, signal) };
              });
              upper = result.state;
              layer = result.layer;
            }
          }
        }
        config = after;
        await this.cache.put(team, key, { ...(layer === undefined ? {} : { layer }), config });
        built.push({ ...(layer === undefined ? {} : { layer }), createdBy });
      }
      at(-1);
      if (pod !== undefined) {
        await this.#opts.runtime.remove(pod);
        pod = undefined;
      }
      const digest = await push(built, config, req.target.tag);
      return {
        image: pullName(digest),
        config: { env: config.env, ...(config.workingDir === undefined ? {} : { workingDir: config.workingDir }), ...(config.user === undefined ? {} : { user: config.user }) },
        cachedSteps: cached,
        cacheKeys: keys,
      };
    } finally {
      if (pod !== undefined) await this.#opts.runtime.remove(pod).catch(() => undefined);
      await this.#opts.base.release(work).catch(() => undefined);
      await rm(work, { recursive: true, force: true });
    }
  }

  async #runStep(req: EngineRequest, pod: string, i: number, step: BuildStep, config: BuildConfig, after: BuildConfig, signal: AbortSignal): Promise<void> {
    const runtime = this.#opts.runtime;
    const line = (message: string): void => req.log({ level: 'info', step: i + 1, message });
    let run: StepRun;
    if (step.type === 'WORKDIR') {
      run = await runInPod(runtime, pod, 'mkdir -p -- "$ASB_DIR"', { user: { uid: 0 }, config: { ...config, workingDir: '/' }, env: { ASB_DIR: after.workingDir ?? '/' }, line, signal });
    } else if (step.type === 'RUN') {
      const user = await resolveUser(runtime, pod, step.args[1] !== undefined && step.args[1] !== '' ? step.args[1] : config.user);
      run = await runInPod(runtime, pod, step.args[0] ?? '', { user, config, line, signal });
    } else {
      const [src = '', dest = '', user = '', mode = ''] = step.args;
      const path = req.files.path(req.team, step.filesHash ?? '');
      if (path === undefined) throw new AsbError('BadRequest', `${stepName(i, step)}: its files ${step.filesHash ?? ''} were never uploaded`);
      run = await copyInPod(runtime, pod, path, { src, dest, mode }, { owner: await resolveUser(runtime, pod, user !== '' ? user : config.user), config, line, signal });
    }
    signal.throwIfAborted();
    if (run.exitCode === 0) return;
    throw new AsbError('BuildFailed', `${stepName(i, step)} failed: ${await this.#why(pod, run, req)}${run.tail.length === 0 ? '' : `; its last output:\n${run.tail.join('\n')}`}`);
  }

  /** Why a step's command failed, in terms of the build's limits when one was passed. */
  async #why(pod: string, run: StepRun, req: EngineRequest): Promise<string> {
    // A sandbox whose own process the step killed may not have said so yet: an exec tells at once.
    const alive = await this.#opts.runtime.exec(pod, { command: ['true'], timeoutMs: 5000 }).then((r) => r.exitCode === 0, () => false);
    const state = this.#opts.runtime.state(pod);
    const usage = await this.#opts.runtime.usage?.(pod).catch(() => undefined);
    const disk = usage?.disk;
    const full = state.reason === 'Evicted' || (disk !== undefined && disk.totalBytes - disk.usedBytes < 2 ** 20) || run.tail.some((l) => /No space left on device/i.test(l));
    if (full) return `it passed the build's disk limit of ${String(Math.round(req.limits.diskBytes / 2 ** 20))} MiB (exit code ${String(run.exitCode)})`;
    if ((!alive || state.phase !== 'Running') && state.reason !== 'OOMKilled') return `it ended the build sandbox (${state.phase}${state.reason === undefined ? '' : `, ${state.reason}`}; exit code ${String(run.exitCode)}): a step must leave the sandbox's own processes running`;
    if (state.reason === 'OOMKilled' || run.signal === 'SIGKILL') return `it was killed (SIGKILL), most likely for passing the build's memory limit of ${String(Math.round(req.limits.memoryBytes / 2 ** 20))} MiB (exit code ${String(run.exitCode)})`;
    if (run.exitCode === 127 && run.tail.some((l) => l.includes('the image has no tar'))) return 'the image has no tar, which a COPY step needs to unpack its files';
    return `its command exited with code ${String(run.exitCode)}`;
  }

  /** The pod's upper dir walked while frozen; `then` runs still frozen, on that walk. */
  async #readUpper<T>(pod: string, then: (state: UpperState, files: LayerFiles, ids: { hostId: number; size: number }) => Promise<T>): Promise<T> {
    const runtime = this.#opts.runtime;
    if (runtime.readWritableLayer === undefined) throw new AsbError('NotImplemented', 'this runtime cannot read a sandbox\'s writable layer: it cannot build templates');
    const helper = await ensureCBinary(this.#opts.stateDir, new URL('./overlay-opaque.c', import.meta.url));
    try {
      return await runtime.readWritableLayer(pod, async (layer) => then(await walkUpper(layer, opaqueReader(helper, layer.dir)), layer, layer.idRange));
    } catch (err) {
      if (isAsbError(err, 'SandboxNotRunning')) throw new AsbError('BuildFailed', 'the build sandbox ended during the step: a step must leave the sandbox\'s own processes running', { cause: err });
      throw err;
    }
  }
}

/** `image` pinned to `digest` (a tag it had is dropped: the digest names the image). */
function byDigest(image: string, digest: string): string {
  const ref = parseImageReference(image);
  return `${ref.registry}/${ref.repository}@${digest}`;
}

/** The request's own fields, checked before anything runs (the steps too). */
function checkRequest(req: EngineRequest): void {
  if (!REPOSITORY.test(req.target.repository)) throw new AsbError('BadRequest', `target repository "${req.target.repository}" is not a registry path (lowercase letters, digits, separators)`);
  if (!TAG.test(req.target.tag)) throw new AsbError('BadRequest', `target tag "${req.target.tag}" must match ${TAG.source}`);
  const { cpu, memoryBytes, diskBytes, timeoutMs } = req.limits;
  for (const [name, value] of [['cpu', cpu], ['memoryBytes', memoryBytes], ['diskBytes', diskBytes], ['timeoutMs', timeoutMs]] as const) {
    if (!Number.isFinite(value) || value <= 0) throw new AsbError('BadRequest', `limits.${name} must be a positive number, got ${String(value)}`);
  }
  validateSteps(req.team, req.steps, req.files);
}

/** How a step shows in the log and the image's history, like `docker history`. */
function describe(step: BuildStep): string {
  switch (step.type) {
    case 'RUN': return `RUN ${step.args[0] ?? ''}${step.args[1] !== undefined && step.args[1] !== '' ? ` (as ${step.args[1]})` : ''}`;
    case 'COPY': return `COPY ${step.args[0] ?? ''} ${step.args[1] ?? ''}`;
    default: return `${step.type} ${step.args.join(' ')}`;
  }
}
