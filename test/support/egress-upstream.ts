// "Public" servers for the egress tests, run inside the test's own network namespace
// (`ip netns exec … node egress-upstream.ts <config json>`). On each address: HTTP on 80 and
// HTTPS on 443 answering with what arrived (Host, path, headers, SNI, the address that served;
// paths containing "quiet" answer just "ok"),
// a server-speaks-first TCP service on 2222 (an SSH-like banner), and on 9000 a control port
// reporting how many connections each port accepted. Prints "ready" once everything listens.
import { createServer as createHttp, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttps } from 'node:https';
import { createServer as createTcp, type Socket } from 'node:net';
import { readFileSync } from 'node:fs';
import { TLSSocket } from 'node:tls';

interface Config {
  addresses: string[];
  certChainPath: string;
  privateKeyPath: string;
}

const config = JSON.parse(process.argv[2] ?? '{}') as Config;
const accepted = new Map<string, number>();
/** The last request any server received (control port: GET /last), so a test can see what arrived without the sandbox seeing it. */
let last: unknown = null;
const count = (key: string): void => {
  accepted.set(key, (accepted.get(key) ?? 0) + 1);
};

function echo(address: string, scheme: string) {
  return (req: IncomingMessage, res: ServerResponse): void => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const socket: unknown = req.socket;
      const sni = socket instanceof TLSSocket && typeof socket.servername === 'string' ? socket.servername : undefined;
      const seen = { served: address, scheme, host: req.headers.host, path: req.url, sni, headers: req.headers, bodyBytes: Buffer.concat(chunks).length };
      last = seen;
      const body = JSON.stringify(seen);
      if (req.url?.includes('quiet') === true) {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end('ok\n');
        return;
      }
      if (req.url?.startsWith('/bytes/') === true) {
        const n = Number(req.url.slice('/bytes/'.length));
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(n) });
        res.end(Buffer.alloc(n, 120));
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(body);
    });
  };
}

const listening: Promise<void>[] = [];
function listen(server: { listen(port: number, host: string, cb: () => void): unknown; on(ev: 'connection', cb: (s: Socket) => void): unknown }, port: number, address: string): void {
  server.on('connection', () => count(`${address}:${port}`));
  listening.push(new Promise((resolve) => server.listen(port, address, resolve)));
}

const tls = { cert: readFileSync(config.certChainPath), key: readFileSync(config.privateKeyPath) };
for (const address of config.addresses) {
  listen(createHttp(echo(address, 'http')), 80, address);
  const https = createHttps(tls, echo(address, 'https'));
  https.on('secureConnection', () => undefined);
  listen(https, 443, address);
  listen(
    createTcp((s) => {
      s.on('error', () => undefined);
      s.end('SSH-2.0-egress-test\r\n');
    }),
    2222,
    address,
  );
}
const control = createHttp((req, res) => {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify(req.url === '/last' ? last : Object.fromEntries(accepted)));
});
const first = config.addresses[0] ?? '127.0.0.1';
listening.push(new Promise((resolve) => control.listen(9000, first, resolve)));
await Promise.all(listening);
process.stdout.write('ready\n');
// The test ends us with SIGTERM (or we die with our stdin when it goes away).
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
