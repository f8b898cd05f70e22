// Tenancy: a non-admin key sees and touches only objects labelled with its team; anything else
// answers 404 exactly as if it did not exist, so one team cannot probe another's ids.
import type { KubeObject } from '../api/meta.ts';
import { isObjectName } from '../api/names.ts';
import type { Sandbox } from '../api/types.ts';
import { LABEL } from '../api/types.ts';
import type { Principal } from '../auth/keyring.ts';
import { AsbError } from '../errors.ts';
import type { RequestContext } from '../http/router.ts';
import type { WorkerContext } from './deps.ts';

export function principalOf(ctx: RequestContext): Principal {
  if (ctx.principal === undefined) throw new AsbError('Internal', 'route needs a principal but runs without authentication');
  return ctx.principal;
}

export function requireAdmin(ctx: RequestContext, action: string): Principal {
  const p = principalOf(ctx);
  if (!p.admin) throw new AsbError('Forbidden', `${action} needs an admin API key; key ${p.prefix} of team "${p.team}" is not one`);
  return p;
}

export function canSee(p: Principal, obj: KubeObject): boolean {
  return p.admin || obj.metadata.labels?.[LABEL.owner] === p.team;
}

/** The label selector that limits a list to what the principal may see. */
export function visibilitySelector(p: Principal): string {
  return p.admin ? LABEL.owner : `${LABEL.owner}=${p.team}`;
}

export function sandboxNotFound(id: string): AsbError {
  return new AsbError('NotFound', `sandbox "${id}" not found; list yours with GET /v1/sandboxes`);
}

/** The sandbox with this id if the principal may see it; 404 naming the id otherwise. */
export async function findSandbox(w: WorkerContext, ctx: RequestContext, id: string): Promise<Sandbox> {
  const p = principalOf(ctx);
  if (!isObjectName(id)) throw sandboxNotFound(id);
  const sandbox = await w.index.find(id, [w.defaultNamespace]);
  if (sandbox === undefined || !canSee(p, sandbox)) throw sandboxNotFound(id);
  return sandbox;
}
