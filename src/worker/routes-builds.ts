// Template builds over our REST API, served by the worker's BuildService (src/builds/contract.ts).
// Any valid key, scoped to its team as sandboxes are: another team's builds and files answer 404
// exactly as absent ones do. Files are the team's, shared by all its templates (the build cache
// is per team); {name} in their path only keeps the routes beside the build's.
//
//   GET  /v1/templates/{name}/files/{sha256}          200 {sha256, present: true} | 404: upload it
//   PUT  /v1/templates/{name}/files/{sha256}          the tar (plain; Content-Encoding gzip allowed);
//                                                     201 stored, 200 already there; 400 when the
//                                                     body's sha256 is another (nothing is stored)
//   POST /v1/templates/{name}/builds                  a BuildSpec → 202 {templateId, buildId, phase};
//                                                     the team's template of that name is made when new;
//                                                     {name} may be name:tag: the tag names the build once
//                                                     it is ready (and name:tag starts it)
//   GET  /v1/built-templates                          200 {items}: the team's built templates, each with
//                                                     its tags, newest build and status (asb template ls)
//   GET  /v1/templates/{name}/builds/{buildId}        200 BuildStatus
//   GET  /v1/templates/{name}/builds/{buildId}/logs?offset=N
//                                                     200 {entries, offset, phase, reason?}: entries
//                                                     from N on, `offset` the next one to ask for
//
// Logs are polled with an offset rather than streamed: the same call works through the edge, the
// hub and any proxy with no long-lived response to hold, and E2B's build API does the same.
import { AsbError } from '../errors.ts';
import { checkBuildSpec, isSha256 } from '../builds/spec-check.ts';
import type { BuildService, BuildStatus, BuiltTemplateView } from '../builds/contract.ts';
import type { FileStore } from '../builds/contract.ts';
import { MAX_FILE_BYTES } from '../builds/files.ts';
import type { TemplateRecord } from '../builds/records.ts';
import type { TemplateBuilds } from '../builds/service.ts';
import { isTaggedName, splitName } from '../builds/template-names.ts';
import { putVerified } from '../builds/verified-upload.ts';
import { principalOf } from './access.ts';
import { isObjectName } from '../api/names.ts';
import { readJson } from '../http/body.ts';
import type { WorkerContext } from './deps.ts';
import { queryInt } from './input.ts';
import type { RequestContext, Route } from '../http/router.ts';
import { discardRest, uploadChunks } from './upload-body.ts';
import type { UploadSlots } from './upload-slots.ts';

export function builtTemplateView(rec: TemplateRecord): BuiltTemplateView {
  const latest = rec.builds.at(-1);
  return {
    name: rec.name,
    templateId: rec.templateId,
    tags: { ...rec.tags },
    latestBuild: latest === undefined ? undefined : { buildId: latest.buildId, phase: latest.phase, createdAt: latest.createdAt, ...(latest.finishedAt === undefined ? {} : { finishedAt: latest.finishedAt }), ...(latest.reason === undefined ? {} : { reason: latest.reason }) },
    status: latest?.phase ?? 'none',
    cpuCount: rec.cpuCount,
    memoryMB: rec.memoryMB,
    createdAt: rec.createdAt,
    updatedAt: rec.updatedAt,
  };
}

/** What the build routes need: the service that runs builds, its template names, and the team's uploaded files. */
export interface WorkerBuilds {
  service: BuildService;
  files: FileStore;
  /** Stores an upload as the team's `hash` once its sha256 is `hash` (BadRequest otherwise, nothing stored); returns the bytes. */
  upload(team: string, hash: string, chunks: AsyncIterable<Buffer>): Promise<number>;
  /** A new build of the team's template `name` (the template made when new), not started yet: the template's id and the build's. */
  newBuild(team: string, name: string, resources: { cpuCount?: number; memoryMB?: number }): { templateId: string; buildId: string };
  /** The id of the team's template `name`; undefined when the team has none of that name (another team's included). */
  templateId(team: string, name: string): string | undefined;
  /** The team's built templates, oldest first. */
  list(team: string): BuiltTemplateView[];
}

/** The routes' view of the worker's build service. */
export function workerBuilds(b: TemplateBuilds): WorkerBuilds {
  return {
    service: b,
    files: b.files,
    upload: (team, hash, chunks) => putVerified(b.files, team, hash, chunks),
    newBuild(team, name, resources) {
      const { template, build } = b.createTemplate(team, { name, ...resources });
      return { templateId: template.templateId, buildId: build.buildId };
    },
    // A build's routes name its template, with the tag the build was requested with, named or not yet.
    templateId: (team, name) => b.find(team, splitName(name).name)?.templateId,
    list: (team) => b.list(team).map(builtTemplateView),
  };
}

/** A build's log grows by a line per output line; 100k lines is far past any real build's. */
const MAX_LOG_OFFSET = 10_000_000;

