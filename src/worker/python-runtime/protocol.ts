// The legacy python-runtime API (kubernetes-sigs/agent-sandbox examples/python-runtime-sandbox,
// what k8s-agent-sandbox's Direct, Gateway and Tunnel modes speak on port 8888), as the worker
// answers it: which call a request is, where its path lands, and the JSON it answers. Pure; the
// wire and the sandbox are in python-runtime.ts.
//
//   GET  /                 {"status":"ok","message":"Sandbox Runtime is active."}
//   POST /execute          {"command": str[, "timeout_seconds": number]} → 200 {stdout, stderr, exit_code, timed_out}
//   POST /upload           multipart/form-data, part "file", filename = the path → 200 {"message"}
//   GET  /download/<path>  200 the bytes (application/octet-stream, Content-Length); 404 missing or a directory
//   GET  /list/<path>      200 [{name, size, type: "file"|"directory", mod_time: epoch s}]; 404 not a directory
//   GET  /exists/<path>    200 {"path": <decoded>, "exists": bool}
//
// Paths, as upstream's get_safe_path: percent-decoded once (the SDK sends quote(path, safe='')),
// leading slashes dropped, then taken from the base directory; one that climbs out of it
// (`../x`, `a/../../x`) is 403 {"message": "Access denied"}. The empty path (`/list/`, which is
// what the SDK's list(".") becomes on the wire) is the base directory itself.
import { posix } from 'node:path';
import type { Container, Sandbox } from '../../api/types.ts';
import { AsbError } from '../../errors.ts';
import type { ExecResult } from '../../runtime/runtime.ts';
import type { EntryInfo } from '../envd/entries.ts';
import { pathField } from '../envd/paths.ts';

/** The main container's variable naming the base directory, as upstream's server reads it. */
export const BASE_DIR_ENV = 'SANDBOX_BASE_DIR';

/**
 * Upstream's server limit on one command (SANDBOX_EXEC_TIMEOUT_SECONDS, default 300 s); a
 * `timeout_seconds` in the request (the SDK's command_timeout) shortens it, never lengthens it.
 */
export const EXEC_LIMIT_MS = 300_000;

/** The exit code of a command killed at its timeout: coreutils' timeout(1), and what the SDK's sandboxd path reports. */
export const TIMED_OUT_EXIT_CODE = 124;

export type Call =
  | { op: 'health' }
  | { op: 'execute' }
  | { op: 'upload' }
  | { op: 'download' | 'list' | 'exists'; path: string };

const PATH_OPS = ['download', 'list', 'exists'] as const;

/**
 * The call a request is, from its method and raw URL (Node's req.url: still percent-encoded).
 * An unknown path is 404 and a wrong method 405, as FastAPI answers them.
 */
export function callOf(method: string, rawUrl: string): Call {
  const q = rawUrl.indexOf('?');
  const path = q === -1 ? rawUrl : rawUrl.slice(0, q);
  const allow = (want: string, call: Call): Call => {
    if (method !== want && !(want === 'GET' && method === 'HEAD')) throw new AsbError('MethodNotAllowed', `${path} takes ${want}, not ${method}`);
    return call;
  };
  if (path === '/') return allow('GET', { op: 'health' });
  if (path === '/execute') return allow('POST', { op: 'execute' });
  if (path === '/upload') return allow('POST', { op: 'upload' });
  for (const op of PATH_OPS) {
    const prefix = `/${op}`;
    if (path === prefix || path.startsWith(`${prefix}/`)) return allow('GET', { op, path: decodedPath(path.slice(prefix.length + 1)) });
  }
  throw new AsbError('NotFound', `the python-runtime API has no ${path}; it serves /execute, /upload, /download/<path>, /list/<path> and /exists/<path>`);
}

/** A path segment as the SDK sends it (quote(path, safe='')), decoded exactly once: `%252F` stays `%2F`. */
export function decodedPath(encoded: string): string {
  let decoded: string;
  try {
    decoded = decodeURIComponent(encoded);
  } catch {
    throw new AsbError('BadRequest', `the path "${encoded.slice(0, 200)}" is not valid percent-encoded UTF-8`, { fields: [{ field: 'path', message: 'is not valid percent-encoding' }] });
  }
  return pathField(decoded);
}

