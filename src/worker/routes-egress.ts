// Egress secrets and credential rules: admin keys only, since a rule applies to every
// sandbox's traffic to its host. Secret values are write-only: PUT takes one, nothing returns it.
import { parseCredentialRule, parseSecretValue, type CredentialStore } from '../egress/credential-store.ts';
import { AsbError } from '../errors.ts';
import { requireAdmin } from './access.ts';
import { readJson } from '../http/body.ts';
import type { WorkerContext } from './deps.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';

function storeOf(w: WorkerContext, ctx: RequestContext, action: string): CredentialStore {
  requireAdmin(ctx, action);
  if (w.egressCredentials === undefined) throw new AsbError('NotFound', 'this worker runs without the egress proxy: no egress secrets or credential rules');
  return w.egressCredentials;
}

async function putSecret(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const store = storeOf(w, ctx, 'setting an egress secret');
  const value = parseSecretValue(await readJson(ctx.req, w.limits.jsonBytes));
  return { status: 200, json: store.setSecret(ctx.params.name ?? '', value) };
}

async function putRule(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const store = storeOf(w, ctx, 'setting a credential rule');
  const rule = parseCredentialRule(ctx.params.id ?? '', await readJson(ctx.req, w.limits.jsonBytes));
  return { status: 200, json: store.setRule(rule) };
}

export function egressRoutes(w: WorkerContext): Route[] {
  return [
    { method: 'GET', pattern: '/v1/egress/secrets', handler: (ctx) => Promise.resolve({ status: 200, json: { items: storeOf(w, ctx, 'listing egress secrets').listSecrets() } }) },
    { method: 'PUT', pattern: '/v1/egress/secrets/{name}', handler: (ctx) => putSecret(w, ctx) },
    {
      method: 'DELETE',
      pattern: '/v1/egress/secrets/{name}',
      handler: (ctx) => {
        storeOf(w, ctx, 'deleting an egress secret').deleteSecret(ctx.params.name ?? '');
        return Promise.resolve({ status: 204 });
      },
    },
    { method: 'GET', pattern: '/v1/egress/credentials', handler: (ctx) => Promise.resolve({ status: 200, json: { items: storeOf(w, ctx, 'listing credential rules').listRules() } }) },
    { method: 'PUT', pattern: '/v1/egress/credentials/{id}', handler: (ctx) => putRule(w, ctx) },
    {
      method: 'DELETE',
      pattern: '/v1/egress/credentials/{id}',
      handler: (ctx) => {
        storeOf(w, ctx, 'deleting a credential rule').deleteRule(ctx.params.id ?? '');
        return Promise.resolve({ status: 204 });
      },
    },
  ];
}
