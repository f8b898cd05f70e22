// The MCP tools a coding agent uses to work in sandboxes, each a thin call of the REST API through
// the typed client (src/client/api-client.ts) with the caller's own API key: the API checks the
// key, scopes to the caller's team and validates input exactly as for any other client. Inputs
// are snake_case with units in their names (timeout_seconds); descriptions are written for a
// model: what the tool does, what it returns, what to call next.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { sandboxUrlFor, type ApiClient, type SandboxView } from '../client/api-client.ts';
import { isCommandId, newCommandId, parseReadStatus, readScript, startScript } from './background.ts';
import { failure, ok, toolProblem } from './tool-result.ts';

export interface ToolOptions {
  client: ApiClient;
  /** Offer upload_file (a file from this machine's disk): only where this machine is the user's (stdio). */
  localFiles?: { cwd: string };
  version: string;
}

/** Output a model is shown per stream, by default; the worker itself cuts at 8 MiB. */
const DEFAULT_OUTPUT_CHARS = 20_000;
const MAX_OUTPUT_CHARS = 1_000_000;
/** A file read's default and largest answer, in bytes. */
const DEFAULT_READ_BYTES = 100_000;
const MAX_READ_BYTES = 4_000_000;

const sandboxId = z.string().min(1).describe('The sandbox id, as create_sandbox or list_sandboxes returned it.');
const envMap = z.record(z.string(), z.string()).describe('Environment variables, e.g. {"DEBUG": "1"}.');
const absolutePath = (what: string): z.ZodString => z.string().min(1).describe(what);

/** A sandbox as a model needs to see it (no token: get_url hands that out with the URL). */
function brief(s: SandboxView): Record<string, unknown> {
  return {
    id: s.id,
    template: s.template,
    phase: s.phase,
    ready: s.ready,
    ...(s.cluster === undefined ? {} : { cluster: s.cluster }),
    createdAt: s.createdAt,
    ...(s.shutdownTime === undefined ? {} : { shutdownTime: s.shutdownTime }),
    ...(s.memory === undefined ? {} : { memory: s.memory }),
    ...(s.reason === undefined ? {} : { reason: s.reason }),
    ...(s.message === undefined ? {} : { message: s.message }),
    ...(Object.keys(s.labels).length === 0 ? {} : { labels: s.labels }),
    ...(s.network === undefined ? {} : { network: s.network }),
  };
}

/** Keeps the head and the tail of long output (a failure's cause is often at the end), and says what was cut. */
export function capOutput(text: string, max: number): { text: string; cut: number } {
  if (text.length <= max) return { text, cut: 0 };
  const head = Math.ceil(max / 2);
  const tail = max - head;
  const cut = text.length - max;
  return { text: `${text.slice(0, head)}\n[... ${String(cut)} characters cut ...]\n${text.slice(text.length - tail)}`, cut };
}

const seconds = (s: number): number => Math.round(s * 1000);

/** Runs a tool body; any failure becomes an isError result naming what to change. */
async function attempt(body: () => Promise<CallToolResult>, renames?: Record<string, string>): Promise<CallToolResult> {
  try {
    return await body();
  } catch (err) {
    return failure(err, renames);
  }
}

