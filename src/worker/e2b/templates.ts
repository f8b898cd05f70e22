// E2B's build API (the `e2b` SDK 2.63's Template.build and 2.51's JS), on the worker's build
// service (src/builds/service.ts). Wire shapes as the SDK's models read them:
//   POST   /v3/templates                         {name, tags?, cpuCount?, memoryMB?} → 202 {templateID, buildID, public, names, tags, aliases}
//   GET    /templates/{id}/files/{hash}          201 {present, url?}: url is a signed PUT URL (below)
//   PUT    /templates/{id}/files/{hash}?token=   the tar; no API key (the SDK sends none): the token
//                                                binds the template, the hash and an expiry (1 h)
//   POST   /v2/templates/{id}/builds/{buildID}   {fromImage|fromTemplate, steps, force, startCmd?, readyCmd?} → 202
//   GET    /templates/{id}/builds/{buildID}/status?logsOffset&limit  {templateID, buildID, status, logEntries, logs, reason?}
//   GET    /templates/{id}/builds/{buildID}/logs?cursor&limit&direction  {logs: [{timestamp, level, message, step?}]}
//   GET    /templates, /v2/templates             the team's templates (Template)
//   GET    /templates/{id}                       TemplateWithBuilds
//   PATCH  /templates/{id}, /v2/templates/{id}   {public}: public true is refused (templates are the team's)
//   DELETE /templates/{id}                       204; a snapshot id is a snapshot's delete (snapshots.ts)
//   GET    /templates/aliases/{alias}            {templateID, public}; 404 for another team's
//   POST   /templates/tags {target, tags}        201 {tags, buildID};  DELETE /templates/tags {name, tags} 204
//   GET    /templates/{id}/tags                  [{tag, buildID, createdAt}]
// Another team's template, build or file answers 404 everywhere, as one that does not exist.
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { BuildLogEntry, BuildSpec, BuildStep } from '../../builds/contract.ts';
import { isFilesHash } from '../../builds/files.ts';
import type { BuildRecord, TemplateRecord } from '../../builds/records.ts';
import type { TemplateBuilds } from '../../builds/service.ts';
import { TEMPLATE_ID_LABEL } from '../../builds/template-object.ts';
import { ownTemplateNamed } from '../team-templates.ts';
import { AsbError } from '../../errors.ts';
import { readJson } from '../../http/body.ts';
import type { WorkerContext } from '../deps.ts';
import type { Authenticator } from '../../auth/keyring.ts';
import { isPlainObject } from '../../http/body.ts';
import type { Reply, Route } from '../../http/router.ts';
import { e2bErrorReply, e2bRoute, type AuthedContext } from './reply.ts';
import { toAsbError } from '../../http/problem.ts';
import type { UploadSlots } from '../upload-slots.ts';

/** How long an upload URL works: the SDK PUTs right after asking, an hour covers a slow link. */
export const UPLOAD_URL_TTL_MS = 3600_000;
/** Log entries one status call returns at most (the SDK drains the rest after the build ends). */
const STATUS_PAGE = 100;
const ENVD_VERSION = '0.2.0';

function builds(w: WorkerContext): TemplateBuilds {
  if (w.builds === undefined) throw new AsbError('NotImplemented', 'template builds are not enabled on this worker');
  return w.builds;
}

function templateNotFound(id: string): AsbError {
  return new AsbError('NotFound', `template "${id}" not found`);
}

function findTemplate(w: WorkerContext, ctx: AuthedContext): TemplateRecord {
  const id = ctx.params.id ?? '';
  const rec = builds(w).find(ctx.principal.team, id);
  if (rec === undefined) throw templateNotFound(id);
  return rec;
}

function findBuild(w: WorkerContext, ctx: AuthedContext): { rec: TemplateRecord; build: BuildRecord } {
  const rec = findTemplate(w, ctx);
  const buildId = ctx.params.buildId ?? '';
  const build = builds(w).build(rec, buildId);
  if (build === undefined) throw new AsbError('NotFound', `build "${buildId}" of template "${rec.templateId}" not found`);
  return { rec, build };
}

