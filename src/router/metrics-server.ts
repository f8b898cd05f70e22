// The router's Prometheus metrics over HTTP (--metrics-listen): GET /metrics serves its registry
// (the asb_router_* series) for the admin key the router already holds to reach its workers, the
// same key a worker's /metrics takes. Nothing else is served; the ext_proc hot path never waits on it.
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import { listen } from '../system/http-server.ts';
import type { Logger } from '../system/log.ts';
import { presentedKey } from '../worker/presented-key.ts';

export interface MetricsServer {
  /** host:port it listens on. */
  readonly address: string;
  close(): Promise<void>;
}

const digest = (text: string): Buffer => createHash('sha256').update(text).digest();

export async function startMetricsServer(opts: { listen: string; registry: Registry; key: string; log: Logger }): Promise<MetricsServer> {
  const expected = digest(opts.key);
  const answer = (res: ServerResponse, status: number, text: string, headers: Record<string, string> = {}): void => {
    res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', ...headers });
    res.end(`${text}\n`);
  };
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = new URL(req.url ?? '/', 'http://router.invalid').pathname;
    if (path !== '/metrics') return answer(res, 404, `no such path on the router's metrics listener: ${path}; GET /metrics`);
    const key = presentedKey(req);
    // Compared as digests: equal lengths, constant time.
    if (key === undefined || !timingSafeEqual(digest(key), expected)) {
      return answer(res, 401, 'the router\'s /metrics needs the admin API key it was given (--worker-key) as "Authorization: Bearer <key>"', { 'www-authenticate': 'Bearer realm="asb-router"' });
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') return answer(res, 405, `${req.method ?? ''} is not allowed on /metrics; allowed: GET`, { allow: 'GET' });
    const text = await opts.registry.metrics();
    res.writeHead(200, { 'content-type': opts.registry.contentType });
    res.end(text);
  };
  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      opts.log.error({ err }, 'metrics request failed');
      res.destroy();
    });
  });
  const sep = opts.listen.lastIndexOf(':');
  await listen(server, Number(opts.listen.slice(sep + 1)), opts.listen.slice(0, sep));
  const bound = server.address();
  const address = typeof bound === 'object' && bound !== null ? `${opts.listen.slice(0, sep)}:${bound.port}` : opts.listen;
  let closing: Promise<void> | undefined;
  return {
    address,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
