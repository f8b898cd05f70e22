// The MCP SDK's own client, as an agent's host runs it, on either transport: `asb mcp` spawned on
// stdio, or streamable HTTP at a worker's or the hub's /mcp with a team's key as bearer.
import { resolve } from 'node:path';
import type { TestContext } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const ASB = resolve(import.meta.dirname, '../../bin/asb');

export interface ToolAnswer {
  isError: boolean;
  /** The tool's structured content (undefined on an error). */
  data: Record<string, unknown>;
  /** The text a model reads. */
  text: string;
}

export interface McpTestClient {
  client: Client;
  call(name: string, args?: Record<string, unknown>): Promise<ToolAnswer>;
  /** Calls a tool and fails the test with its text when it answered an error. */
  ok(name: string, args?: Record<string, unknown>): Promise<Record<string, unknown>>;
}

function wrap(client: Client): McpTestClient {
  const call = async (name: string, args: Record<string, unknown> = {}): Promise<ToolAnswer> => {
    // Creates, snapshots and forks wait for real sandboxes: longer than the SDK's 60 s default is allowed.
    const r = await client.callTool({ name, arguments: args }, undefined, { timeout: 240_000 });
    const content = r.content as { type: string; text?: string }[];
    const text = content.map((c) => c.text ?? '').join('\n');
    return { isError: r.isError === true, data: (r.structuredContent ?? {}) as Record<string, unknown>, text };
  };
  return {
    client,
    call,
    async ok(name, args) {
      const r = await call(name, args);
      if (r.isError) throw new Error(`${name} answered an error: ${r.text}`);
      return r.data;
    },
  };
}

/** `asb mcp` as a child process on stdio, with the given API URL and key in its environment. */
export async function stdioClient(t: TestContext, apiUrl: string, key: string, cwd: string): Promise<McpTestClient> {
  const transport = new StdioClientTransport({
    command: ASB,
    args: ['mcp'],
    cwd,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/root', ASB_API_URL: apiUrl, ASB_API_KEY: key },
    stderr: 'pipe',
  });
  const client = new Client({ name: 'asb-test', version: '1.0.0' });
  await client.connect(transport);
  t.after(() => client.close());
  return wrap(client);
}

/** Streamable HTTP at `<base>/mcp` with `key` as bearer. */
export async function httpClient(t: TestContext, baseUrl: string, key: string): Promise<McpTestClient> {
  const transport = new StreamableHTTPClientTransport(new URL('/mcp', baseUrl), { requestInit: { headers: { authorization: `Bearer ${key}` } } });
  const client = new Client({ name: 'asb-test', version: '1.0.0' });
  await client.connect(transport);
  t.after(() => client.close());
  return wrap(client);
}