function templateName(ctx: RequestContext): string {
  const name = ctx.params.name ?? '';
  if (!isObjectName(name) && !isTaggedName(name)) {
    throw new AsbError('BadRequest', `template name "${name.slice(0, 100)}" is not valid: lower-case letters, digits and '-', at most 253 characters, starting and ending alphanumeric, optionally :tag (letters, digits, '.', '_', '-')`, { fields: [{ field: 'name', message: 'not a valid template name' }] });
  }
  return name;
}

function hashParam(ctx: RequestContext): string {
  const hash = ctx.params.sha256 ?? '';
  if (!isSha256(hash)) throw new AsbError('BadRequest', `"${hash.slice(0, 100)}" is not a sha256: 64 lower-case hex digits of the tar's sha256`, { fields: [{ field: 'sha256', message: 'not a sha256' }] });
  return hash;
}

function buildNotFound(name: string, id: string): AsbError {
  return new AsbError('NotFound', `build "${id}" of template "${name}" not found`);
}

function statusOf(b: WorkerBuilds, ctx: RequestContext): BuildStatus {
  const name = templateName(ctx);
  const team = principalOf(ctx).team;
  const id = ctx.params.buildId ?? '';
  const templateId = b.templateId(team, name);
  const status = templateId === undefined ? undefined : b.service.status(team, templateId, id);
  if (status === undefined) throw buildNotFound(name, id);
  return status;
}

export function buildRoutes(w: WorkerContext, uploads: UploadSlots, fileBytes = MAX_FILE_BYTES): Route[] {
  const builds = w.builds === undefined ? undefined : workerBuilds(w.builds);
  const enabled = (): WorkerBuilds => {
    if (builds === undefined) throw new AsbError('NotImplemented', 'template builds are not enabled on this worker');
    return builds;
  };
  return [
    {
      method: 'GET',
      pattern: '/v1/built-templates',
      handler(ctx) {
        // A worker that builds nothing has built nothing: an empty list, not an error.
        const items = builds === undefined ? [] : builds.list(principalOf(ctx).team);
        return Promise.resolve({ status: 200, json: { items } });
      },
    },
    {
      method: 'GET',
      pattern: '/v1/templates/{name}/files/{sha256}',
      handler(ctx) {
        const b = enabled();
        templateName(ctx);
        const hash = hashParam(ctx);
        if (!b.files.has(principalOf(ctx).team, hash)) {
          return Promise.reject(new AsbError('NotFound', `no files with sha256 ${hash} were uploaded by this team; PUT the tar to this path`));
        }
        return Promise.resolve({ status: 200, json: { sha256: hash, present: true } });
      },
    },
    {
      method: 'PUT',
      pattern: '/v1/templates/{name}/files/{sha256}',
      async handler(ctx) {
        const b = enabled();
        templateName(ctx);
        const hash = hashParam(ctx);
        const p = principalOf(ctx);
        if (b.files.has(p.team, hash)) {
          discardRest(ctx.req);
          return { status: 200, json: { sha256: hash, present: true } };
        }
        try {
          const bytes = await uploads.run(p.prefix, `key ${p.prefix}`, () => b.upload(p.team, hash, uploadChunks(ctx.req, fileBytes)));
          return { status: 201, json: { sha256: hash, present: true, bytes } };
        } catch (err) {
          discardRest(ctx.req);
          throw err;
        }
      },
    },
    {
      method: 'POST',
      pattern: '/v1/templates/{name}/builds',
      async handler(ctx) {
        const b = enabled();
        const name = templateName(ctx);
        const team = principalOf(ctx).team;
        const raw = await readJson(ctx.req, w.limits.jsonBytes);
        const spec = checkBuildSpec(raw, (hash) => b.files.has(team, hash));
        // Before the build is made: a policy the worker refuses leaves no template or build behind.
        b.service.buildEgress(spec);
        const { templateId, buildId } = b.newBuild(team, name, {
          ...(spec.cpuCount === undefined ? {} : { cpuCount: spec.cpuCount }),
          ...(spec.memoryMB === undefined ? {} : { memoryMB: spec.memoryMB }),
        });
        await b.service.start(team, templateId, buildId, spec);
        const status = b.service.status(team, templateId, buildId);
        return {
          status: 202,
          json: { templateId, buildId, phase: status?.phase ?? 'waiting' },
          headers: { location: `/v1/templates/${name}/builds/${buildId}` },
        };
      },
    },
    {
      method: 'GET',
      pattern: '/v1/templates/{name}/builds/{buildId}',
      handler(ctx) {
        return Promise.resolve({ status: 200, json: statusOf(enabled(), ctx) });
      },
    },
    {
      method: 'GET',
      pattern: '/v1/templates/{name}/builds/{buildId}/logs',
      handler(ctx) {
        const b = enabled();
        const status = statusOf(b, ctx);
        const offset = queryInt(ctx.query, 'offset', 0, MAX_LOG_OFFSET) ?? 0;
        const entries = b.service.logs(principalOf(ctx).team, status.templateId, status.buildId, offset);
        return Promise.resolve({
          status: 200,
          json: { entries, offset: offset + entries.length, phase: status.phase, ...(status.reason === undefined ? {} : { reason: status.reason }), ...(status.image === undefined ? {} : { image: status.image }) },
        });
      },
    },
  ];
}
