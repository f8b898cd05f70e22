// The kubernetes-sigs sandbox-router's data plane on the owning worker: requests the edge routed
// by X-Sandbox-ID / -Namespace / -Port / -Timeout (the k8s-agent-sandbox Python SDK; see
// src/router/host.ts). Their SDK's Direct mode can carry only client-wide static headers, so they
// bear the team's API key rather than a sandbox's access token, which the router cannot check:
// the worker does, here, before anything reaches the pod.
//
//   1. API key (Authorization: Bearer or X-API-Key): none or unknown → 401.
//   2. The sandbox: unknown, not claimed, being deleted, another team's, or in another namespace
//      than X-Sandbox-Namespace → 404, all alike (one team cannot probe another's ids).
//   3. Hibernated → resumed; starting → waited for (both bounded by the worker's waitReadyMs).
//   4. Port 8888 (the python-runtime's) of a pod without `asb.dev/python-runtime: pod`: answered
//      here by the worker (../python-runtime/), inside the sandbox through the pod runtime.
//   5. Otherwise, after a wake or a wait, until the port accepts connections (at most 25 s, as
//      the router holds a wake): an app that binds a while after its pod runs gives one slow
//      answer, not a 503.
//   6. Proxied to <pod IP>:<port> over HTTP/1.1 with the key, our and upstream's routing headers
//      removed (request.ts); X-Sandbox-Pod-IP is never read. No answer from the pod within
//      X-Sandbox-Timeout (default and cap 180 s, as upstream's router) → 504; no connection → 503.
import { request as httpRequest, type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { LABEL, wantsRunning, type Sandbox } from '../../api/types.ts';
import { AsbError } from '../../errors.ts';
import { PortWaiter } from '../../router/port-wait.ts';
import { canSee } from '../access.ts';
import { isObjectName } from '../../api/names.ts';
import type { WorkerContext } from '../deps.ts';
import type { Authenticator } from '../../auth/keyring.ts';
import { AUTH_HINT, presentedKey } from '../../http/presented-key.ts';
import { toAsbError, writeProblem } from '../../http/problem.ts';
import type { UserIds } from '../envd/users.ts';
import { PythonRuntime } from '../python-runtime/python-runtime.ts';
import { resumeSandbox, waitReady } from '../sandbox-lifecycle.ts';
import type { UploadSlots } from '../upload-slots.ts';
import { clientResponseHeaders, podRequestHeaders, PYTHON_RUNTIME_ANNOTATION, PYTHON_RUNTIME_PORT, sigsCallOf, type SigsCall } from './request.ts';

/** How long a request for a sandbox it woke (or waited for) waits for the port to listen: the router's hold limit for a wake. */
export const LISTEN_LIMIT_MS = 25_000;

export class SandboxRouterProxy {
  readonly #w: WorkerContext;
  readonly #auth: Authenticator;
  readonly #python: PythonRuntime;
  /** Requests to pods in flight, aborted by close(). */
  readonly #upstreams = new Set<ClientRequest>();
  readonly #ports: PortWaiter;
  /** Aborted by close(): ends waits for a port. */
  readonly #closing = new AbortController();
  #closed = false;

  constructor(w: WorkerContext, auth: Authenticator, uploads: UploadSlots, users: UserIds) {
    this.#w = w;
    this.#auth = auth;
    this.#python = new PythonRuntime(w, uploads, users);
    this.#ports = new PortWaiter({ clock: w.clock });
  }

  /** The node:http handler for a request isSigsRequest accepted. */
  handle(req: IncomingMessage, res: ServerResponse): void {
    this.#serve(req, res).catch((err: unknown) => {
      const problem = toAsbError(err);
      if (problem.code === 'Internal') this.#w.log.error({ err, url: req.url }, 'sandbox-router request failed');
      if (res.headersSent) {
        res.destroy();
        return;
      }
      writeProblem(res, problem, problem.code === 'Unauthorized' ? { 'www-authenticate': 'Bearer realm="asb"' } : {});
    });
  }

  /** Aborts every request still waiting on a pod, so the server can close. Idempotent. */
  close(): void {
    this.#closed = true;
    this.#closing.abort(new AsbError('Unavailable', 'the worker is shutting down', { retryAfterS: 2 }));
    for (const upstream of this.#upstreams) upstream.destroy();
    this.#upstreams.clear();
  }

  async #serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const call = sigsCallOf(req.headers);
    const key = presentedKey(req);
    if (key === undefined || key === '') throw new AsbError('Unauthorized', `no API key: ${AUTH_HINT}`);
    const principal = this.#auth.verify(key);
    if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown to the worker or revoked; ${AUTH_HINT}`);
    let sandbox = await this.#sandbox(call);
    if (sandbox === undefined || !canSee(principal, sandbox)) throw notFound(call);
    const answered = call.port === PYTHON_RUNTIME_PORT && sandbox.spec.podTemplate.metadata?.annotations?.[PYTHON_RUNTIME_ANNOTATION] !== 'pod';
    const w = this.#w;
    let waited = false;
    if (!wantsRunning(sandbox.spec)) {
      sandbox = await resumeSandbox(w, sandbox, true);
      waited = true;
    }
    let ip = this.#podIp(call.id);
    if (ip === undefined) {
      await waitReady(w, sandbox);
      waited = true;
      ip = this.#podIp(call.id);
    }
    if (ip === undefined) throw new AsbError('Unavailable', `sandbox ${call.id} is not running`, { retryAfterS: 2 });
    if (answered) {
      if (this.#closed) throw new AsbError('Unavailable', 'the worker is shutting down', { retryAfterS: 2 });
      w.operator.activity.touch(call.id);
      await this.#python.serve(req, res, { sandbox, id: call.id, uploadKey: `key:${principal.prefix}`, uploadWho: `API key ${principal.prefix}` });
      return;
    }
    if (waited) {
      const gone = new AbortController();
      res.once('close', () => gone.abort(new AsbError('Unavailable', 'the client went away')));
      await this.#ports.untilListening(ip, call.port, LISTEN_LIMIT_MS, AbortSignal.any([gone.signal, this.#closing.signal]), `sandbox ${call.id}`);
    }
    if (this.#closed) throw new AsbError('Unavailable', 'the worker is shutting down', { retryAfterS: 2 });
    w.operator.activity.touch(call.id);
    await this.#proxy(req, res, call, ip);
  }

  /** The claimed, live sandbox of this worker with that id in that namespace, or undefined. */
  async #sandbox(call: SigsCall): Promise<Sandbox | undefined> {
    if (!isObjectName(call.id)) return undefined;
    const w = this.#w;
    const sandbox = await w.index.find(call.id, [w.defaultNamespace]);
    if (sandbox === undefined || sandbox.metadata.deletionTimestamp !== undefined) return undefined;
    const owner = sandbox.metadata.labels?.[LABEL.owner];
    if (owner === undefined || owner === '') return undefined;
    // Ids are unique per cluster across namespaces, so another namespace is a wrong address, never another sandbox.
    if ((sandbox.metadata.namespace ?? w.defaultNamespace) !== call.namespace) return undefined;
    return sandbox;
  }

  #podIp(id: string): string | undefined {
    const state = this.#w.runtime.state(id);
    return state.phase === 'Running' ? state.ip : undefined;
  }

  #proxy(req: IncomingMessage, res: ServerResponse, call: SigsCall, ip: string): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const upstream = httpRequest({ host: ip, port: call.port, method: req.method, path: req.url ?? '/', headers: podRequestHeaders(req.headers, call.id), timeout: call.timeoutMs });
      this.#upstreams.add(upstream);
      let answered = false;
      const fail = (err: AsbError): void => {
        this.#upstreams.delete(upstream);
        req.unpipe(upstream);
        upstream.destroy();
        if (answered) {
          res.destroy();
          resolve();
        } else {
          reject(err);
        }
      };
      upstream.on('timeout', () => {
        fail(new AsbError('Timeout', `port ${call.port} of sandbox ${call.id} did not answer within ${call.timeoutMs} ms (X-Sandbox-Timeout)`));
      });
      upstream.on('error', (err: NodeJS.ErrnoException) => {
        fail(new AsbError('Unavailable', `could not reach port ${call.port} of sandbox ${call.id}: ${err.code ?? err.message}; is a server listening there?`, { retryAfterS: 2, cause: err }));
      });
      upstream.on('response', (answer) => {
        answered = true;
        // The timeout bounds the wait for an answer, not a long download.
        upstream.setTimeout(0);
        res.writeHead(answer.statusCode ?? 502, answer.statusMessage, clientResponseHeaders(answer.headers));
        answer.pipe(res);
        answer.on('error', () => res.destroy());
        res.on('close', () => {
          this.#upstreams.delete(upstream);
          if (!answer.complete) upstream.destroy();
          resolve();
        });
      });
      // A client that goes away mid-request: drop the pod request too.
      res.on('close', () => {
        if (!answered) fail(new AsbError('Unavailable', 'the client went away'));
      });
      req.pipe(upstream);
    });
  }
}

function notFound(call: SigsCall): AsbError {
  return new AsbError('NotFound', `sandbox "${call.id}" not found in namespace "${call.namespace}"`);
}
