// The kube store's transport, and the one module that loads @kubernetes/client-node: its
// KubeConfig reads the kubeconfig (server, CA, client certificate, token, exec and OIDC
// credential plugins) into request options; requests then go over node:https with keep-alive
// agents we own.
//
// Why not the generated API classes: a claim is one PUT on the hot path, and the generic
// CustomObjectsApi would add a serializer pass and a second code path for cluster-scoped kinds;
// its Watch gives up on the first error and drops lines it cannot parse, and we supervise
// watches ourselves (kube-watch.ts). What we need from the library is the part that is hard to
// get right: reading every kind of kubeconfig credential.
import { KubeConfig } from '@kubernetes/client-node';
import http from 'node:http';
import https from 'node:https';
import { setTimeout as sleep } from 'node:timers/promises';
import { AsbError } from '../errors.ts';

export interface KubeResponse {
  status: number;
  /** Parsed JSON, or undefined for an empty or non-JSON body. */
  body: unknown;
}

/** A streamed GET (a watch): lines as they arrive, then exactly one end. */
export interface StreamHandlers {
  /** The response started with this status; for a non-200 the body follows as one onEnd. */
  onResponse(status: number): void;
  onLine(line: string): void;
  /** err undefined: the server ended the stream; otherwise why it broke. */
  onEnd(err: Error | undefined, errorBody?: unknown): void;
}

export interface Stream {
  /** Aborts the request; onEnd is not called afterwards. */
  abort(): void;
}

// Non-watch requests: an apiserver answers in milliseconds; 30 s means it is stuck.
const REQUEST_TIMEOUT_MS = 30_000;
// The apiserver (Go net/http) closes idle connections after 90 s; dropping ours after 60 s
// means a reused socket is never one the server is closing at the same moment.
const IDLE_SOCKET_MS = 60_000;
// Concurrent requests the store keeps open to one apiserver. 64 covers a claim burst of 64
// (one PUT each) without a TLS handshake per request; more only queues at the server's
// max-mutating-requests-inflight (200) anyway.
const MAX_SOCKETS = 64;
const THROTTLED_RETRIES = 5;

export interface KubeTarget {
  /** The server URL, e.g. https://127.0.0.1:6443 */
  server: string;
  /** The kubeconfig context's namespace, if it names one. */
  namespace: string | undefined;
}