function optionalInt(body: Record<string, unknown>, field: string): number | undefined {
  const v = body[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new AsbError('BadRequest', `${field} must be an integer`);
  return v;
}

function stringList(body: Record<string, unknown>, field: string): string[] | undefined {
  const v = body[field];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((x): x is string => typeof x === 'string')) throw new AsbError('BadRequest', `${field} must be an array of strings`);
  return v;
}

async function body(w: WorkerContext, req: IncomingMessage): Promise<Record<string, unknown>> {
  const raw = await readJson(req, w.limits.jsonBytes);
  if (!isPlainObject(raw)) throw new AsbError('BadRequest', 'the request body must be a JSON object');
  return raw;
}

function names(rec: TemplateRecord): string[] {
  return [rec.name];
}

async function requestBuild(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const b = await body(w, ctx.req);
  const name = typeof b.name === 'string' ? b.name : typeof b.alias === 'string' ? b.alias : undefined;
  if (name === undefined) throw new AsbError('BadRequest', 'name is required: the template\'s name (name or name:tag)');
  const tags = stringList(b, 'tags');
  const cpuCount = optionalInt(b, 'cpuCount');
  const memoryMB = optionalInt(b, 'memoryMB');
  const { template, build } = builds(w).createTemplate(ctx.principal.team, { name, ...(tags === undefined ? {} : { tags }), ...(cpuCount === undefined ? {} : { cpuCount }), ...(memoryMB === undefined ? {} : { memoryMB }) });
  return { status: 202, json: { templateID: template.templateId, buildID: build.buildId, public: false, names: names(template), tags: build.pendingTags ?? [], aliases: [template.name] } };
}

// ---- uploads

function uploadKey(w: WorkerContext): Buffer {
  return Buffer.from(w.dataPlane.tokens.derive('asb:build-upload-key'), 'utf8');
}

function uploadMac(w: WorkerContext, templateId: string, hash: string, expires: number): string {
  return createHmac('sha256', uploadKey(w)).update(`${templateId}\n${hash}\n${String(expires)}`).digest('base64url');
}

export function uploadToken(w: WorkerContext, templateId: string, hash: string): string {
  const expires = w.clock.now() + UPLOAD_URL_TTL_MS;
  return `${String(expires)}.${uploadMac(w, templateId, hash, expires)}`;
}

function checkUploadToken(w: WorkerContext, templateId: string, hash: string, token: string | null): void {
  const [exp, mac] = (token ?? '').split('.');
  const expires = Number(exp);
  const want = Buffer.from(uploadMac(w, templateId, hash, expires));
  const got = Buffer.from(mac ?? '');
  if (!Number.isInteger(expires) || got.length !== want.length || !timingSafeEqual(got, want)) throw new AsbError('Unauthorized', 'the upload URL is not valid for this template and files hash: ask for one with GET /templates/{id}/files/{hash}');
  if (expires < w.clock.now()) throw new AsbError('Unauthorized', 'the upload URL has expired: ask for a new one with GET /templates/{id}/files/{hash}');
}

/** The API's own base URL as the caller reached it (through the edge: its host and scheme). */
function baseUrl(req: IncomingMessage): string {
  const proto = req.headers['x-forwarded-proto'] === 'https' ? 'https' : 'http';
  return `${proto}://${req.headers.host ?? 'localhost'}`;
}

function fileLink(w: WorkerContext, ctx: AuthedContext): Reply {
  const rec = findTemplate(w, ctx);
  const hash = ctx.params.hash ?? '';
  if (!isFilesHash(hash)) throw new AsbError('BadRequest', `files hash "${hash}" is not a sha256 (64 lowercase hex characters)`);
  if (builds(w).files.has(rec.team, hash)) return { status: 201, json: { present: true } };
  const url = `${baseUrl(ctx.req)}/templates/${rec.templateId}/files/${hash}?token=${uploadToken(w, rec.templateId, hash)}`;
  return { status: 201, json: { present: false, url } };
}

