// The Kubernetes API on the worker: /api, /apis, /version and /openapi/v3, for kubectl and
// Kubernetes client libraries (kubernetes-sigs' Python SDK among them) with no cluster. It serves
// our four kinds in both groups and both versions (resources.ts) from the worker's store, behind
// the REST API's gate and tenancy (objects.ts), with the API key as the bearer token.
//
// It runs beside the REST pipeline rather than inside it because everything differs on the
// wire: errors are Status objects (status.ts), lists may be Tables (table.ts), watches stream
// (watch.ts), and bodies are patches of three media types (patch.ts).
//
// Shutdown (close): end every open watch (each ends its response), so the worker's server.close()
// is not held by them.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Counter } from 'prom-client';
import { parse as parseYaml } from 'yaml';
import type { Principal } from '../auth/keyring.ts';
import { AsbError } from '../errors.ts';
import { readBody } from '../http/body.ts';
import type { WorkerContext } from '../worker/deps.ts';
import type { Authenticator } from '../auth/keyring.ts';
import { presentedKey } from '../http/presented-key.ts';
import { toAsbError } from '../http/problem.ts';
import { aggregatedDiscovery, aggregatedVersion, AGGREGATED_V2, AGGREGATED_V2BETA1, apiGroup, apiGroupList, apiVersions, coreResourceList, resourceList, versionInfo } from './discovery.ts';
import { createObject, deleteCollection, deleteObject, getObject, listObjects, patchObject, patchTypeOf, updateObject, type Answer } from './objects.ts';
import { buildOpenApi, type OpenApiDocs } from './openapi.ts';
import { getEvents, parseEventsPath } from './events.ts';
import { EventType } from '../api/event.ts';
import { boolParam, parseResourcePath, type ResourcePath } from './request.ts';
import { groupVersions, qualifiedResource, SERVED_GROUPS } from './resources.ts';
import { getScale, patchScale, scaleSpecOf, updateScale } from './scale.ts';
import { notFoundError, statusOf, type Subject } from './status.ts';
import { includeObjectOf, toTable, wantsTable } from './table.ts';
import { serveWatch, Watches } from './watch.ts';

export { isKubeApiPath } from './request.ts';

export interface KubeApiOptions {
  w: WorkerContext;
  auth: Pick<Authenticator, 'verify'>;
  requests: Counter<'route' | 'code'>;
}

type Json = { status: number; body: unknown; contentType?: string; headers?: Record<string, string> };

