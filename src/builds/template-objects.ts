// The SandboxTemplates of the built templates in the store (each made by template-object.ts):
// a template's own, and a pin for each build a tag other than `default` names.
//
// Tags: a template's record maps each tag to a build. `default` names the build the template's
// own SandboxTemplate runs, what `name` starts: each successful build takes it (and the tags it
// was requested with), and an assignment of `default` moves it back (a rollback). Every other tag
// pins its build: that build has a SandboxTemplate of its own (pinnedTemplateName), made before
// the tag names it and deleted once no tag does, so `name:tag` starts the build the tag names now,
// and a build a tag names is never trimmed from the record. Each pin carries the tags that name
// its build (TEMPLATE_TAGS_ANNOTATION), kept in step with the record after every change: the pins
// sync through the hub, so `name:tag` starts on every cluster.
import { AsbError, isAsbError } from '../errors.ts';
import { LABEL, SandboxTemplateType, type SandboxTemplate } from '../api/types.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Logger } from '../base/log.ts';
import type { BuildRecord, TemplateRecord } from './records.ts';
import { builtTemplateObject, tagsAnnotation, TEMPLATE_ID_LABEL, TEMPLATE_PIN_LABEL, TEMPLATE_TAGS_ANNOTATION } from './template-object.ts';

export interface TemplateObjectsOptions {
  store: ObjectStore;
  namespace: string;
  log: Logger;
}

export class TemplateObjects {
  readonly #store: ObjectStore;
  readonly #namespace: string;
  readonly #log: Logger;

  constructor(opts: TemplateObjectsOptions) {
    this.#store = opts.store;
    this.#namespace = opts.namespace;
    this.#log = opts.log;
  }

