// `asb mcp`: the MCP tools (src/mcp/tools.ts) on stdio, for agents that spawn a command
// (`claude mcp add agent-sandbox -- npx asb mcp`). The tools call the REST API with the URL and
// key every asb command uses (--url/--key, ASB_API_URL/ASB_API_KEY, .asb/env). Stdout carries
// the protocol and nothing else; it runs until the client closes stdin.
import { Readable, Writable } from 'node:stream';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { createMcpServer } from '../mcp/tools.ts';
import { packageVersion } from '../http/http-server.ts';
import { parseCommandArgs, UsageError } from './args.ts';
import { EXIT, type Command } from './command.ts';

export const mcpCommand: Command = {
  name: 'mcp',
  summary: 'Serve the sandbox tools to an AI agent over MCP (stdio)',
  usage: 'asb mcp [--url URL] [--key KEY]',
  help: `Speaks the Model Context Protocol on stdin/stdout; the agent starts it. The tools work
with the API key and server of every asb command (ASB_API_KEY, ASB_API_URL, .asb/env).

Examples:
  claude mcp add agent-sandbox -e ASB_API_KEY=asb_... -e ASB_API_URL=http://127.0.0.1:8080 -- npx asb mcp
  Cursor (.cursor/mcp.json): {"mcpServers": {"agent-sandbox": {"command": "npx", "args": ["asb", "mcp"],
                              "env": {"ASB_API_KEY": "asb_...", "ASB_API_URL": "http://127.0.0.1:8080"}}}}

Over HTTP instead: POST <worker or hub URL>/mcp with "Authorization: Bearer <key>".`,
  options: {},
  async run(argv, ctx) {
    const { positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0] ?? ''}"`, this.usage);
    const { stdin } = ctx.io;
    const { stdout } = ctx.io;
    if (!(stdin instanceof Readable) || !(stdout instanceof Writable)) throw new UsageError('asb mcp needs stdin and stdout as streams', this.usage);
    const client = ctx.client(global);
    const server = createMcpServer({ client, version: packageVersion(), localFiles: { cwd: ctx.io.cwd } });
    const transport = new StdioServerTransport(stdin, stdout);
    // The client closing stdin ends the session (the transport itself does not watch for it).
    const ended = new Promise<void>((resolve) => {
      stdin.once('end', resolve);
      stdin.once('close', resolve);
      transport.onclose = resolve;
    });
    await server.connect(transport);
    await ended;
    await server.close();
    return EXIT.ok;
  },
};
