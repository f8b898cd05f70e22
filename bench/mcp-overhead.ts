// What a tool call over MCP costs beside the REST call it wraps: 30 × `true` through
// POST /v1/sandboxes/{id}/exec, through run_command over the worker's /mcp (one POST, then the
// loopback REST call), and through `asb mcp` on stdio, on one real sandbox. Prints p50 and p90 in ms.
// Run: .tools/node/bin/node bench/mcp-overhead.ts (its own system: bridge asbmcpb, 10.144.0.0/16).
import { performance } from 'node:perf_hooks';
import { startTestSystem } from '../test/support/local-system.ts';
import { api } from '../test/support/worker-process.ts';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const N = 30;

function pct(xs: number[], p: number): string {
  const s = [...xs].sort((a, b) => a - b);
  return (s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? 0).toFixed(1);
}

async function time(label: string, fn: () => Promise<unknown>): Promise<void> {
  await fn();
  const xs: number[] = [];
  for (let i = 0; i < N; i++) {
    const t0 = performance.now();
    await fn();
    xs.push(performance.now() - t0);
  }
  console.log(`${label.padEnd(34)} p50 ${pct(xs, 50)} ms  p90 ${pct(xs, 90)} ms  (n=${String(N)})`);
}

const system = await startTestSystem('mcpb', 144, 'local', 0, false, ['bench']);
try {
  const key = system.teamKeys.bench ?? '';
  const sb = (await api<{ id: string }>(system, 'POST', '/v1/sandboxes', { template: 'base' }, key)).body;
  const http = new Client({ name: 'bench', version: '1' });
  await http.connect(new StreamableHTTPClientTransport(new URL('/mcp', system.apiUrl), { requestInit: { headers: { authorization: `Bearer ${key}` } } }));
  const stdio = new Client({ name: 'bench', version: '1' });
  await stdio.connect(new StdioClientTransport({ command: 'bin/asb', args: ['mcp'], env: { PATH: process.env.PATH ?? '', ASB_API_URL: system.apiUrl, ASB_API_KEY: key } }));
  await time('REST POST /exec', () => api(system, 'POST', `/v1/sandboxes/${sb.id}/exec`, { command: 'true' }, key));
  await time('MCP run_command, worker /mcp', () => http.callTool({ name: 'run_command', arguments: { sandbox_id: sb.id, command: 'true' } }));
  await time('MCP run_command, asb mcp (stdio)', () => stdio.callTool({ name: 'run_command', arguments: { sandbox_id: sb.id, command: 'true' } }));
  await time('MCP tools/list, worker /mcp', () => http.listTools());
  await http.close();
  await stdio.close();
} finally {
  await system.cleanup();
}