/** Uploads at once count against the worker's bounds like file uploads, per template (the URL carries no key). */
function uploadRoute(w: WorkerContext, uploads: UploadSlots): Route {
  return {
    method: 'PUT',
    pattern: '/templates/{id}/files/{hash}',
    auth: false,
    handler: async (ctx) => {
      try {
        const id = ctx.params.id ?? '';
        const hash = ctx.params.hash ?? '';
        checkUploadToken(w, id, hash, ctx.query.get('token'));
        const service = builds(w);
        const team = service.templateTeam(id);
        if (team === undefined) throw templateNotFound(id);
        await uploads.run(`template:${id}`, `template ${id}`, () => service.files.put(team, hash, ctx.req));
        return { status: 200, json: { present: true } };
      } catch (err) {
        return e2bErrorReply(toAsbError(err));
      }
    },
  };
}

// ---- builds

function buildSpecOf(b: Record<string, unknown>): BuildSpec {
  const fromImage = b.fromImage;
  const fromTemplate = b.fromTemplate;
  if (b.fromImageRegistry !== undefined && b.fromImageRegistry !== null) throw new AsbError('BadRequest', 'fromImageRegistry (registry credentials) is not supported here: push the image to this installation\'s registry, or build from a public image');
  if ((typeof fromImage === 'string') === (typeof fromTemplate === 'string')) throw new AsbError('BadRequest', 'a build starts from exactly one of fromImage or fromTemplate');
  const startCmd = b.startCmd;
  const readyCmd = b.readyCmd;
  if (startCmd !== undefined && startCmd !== null && typeof startCmd !== 'string') throw new AsbError('BadRequest', 'startCmd must be a string');
  if (readyCmd !== undefined && readyCmd !== null && typeof readyCmd !== 'string') throw new AsbError('BadRequest', 'readyCmd must be a string');
  if (b.force !== undefined && b.force !== null && typeof b.force !== 'boolean') throw new AsbError('BadRequest', 'force must be a boolean');
  return {
    from: typeof fromImage === 'string' ? { image: fromImage } : { template: String(fromTemplate) },
    // Checked by the service against the team's files (steps.ts), each problem naming its step.
    steps: (Array.isArray(b.steps) ? b.steps : b.steps === undefined || b.steps === null ? [] : b.steps) as BuildSpec['steps'],
    ...(typeof startCmd === 'string' && startCmd !== '' ? { startCmd } : {}),
    ...(typeof readyCmd === 'string' && readyCmd !== '' ? { readyCmd } : {}),
    noCache: b.force === true,
  };
}

/**
 * E2B's templates all have the user `user` (home /home/user): E2B's own base step makes it, the
 * SDK's Dockerfile parser ends with USER user, and commands run as `user` by default. A build from
 * an image gets the same first, as root, when the image lacks it (useradd, BusyBox adduser, or
 * passwd lines where neither exists), its home theirs (0777 where it cannot be chowned: a
 * sandbox has one tenant). A cached layer after the first build from that image.
 */
export const E2B_USER_STEP: BuildStep = {
  type: 'RUN',
  args: [
    'if ! id -u user >/dev/null 2>&1; then ' +
      'useradd -m -U -s /bin/sh user >/dev/null 2>&1 || adduser -D -s /bin/sh user >/dev/null 2>&1 || ' +
      '{ echo "user:x:1000:1000::/home/user:/bin/sh" >> /etc/passwd; grep -q "^user:" /etc/group || echo "user:x:1000:" >> /etc/group; }; ' +
      'mkdir -p /home/user && { chown "$(id -u user):$(id -g user)" /home/user 2>/dev/null || chmod 0777 /home/user; }; ' +
      'id -u user >/dev/null; fi',
    'root',
  ],
};

async function startBuild(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const { rec, build } = findBuild(w, ctx);
  const spec = buildSpecOf(await body(w, ctx.req));
  const prelude = 'image' in spec.from ? [E2B_USER_STEP] : [];
  await builds(w).start(ctx.principal.team, rec.templateId, build.buildId, { ...spec, cpuCount: build.cpuCount, memoryMB: build.memoryMB }, prelude);
  return { status: 202, json: {} };
}

function wireEntry(e: BuildLogEntry): { timestamp: string; level: string; message: string; step?: string } {
  return { timestamp: e.timestamp, level: e.level, message: e.message, ...(e.step === undefined ? {} : { step: String(e.step) }) };
}

