// The egress benchmark's load client, run inside the sandbox namespace (`ip netns exec … node
// bench/egress-load.ts <json>`); prints one JSON line of figures. Modes:
//   requests:    `connections` kept-alive connections, each sending small GETs back to back
//   connections: every GET on a new connection (TLS handshake and the proxy's Check each time)
//   bulk:        one connection downloading `bytes`-sized bodies back to back
import http from 'node:http';
import https from 'node:https';
import { readFileSync } from 'node:fs';

interface Job {
  scheme: 'http' | 'https';
  ip: string;
  name: string;
  caPath: string;
  mode: 'requests' | 'connections' | 'bulk';
  connections: number;
  durationMs: number;
  bytes: number;
  /** Connect here instead of ip:443/80 (the bare-Envoy floor listens on the gateway). */
  port?: number;
}

const job = JSON.parse(process.argv[2] ?? '{}') as Job;
const ca = readFileSync(job.caPath);
const keepAlive = job.mode !== 'connections';
const agent = job.scheme === 'https' ? new https.Agent({ keepAlive, maxSockets: job.connections, ca }) : new http.Agent({ keepAlive, maxSockets: job.connections });
const path = job.mode === 'bulk' ? `/bytes/${job.bytes}` : '/quiet';

function once(): Promise<number> {
  return new Promise((resolve, reject) => {
    const opts = { host: job.ip, port: job.port ?? (job.scheme === 'https' ? 443 : 80), path, agent, servername: job.name, headers: { host: job.name } };
    const req = (job.scheme === 'https' ? https : http).get(opts, (res) => {
      let n = 0;
      res.on('data', (c: Buffer) => (n += c.length));
      res.on('end', () => (res.statusCode === 200 ? resolve(n) : reject(new Error(`status ${res.statusCode ?? 0}`))));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
}

const latencies: number[] = [];
let bytes = 0;
let errors = 0;
const started = performance.now();
const deadline = started + job.durationMs;
await Promise.all(
  Array.from({ length: job.connections }, async () => {
    while (performance.now() < deadline) {
      const t0 = performance.now();
      try {
        bytes += await once();
        latencies.push(performance.now() - t0);
      } catch {
        errors++;
      }
    }
  }),
);
const wallMs = performance.now() - started;
latencies.sort((a, b) => a - b);
const pct = (p: number): number => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] ?? 0;
process.stdout.write(`${JSON.stringify({ requests: latencies.length, errors, wallMs, perSec: (latencies.length * 1000) / wallMs, mbPerSec: bytes / 1e6 / (wallMs / 1000), p50Ms: pct(0.5), p99Ms: pct(0.99) })}\n`);
agent.destroy();
