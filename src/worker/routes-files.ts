// Work inside a sandbox: exec, and files read, written and listed. All go through the pod
// runtime (no agent in the image) and count as activity, which holds off idle hibernation.
import type { Sandbox } from '../api/types.ts';
import { AsbError } from '../errors.ts';
import type { ExecRequest } from '../runtime/runtime.ts';
import { findSandbox } from './access.ts';
import { envVarsOf } from './e2b/shape.ts';
import { readJson } from '../http/body.ts';
import { discardRest, uploadChunks } from './upload-body.ts';
import type { UploadSlots } from './upload-slots.ts';
import type { WorkerContext } from './deps.ts';
import { argvFields, checkBody, checkSpawnInput, spawnFailure } from './input.ts';
import type { Reply, RequestContext, Route } from '../http/router.ts';

// An hour: long builds fit; a forgotten `sleep infinity` does not hold a request forever.
const MAX_EXEC_TIMEOUT_MS = 3600 * 1000;
// Linux PATH_MAX.
const MAX_PATH_LENGTH = 4096;

const EXEC_BODY = {
  command: { kind: 'command', required: true },
  stdin: { kind: 'string' },
  env: { kind: 'stringMap' },
  cwd: { kind: 'string', min: 1, max: MAX_PATH_LENGTH },
  timeoutMs: { kind: 'integer', min: 1, max: MAX_EXEC_TIMEOUT_MS },
} as const;

/** A sandbox that can run commands now, or 409 saying how to get there. */
async function runningSandbox(w: WorkerContext, ctx: RequestContext): Promise<Sandbox> {
  const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
  const id = sandbox.metadata.name;
  if (w.runtime.state(id).phase !== 'Running') {
    throw new AsbError('SandboxNotRunning', `sandbox "${id}" is not running (hibernated, starting or stopped); resume it with POST /v1/sandboxes/${id}/resume and retry`);
  }
  w.operator.activity.touch(id);
  return sandbox;
}

function pathParam(ctx: RequestContext): string {
  const path = ctx.query.get('path');
  if (path === null || path === '') {
    throw new AsbError('BadRequest', 'query parameter path is required: an absolute path inside the sandbox, e.g. ?path=/home/user/file.txt', { fields: [{ field: 'path', message: 'is required' }] });
  }
  if (!path.startsWith('/') || path.includes('\0') || path.length > MAX_PATH_LENGTH) {
    throw new AsbError('BadRequest', `query parameter path must be an absolute path (starting with /), got "${path.slice(0, 200)}"`, { fields: [{ field: 'path', message: 'must be an absolute path' }] });
  }
  return path;
}

/** Filesystem errors from the runtime, converted once into coded errors a user can act on. */
function fileError(err: unknown, id: string, path: string): unknown {
  if (err instanceof AsbError || !(err instanceof Error)) return err;
  const code = (err as NodeJS.ErrnoException).code;
  switch (code) {
    case 'ENOENT':
      return new AsbError('NotFound', `no such file or directory "${path}" in sandbox "${id}"`, { cause: err });
    case 'EISDIR':
      return new AsbError('BadRequest', `"${path}" in sandbox "${id}" is a directory; list it with GET /v1/sandboxes/${id}/files/list?path=${path}`, { cause: err });
    case 'ENOTDIR':
      return new AsbError('BadRequest', `a parent of "${path}" in sandbox "${id}" is not a directory`, { cause: err });
    case 'EACCES':
    case 'EPERM':
      return new AsbError('Forbidden', `permission denied for "${path}" in sandbox "${id}"`, { cause: err });
    case 'ENOSPC':
    case 'EDQUOT':
      return new AsbError('PayloadTooLarge', `no space left for "${path}" in sandbox "${id}"`, { cause: err });
    default:
      return err;
  }
}

