// The build service one worker runs (contract.ts BuildService): template records and their
// builds (records.ts, persisted), the team's uploaded files (files.ts), and the SandboxTemplates
// each successful build makes or updates (template-objects.ts, which also says how tags pin
// builds). The engine turns steps into an image; this service resolves names (template-names.ts),
// enforces the limits, keeps the logs (build-log.ts) and owns the outcome.
//
// Names: a template's id and its name (unique within its team) both find it, the team's only:
// another team's ids and names answer as absent everywhere (status, logs, files, from_template,
// delete).
//
// Limits (build-limits.ts): past its time or disk limit a build ends as error, and a template whose
// first build failed has no SandboxTemplate, so nothing can start from a partial result.
import { AsbError, isAsbError } from '../errors.ts';
import { newSandboxId } from '../api/ids.ts';
import { LABEL, SandboxTemplateType, type SandboxTemplate } from '../api/types.ts';
import { DEFAULT_EGRESS_POLICY, type EgressPolicy } from '../network/egress-policy.ts';
import { narrowEgress } from './build-egress.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Clock, Timer } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { BuildEngine, BuildLogEntry, BuildService, BuildSpec, BuildStatus, BuildStep } from './contract.ts';
import type { TeamFileStore } from './files.ts';
import { DEFAULT_BUILD_LIMITS, type BuildLimits } from './build-limits.ts';
import { INTERRUPTED, MAX_BUILDS, RecordFiles, type BuildRecord, type TemplateRecord } from './records.ts';
import { appendLog, callerMessage, callerStep, errorMessage, stepOf } from './build-log.ts';
import { checkSteps } from './wire-steps.ts';
import { pinnedTemplateName } from './template-object.ts';
import { TemplateObjects } from './template-objects.ts';
import { checkTemplateName, OBJECT_NAME, splitName } from './template-names.ts';

/** How often uploaded files past their age are looked for: hourly (ages are days). */
const FILE_SWEEP_MS = 3600_000;

export interface TemplateBuildsOptions {
  /** A private directory of the worker's data dir for the records. */
  recordsDir: string;
  files: TeamFileStore;
  store: ObjectStore;
  /** Undefined: this worker builds nothing (starts answer 503), templates are still listed. */
  engine: BuildEngine | undefined;
  namespace: string;
  clusterTag: string;
  clock: Clock;
  log: Logger;
  limits?: Partial<BuildLimits>;
  /** The runtime class RUN steps run under (the worker's default when absent). */
  runtimeClassName?: string;
  /** What the build sandbox may reach (the worker's --build-egress); absent: a sandbox's default. */
  egress?: EgressPolicy;
  /** Called after a SandboxTemplate was written or deleted (the worker tells the hub). */
  onTemplatesChanged?: () => void;
}

interface Running {
  abort: AbortController;
  done: Promise<void>;
}

export class TemplateBuilds implements BuildService {
  readonly files: TeamFileStore;
  readonly limits: BuildLimits;
  readonly #o: TemplateBuildsOptions;
  readonly #records: RecordFiles;
  readonly #templates = new Map<string, TemplateRecord>();
  readonly #running = new Map<string, Running>();
  #closed = false;
  #sweep: Timer | undefined;
  readonly #objects: TemplateObjects;
  #pinsSynced: Promise<void>;

