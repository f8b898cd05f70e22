// What the end-to-end data-plane tests run inside sandboxes and how they reach them through an
// edge: a template serving /tmp over HTTP on 8080 (with a marker file naming the sandbox), a
// WebSocket echo server started on demand, and a GET through Envoy addressed by Host header.
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { waitFor } from './wait.ts';
import { api } from './worker-process.ts';

export const WEB_TEMPLATE = {
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name: 'web', namespace: 'default' },
  spec: {
    podTemplate: {
      spec: {
        containers: [
          {
            name: 'main',
            image: 'python:3.11',
            // The marker file names the sandbox, so a test can tell which one answered.
            command: ['sh', '-c', 'hostname > /tmp/whoami.txt && exec python3 -m http.server 8080 --directory /tmp'],
            ports: [{ containerPort: 8080 }],
            readinessProbe: { tcpSocket: { port: 8080 }, periodSeconds: 1 },
          },
        ],
      },
    },
  },
};

export function webPool(replicas: number): unknown {
  return {
    apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
    kind: 'SandboxWarmPool',
    metadata: { name: 'web', namespace: 'default' },
    spec: { replicas, sandboxTemplateRef: { name: 'web' } },
  };
}

export interface EdgeAnswer {
  status: number;
  body: string;
  headers: Record<string, string | string[] | undefined>;
}

/** A GET through the edge at edgeUrl for `host`; `timeoutMs` bounds how long the answer may take. */
export function edgeGet(edgeUrl: string, host: string, opts: { headers?: Record<string, string>; path?: string; timeoutMs?: number } = {}): Promise<EdgeAnswer> {
  const timeoutMs = opts.timeoutMs ?? 20_000;
  return new Promise((resolve, reject) => {
    const req = request(`${edgeUrl}${opts.path ?? '/'}`, { headers: { host, ...opts.headers }, timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms from ${edgeUrl} for ${host}`)));
    req.on('error', reject);
    req.end();
  });
}

/** Starts test/fixtures/ws_echo.py on `port` inside the sandbox and waits until it listens. */
export async function startWsEcho(worker: { apiUrl: string; adminKey: string }, id: string, port: number): Promise<void> {
  const script = readFileSync(new URL('../fixtures/ws_echo.py', import.meta.url));
  const put = await fetch(`${worker.apiUrl}/v1/sandboxes/${id}/files?path=/tmp/ws_echo.py`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${worker.adminKey}`, 'content-type': 'application/octet-stream' },
    body: script,
  });
  if (put.status !== 204) throw new Error(`uploading the echo server: HTTP ${put.status}`);
  await api(worker, 'POST', `/v1/sandboxes/${id}/exec`, { command: `nohup python3 /tmp/ws_echo.py ${port} >/dev/null 2>&1 &` });
  await waitFor('the echo server to listen', async () => {
    const probe = await api<{ exitCode: number }>(worker, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['python3', '-c', `import socket; socket.create_connection(("127.0.0.1", ${port}), 1)`] });
    return probe.body.exitCode === 0 ? true : undefined;
  });
}

/**
 * A template whose server starts listening `delayS` seconds after its pod starts, with no
 * readiness probe: the pod is Running (and routable) well before anything accepts connections
 * on port 8000, as with any app that loads before it binds (python -m http.server after a slow
 * import, a dev server compiling). Serves /tmp, where whoami.txt names the sandbox.
 */
export function slowListenTemplate(name: string, delayS: number): unknown {
  return {
    apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
    kind: 'SandboxTemplate',
    metadata: { name, namespace: 'default' },
    spec: {
      podTemplate: {
        spec: {
          containers: [
            {
              name: 'main',
              image: 'python:3.11',
              command: ['sh', '-c', `hostname > /tmp/whoami.txt && sleep ${delayS} && exec python3 -m http.server 8000 --directory /tmp`],
              ports: [{ containerPort: 8000 }],
            },
          ],
        },
      },
    },
  };
}