async function exec(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const body = checkBody(await readJson(ctx.req, w.limits.jsonBytes), EXEC_BODY);
  if (body.cwd?.startsWith('/') === false) {
    throw new AsbError('Invalid', 'request body is invalid: cwd: must be an absolute path', { fields: [{ field: 'cwd', message: 'must be an absolute path' }] });
  }
  checkSpawnInput({
    argv: argvFields('command', body.command),
    ...(body.env === undefined ? {} : { env: { field: 'env', vars: body.env } }),
    ...(body.cwd === undefined ? {} : { cwd: { field: 'cwd', value: body.cwd } }),
  });
  const sandbox = await runningSandbox(w, ctx);
  const id = sandbox.metadata.name;
  const req: ExecRequest = {
    command: typeof body.command === 'string' ? ['/bin/sh', '-c', body.command] : body.command,
    maxOutputBytes: w.limits.execOutputBytes,
  };
  if (body.stdin !== undefined) req.stdin = body.stdin;
  // The sandbox's env from its create (env, or E2B's envVars), under the exec's own.
  const env = { ...envVarsOf(sandbox), ...body.env };
  if (Object.keys(env).length > 0) req.env = env;
  if (body.cwd !== undefined) req.cwd = body.cwd;
  if (body.timeoutMs !== undefined) req.timeoutMs = body.timeoutMs;
  const result = await w.runtime.exec(id, req).catch((err: unknown) => {
    throw fileError(spawnFailure(err, 'command'), id, body.cwd ?? '/');
  });
  const decoder = new TextDecoder('utf-8');
  const json: Record<string, unknown> = {
    exitCode: result.exitCode,
    stdout: decoder.decode(result.stdout),
    stderr: decoder.decode(result.stderr),
    timedOut: result.timedOut,
    truncated: result.truncated,
  };
  if (result.signal !== undefined) json.signal = result.signal;
  return { status: 200, json };
}

async function readFile(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const path = pathParam(ctx);
  const sandbox = await runningSandbox(w, ctx);
  const id = sandbox.metadata.name;
  const bytes = await w.runtime.readFile(id, path).catch((err: unknown) => {
    throw fileError(err, id, path);
  });
  return { status: 200, bytes, contentType: 'application/octet-stream' };
}

/** The body streams into the sandbox (runtime.writeFile); the file changes only once all of it arrived. */
async function writeFile(w: WorkerContext, uploads: UploadSlots, ctx: RequestContext): Promise<Reply> {
  const path = pathParam(ctx);
  const sandbox = await runningSandbox(w, ctx);
  const id = sandbox.metadata.name;
  const prefix = ctx.principal?.prefix ?? '';
  await uploads.run(`key:${prefix}`, `API key ${prefix}`, async () => {
    try {
      await w.runtime.writeFile(id, path, uploadChunks(ctx.req, w.limits.uploadBytes));
    } catch (err) {
      discardRest(ctx.req);
      throw fileError(err, id, path);
    }
  });
  return { status: 204 };
}

async function listDir(w: WorkerContext, ctx: RequestContext): Promise<Reply> {
  const path = pathParam(ctx);
  const sandbox = await runningSandbox(w, ctx);
  const id = sandbox.metadata.name;
  const entries = await w.runtime.listDir(id, path).catch((err: unknown) => {
    throw fileError(err, id, path);
  });
  return { status: 200, json: { entries } };
}

export function fileRoutes(w: WorkerContext, uploads: UploadSlots): Route[] {
  return [
    { method: 'POST', pattern: '/v1/sandboxes/{id}/exec', handler: (ctx) => exec(w, ctx) },
    { method: 'GET', pattern: '/v1/sandboxes/{id}/files', handler: (ctx) => readFile(w, ctx) },
    { method: 'PUT', pattern: '/v1/sandboxes/{id}/files', handler: (ctx) => writeFile(w, uploads, ctx) },
    { method: 'GET', pattern: '/v1/sandboxes/{id}/files/list', handler: (ctx) => listDir(w, ctx) },
  ];
}