  constructor(opts: TemplateBuildsOptions) {
    this.#o = opts;
    this.files = opts.files;
    this.limits = Object.freeze({ ...DEFAULT_BUILD_LIMITS, ...opts.limits });
    this.#records = new RecordFiles(opts.recordsDir);
    for (const rec of this.#records.load(this.#isoNow())) this.#templates.set(rec.templateId, rec);
    this.#objects = new TemplateObjects({ store: opts.store, namespace: opts.namespace, log: opts.log });
    this.#sweepFiles();
    // Pins out of step with their record are brought in step once at start, and the hub told.
    this.#pinsSynced = this.#objects.syncStale((id) => this.#templates.get(id)).then((stale) => {
      if (stale > 0) this.#o.onTemplatesChanged?.();
    });
  }

  /** Uploaded files unused past their age go now and every FILE_SWEEP_MS after. */
  #sweepFiles(): void {
    if (this.#closed) return;
    try {
      const removed = this.files.sweep();
      if (removed > 0) this.#o.log.info({ removed }, 'removed uploaded build files unused past their age');
    } catch (err) {
      this.#o.log.warn({ err }, 'cannot sweep uploaded build files');
    }
    this.#sweep = this.#o.clock.after(FILE_SWEEP_MS, () => this.#sweepFiles());
  }

  #isoNow(): string {
    return new Date(this.#o.clock.now()).toISOString();
  }

  get namespace(): string {
    return this.#o.namespace;
  }

  /**
   * The layer cache keys of every build a tag names (`default` included): the steps a live
   * template is made of, which the cache's collection keeps (layer-cache.ts).
   */
  liveCacheKeys(): Set<string> {
    const keys = new Set<string>();
    for (const rec of this.#templates.values()) {
      const live = new Set(Object.values(rec.tags));
      for (const b of rec.builds) if (live.has(b.buildId)) for (const k of b.cacheKeys ?? []) keys.add(k);
    }
    return keys;
  }

  /** The team's template by id, name or name:tag; another team's is undefined. */
  find(team: string, idOrName: string): TemplateRecord | undefined {
    const byId = this.#templates.get(idOrName);
    if (byId !== undefined) return byId.team === team ? byId : undefined;
    const { name, tag } = splitName(idOrName);
    for (const rec of this.#templates.values()) {
      if (rec.team === team && rec.name === name && (tag === undefined || tag === 'default' || Object.hasOwn(rec.tags, tag))) return rec;
    }
    return undefined;
  }

  /** The team a template id belongs to (for a signed upload, which carries no API key). */
  templateTeam(templateId: string): string | undefined {
    return this.#templates.get(templateId)?.team;
  }

  list(team: string): TemplateRecord[] {
    return [...this.#templates.values()].filter((r) => r.team === team).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }

  build(rec: TemplateRecord, buildId: string): BuildRecord | undefined {
    return rec.builds.find((b) => b.buildId === buildId);
  }

  /**
   * E2B's POST /v3/templates: the team's template of that name (made if new) and a new build of it,
   * waiting for its steps. `cpuCount`/`memoryMB` become the template's when given.
   */
  createTemplate(team: string, req: { name: string; tags?: string[]; cpuCount?: number; memoryMB?: number }): { template: TemplateRecord; build: BuildRecord } {
    const { name, tag } = checkTemplateName(req.name);
    const tags = [...new Set([...(tag === undefined ? [] : [tag]), ...(req.tags ?? [])])];
    for (const t of tags) checkTemplateName(`x:${t}`, 'tags');
    const cpu = req.cpuCount ?? undefined;
    const mem = req.memoryMB ?? undefined;
    if (cpu !== undefined && (!Number.isInteger(cpu) || cpu < 1 || cpu > this.limits.maxCpuCount)) throw new AsbError('BadRequest', `cpuCount must be an integer from 1 to ${String(this.limits.maxCpuCount)}, got ${String(cpu)}`);
    if (mem !== undefined && (!Number.isInteger(mem) || mem < 128 || mem > this.limits.maxMemoryMB)) throw new AsbError('BadRequest', `memoryMB must be an integer from 128 to ${String(this.limits.maxMemoryMB)}, got ${String(mem)}`);
    const now = this.#isoNow();
    let rec = this.find(team, name);
    if (rec === undefined) {
      rec = { templateId: newSandboxId(this.#o.clusterTag), team, name, tags: {}, cpuCount: cpu ?? this.limits.defaultCpuCount, memoryMB: mem ?? this.limits.defaultMemoryMB, createdAt: now, updatedAt: now, builds: [] };
      this.#templates.set(rec.templateId, rec);
    }
    if (cpu !== undefined) rec.cpuCount = cpu;
    if (mem !== undefined) rec.memoryMB = mem;
    const build: BuildRecord = { buildId: crypto.randomUUID(), phase: 'waiting', createdAt: now, updatedAt: now, cpuCount: rec.cpuCount, memoryMB: rec.memoryMB, logs: [], logsDropped: 0 };
    rec.builds.push(build);
    // The tags name this build once it is ready (E2B assigns them at request time; ours move on success).
    build.pendingTags = tags;
    this.#trimBuilds(rec);
    rec.updatedAt = now;
    this.#records.save(rec);
    return { template: rec, build };
  }

  #trimBuilds(rec: TemplateRecord): void {
    const tagged = new Set(Object.values(rec.tags));
    while (rec.builds.length > MAX_BUILDS) {
      const i = rec.builds.findIndex((b) => b.buildId !== rec.readyBuildId && !tagged.has(b.buildId) && b.phase !== 'building' && b.phase !== 'waiting');
      if (i === -1) return;
      rec.builds.splice(i, 1);
    }
  }

  /** The image of a template a build starts from: the team's (ready) template, else an unowned SandboxTemplate. */
  async #fromTemplate(team: string, ref: string): Promise<string> {
    const rec = this.find(team, ref);
    if (rec !== undefined) {
      // `name:tag` builds on the build the tag names, `name` on the default one.
      const { tag } = splitName(ref);
      const buildId = tag === undefined || tag === 'default' ? rec.readyBuildId : rec.tags[tag];
      const ready = buildId === undefined ? undefined : this.build(rec, buildId);
      if (ready?.image === undefined) throw new AsbError('BadRequest', `fromTemplate "${ref}" has no successful build yet to build on`);
      return ready.image;
    }
    const obj = OBJECT_NAME.test(ref) ? await this.#o.store.tryGet<SandboxTemplate>(SandboxTemplateType, this.#o.namespace, ref) : undefined;
    const owner = obj?.metadata.labels?.[LABEL.owner];
    const image = obj?.spec.podTemplate.spec.containers[0]?.image;
    if (obj === undefined || (owner !== undefined && owner !== team) || typeof image !== 'string') throw new AsbError('BadRequest', `fromTemplate "${ref}": no such template of this team`);
    return image;
  }

  buildEgress(spec: BuildSpec): EgressPolicy | undefined {
    return spec.egress === undefined ? this.#o.egress : narrowEgress(spec.egress, this.#o.egress ?? DEFAULT_EGRESS_POLICY, 'egress');
  }

  /**
   * `prelude`: steps run before the caller's (E2B's build API makes its `user`), numbered as the
   * base: logs and failures name the caller's steps by the caller's numbers.
   */
  async start(team: string, templateId: string, buildId: string, spec: BuildSpec, prelude: readonly BuildStep[] = []): Promise<void> {
    if (this.#closed) throw new AsbError('Unavailable', 'the build service is shutting down');
    const rec = this.find(team, templateId);
    const build = rec === undefined ? undefined : this.build(rec, buildId);
    if (rec === undefined || build === undefined) throw new AsbError('NotFound', `build ${buildId} of template ${templateId} not found`);
    if (build.phase !== 'waiting') throw new AsbError('Conflict', `build ${buildId} was already started (it is ${build.phase}); request a new build with POST /v3/templates`);
    const engine = this.#o.engine;
    if (engine === undefined) throw new AsbError('Unavailable', 'this worker has no build engine: template builds are not available here');
    // Every check before any state changes: a bad request leaves the build waiting, as it was.
    const steps = checkSteps(spec.steps, team, this.files);
    const baseImage = 'image' in spec.from ? checkImage(spec.from.image) : await this.#fromTemplate(team, spec.from.template);
    if (spec.startCmd !== undefined && spec.startCmd.includes('\0')) throw new AsbError('BadRequest', 'startCmd may not contain NUL bytes');
    if (spec.readyCmd !== undefined && spec.readyCmd.includes('\0')) throw new AsbError('BadRequest', 'readyCmd may not contain NUL bytes');
    const egress = this.buildEgress(spec);
    // Another start may have won while this one awaited fromTemplate's read.
    if (phaseOf(build) !== 'waiting') throw new AsbError('Conflict', `build ${buildId} was already started`);
    const now = this.#isoNow();
    build.phase = 'building';
    build.spec = { ...spec, steps };
    if (prelude.length > 0) build.stepOffset = prelude.length;
    build.updatedAt = now;
    this.#records.save(rec);
    const abort = new AbortController();
    const key = `${rec.templateId}/${buildId}`;
    const done = this.#run(engine, rec, build, baseImage, [...prelude, ...steps], spec, egress, abort).finally(() => this.#running.delete(key));
    this.#running.set(key, { abort, done });
  }

  async #run(engine: BuildEngine, rec: TemplateRecord, build: BuildRecord, baseImage: string, steps: BuildSpec['steps'], spec: BuildSpec, egress: EgressPolicy | undefined, abort: AbortController): Promise<void> {
    const limits = this.limits;
    const timer = this.#o.clock.after(limits.timeoutMs, () => {
      abort.abort(new AsbError('Timeout', `the build exceeded its time limit of ${String(Math.round(limits.timeoutMs / 1000))} s`));
    });
    appendLog(build, this.#isoNow(), { level: 'info', message: `Building template ${rec.name} (${rec.templateId}) from ${baseImage}, ${String(steps.length)} steps` });
    try {
      for (const s of steps) if (s.filesHash !== undefined) this.files.touch(rec.team, s.filesHash);
      const result = await engine.build({
        team: rec.team,
        baseImage,
        steps,
        noCache: spec.noCache === true,
        target: { repository: `templates/${rec.templateId}`, tag: build.buildId },
        ...(this.#o.runtimeClassName === undefined ? {} : { runtimeClassName: this.#o.runtimeClassName }),
        ...(egress === undefined ? {} : { egress }),
        limits: { cpu: build.cpuCount, memoryBytes: build.memoryMB * 1024 * 1024, diskBytes: limits.diskBytes, timeoutMs: limits.timeoutMs },
        files: this.files,
        log: (entry) => appendLog(build, this.#isoNow(), entry),
        signal: abort.signal,
      });
      if (abort.signal.aborted) throw abort.signal.reason;
      build.image = result.image;
      build.config = result.config;
      if (result.cacheKeys !== undefined) build.cacheKeys = result.cacheKeys;
      const pending = build.pendingTags ?? [];
      // The pin first: a build whose objects cannot be written fails with the tags as they were.
      if (pending.some((t) => t !== 'default')) await this.#objects.write(rec, build, true, pending.filter((t) => t !== 'default'));
      await this.#objects.write(rec, build, false);
      for (const t of pending) rec.tags[t] = build.buildId;
      rec.tags.default = build.buildId;
      rec.readyBuildId = build.buildId;
      build.phase = 'ready';
      // Pins a requested tag moved off an older build lose it (and go when no tag is left).
      await this.#objects.sync(rec);
      this.#o.onTemplatesChanged?.();
      appendLog(build, this.#isoNow(), { level: 'info', message: `Build finished: ${String(result.cachedSteps)} of ${String(steps.length)} steps from the cache; image ${result.image}` });
    } catch (err) {
      // An aborted build says why it was stopped (time limit, restart, deletion), whatever the engine threw.
      const reason = abort.signal.aborted ? errorMessage(abort.signal.reason) : errorMessage(err);
      build.phase = 'error';
      delete build.image;
      delete build.config;
      delete build.cacheKeys;
      const step = stepOf(err);
      const callers = callerStep(build, step);
      const message = callerMessage(build, reason);
      build.reason = callers === undefined ? { message } : { message, step: callers };
      appendLog(build, this.#isoNow(), { level: 'error', message: `Build failed: ${reason}`, ...(step === undefined ? {} : { step }) });
      if (!isAsbError(err)) this.#o.log.error({ err, templateId: rec.templateId, buildId: build.buildId }, 'build failed unexpectedly');
      // A pin written before the template's own object failed names no tag: it goes.
      if (this.#templates.has(rec.templateId)) await this.#objects.sync(rec);
    } finally {
      timer.cancel();
      const now = this.#isoNow();
      build.finishedAt = now;
      build.updatedAt = now;
      rec.updatedAt = now;
      delete build.pendingTags;
      if (this.#templates.has(rec.templateId)) this.#records.save(rec);
    }
  }

  /**
   * The SandboxTemplate a create of `ref` (`name`, `name:tag`, or the template id with either)
   * starts for the team: the template's own for no tag or `default`, the pin of the build the tag
   * names otherwise; undefined when the team has no such template, tag or ready build.
   */
  templateObjectFor(team: string, ref: string): string | undefined {
    const { name, tag } = splitName(ref);
    const rec = this.find(team, name);
    if (rec === undefined) return undefined;
    if (tag === undefined || tag === 'default') return rec.readyBuildId === undefined ? undefined : rec.templateId;
    const buildId = rec.tags[tag];
    return buildId === undefined ? undefined : pinnedTemplateName(rec.templateId, buildId);
  }

  status(team: string, templateId: string, buildId: string): BuildStatus | undefined {
    const rec = this.find(team, templateId);
    const b = rec === undefined ? undefined : this.build(rec, buildId);
    if (rec === undefined || b === undefined) return undefined;
    return { templateId: rec.templateId, buildId, phase: b.phase, ...(b.reason === undefined ? {} : { reason: b.reason }), ...(b.image === undefined ? {} : { image: b.image }) };
  }

  logs(team: string, templateId: string, buildId: string, offset: number): BuildLogEntry[] {
    const rec = this.find(team, templateId);
    const b = rec === undefined ? undefined : this.build(rec, buildId);
    if (b === undefined) return [];
    return b.logs.slice(Math.max(0, offset - b.logsDropped));
  }

  /** Deletes the team's template: its running build stops, its SandboxTemplate and record go, and the team's files with its last template. */
  async delete(team: string, idOrName: string): Promise<boolean> {
    const rec = this.find(team, idOrName);
    if (rec === undefined) return false;
    this.#templates.delete(rec.templateId);
    for (const b of rec.builds) {
      const running = this.#running.get(`${rec.templateId}/${b.buildId}`);
      running?.abort.abort(new AsbError('Conflict', 'the template was deleted'));
      await running?.done;
    }
    await this.#objects.delete(rec.templateId);
    for (const pin of await this.#objects.pins(rec)) await this.#objects.delete(pin.metadata.name);
    this.#records.remove(rec.templateId);
    this.#o.onTemplatesChanged?.();
    if (this.list(team).length === 0) this.files.removeTeam(team);
    return true;
  }

  /**
   * Points tags at the build `target` names (`name:tag`, or `name` for its default build): a
   * create of `name:tag` starts that build from now on. `default` moves what `name` starts.
   * The build's pin is written before any tag moves; a failure leaves every tag as it was.
   */
  async assignTags(team: string, target: string, tags: string[]): Promise<{ buildId: string; tags: string[] }> {
    const { tag } = splitName(target);
    const rec = this.find(team, target);
    const buildId = rec === undefined ? undefined : tag === undefined ? rec.readyBuildId : rec.tags[tag];
    const build = rec === undefined || buildId === undefined ? undefined : this.build(rec, buildId);
    if (rec === undefined || buildId === undefined || build?.phase !== 'ready') throw new AsbError('NotFound', `template "${target}" not found or has no ready build`);
    for (const t of tags) checkTemplateName(`x:${t}`, 'tags');
    if (tags.some((t) => t !== 'default')) await this.#objects.makePin(rec, buildId, tags.filter((t) => t !== 'default'));
    if (tags.includes('default')) {
      await this.#objects.write(rec, build, false);
      rec.readyBuildId = buildId;
    }
    for (const t of tags) rec.tags[t] = buildId;
    rec.updatedAt = this.#isoNow();
    this.#records.save(rec);
    await this.#objects.sync(rec);
    this.#o.onTemplatesChanged?.();
    return { buildId, tags };
  }

  /** Removes tags of the template; a build no tag names any more loses its pin. `default` stays: it is what `name` starts. */
  async removeTags(team: string, name: string, tags: string[]): Promise<void> {
    const rec = this.find(team, splitName(name).name);
    if (rec === undefined) throw new AsbError('NotFound', `template "${name}" not found`);
    if (tags.includes('default')) throw new AsbError('BadRequest', `tag "default" cannot be removed: it names the build "${rec.name}" starts; assign it to another build instead`);
    rec.tags = Object.fromEntries(Object.entries(rec.tags).filter(([t]) => !tags.includes(t)));
    rec.updatedAt = this.#isoNow();
    this.#records.save(rec);
    await this.#objects.sync(rec);
    this.#o.onTemplatesChanged?.();
  }

  /** Stops every running build (each ends as error "interrupted by a worker restart") and waits. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#sweep?.cancel();
    await this.#pinsSynced;
    const running = [...this.#running.values()];
    for (const r of running) r.abort.abort(new AsbError('Unavailable', INTERRUPTED));
    await Promise.allSettled(running.map((r) => r.done));
  }
}

function phaseOf(b: BuildRecord): BuildRecord['phase'] {
  return b.phase;
}

function checkImage(image: string): string {
  if (image.trim() === '' || /\s/.test(image) || image.length > 512) throw new AsbError('BadRequest', `fromImage "${image}" is not an image reference`);
  return image;
}
