// POST /v1/activity: routers report which sandboxes saw data-plane traffic (requests, open
// WebSocket and streaming connections) so the idle clock does not hibernate a sandbox in use.
// Routers batch these (at most one report per id every 5 s), so one call may name thousands.
import { AsbError, type FieldProblem } from '../errors.ts';
import { requireAdmin } from './access.ts';
import { readJson } from '../http/body.ts';
import type { WorkerContext } from './deps.ts';
import { isPlainObject } from '../http/body.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';

/** 10,000 ids of ~20 characters is ~250 KB, inside the 1 MiB JSON limit with room to spare. */
export const MAX_ACTIVITY_IDS = 10_000;

function parseIds(body: unknown): string[] {
  if (!isPlainObject(body)) throw new AsbError('BadRequest', 'request body must be a JSON object {"ids": ["<sandbox id>", ...]}');
  const problems: FieldProblem[] = [];
  for (const key of Object.keys(body)) if (key !== 'ids') problems.push({ field: key, message: 'unknown field; allowed fields are ids' });
  const ids = body.ids;
  if (!Array.isArray(ids)) problems.push({ field: 'ids', message: ids === undefined ? 'is required' : 'must be an array of sandbox ids' });
  else if (ids.length > MAX_ACTIVITY_IDS) problems.push({ field: 'ids', message: `must hold at most ${MAX_ACTIVITY_IDS} ids, got ${ids.length}; send several batches` });
  else {
    const bad = ids.findIndex((id) => typeof id !== 'string' || id === '');
    if (bad >= 0) problems.push({ field: `ids[${bad}]`, message: 'must be a non-empty string' });
  }
  if (problems.length > 0) throw new AsbError('Invalid', `request body is invalid: ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}`, { fields: problems });
  return ids as string[];
}

async function report(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  requireAdmin(ctx, 'reporting activity');
  const ids = parseIds(await readJson(ctx.req, w.limits.jsonBytes));
  let touched = 0;
  // Unknown ids (deleted meanwhile, or another cluster's) are skipped: touching them would grow
  // the activity map with entries nothing ever forgets.
  for (const id of new Set(ids)) {
    if (!w.index.has(id)) continue;
    w.operator.activity.touch(id);
    touched += 1;
  }
  return { status: 200, json: { touched } };
}

export function activityRoutes(w: WorkerContext): Route[] {
  return [{ method: 'POST', pattern: '/v1/activity', handler: (ctx) => report(w, ctx) }];
}