  /**
   * At start: pins out of step with their record (made before pins carried their tags, or left by
   * a sync that failed) are brought in step; returns how many templates had one (the service
   * then tells the hub, with the next `built` set). One list of the namespace's pins per start;
   * nothing is written when every pin is in step.
   */
  async syncStale(find: (templateId: string) => TemplateRecord | undefined): Promise<number> {
    let pins: SandboxTemplate[];
    try {
      pins = (await this.#store.list<SandboxTemplate>(SandboxTemplateType, { namespace: this.#namespace, labelSelector: TEMPLATE_PIN_LABEL })).items;
    } catch (err) {
      this.#log.warn({ err }, 'cannot list the SandboxTemplates of tagged builds to bring them in step with their tags');
      return 0;
    }
    const stale = new Set<TemplateRecord>();
    for (const pin of pins) {
      const rec = find(pin.metadata.labels?.[TEMPLATE_ID_LABEL] ?? '');
      if (rec === undefined || pin.metadata.labels?.[LABEL.owner] !== rec.team) continue;
      const tags = tagsAnnotation(tagsOf(rec, pin.metadata.labels[TEMPLATE_PIN_LABEL] ?? ''));
      if (pin.metadata.annotations?.[TEMPLATE_TAGS_ANNOTATION] !== tags) stale.add(rec);
    }
    await Promise.all([...stale].map((rec) => this.sync(rec)));
    return stale.size;
  }

  /** Writes the template's own SandboxTemplate (pinned false) or the build's pin, naming `tags`, from the build's record. */
  async write(rec: TemplateRecord, build: BuildRecord, pinned: boolean, tags: readonly string[] = []): Promise<void> {
    const { image, config, spec } = build;
    if (image === undefined || config === undefined) throw new AsbError('Conflict', `build ${build.buildId} of template "${rec.name}" has no recorded image config (it was built before tags pinned builds): build it again, then tag that build`);
    const obj = builtTemplateObject({
      namespace: this.#namespace,
      templateId: rec.templateId,
      team: rec.team,
      name: rec.name,
      buildId: build.buildId,
      image,
      config,
      ...(spec?.startCmd === undefined ? {} : { startCmd: spec.startCmd }),
      ...(spec?.readyCmd === undefined ? {} : { readyCmd: spec.readyCmd }),
      cpuCount: build.cpuCount,
      memoryMB: build.memoryMB,
      pinned,
      ...(pinned ? { tags } : {}),
    });
    const store = this.#store;
    for (let attempt = 0; ; attempt++) {
      const existing = await store.tryGet<SandboxTemplate>(SandboxTemplateType, this.#namespace, obj.metadata.name);
      try {
        if (existing === undefined) await store.create(SandboxTemplateType, obj);
        else await store.update(SandboxTemplateType, { ...obj, metadata: { ...existing.metadata, labels: obj.metadata.labels ?? {}, annotations: { ...existing.metadata.annotations, ...obj.metadata.annotations } } });
        return;
      } catch (err) {
        if (attempt >= 3 || !(isAsbError(err, 'Conflict') || isAsbError(err, 'AlreadyExists'))) throw err;
      }
    }
  }

  /** The pinned builds' SandboxTemplates of a template (the team's only). */
  async pins(rec: TemplateRecord): Promise<SandboxTemplate[]> {
    const page = await this.#store.list<SandboxTemplate>(SandboxTemplateType, { namespace: this.#namespace, labelSelector: `${LABEL.owner}=${rec.team},${TEMPLATE_ID_LABEL}=${rec.templateId},${TEMPLATE_PIN_LABEL}` });
    return page.items;
  }

  /**
   * Makes the pin of `buildId`, naming its tags and `more` (the tags about to name it), or adds
   * `more` to the pin it has; throws when it cannot be written.
   */
  async makePin(rec: TemplateRecord, buildId: string, more: readonly string[]): Promise<void> {
    const tags = [...tagsOf(rec, buildId), ...more];
    const pin = (await this.pins(rec)).find((o) => o.metadata.labels?.[TEMPLATE_PIN_LABEL] === buildId);
    if (pin !== undefined) return this.#setTags(pin, tags);
    const build = rec.builds.find((b) => b.buildId === buildId);
    if (build === undefined) throw new AsbError('NotFound', `build ${buildId} of template "${rec.name}" not found`);
    await this.write(rec, build, true, tags);
  }

  /** Writes `tags` into the pin's annotation when they differ (read again on a conflict). */
  async #setTags(pin: SandboxTemplate, tags: readonly string[]): Promise<void> {
    const value = tagsAnnotation(tags);
    const store = this.#store;
    let obj: SandboxTemplate | undefined = pin;
    for (let attempt = 0; obj !== undefined && obj.metadata.annotations?.[TEMPLATE_TAGS_ANNOTATION] !== value; attempt++) {
      try {
        await store.update(SandboxTemplateType, { ...obj, metadata: { ...obj.metadata, annotations: { ...obj.metadata.annotations, [TEMPLATE_TAGS_ANNOTATION]: value } } });
        return;
      } catch (err) {
        if (attempt >= 3 || !isAsbError(err, 'Conflict')) throw err;
        obj = await store.tryGet<SandboxTemplate>(SandboxTemplateType, this.#namespace, pin.metadata.name);
      }
    }
  }

  /**
   * Brings the pins in step with the record: a pin no tag names goes, the others name exactly
   * their build's tags. A failure is logged and left for the next change (meanwhile a pin may
   * start by a tag that moved, on the clusters that resolve tags from pins).
   */
  async sync(rec: TemplateRecord): Promise<void> {
    try {
      for (const o of await this.pins(rec)) {
        const tags = tagsOf(rec, o.metadata.labels?.[TEMPLATE_PIN_LABEL] ?? '');
        if (tags.length === 0) await this.delete(o.metadata.name);
        else await this.#setTags(o, tags);
      }
    } catch (err) {
      this.#log.warn({ err, templateId: rec.templateId }, 'cannot bring the SandboxTemplates of tagged builds in step with their tags');
    }
  }

  /** Deletes the SandboxTemplate `name`; one already gone is no error. */
  async delete(name: string): Promise<void> {
    try {
      await this.#store.delete(SandboxTemplateType, this.#namespace, name);
    } catch (err) {
      if (!isAsbError(err, 'NotFound')) throw err;
    }
  }
}

/** The tags other than `default` that name `buildId`: what its pin carries. */
function tagsOf(rec: TemplateRecord, buildId: string): string[] {
  return Object.entries(rec.tags).filter(([t, id]) => t !== 'default' && id === buildId).map(([t]) => t);
}
