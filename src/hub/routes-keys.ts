// API keys, held by the hub and synced to every cluster. A key is shown once, when created; the
// store and every listing carry only its public prefix, never its hash.
import type { ApiKey } from '../api/types.ts';
import { ApiKeyType } from '../api/types.ts';
import { createApiKey, revokeApiKey } from '../auth/keys.ts';
import { AsbError, isAsbError } from '../errors.ts';
import { requireAdmin } from '../worker/access.ts';
import { readJson } from '../http/body.ts';
import { checkBody } from '../worker/input.ts';
import type { Route } from '../http/router.ts';
import type { HubContext } from './hub-context.ts';

/** A key as listed: everything but its hash. */
export interface KeyView {
  prefix: string;
  team: string;
  admin: boolean;
  revoked: boolean;
  description?: string;
  created?: string;
}

export function keyView(key: ApiKey): KeyView {
  const view: KeyView = { prefix: key.spec.prefix, team: key.spec.team, admin: key.spec.admin === true, revoked: key.spec.revoked === true };
  if (key.spec.description !== undefined) view.description = key.spec.description;
  if (key.metadata.creationTimestamp !== undefined) view.created = key.metadata.creationTimestamp;
  return view;
}

const PREFIX_PATTERN = /^(asb_)?[a-z0-9]{8}$/;

export function keyRoutes(h: HubContext): Route[] {
  return [
    {
      method: 'GET',
      pattern: '/v1/keys',
      async handler(ctx) {
        requireAdmin(ctx, 'listing API keys');
        const listed = await h.store.list<ApiKey>(ApiKeyType);
        return { status: 200, json: { items: listed.items.map(keyView) } };
      },
    },
    {
      method: 'POST',
      pattern: '/v1/keys',
      async handler(ctx) {
        requireAdmin(ctx, 'creating an API key');
        const body = checkBody(await readJson(ctx.req, h.jsonBytes), {
          team: { kind: 'string', required: true, min: 1, max: 63 },
          admin: { kind: 'boolean' },
          description: { kind: 'string', max: 256 },
        });
        const { key, object } = await createApiKey(h.store, {
          team: body.team,
          admin: body.admin ?? false,
          ...(body.description === undefined ? {} : { description: body.description }),
        });
        ctx.log.info({ created: object.spec.prefix, forTeam: object.spec.team, admin: object.spec.admin === true }, 'API key created');
        return { status: 201, json: { key, prefix: object.spec.prefix, team: object.spec.team, admin: object.spec.admin === true } };
      },
    },
    {
      method: 'POST',
      pattern: '/v1/keys/{prefix}/revoke',
      async handler(ctx) {
        requireAdmin(ctx, 'revoking an API key');
        const prefix = ctx.params.prefix ?? '';
        if (!PREFIX_PATTERN.test(prefix)) {
          throw new AsbError('NotFound', `no API key with prefix "${prefix}"; prefixes look like asb_ab12cd34 (see GET /v1/keys)`);
        }
        try {
          const revoked = await revokeApiKey(h.store, prefix);
          ctx.log.info({ revoked: revoked.spec.prefix }, 'API key revoked');
          return { status: 200, json: keyView(revoked) };
        } catch (err) {
          if (isAsbError(err, 'NotFound')) throw new AsbError('NotFound', `no API key with prefix "${prefix}" (see GET /v1/keys)`);
          throw err;
        }
      },
    },
  ];
}