function send(res: ServerResponse, reply: Json): void {
  const body = typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body);
  res.writeHead(reply.status, { ...reply.headers, 'content-type': reply.contentType ?? 'application/json', 'cache-control': 'no-cache, private', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/** The apiserver's 404 for a path it does not serve (not a Status: plain text). */
function pageNotFound(res: ServerResponse): void {
  const body = '404 page not found\n';
  res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8', 'x-content-type-options': 'nosniff', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

async function readPayload(req: IncomingMessage, limit: number, yamlAllowed: boolean): Promise<unknown> {
  const raw = await readBody(req, limit);
  if (raw.length === 0) return undefined;
  const text = raw.toString('utf8');
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    if (!yamlAllowed) throw new AsbError('MalformedJson', `the request body is not valid JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
  try {
    return parseYaml(text, { maxAliasCount: 0 }) as unknown;
  } catch (err) {
    throw new AsbError('BadRequest', `the apply patch is neither JSON nor YAML: ${err instanceof Error ? err.message : String(err)}`);
  }
}

export class KubeApi {
  readonly #w: WorkerContext;
  readonly #auth: Pick<Authenticator, 'verify'>;
  readonly #requests: Counter<'route' | 'code'>;
  readonly #watches = new Watches();
  #openapi: OpenApiDocs | undefined;

  constructor(opts: KubeApiOptions) {
    this.#w = opts.w;
    this.#auth = opts.auth;
    this.#requests = opts.requests;
  }

  /** Open watch streams (for tests and metrics). */
  get watchCount(): number {
    return this.#watches.size;
  }

  handle(req: IncomingMessage, res: ServerResponse): void {
    let route = 'kubeapi';
    res.once('finish', () => this.#requests.inc({ route, code: String(res.statusCode) }));
    let subject: Subject | undefined;
    const run = async (): Promise<void> => {
      const url = new URL(req.url ?? '/', 'http://worker.invalid');
      const principal = this.#authenticate(req);
      const ep = parseEventsPath(url.pathname);
      if (ep !== undefined) {
        route = 'kubeapi:events';
        subject = { rt: EventType, ...(ep.name === undefined ? {} : { name: ep.name }) };
        if (req.method !== 'GET' || boolParam(url.searchParams, 'watch')) throw new AsbError('MethodNotAllowed', 'Events are read-only here and cannot be watched: get or list them');
        const answer = await getEvents(this.#w, principal, ep, url.searchParams, wantsTable(req.headers.accept));
        send(res, answer);
        return;
      }
      const rp = parseResourcePath(url.pathname);
      if (rp !== undefined) {
        route = rp.name === undefined ? 'kubeapi:collection' : 'kubeapi:object';
        subject = { rt: rp.served.rt, ...(rp.name === undefined ? {} : { name: rp.name }) };
        await this.#resource(principal, rp, url.searchParams, req, res);
        return;
      }
      route = 'kubeapi:discovery';
      const reply = this.#discovery(req, url);
      if (reply === undefined) pageNotFound(res);
      else send(res, reply);
    };
    run().catch((err: unknown) => {
      const problem = toAsbError(err);
      if (problem.code === 'Internal') this.#w.log.error({ err, method: req.method, url: req.url }, 'kubeapi: request failed');
      if (res.headersSent) {
        res.destroy();
        return;
      }
      // A create names its object only in the body: its Invalid or AlreadyExists takes the name
      // from the message. A method a path does not take names the resource only, as the apiserver's does.
      const named = subject !== undefined && subject.name === undefined && (problem.code === 'Invalid' || problem.code === 'AlreadyExists') ? { ...subject, name: /"([^"]*)"/.exec(problem.message)?.[1] ?? '' }
        : subject !== undefined && problem.code === 'MethodNotAllowed' ? { rt: subject.rt } : subject;
      const status = statusOf(inKubeInvalid(problem, named), named);
      send(res, { status: problem.status, body: status, headers: problem.code === 'Unauthorized' ? { 'www-authenticate': 'Bearer realm="asb"' } : {} });
    });
  }

  /** Ends every open watch. Idempotent. */
  close(): void {
    this.#watches.closeAll();
  }

  #authenticate(req: IncomingMessage): Principal {
    const key = presentedKey(req);
    const principal = key === undefined || key === '' ? undefined : this.#auth.verify(key);
    // The apiserver says only "Unauthorized"; kubectl prints it after "error: You must be logged in".
    if (principal === undefined) throw new AsbError('Unauthorized', 'Unauthorized');
    return principal;
  }

  #discovery(req: IncomingMessage, url: URL): Json | undefined {
    const path = url.pathname.replace(/\/+$/, '') || '/';
    if (req.method !== 'GET') return undefined;
    const agg = aggregatedVersion(req.headers.accept);
    if ((path === '/api' || path === '/apis') && agg !== undefined) {
      return { status: 200, body: aggregatedDiscovery(path, agg), contentType: agg === 'v2' ? AGGREGATED_V2 : AGGREGATED_V2BETA1, headers: { vary: 'Accept' } };
    }
    if (path === '/api') return { status: 200, body: apiVersions(req.headers.host ?? '127.0.0.1') };
    if (path === '/api/v1') return { status: 200, body: coreResourceList() };
    if (path === '/apis') return { status: 200, body: apiGroupList() };
    if (path === '/version') return { status: 200, body: versionInfo(this.#w.version) };
    const parts = path.split('/').slice(1);
    if (parts[0] === 'apis' && parts.length === 2 && SERVED_GROUPS.includes(parts[1] ?? '')) return { status: 200, body: apiGroup(parts[1] ?? '') };
    if (parts[0] === 'apis' && parts.length === 3 && groupVersions(parts[1] ?? '').includes(parts[2] ?? '')) return { status: 200, body: resourceList(parts[1] ?? '', parts[2] ?? '') };
    if (path === '/openapi/v3') return { status: 200, body: this.#docs().index };
    if (parts[0] === 'openapi' && parts[1] === 'v3' && parts[2] === 'apis' && parts.length === 5) {
      const doc = this.#docs().documents.get(`${parts[3] ?? ''}/${parts[4] ?? ''}`);
      if (doc !== undefined) return { status: 200, body: doc.body, headers: { etag: `"${doc.hash}"` } };
    }
    return undefined;
  }

  #docs(): OpenApiDocs {
    this.#openapi ??= buildOpenApi();
    return this.#openapi;
  }

  async #resource(p: Principal, rp: ResourcePath, query: URLSearchParams, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const w = this.#w;
    const method = req.method ?? '';
    const reply = (a: Answer): void => send(res, { status: a.status, body: a.body });
    if (rp.name === undefined) {
      if (method === 'GET' && boolParam(query, 'watch')) {
        const table = wantsTable(req.headers.accept) ? { include: includeObjectOf(query.get('includeObject')) } : undefined;
        await serveWatch(w, p, rp, query, req, res, { table }, this.#watches);
        return;
      }
      if (method === 'GET') {
        const listed = await listObjects(w, p, rp, query);
        if (wantsTable(req.headers.accept)) {
          reply({ status: 200, body: toTable(listed.items, { columns: rp.served.columns, now: w.clock.now(), include: includeObjectOf(query.get('includeObject')), resourceVersion: listed.resourceVersion, ...(listed.continue === undefined ? {} : { continue: listed.continue }) }) });
        } else {
          const metadata = { resourceVersion: listed.resourceVersion, ...(listed.continue === undefined ? {} : { continue: listed.continue }) };
          reply({ status: 200, body: { apiVersion: `${rp.group}/${rp.version}`, kind: `${rp.served.rt.kind}List`, metadata, items: listed.items } });
        }
        return;
      }
      if (method === 'POST') {
        if (rp.namespace === undefined) throw new AsbError('MethodNotAllowed', `create a ${rp.served.rt.kind} in a namespace: POST /apis/${rp.group}/${rp.version}/namespaces/<namespace>/${rp.served.rt.plural}`);
        reply(await createObject(w, p, rp, await readPayload(req, w.limits.jsonBytes, false), query));
        return;
      }
      if (method === 'DELETE') {
        // deletecollection is served per namespace only: across namespaces the apiserver has no such route.
        if (rp.namespace === undefined) {
          pageNotFound(res);
          return;
        }
        reply(await deleteCollection(w, p, rp, await readPayload(req, w.limits.jsonBytes, false), query));
        return;
      }
      throw new AsbError('MethodNotAllowed', `${method} is not supported on a collection here: GET (list, watch), POST (create) or DELETE (deletecollection)`);
    }
    if (rp.subresource === 'scale') {
      const scale = scaleSpecOf(rp);
      // A subresource the CRD does not declare is answered as the apiserver answers it: the object is not found.
      if (scale === undefined) throw notFoundError(rp.served.rt, rp.name);
      if (method === 'GET') reply(await getScale(w, p, rp, scale));
      else if (method === 'PUT') reply(await updateScale(w, p, rp, scale, await readPayload(req, w.limits.jsonBytes, false), query));
      else if (method === 'PATCH') {
        const type = patchTypeOf(req.headers['content-type']);
        reply(await patchScale(w, p, rp, scale, type, await readPayload(req, w.limits.jsonBytes, type === 'apply'), query));
      } else throw notSupported(method, rp);
      return;
    }
    if (rp.subresource !== undefined && rp.subresource !== 'status') throw notFoundError(rp.served.rt, rp.name);
    switch (method) {
      case 'GET':
        if (wantsTable(req.headers.accept)) {
          const got = await getObject(w, p, rp);
          reply({ status: 200, body: toTable([got.body as never], { columns: rp.served.columns, now: w.clock.now(), include: includeObjectOf(query.get('includeObject')) }) });
        } else {
          reply(await getObject(w, p, rp));
        }
        return;
      case 'PUT':
        reply(await updateObject(w, p, rp, await readPayload(req, w.limits.jsonBytes, false), query));
        return;
      case 'PATCH': {
        const type = patchTypeOf(req.headers['content-type']);
        reply(await patchObject(w, p, rp, type, await readPayload(req, w.limits.jsonBytes, type === 'apply'), query));
        return;
      }
      case 'DELETE':
        if (rp.subresource !== undefined) throw notSupported(method, rp);
        reply(await deleteObject(w, p, rp, await readPayload(req, w.limits.jsonBytes, false), query));
        return;
      default:
        if (rp.subresource !== undefined) throw notSupported(method, rp);
        throw new AsbError('MethodNotAllowed', `${method} is not supported here: GET, PUT, PATCH or DELETE`);
    }
  }
}

/** A verb a subresource does not take, in the apiserver's words (a POST is its create). */
function notSupported(method: string, rp: ResourcePath): AsbError {
  const verb = method === 'POST' ? 'create' : method.toLowerCase();
  return new AsbError('MethodNotAllowed', `${verb} is not supported on resources of kind "${qualifiedResource(rp.served.rt)}"`);
}

/** Invalid in the apiserver's words: `Kind.group "name" is invalid: [field: message, …]`. */
function inKubeInvalid(err: AsbError, subject: Subject | undefined): AsbError {
  if (err.code !== 'Invalid' || subject === undefined || err.fields.length === 0) return err;
  const message = `${subject.rt.kind}.${subject.rt.group} "${subject.name ?? ''}" is invalid: [${err.fields.map((f) => `${f.field}: ${f.message}`).join(', ')}]`;
  return new AsbError('Invalid', message, { fields: [...err.fields] });
}
