// The app the state tests run (pause with memory, snapshots, fork): a python3 HTTP server whose
// state lives only in its memory, a token drawn at start and a counter each GET bumps, answering
// "<token> <count>". A fresh start answers with another token and counts from 1 again; a restored
// one goes on. With `hold`, its first argument is a number of MiB of touched memory it keeps, so
// its memory image is that big.
import assert from 'node:assert/strict';
import { get } from 'node:http';
import type { PodRequest, PodState } from '../../src/runtime/runtime.ts';

export function counterApp(port: number, opts: { hold?: boolean } = {}): string {
  return [
    'import http.server, os, sys',
    ...(opts.hold === true ? ['hold = b"\\x01" * (int(sys.argv[1]) << 20)'] : []),
    'token = os.urandom(8).hex()',
    'n = 0',
    'class H(http.server.BaseHTTPRequestHandler):',
    '    def do_GET(self):',
    '        global n',
    '        n += 1',
    '        body = f"{token} {n}".encode()',
    '        self.send_response(200)',
    '        self.send_header("Content-Length", str(len(body)))',
    '        self.end_headers()',
    '        self.wfile.write(body)',
    '    def log_message(self, *args):',
    '        pass',
    `http.server.HTTPServer(("0.0.0.0", ${String(port)}), H).serve_forever()`,
  ].join('\n');
}

/** One GET on a fresh connection; the body. */
export function httpGet(url: string, timeoutMs = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = get(url, { agent: false, timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve(body));
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url} timed out`)));
    req.on('error', reject);
  });
}

/** What the helpers below need of a runtime. */
interface Runtime {
  start(req: PodRequest): Promise<PodState>;
  state(id: string): PodState;
  exec(id: string, req: { command: string[] }): Promise<{ exitCode: number; stdout: Uint8Array; stderr: Uint8Array }>;
}

/** Started and answering: the readiness probe saw the port (bounded: 10 s). */
export async function startedReady(rt: Runtime, req: PodRequest): Promise<PodState> {
  const state = await rt.start(req);
  assert.equal(state.phase, 'Running', `${req.id}: ${JSON.stringify(state)}`);
  for (let i = 0; i < 200 && !rt.state(req.id).ready; i++) await new Promise((resolve) => setTimeout(resolve, 50));
  const ready = rt.state(req.id);
  assert.equal(ready.ready, true, `${req.id} never became ready: ${JSON.stringify(ready)}`);
  return ready;
}

/** A shell script's stdout in the pod; it must exit 0. */
export async function podSh(rt: Runtime, id: string, script: string): Promise<string> {
  const r = await rt.exec(id, { command: ['sh', '-c', script] });
  assert.equal(r.exitCode, 0, `${id}: ${Buffer.from(r.stderr).toString()}`);
  return Buffer.from(r.stdout).toString();
}