export function createMcpServer(opts: ToolOptions): McpServer {
  const { client } = opts;
  const server = new McpServer({ name: 'agent-sandbox', version: opts.version }, {
    instructions: 'Agent Sandbox runs isolated Linux sandboxes. Typical use: create_sandbox, then write_file / run_command / start_command inside it, get_url to reach a server in it, kill_sandbox when done.',
  });
  const readOnly = { readOnlyHint: true, openWorldHint: false } as const;

  server.registerTool('list_templates', {
    description: 'List the templates sandboxes can be created from (names to pass as create_sandbox\'s template).',
    annotations: readOnly,
  }, () => attempt(async () => {
    const templates = await client.listTemplates();
    // Built templates are a worker's (the hub has no such route): where they cannot be listed, say so.
    const built = await client.listBuiltTemplates().then(
      ({ items }) => ({ built: items.map((b) => ({ name: b.name, tags: Object.keys(b.tags), status: b.status })) }),
      (err: unknown) => ({ built_unavailable: err instanceof Error ? err.message : String(err) }),
    );
    return ok({ templates: templates.items.map((t) => t.metadata.name), ...built, note: 'pass a template name, or a built template as name:tag, to create_sandbox' });
  }));

  server.registerTool('create_sandbox', {
    description: 'Create a sandbox (an isolated Linux machine) and wait until it is ready. Returns its id; pass that id to every other tool. It is shut down after timeout_seconds.',
    inputSchema: {
      template: z.string().min(1).optional().describe('Template name (default "base": Debian with python3, git, bash). list_templates shows the others.'),
      timeout_seconds: z.number().int().min(1).max(365 * 24 * 3600).optional().describe('Shut the sandbox down this long after creation (default: the template\'s).'),
      idle_timeout_seconds: z.number().int().min(0).optional().describe('Pause it after this long without activity (0: never).'),
      env: envMap.optional().describe('Environment variables for every command run in the sandbox.'),
      network: z.object({
        internet: z.boolean().optional().describe('false: no outbound traffic except what allow lists.'),
        allow: z.array(z.string()).optional().describe('CIDRs, IPs or domains ("api.github.com", "*.pypi.org") it may reach.'),
        deny: z.array(z.string()).optional().describe('CIDRs, IPs or domains it may not reach.'),
      }).optional().describe('Outbound network policy (default: the template\'s).'),
      labels: z.record(z.string(), z.string()).optional().describe('Labels to find it by later (list_sandboxes label_selector).'),
    },
  }, (args) => attempt(async () => {
    const sb = await client.createSandbox({
      ...(args.template === undefined ? {} : { template: args.template }),
      ...(args.timeout_seconds === undefined ? {} : { timeoutMs: seconds(args.timeout_seconds) }),
      ...(args.idle_timeout_seconds === undefined ? {} : { idleTimeoutMs: seconds(args.idle_timeout_seconds) }),
      ...(args.env === undefined ? {} : { env: args.env }),
      ...(args.network === undefined ? {} : { network: args.network }),
      ...(args.labels === undefined ? {} : { labels: args.labels }),
      wait: true,
    });
    return ok(brief(sb));
  }, { timeoutMs: 'timeout_seconds', idleTimeoutMs: 'idle_timeout_seconds' }));

  server.registerTool('list_sandboxes', {
    description: 'List your sandboxes with their phase (Running, Hibernated = paused, Failed, ...).',
    inputSchema: {
      phase: z.string().optional().describe('Only sandboxes in this phase, e.g. Running or Hibernated.'),
      template: z.string().optional().describe('Only sandboxes of this template.'),
      label_selector: z.string().optional().describe('Only sandboxes whose labels match, e.g. "task=demo".'),
    },
    annotations: readOnly,
  }, (args) => attempt(async () => {
    const page = await client.listSandboxes({
      limit: 200,
      ...(args.phase === undefined ? {} : { phase: args.phase }),
      ...(args.template === undefined ? {} : { template: args.template }),
      ...(args.label_selector === undefined ? {} : { labelSelector: args.label_selector }),
    });
    return ok({ sandboxes: page.items.map(brief), ...(page.continue === undefined ? {} : { more: 'more than 200: narrow with phase, template or label_selector' }) });
  }, { labelSelector: 'label_selector' }));

  server.registerTool('get_sandbox', {
    description: 'Show one sandbox: phase, readiness, when it shuts down, and why it failed if it did.',
    inputSchema: { sandbox_id: sandboxId },
    annotations: readOnly,
  }, (args) => attempt(async () => ok(brief(await client.getSandbox(args.sandbox_id)))));

  server.registerTool('kill_sandbox', {
    description: 'Delete a sandbox and everything in it, for good. Snapshots taken of it stay.',
    inputSchema: { sandbox_id: sandboxId },
    annotations: { destructiveHint: true },
  }, (args) => attempt(async () => {
    const sb = await client.deleteSandbox(args.sandbox_id);
    return ok({ id: sb.id, phase: sb.phase, killed: true });
  }));

  server.registerTool('pause_sandbox', {
    description: 'Pause a sandbox: it stops using CPU and memory; its files stay. resume_sandbox brings it back.',
    inputSchema: {
      sandbox_id: sandboxId,
      keep_memory: z.boolean().optional().describe('true: also keep memory and running processes (fails where the sandbox cannot); false: files only; absent: the template\'s choice.'),
    },
  }, (args) => attempt(async () => {
    const sb = await client.pause(args.sandbox_id, { ...(args.keep_memory === undefined ? {} : { memory: args.keep_memory }), wait: true });
    return ok(brief(sb));
  }, { memory: 'keep_memory' }));

  server.registerTool('resume_sandbox', {
    description: 'Resume a paused sandbox and wait until it is ready again.',
    inputSchema: { sandbox_id: sandboxId },
  }, (args) => attempt(async () => ok(brief(await client.resume(args.sandbox_id, { wait: true })))));

  server.registerTool('run_command', {
    description: 'Run a shell command in a sandbox (sh -c, so pipes and && work) and wait for it. Returns exit_code, stdout and stderr; long output is cut in the middle and the result says so. For servers or anything long-running, use start_command.',
    inputSchema: {
      sandbox_id: sandboxId,
      command: z.string().min(1).describe('The command line, e.g. "python3 main.py | tail -5".'),
      cwd: absolutePath('Absolute working directory (default: the template\'s, usually /home/user).').optional(),
      env: envMap.optional(),
      timeout_seconds: z.number().min(1).max(3600).optional().describe('Kill the command after this long (default 120).'),
      max_output_chars: z.number().int().min(100).max(MAX_OUTPUT_CHARS).optional().describe(`Characters of stdout and of stderr to return (default ${String(DEFAULT_OUTPUT_CHARS)}).`),
    },
  }, (args) => attempt(async () => {
    const r = await client.exec(args.sandbox_id, {
      command: args.command,
      ...(args.cwd === undefined ? {} : { cwd: args.cwd }),
      ...(args.env === undefined ? {} : { env: args.env }),
      timeoutMs: seconds(args.timeout_seconds ?? 120),
    });
    const max = args.max_output_chars ?? DEFAULT_OUTPUT_CHARS;
    const out = capOutput(r.stdout, max);
    const err = capOutput(r.stderr, max);
    const notes: string[] = [];
    if (r.timedOut) notes.push(`killed after ${String(args.timeout_seconds ?? 120)} s (timeout_seconds); run it with start_command if it is meant to keep going`);
    if (r.signal !== undefined && !r.timedOut) notes.push(`ended by ${r.signal}`);
    if (out.cut > 0 || err.cut > 0) notes.push(`output cut to max_output_chars=${String(max)} per stream (${String(out.cut)} stdout and ${String(err.cut)} stderr characters left out); redirect to a file and read_file it, or raise max_output_chars`);
    if (r.truncated === true) notes.push('the server cut the output at 8 MiB per stream');
    return ok({
      exit_code: r.exitCode,
      stdout: out.text,
      stderr: err.text,
      ...(r.timedOut ? { timed_out: true } : {}),
      output_cut: out.cut > 0 || err.cut > 0 || r.truncated === true,
      ...(notes.length === 0 ? {} : { note: notes.join('; ') }),
    });
  }, { timeoutMs: 'timeout_seconds' }));

  server.registerTool('start_command', {
    description: 'Start a shell command in the background (a server, a long build) and return at once with a command_id. read_command_output shows its output and whether it has ended. Stop it and all it started with run_command "kill -- -<pid>".',
    inputSchema: {
      sandbox_id: sandboxId,
      command: z.string().min(1).describe('The command line, e.g. "python3 -m http.server 8000".'),
      cwd: absolutePath('Absolute working directory.').optional(),
      env: envMap.optional(),
    },
  }, (args) => attempt(async () => {
    const id = newCommandId();
    const r = await client.exec(args.sandbox_id, {
      command: startScript(id, args.command),
      ...(args.cwd === undefined ? {} : { cwd: args.cwd }),
      ...(args.env === undefined ? {} : { env: args.env }),
      timeoutMs: 30_000,
    });
    const pid = Number(r.stdout.trim());
    if (r.exitCode !== 0 || !Number.isInteger(pid)) throw toolProblem(`the command could not be started (exit ${String(r.exitCode)}): ${r.stderr.trim().slice(0, 500)}`);
    return ok({ command_id: id, pid, note: 'call read_command_output with this command_id to see its output' });
  }));

  server.registerTool('read_command_output', {
    description: 'Read the output (stdout and stderr together) of a command start_command started, from byte offset on, and whether it is still running. Pass next_offset back as offset to read only what is new.',
    inputSchema: {
      sandbox_id: sandboxId,
      command_id: z.string().describe('The command_id start_command returned.'),
      offset: z.number().int().min(0).optional().describe('Byte offset to read from (default 0).'),
      max_bytes: z.number().int().min(1).max(MAX_OUTPUT_CHARS).optional().describe(`Bytes to return at most (default ${String(DEFAULT_OUTPUT_CHARS)}).`),
    },
    annotations: readOnly,
  }, (args) => attempt(async () => {
    if (!isCommandId(args.command_id)) throw toolProblem(`command_id "${args.command_id}" is not one start_command returns (12 hex characters)`, 'command_id');
    const offset = args.offset ?? 0;
    const max = args.max_bytes ?? DEFAULT_OUTPUT_CHARS;
    const r = await client.exec(args.sandbox_id, { command: readScript(args.command_id, offset, max), timeoutMs: 30_000 });
    if (r.exitCode === 3) throw toolProblem(`no command "${args.command_id}" was started in sandbox "${args.sandbox_id}" with start_command`, 'command_id');
    const status = parseReadStatus(r.stderr);
    if (r.exitCode !== 0 || status === undefined) throw toolProblem(`reading the output failed (exit ${String(r.exitCode)}): ${r.stderr.trim().slice(0, 500)}`);
    const next = offset + Buffer.byteLength(r.stdout, 'utf8');
    const { state } = status;
    return ok({
      running: state.running,
      ...(state.running ? {} : state.exitCode === undefined ? { exit_code: null, note: 'it ended without an exit status: it was killed' } : { exit_code: state.exitCode }),
      output: r.stdout,
      next_offset: Math.min(next, status.size),
      total_bytes: status.size,
      ...(next < status.size ? { more: `${String(status.size - next)} more bytes: call again with offset ${String(next)}` } : {}),
    });
  }));

  server.registerTool('read_file', {
    description: 'Read a file in a sandbox. Text comes back as text; a file that is not UTF-8 comes back base64-encoded.',
    inputSchema: {
      sandbox_id: sandboxId,
      path: absolutePath('Absolute path of the file, e.g. /home/user/main.py.'),
      max_bytes: z.number().int().min(1).max(MAX_READ_BYTES).optional().describe(`Bytes to return at most (default ${String(DEFAULT_READ_BYTES)}); the result says when the file is longer.`),
    },
    annotations: readOnly,
  }, (args) => attempt(async () => {
    const data = await client.readFile(args.sandbox_id, args.path);
    const max = args.max_bytes ?? DEFAULT_READ_BYTES;
    const part = data.subarray(0, max);
    const cut = data.byteLength > max ? { note: `only the first ${String(max)} of ${String(data.byteLength)} bytes; raise max_bytes, or use run_command with sed -n or tail` } : {};
    try {
      return ok({ path: args.path, size: data.byteLength, content: new TextDecoder('utf-8', { fatal: true }).decode(part), ...cut });
    } catch {
      return ok({ path: args.path, size: data.byteLength, encoding: 'base64', content: Buffer.from(part).toString('base64'), ...cut });
    }
  }));

  server.registerTool('write_file', {
    description: 'Create or overwrite a file in a sandbox (parent directories are created).',
    inputSchema: {
      sandbox_id: sandboxId,
      path: absolutePath('Absolute path of the file, e.g. /home/user/main.py.'),
      content: z.string().describe('The whole content of the file.'),
      encoding: z.enum(['utf8', 'base64']).optional().describe('How content is encoded: utf8 text (default) or base64 for binary files.'),
    },
  }, (args) => attempt(async () => {
    const bytes = args.encoding === 'base64' ? Buffer.from(args.content, 'base64') : Buffer.from(args.content, 'utf8');
    await client.writeFile(args.sandbox_id, args.path, bytes);
    return ok({ path: args.path, bytes: bytes.byteLength });
  }));

  server.registerTool('list_files', {
    description: 'List a directory in a sandbox: name, type (file, dir, symlink), size and modification time of each entry.',
    inputSchema: {
      sandbox_id: sandboxId,
      path: absolutePath('Absolute path of the directory (default /home/user).').optional(),
    },
    annotations: readOnly,
  }, (args) => attempt(async () => {
    const path = args.path ?? '/home/user';
    const { entries } = await client.listFiles(args.sandbox_id, path);
    return ok({ path, entries: entries.map((e) => ({ name: e.name, type: e.type, size: e.size, mtime: e.mtime })) });
  }));

  const localFiles = opts.localFiles;
  if (localFiles !== undefined) {
    server.registerTool('upload_file', {
      description: 'Copy a file from this computer (where the MCP server runs) into a sandbox.',
      inputSchema: {
        sandbox_id: sandboxId,
        local_path: z.string().min(1).describe('Path of the file on this computer (relative to the directory the MCP server was started in).'),
        path: absolutePath('Absolute path to write it to inside the sandbox.'),
      },
    }, (args) => attempt(async () => {
      let bytes: Buffer;
      try {
        bytes = await readFile(resolve(localFiles.cwd, args.local_path));
      } catch (err) {
        throw toolProblem(`cannot read local_path "${args.local_path}": ${(err as NodeJS.ErrnoException).code ?? String(err)}`, 'local_path');
      }
      await client.writeFile(args.sandbox_id, args.path, bytes);
      return ok({ path: args.path, bytes: bytes.byteLength });
    }));
  }

  server.registerTool('get_url', {
    description: 'The URL at which a port of a sandbox is reachable from outside (e.g. a web server started with start_command). Requests must send the returned header unless the port is public.',
    inputSchema: {
      sandbox_id: sandboxId,
      port: z.number().int().min(1).max(65535).describe('The port the server listens on inside the sandbox.'),
    },
    annotations: readOnly,
  }, (args) => attempt(async () => {
    const sb = await client.getSandbox(args.sandbox_id);
    if (sb.url === undefined || sb.defaultPort === undefined) throw toolProblem(`the server returned no URL for sandbox "${args.sandbox_id}"`);
    const url = sandboxUrlFor(sb.url, sb.defaultPort, args.port);
    const open = sb.publicPorts?.includes(args.port) === true;
    return ok({
      url,
      port: args.port,
      public: open,
      ...(open || sb.accessToken === undefined ? {} : { headers: { 'X-Access-Token': sb.accessToken } }),
    });
  }));

  server.registerTool('snapshot_sandbox', {
    description: 'Take a snapshot of a sandbox (files, and memory and processes where it can keep them). The sandbox pauses for it, then runs on. Start new sandboxes from it with start_from_snapshot.',
    inputSchema: {
      sandbox_id: sandboxId,
      name: z.string().min(1).optional().describe('A name to use instead of the snapshot id.'),
      keep_memory: z.boolean().optional().describe('true: memory and processes too, or fail; false: files only; absent: memory where the sandbox can keep it.'),
    },
  }, (args) => attempt(async () => {
    const s = await client.createSnapshot(args.sandbox_id, { ...(args.name === undefined ? {} : { name: args.name }), ...(args.keep_memory === undefined ? {} : { memory: args.keep_memory }) });
    return ok({ snapshot_id: s.id, ...(s.name === undefined ? {} : { name: s.name }), sandbox_id: s.sandbox, phase: s.phase, memory: s.memory, ...(s.bytes === undefined ? {} : { bytes: s.bytes }) });
  }, { memory: 'keep_memory' }));

  server.registerTool('list_snapshots', {
    description: 'List your snapshots: id, name, the sandbox each was taken of, and whether it kept memory.',
    annotations: readOnly,
  }, () => attempt(async () => {
    const { items } = await client.listSnapshots();
    return ok({ snapshots: items.map((s) => ({ snapshot_id: s.id, ...(s.name === undefined ? {} : { name: s.name }), sandbox_id: s.sandbox, phase: s.phase, memory: s.memory })) });
  }));

  server.registerTool('start_from_snapshot', {
    description: 'Create a new sandbox from a snapshot: it starts with the snapshot\'s files (and memory and processes, if kept).',
    inputSchema: {
      snapshot: z.string().min(1).describe('Snapshot id or name.'),
      timeout_seconds: z.number().int().min(1).max(365 * 24 * 3600).optional().describe('Shut the new sandbox down this long after it starts.'),
    },
  }, (args) => attempt(async () => ok(brief(await client.startFromSnapshot(args.snapshot, { wait: true, ...(args.timeout_seconds === undefined ? {} : { timeoutMs: seconds(args.timeout_seconds) }) }))), { timeoutMs: 'timeout_seconds' }));

  server.registerTool('fork_sandbox', {
    description: 'Fork a running sandbox into count new sandboxes, each with a copy of its files (and memory and processes where kept) but its own id. Try different approaches in parallel.',
    inputSchema: {
      sandbox_id: sandboxId,
      count: z.number().int().min(1).max(20).optional().describe('How many forks (default 1).'),
      timeout_seconds: z.number().int().min(1).max(365 * 24 * 3600).optional().describe('Shut each fork down this long after it starts.'),
    },
  }, (args) => attempt(async () => {
    const { forks } = await client.fork(args.sandbox_id, { count: args.count ?? 1, ...(args.timeout_seconds === undefined ? {} : { timeoutMs: seconds(args.timeout_seconds) }) });
    return ok({ forks: forks.map((f) => ('sandbox' in f ? brief(f.sandbox) : { error: `${f.error.code}: ${f.error.message}` })) });
  }, { timeoutMs: 'timeout_seconds' }));

  return server;
}