/**
 * The absolute path inside the sandbox that `path` names under `base`: leading slashes dropped,
 * then resolved from the base; Forbidden (403) when it climbs out of the base, as upstream's
 * get_safe_path refuses it. Lexical: what a symlink under the base points to is the sandbox's
 * business (every operation runs inside the sandbox as its user, who can /execute anything anyway).
 */
export function confinedPath(base: string, path: string, field = 'path'): string {
  const relative = pathField(path, field).replace(/^\/+/, '');
  const full = posix.resolve(base, relative);
  if (full !== base && !full.startsWith(base === '/' ? '/' : `${base}/`)) {
    throw new AsbError('Forbidden', `Access denied: ${field} "${path.slice(0, 200)}" leads out of the base directory ${base}`, { fields: [{ field, message: 'leads out of the base directory' }] });
  }
  return full;
}

/** The base directory the main container names in SANDBOX_BASE_DIR (blank counts as unset), or undefined: then the pod user's home. */
export function baseDirOf(sandbox: Sandbox): string | undefined {
  const main: Container | undefined = sandbox.spec.podTemplate.spec.containers[0];
  const value = main?.env?.find((e) => e.name === BASE_DIR_ENV)?.value?.trim();
  if (value === undefined || value === '') return undefined;
  // A relative one counts from / (the server's cwd in upstream's image is its WORKDIR, which we do not have).
  return posix.resolve('/', value);
}

export interface ExecuteRequest {
  command: string;
  timeoutMs: number;
}

function invalid(field: string, message: string): AsbError {
  return new AsbError('Invalid', `/execute: ${field} ${message}`, { fields: [{ field, message }] });
}

/** The body of POST /execute, parsed JSON: a command string and an optional timeout_seconds > 0 (capped at EXEC_LIMIT_MS). 422 as FastAPI's validation. */
export function executeRequestOf(body: unknown): ExecuteRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw invalid('body', 'must be a JSON object {"command": "..."}');
  const { command, timeout_seconds: seconds } = body as Record<string, unknown>;
  if (command === undefined) throw invalid('command', 'is required');
  if (typeof command !== 'string') throw invalid('command', 'must be a string');
  if (command.includes('\0')) throw invalid('command', 'contains a NUL byte');
  let timeoutMs = EXEC_LIMIT_MS;
  if (seconds !== undefined && seconds !== null) {
    if (typeof seconds !== 'number' || !Number.isFinite(seconds) || seconds <= 0) throw invalid('timeout_seconds', 'must be a number of seconds greater than 0');
    timeoutMs = Math.min(Math.ceil(seconds * 1000), EXEC_LIMIT_MS);
  }
  return { command, timeoutMs };
}

export interface ExecuteResponse {
  stdout: string;
  stderr: string;
  exit_code: number;
  timed_out: boolean;
}

/** What /execute answers for a finished (or killed) command: text as UTF-8, 124 and timed_out for a timeout. */
export function executeResponseOf(result: ExecResult): ExecuteResponse {
  return {
    stdout: Buffer.from(result.stdout).toString('utf8'),
    stderr: Buffer.from(result.stderr).toString('utf8'),
    exit_code: result.timedOut ? TIMED_OUT_EXIT_CODE : result.exitCode,
    timed_out: result.timedOut,
  };
}

export interface ListEntry {
  name: string;
  size: number;
  type: 'file' | 'directory';
  mod_time: number;
}

/**
 * /list's entries: the SDK accepts only "file" and "directory" (any other type fails the whole
 * call), so a symlink, socket or fifo is a "file"; mod_time is epoch seconds as a float.
 */
export function listEntriesOf(entries: readonly EntryInfo[]): ListEntry[] {
  return entries.map((e) => ({
    name: e.name,
    size: e.size,
    type: e.type === 'FILE_TYPE_DIRECTORY' ? 'directory' : 'file',
    mod_time: Date.parse(e.modifiedTime) / 1000,
  }));
}

/** Upstream's error body: {"message"}; ours adds the stable code. */
export function errorBodyOf(err: AsbError): { message: string; code: string } {
  return { message: err.message, code: err.code };
}

/** Content-Disposition for a download, as Starlette's FileResponse names the file (RFC 6266 filename*). */
export function dispositionOf(path: string): string {
  return `attachment; filename*=utf-8''${encodeURIComponent(posix.basename(path) || 'download')}`;
}