function queryCount(ctx: AuthedContext, name: string, dflt: number, max: number): number {
  const raw = ctx.query.get(name);
  if (raw === null || raw === '') return dflt;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new AsbError('BadRequest', `query parameter ${name} must be a non-negative integer`);
  return Math.min(n, max);
}

function status(w: WorkerContext, ctx: AuthedContext): Reply {
  const { rec, build } = findBuild(w, ctx);
  const offset = queryCount(ctx, 'logsOffset', 0, Number.MAX_SAFE_INTEGER);
  const limit = queryCount(ctx, 'limit', STATUS_PAGE, STATUS_PAGE);
  const entries = builds(w).logs(rec.team, rec.templateId, build.buildId, offset).slice(0, limit);
  const json: Record<string, unknown> = {
    templateID: rec.templateId,
    buildID: build.buildId,
    status: build.phase,
    logEntries: entries.map(wireEntry),
    logs: entries.map((e) => `[${e.timestamp}] ${e.message}`),
  };
  if (build.reason !== undefined) json.reason = { message: build.reason.message, ...(build.reason.step === undefined ? {} : { step: String(build.reason.step) }) };
  return { status: 200, json };
}

function logs(w: WorkerContext, ctx: AuthedContext): Reply {
  const { rec, build } = findBuild(w, ctx);
  const limit = queryCount(ctx, 'limit', 100, 1000);
  // cursor: a time in ms; entries from it on (forward) or before it (backward).
  const cursor = ctx.query.get('cursor');
  const from = cursor === null || cursor === '' ? undefined : Number(cursor);
  if (from !== undefined && !Number.isFinite(from)) throw new AsbError('BadRequest', 'query parameter cursor must be a time in milliseconds');
  const backward = ctx.query.get('direction') === 'backward';
  let all = builds(w).logs(rec.team, rec.templateId, build.buildId, 0);
  if (from !== undefined) all = all.filter((e) => (backward ? Date.parse(e.timestamp) <= from : Date.parse(e.timestamp) >= from));
  const page = backward ? all.slice(-limit).reverse() : all.slice(0, limit);
  return { status: 200, json: { logs: page.map(wireEntry) } };
}

// ---- templates

function buildStatusOf(rec: TemplateRecord): string {
  const ready = rec.readyBuildId === undefined ? undefined : rec.builds.find((b) => b.buildId === rec.readyBuildId);
  return (ready ?? rec.builds.at(-1))?.phase ?? 'waiting';
}

function templateView(rec: TemplateRecord): Record<string, unknown> {
  const current = rec.readyBuildId ?? rec.builds.at(-1)?.buildId ?? '';
  return {
    templateID: rec.templateId,
    buildID: current,
    cpuCount: rec.cpuCount,
    memoryMB: rec.memoryMB,
    diskSizeMB: 0,
    public: false,
    aliases: [rec.name],
    names: names(rec),
    createdAt: rec.createdAt,
    updatedAt: rec.updatedAt,
    createdBy: null,
    lastSpawnedAt: null,
    spawnCount: 0,
    buildCount: rec.builds.length,
    envdVersion: ENVD_VERSION,
    buildStatus: buildStatusOf(rec),
  };
}

function buildView(b: BuildRecord): Record<string, unknown> {
  return { buildID: b.buildId, status: b.phase, createdAt: b.createdAt, updatedAt: b.updatedAt, cpuCount: b.cpuCount, memoryMB: b.memoryMB, envdVersion: ENVD_VERSION, ...(b.finishedAt === undefined ? {} : { finishedAt: b.finishedAt }) };
}

async function update(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const rec = findTemplate(w, ctx);
  const b = await body(w, ctx.req);
  if (b.public === true) throw new AsbError('BadRequest', 'public templates are not offered here: a built template belongs to its team (an admin can apply a SandboxTemplate for every team)');
  return { status: 200, json: { names: names(rec) } };
}

/** DELETE /templates/{id} of a built template; false when the id is no template of the team's (then it may be a snapshot's). */
export async function deleteBuiltTemplate(w: WorkerContext, ctx: AuthedContext): Promise<boolean> {
  if (w.builds === undefined) return false;
  const deleted = await w.builds.delete(ctx.principal.team, ctx.params.id ?? '');
  if (deleted) await w.reportToHub?.(2000);
  return deleted;
}

