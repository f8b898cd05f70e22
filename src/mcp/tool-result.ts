// What an MCP tool answers: a result, or a failure as a tool result (isError) a model can act on.
// Every failure from the REST API (an ApiError with its code, detail and fields) or from the tool
// itself is converted here, once, into text that says what went wrong and which tool or argument
// to change. Never a thrown protocol error: a model sees tool results, not JSON-RPC errors.
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { ApiError, ApiUnreachableError } from '../client/api-client.ts';
import { AsbError, isAsbError } from '../errors.ts';

/** A tool's answer: the data as JSON text (what a model reads) and as structured content. */
export function ok(data: Record<string, unknown>): CallToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(data, null, 2) }], structuredContent: data };
}

/** A failure the tool found itself, naming the argument to change. */
export function toolProblem(message: string, field?: string): AsbError {
  return new AsbError('BadRequest', message, field === undefined ? undefined : { fields: [{ field, message }] });
}

/**
 * The REST API names its own fields (timeoutMs, network.allow[0]); a tool names its arguments
 * (timeout_seconds). `renames` maps the first onto the second for one tool.
 */
export function failure(err: unknown, renames: Readonly<Record<string, string>> = {}): CallToolResult {
  const rename = (field: string): string => {
    for (const [api, arg] of Object.entries(renames)) {
      if (field === api || field.startsWith(`${api}.`) || field.startsWith(`${api}[`)) return arg + field.slice(api.length);
    }
    return field;
  };
  let text: string;
  if (err instanceof ApiUnreachableError) {
    text = `Unavailable: cannot reach the Agent Sandbox API at ${err.url}. Is it running (\`asb up\`), and is ASB_API_URL right?`;
  } else if (isAsbError(err)) {
    const fields = err.fields.map((f) => `${rename(f.field)}: ${f.message}`);
    const detail = err instanceof ApiError ? err.detail : err.message;
    text = `${err.code}: ${restHintsOut(detail)}`;
    if (fields.length > 0 && !fields.every((f) => text.includes(f))) text += `\nArguments to fix: ${fields.join('; ')}`;
    const hint = hintFor(err.code, detail);
    if (hint !== undefined) text += `\n${hint}`;
  } else {
    text = `Internal: ${err instanceof Error ? err.message : String(err)}`;
  }
  return { content: [{ type: 'text', text }], isError: true };
}

/** The REST API's own advice ("list yours with GET /v1/sandboxes") is for HTTP callers; a model gets a tool instead. */
function restHintsOut(detail: string): string {
  return detail.replace(/;\s*(list (yours|templates|your templates) with|the routes are listed in)[^;]*$/i, '');
}

function hintFor(code: string, detail: string): string | undefined {
  if (code === 'NotFound') {
    if (/no such route/i.test(detail)) return 'This server does not offer that operation (snapshots are listed and started at a worker, not at the hub).';
    if (/^template\b/i.test(detail)) return 'Call list_templates to see the templates you can create sandboxes from.';
    if (/^sandbox\b/i.test(detail)) return 'Call list_sandboxes to see the ids of your sandboxes.';
    if (/snapshot/i.test(detail)) return 'Call list_snapshots to see your snapshots.';
    if (/no such file or directory/i.test(detail)) return 'Call list_files on the parent directory to see what is there.';
    return undefined;
  }
  if (code === 'SandboxNotRunning') return 'Call resume_sandbox first if it is paused, or get_sandbox to see its phase.';
  if (code === 'Unauthorized') return 'The API key is missing, unknown or revoked: set ASB_API_KEY (asb mcp) or send "Authorization: Bearer <key>" (HTTP).';
  if (code === 'PoolExhausted') return 'No warm sandbox was free: retry, or create without cold_start false.';
  if (code === 'QuotaExceeded') return 'Kill sandboxes or delete snapshots you no longer need, then retry.';
  if (code === 'CheckpointFailed') return 'The sandbox keeps running. Retry with keep_memory false to keep its files only.';
  if (code === 'Timeout') return 'The operation took too long; call get_sandbox to see where it stands, then retry.';
  return undefined;
}
