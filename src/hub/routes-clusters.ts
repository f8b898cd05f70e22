// The cluster registry over REST, admin keys only. A cluster's sync credential leaves the hub
// exactly twice: in the answer to its registration and to a rotation. Listings never carry it
// or its hash. Removing a cluster removes the templates its builds made (built-templates.ts).
import type { Cluster } from '../api/hub-contract.ts';
import { ClusterType } from '../api/hub-contract.ts';
import { isAsbError } from '../errors.ts';
import { CLUSTER_SCOPE } from '../store/store.ts';
import { requireAdmin } from '../worker/access.ts';
import { readJson } from '../http/body.ts';
import { checkBody } from '../worker/input.ts';
import type { RequestContext, Route } from '../http/router.ts';
import { forgetBuiltTemplates } from './built-templates.ts';
import { clusterNotFound, clusterView, registerCluster, rotateClusterCredential } from './clusters.ts';
import type { HubContext } from './hub-context.ts';

function nameOf(ctx: RequestContext): string {
  return ctx.params.name ?? '';
}

export function clusterRoutes(h: HubContext): Route[] {
  return [
    {
      method: 'GET',
      pattern: '/v1/clusters',
      async handler(ctx) {
        requireAdmin(ctx, 'listing clusters');
        const listed = await h.store.list<Cluster>(ClusterType);
        return { status: 200, json: { items: listed.items.map((c) => clusterView(c, h.sync)) } };
      },
    },
    {
      method: 'GET',
      pattern: '/v1/clusters/{name}',
      async handler(ctx) {
        requireAdmin(ctx, 'reading a cluster');
        const cluster = await h.store.tryGet<Cluster>(ClusterType, CLUSTER_SCOPE, nameOf(ctx));
        if (cluster === undefined) throw clusterNotFound(nameOf(ctx));
        return { status: 200, json: clusterView(cluster, h.sync) };
      },
    },
    {
      method: 'PUT',
      pattern: '/v1/clusters/{name}',
      async handler(ctx) {
        requireAdmin(ctx, 'registering or changing a cluster');
        const body = checkBody(await readJson(ctx.req, h.jsonBytes), {
          region: { kind: 'string' },
          ingressAddress: { kind: 'string' },
          apiUrl: { kind: 'string' },
          labels: { kind: 'stringMap' },
          drain: { kind: 'boolean' },
          tag: { kind: 'string' },
        });
        const result = await registerCluster(h.store, nameOf(ctx), body);
        if (result.created) ctx.log.info({ cluster: nameOf(ctx), tag: result.cluster.spec.tag }, 'cluster registered');
        const json = result.credential === undefined ? { cluster: clusterView(result.cluster, h.sync) } : { cluster: clusterView(result.cluster, h.sync), credential: result.credential };
        return { status: result.created ? 201 : 200, json };
      },
    },
    {
      method: 'POST',
      pattern: '/v1/clusters/{name}/credential',
      async handler(ctx) {
        requireAdmin(ctx, "rotating a cluster's credential");
        const { cluster, credential } = await rotateClusterCredential(h.store, nameOf(ctx));
        ctx.log.info({ cluster: nameOf(ctx) }, 'cluster credential rotated');
        return { status: 200, json: { cluster: clusterView(cluster, h.sync), credential } };
      },
    },
    {
      method: 'DELETE',
      pattern: '/v1/clusters/{name}',
      async handler(ctx) {
        requireAdmin(ctx, 'removing a cluster');
        try {
          const removed = await h.store.delete<Cluster>(ClusterType, CLUSTER_SCOPE, nameOf(ctx));
          // After the Cluster: a `built` message it sends from now on is ignored (acceptBuiltTemplates).
          const templates = await forgetBuiltTemplates(h.store, nameOf(ctx));
          ctx.log.info({ cluster: nameOf(ctx), builtTemplatesRemoved: templates }, 'cluster removed');
          return { status: 200, json: clusterView(removed, h.sync) };
        } catch (err) {
          if (isAsbError(err, 'NotFound')) throw clusterNotFound(nameOf(ctx));
          throw err;
        }
      },
    },
  ];
}
