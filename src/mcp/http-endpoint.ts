// POST /mcp on the worker and the hub: the MCP tools (tools.ts) over streamable HTTP, for agents
// that take a URL and a bearer token instead of a command to spawn.
//
// Stateless: each POST gets its own MCP server and transport (the SDK's stateless mode, JSON
// answers), so nothing is kept between requests and any worker or hub behind a balancer can
// answer any of them. The caller's API key is checked first, by the REST pipeline's own check, and
// 401 is a problem+json answer like every other route's, counted as the pipeline counts its own.
// The tools then call this same server's REST API over loopback (the address the request came in
// on) with that same key: the REST routes check it again and scope to its team, so MCP can see and
// do exactly what the key can through REST, by construction, and no tool reimplements a route. The
// hop costs a loopback request per tool call, small beside the exec or create it carries.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createApiClient } from '../client/api-client.ts';
import { AsbError } from '../errors.ts';
import { authenticate, type PipelineOptions } from '../http/pipeline.ts';
import { toAsbError, writeProblem } from '../http/problem.ts';
import { createMcpServer } from './tools.ts';

export const MCP_PATH = '/mcp';

/** As the server's REST pipeline is given them (its key check, logger, counters, name and realm), and the version to report. */
export interface McpEndpointOptions extends Pick<PipelineOptions, 'auth' | 'log' | 'requests' | 'errors' | 'server' | 'realm'> {
  version: string;
}

/** Whether a request's path (query ignored) is the MCP endpoint. */
export function isMcpPath(url: string | undefined): boolean {
  const target = url ?? '/';
  const q = target.indexOf('?');
  return (q === -1 ? target : target.slice(0, q)) === MCP_PATH;
}

/** This server's own base URL, as the request reached it. */
function selfUrl(req: IncomingMessage): string {
  const address = req.socket.localAddress ?? '127.0.0.1';
  const host = address.includes(':') ? `[${address}]` : address;
  return `http://${host}:${String(req.socket.localPort ?? 0)}`;
}

export function createMcpEndpoint(opts: McpEndpointOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const log = opts.log.child({ component: 'mcp' });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { key } = authenticate(req, opts.auth, opts.server);
    if (req.method !== 'POST') {
      res.setHeader('allow', 'POST');
      throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on ${MCP_PATH}: this MCP endpoint is stateless and answers POST only (no SSE stream, no session)`);
    }
    // No sessionIdGenerator: the SDK's stateless mode.
    const server = createMcpServer({ client: createApiClient({ url: selfUrl(req), key }), version: opts.version });
    const transport = new StreamableHTTPServerTransport({ enableJsonResponse: true });
    res.once('close', () => {
      void transport.close();
      void server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res);
  }

  return (req, res) => {
    res.once('close', () => opts.requests.inc({ route: MCP_PATH, code: String(res.statusCode) }));
    handle(req, res).catch((err: unknown) => {
      const problem = toAsbError(err);
      opts.errors?.inc({ code: problem.code });
      if (problem.code === 'Internal') log.error({ err }, 'MCP request failed');
      if (res.headersSent) res.destroy();
      else writeProblem(res, problem, problem.code === 'Unauthorized' ? { 'www-authenticate': `Bearer realm="${opts.realm}"` } : {});
    });
  };
}