async function assignTags(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const b = await body(w, ctx.req);
  const tags = stringList(b, 'tags');
  if (typeof b.target !== 'string' || tags === undefined || tags.length === 0) throw new AsbError('BadRequest', 'target (name:tag) and a non-empty tags array are required');
  const out = await builds(w).assignTags(ctx.principal.team, b.target, tags);
  return { status: 201, json: { tags: out.tags, buildID: out.buildId } };
}

async function removeTags(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const b = await body(w, ctx.req);
  const tags = stringList(b, 'tags');
  if (typeof b.name !== 'string' || tags === undefined) throw new AsbError('BadRequest', 'name and tags are required');
  await builds(w).removeTags(ctx.principal.team, b.name, tags);
  return { status: 204 };
}

function listTags(w: WorkerContext, ctx: AuthedContext): Reply {
  const rec = findTemplate(w, ctx);
  const json = Object.entries(rec.tags).map(([tag, buildId]) => ({ tag, buildID: buildId, createdAt: rec.builds.find((b) => b.buildId === buildId)?.finishedAt ?? rec.updatedAt }));
  return { status: 200, json };
}

/**
 * The team's template of that name: one built here (its record), else one another cluster built
 * and the hub synced here (its SandboxTemplate, found by the team and name labels).
 */
async function alias(w: WorkerContext, ctx: AuthedContext): Promise<Reply> {
  const name = ctx.params.alias ?? '';
  const rec = builds(w).find(ctx.principal.team, name);
  if (rec !== undefined && rec.templateId !== name) return { status: 200, json: { templateID: rec.templateId, public: false } };
  if (rec === undefined) {
    const id = (await ownTemplateNamed(w, ctx.principal.team, builds(w).namespace, name))?.metadata.labels?.[TEMPLATE_ID_LABEL];
    if (id !== undefined) return { status: 200, json: { templateID: id, public: false } };
  }
  throw new AsbError('NotFound', `no template of this team is named "${name}"`);
}

export function e2bTemplateRoutes(w: WorkerContext, auth: Authenticator, uploads: UploadSlots): Route[] {
  const route = (method: Route['method'], pattern: string, handler: (ctx: AuthedContext) => Promise<Reply> | Reply): Route => e2bRoute(auth, method, pattern, async (ctx) => handler(ctx));
  return [
    route('POST', '/v3/templates', (ctx) => requestBuild(w, ctx)),
    route('GET', '/templates/aliases/{alias}', (ctx) => alias(w, ctx)),
    route('POST', '/templates/tags', (ctx) => assignTags(w, ctx)),
    route('DELETE', '/templates/tags', (ctx) => removeTags(w, ctx)),
    route('GET', '/templates/{id}/files/{hash}', (ctx) => fileLink(w, ctx)),
    uploadRoute(w, uploads),
    route('POST', '/v2/templates/{id}/builds/{buildId}', (ctx) => startBuild(w, ctx)),
    route('GET', '/templates/{id}/builds/{buildId}/status', (ctx) => status(w, ctx)),
    route('GET', '/templates/{id}/builds/{buildId}/logs', (ctx) => logs(w, ctx)),
    route('GET', '/templates/{id}/tags', (ctx) => listTags(w, ctx)),
    route('GET', '/templates', (ctx) => ({ status: 200, json: w.builds === undefined ? [] : w.builds.list(ctx.principal.team).map(templateView) })),
    route('GET', '/v2/templates', (ctx) => ({ status: 200, json: w.builds === undefined ? [] : w.builds.list(ctx.principal.team).map(templateView) })),
    route('GET', '/templates/{id}', (ctx) => {
      const rec = findTemplate(w, ctx);
      return { status: 200, json: { ...templateView(rec), builds: rec.builds.map(buildView) } };
    }),
    route('PATCH', '/templates/{id}', (ctx) => update(w, ctx)),
    route('PATCH', '/v2/templates/{id}', (ctx) => update(w, ctx)),
  ];
}