export function loadKubeConfig(source: string | KubeConfig): KubeConfig {
  if (typeof source !== 'string') return source;
  const kc = new KubeConfig();
  try {
    kc.loadFromFile(source);
  } catch (err) {
    throw new AsbError('Unavailable', `kubeconfig ${source}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
  return kc;
}

/**
 * A Pod's own credentials, as kubectl in a Pod finds them: the API server from
 * KUBERNETES_SERVICE_HOST/PORT, the ServiceAccount token, the cluster CA and the Pod's namespace
 * (as the context's namespace) under /var/run/secrets/kubernetes.io/serviceaccount.
 */
export function inClusterKubeConfig(): KubeConfig {
  if (process.env.KUBERNETES_SERVICE_HOST === undefined || process.env.KUBERNETES_SERVICE_HOST === '') {
    throw new AsbError('Unavailable', 'no kubeconfig given (--kubeconfig, ASB_KUBECONFIG or KUBECONFIG) and not running in a Pod (KUBERNETES_SERVICE_HOST is unset), so there is no API server to use');
  }
  const kc = new KubeConfig();
  kc.loadFromCluster();
  return kc;
}

function targetOf(kc: KubeConfig): KubeTarget {
  const cluster = kc.getCurrentCluster();
  if (cluster === null) throw new AsbError('Unavailable', `kubeconfig: the current context "${kc.getCurrentContext()}" names no cluster`);
  const ns = kc.getContextObject(kc.getCurrentContext())?.namespace;
  return { server: cluster.server.replace(/\/+$/, ''), namespace: ns === undefined || ns === '' ? undefined : ns };
}

export interface Credentials {
  /** TLS: the CA, the client certificate and key, verification. */
  agentOptions: Pick<https.AgentOptions, 'ca' | 'cert' | 'key' | 'rejectUnauthorized' | 'servername'>;
  /** Authorization (a token, basic auth, or what an exec or OIDC plugin gave). */
  headers: Record<string, string>;
}

/**
 * The kubeconfig's current credentials; rejects with AsbError Unavailable. Reads the CA and
 * certificate files and may run a credential plugin: callers keep the result.
 */
export async function credentialsOf(kc: KubeConfig): Promise<Credentials> {
  const opts: https.RequestOptions = {};
  try {
    await kc.applyToHTTPSOptions(opts);
  } catch (err) {
    throw new AsbError('Unavailable', `kubeconfig: cannot read the credentials of context "${kc.getCurrentContext()}": ${String(err)}`, { cause: err });
  }
  const headers: Record<string, string> = {};
  for (const [key, value] of Object.entries(opts.headers ?? {})) if (value !== undefined) headers[key] = String(value);
  if (opts.auth !== undefined && opts.auth !== null) headers.Authorization = `Basic ${Buffer.from(opts.auth).toString('base64')}`;
  const agentOptions: Credentials['agentOptions'] = {};
  if (opts.ca !== undefined) agentOptions.ca = opts.ca;
  if (opts.cert !== undefined) agentOptions.cert = opts.cert;
  if (opts.key !== undefined) agentOptions.key = opts.key;
  if (opts.rejectUnauthorized !== undefined) agentOptions.rejectUnauthorized = opts.rejectUnauthorized;
  if (opts.servername !== undefined) agentOptions.servername = opts.servername;
  return { agentOptions, headers };
}

function networkError(server: string, err: unknown): AsbError {
  const code = (err as NodeJS.ErrnoException).code;
  const detail = err instanceof Error ? err.message : String(err);
  return new AsbError('Unavailable', `API server ${server} unreachable${code === undefined ? '' : ` (${code})`}: ${detail}`, { cause: err });
}

function parseBody(text: string): unknown {
  if (text === '') return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

export class KubeHttp {
  readonly target: KubeTarget;
  #kc: KubeConfig;
  #url: URL;
  #secure: boolean;
  #headers: Record<string, string>;
  /** Short requests, pooled. */
  #agent: http.Agent;
  /** Watches: long-lived, so they get their own sockets and never starve short requests. */
  #watchAgent: http.Agent;
  #refreshing: Promise<void> | undefined;
  #closed = false;

  private constructor(kc: KubeConfig, target: KubeTarget, creds: Credentials) {
    this.#kc = kc;
    this.target = target;
    this.#url = new URL(target.server);
    this.#secure = this.#url.protocol === 'https:';
    this.#headers = creds.headers;
    const common = { keepAlive: true, timeout: IDLE_SOCKET_MS, scheduling: 'lifo' as const };
    this.#agent = this.#secure ? new https.Agent({ ...creds.agentOptions, ...common, maxSockets: MAX_SOCKETS }) : new http.Agent({ ...common, maxSockets: MAX_SOCKETS });
    this.#watchAgent = this.#secure ? new https.Agent({ ...creds.agentOptions, keepAlive: true }) : new http.Agent({ keepAlive: true });
  }

  static async open(kc: KubeConfig): Promise<KubeHttp> {
    const target = targetOf(kc);
    return new KubeHttp(kc, target, await credentialsOf(kc));
  }

  /** Re-reads credentials (an exec or OIDC token may have expired); one refresh at a time. */
  async #refresh(): Promise<void> {
    this.#refreshing ??= credentialsOf(this.#kc)
      .then((creds) => {
        this.#headers = creds.headers;
      })
      .finally(() => {
        this.#refreshing = undefined;
      });
    return this.#refreshing;
  }

  #options(method: string, path: string, agent: http.Agent, body: string | undefined): http.RequestOptions {
    const headers: Record<string, string> = { ...this.#headers, Accept: 'application/json' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      headers['Content-Length'] = String(Buffer.byteLength(body));
    }
    return { method, host: this.#url.hostname, port: this.#url.port, path, agent, headers };
  }

  #send(opts: http.RequestOptions): http.ClientRequest {
    return this.#secure ? https.request(opts) : http.request(opts);
  }

  /** One request; rejects only with AsbError Unavailable/Timeout (no answer). */
  async request(method: string, path: string, body?: string): Promise<KubeResponse> {
    if (this.#closed) throw new AsbError('Unavailable', 'store is closed');
    let res = await this.#once(method, path, body, true);
    if (res.status === 401) {
      // Credentials from a plugin expire; read them again once before giving up.
      await this.#refresh();
      res = await this.#once(method, path, body, true);
    }
    // 429: refused before it was handled (API priority and fairness, or a kind whose storage is
    // re-initializing just after its CRD changed), so sending it again is safe for any method, as
    // client-go does. 250 ms doubling to 1 s, 5 times: ~4 s, then the caller sees Unavailable.
    for (let attempt = 0; res.status === 429 && attempt < THROTTLED_RETRIES; attempt++) {
      await sleep(Math.min(250 * 2 ** attempt, 1_000));
      res = await this.#once(method, path, body, true);
    }
    return res;
  }

  #once(method: string, path: string, body: string | undefined, mayRetry: boolean): Promise<KubeResponse> {
    return new Promise((resolve, reject) => {
      const req = this.#send(this.#options(method, path, this.#agent, body));
      req.setTimeout(REQUEST_TIMEOUT_MS, () => {
        req.destroy(new AsbError('Timeout', `API server ${this.target.server}: no answer to ${method} ${path} within ${REQUEST_TIMEOUT_MS} ms`));
      });
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: parseBody(Buffer.concat(chunks).toString('utf8')) }));
        res.on('error', (err) => reject(networkError(this.target.server, err)));
      });
      req.on('error', (err) => {
        // A kept-alive socket the server closed just as we reused it: the request never reached
        // the server, so sending it again on a fresh socket is safe (Node's documented pattern).
        if (mayRetry && req.reusedSocket && (err as NodeJS.ErrnoException).code === 'ECONNRESET') {
          this.#once(method, path, body, false).then(resolve, reject);
          return;
        }
        reject(err instanceof AsbError ? err : networkError(this.target.server, err));
      });
      req.end(body);
    });
  }

  /** A streamed GET: lines as they arrive (a watch). */
  stream(path: string, handlers: StreamHandlers): Stream {
    let done = false;
    const end = (err: Error | undefined, errorBody?: unknown): void => {
      if (done) return;
      done = true;
      handlers.onEnd(err, errorBody);
    };
    if (this.#closed) {
      queueMicrotask(() => end(new AsbError('Unavailable', 'store is closed')));
      return { abort: () => (done = true) };
    }
    const req = this.#send(this.#options('GET', path, this.#watchAgent, undefined));
    req.on('response', (res) => {
      const status = res.statusCode ?? 0;
      if (!done) handlers.onResponse(status);
      if (status === 401) void this.#refresh().catch(() => undefined); // the retry after backoff uses fresh credentials
      if (status !== 200) {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => end(undefined, parseBody(Buffer.concat(chunks).toString('utf8'))));
        res.on('error', (err) => end(networkError(this.target.server, err)));
        return;
      }
      res.setEncoding('utf8');
      let partial = '';
      res.on('data', (chunk: string) => {
        partial += chunk;
        let nl = partial.indexOf('\n');
        while (nl >= 0 && !done) {
          const line = partial.slice(0, nl);
          partial = partial.slice(nl + 1);
          if (line.trim() !== '') handlers.onLine(line);
          nl = partial.indexOf('\n');
        }
      });
      res.on('end', () => end(undefined));
      res.on('error', (err) => end(networkError(this.target.server, err)));
      res.on('close', () => end(res.complete ? undefined : networkError(this.target.server, new Error('watch stream closed mid-response'))));
    });
    req.on('error', (err) => end(networkError(this.target.server, err)));
    req.end();
    return {
      abort: () => {
        done = true;
        req.destroy();
      },
    };
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#agent.destroy();
    this.#watchAgent.destroy();
  }
}
