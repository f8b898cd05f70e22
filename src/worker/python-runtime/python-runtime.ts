// The python-runtime API (port 8888 of a sandbox, protocol.ts) answered by the owning worker on
// the sandbox's behalf, as envd is: no agent in the image, everything runs inside the sandbox
// through the pod runtime with a POSIX shell (the same pieces as envd's: the runtime's exec with
// its timeout and output cap, the streamed staged writes of src/runtime/file-upload.ts, envd's
// multipart parser, listing and read script).
//
// The sandbox-router proxy (../sandbox-router/proxy.ts) has already checked the API key and the
// team, and woken or waited for the sandbox; this answers the call.
//
// Choices where upstream's reference server differs or is silent (docs/compatibility.md, "The kubernetes-sigs Python SDK"):
// - Exec: the command string runs as `sh -c <command>` (what the SDK's sandboxd flavour and E2B's
//   commands.run do; the reference shlex-splits it and runs it without a shell), as the pod's own
//   user, in the base directory, with the pod's environment. A timeout (timeout_seconds, capped at
//   300 s, upstream's server limit) kills the process group and answers exit_code 124 with
//   timed_out: true. stdout and stderr are each capped at the worker's exec output cap (8 MiB).
// - One base directory for exec and files: the main container's SANDBOX_BASE_DIR (upstream's own
//   variable), else the home of the pod's user (the directory envd resolves E2B's relative paths
//   against, so both SDKs see the same files). It is created on first use, as uploads create
//   their parents.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { AsbError } from '../../errors.ts';
import type { Sandbox } from '../../api/types.ts';
import type { Timer } from '../../base/clock.ts';
import { writeFileFrom, type PodShell } from '../../runtime/file-upload.ts';
import { fileFailure, IS_DIR, NOT_FOUND, READ } from '../../runtime/shell-files.ts';
import { readBody } from '../../http/body.ts';
import type { WorkerContext } from '../deps.ts';
import { listDir, type FsTarget } from '../envd/entries.ts';
import { boundaryOf, parseMultipart } from '../envd/multipart.ts';
import type { UserIds } from '../envd/users.ts';
import { discardRest, uploadChunks } from '../upload-body.ts';
import type { UploadSlots } from '../upload-slots.ts';
import { baseDirOf, callOf, confinedPath, dispositionOf, errorBodyOf, executeRequestOf, executeResponseOf, listEntriesOf } from './protocol.ts';

const HEALTH = { status: 'ok', message: 'Sandbox Runtime is active.' };

/** $1 the base directory, $2 the user's command: run from the base (made if missing), in a fresh shell. */
const EXEC = 'mkdir -p -- "$1" 2>/dev/null; cd -- "$1" || exit 1; exec sh -c "$2" sh';
/** Exit 0 when $1 exists (a symlink is followed, as os.path.exists does), else 1. */
const EXISTS = '[ -e "$1" ]';
/** How often a running /execute counts as activity: well within the shortest idle timeout worth setting (a minute). */
const ACTIVITY_EVERY_MS = 15_000;
/** Short scripts (a test, a listing) get this long before they count as failed. */
const FILE_OP_TIMEOUT_MS = 60_000;

export interface RuntimeCall {
  sandbox: Sandbox;
  id: string;
  /** The upload slot key of the credential (the API key's prefix). */
  uploadKey: string;
  uploadWho: string;
}

export class PythonRuntime {
  readonly #w: WorkerContext;
  readonly #uploads: UploadSlots;
  readonly #users: UserIds;

  constructor(w: WorkerContext, uploads: UploadSlots, users: UserIds) {
    this.#w = w;
    this.#uploads = uploads;
    this.#users = users;
  }

  /** Answers one request for a running sandbox; errors in upstream's shape {"message"} with our code. */
  async serve(req: IncomingMessage, res: ServerResponse, call: RuntimeCall): Promise<void> {
    try {
      await this.#serve(req, res, call);
    } catch (err) {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const problem = err instanceof AsbError ? err : new AsbError('Internal', 'internal error in the python-runtime API; the worker log has the details', { cause: err });
      if (problem.code === 'Internal') this.#w.log.error({ err, url: req.url, sandbox: call.id }, 'python-runtime request failed');
      discardRest(req);
      const headers = problem.retryAfterS === undefined ? {} : { 'retry-after': String(problem.retryAfterS) };
      writeJson(res, problem.status, errorBodyOf(problem), headers);
    }
  }

  async #serve(req: IncomingMessage, res: ServerResponse, call: RuntimeCall): Promise<void> {
    const what = callOf(req.method ?? 'GET', req.url ?? '/');
    if (what.op === 'health') {
      writeJson(res, 200, HEALTH);
      return;
    }
    const base = await this.#base(call);
    const target: FsTarget = { runtime: this.#w.runtime, id: call.id, uid: undefined, home: () => Promise.resolve(base) };
    switch (what.op) {
      case 'execute': return this.#execute(req, res, call, base);
      case 'upload': return this.#uploads.run(call.uploadKey, call.uploadWho, () => this.#upload(req, res, call, base));
      case 'download': return this.#download(res, call, confinedPath(base, what.path));
      case 'list': return this.#list(res, target, confinedPath(base, what.path));
      case 'exists': return this.#exists(res, call, what.path, confinedPath(base, what.path));
    }
  }

  #base(call: RuntimeCall): Promise<string> {
    const named = baseDirOf(call.sandbox);
    return named === undefined ? this.#users.homeOf(call.id, undefined) : Promise.resolve(named);
  }

  async #execute(req: IncomingMessage, res: ServerResponse, call: RuntimeCall, base: string): Promise<void> {
    const raw = await readBody(req, this.#w.limits.jsonBytes);
    let body: unknown;
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch (err) {
      throw new AsbError('MalformedJson', `/execute takes a JSON body {"command": "..."}: ${err instanceof Error ? err.message : String(err)}`);
    }
    const { command, timeoutMs } = executeRequestOf(body);
    // A command of up to 300 s is activity for as long as it runs, as an envd stream's keepalives
    // are: idle hibernation must not stop the sandbox under it.
    const w = this.#w;
    let timer: Timer | undefined;
    const touch = (): void => {
      w.operator.activity.touch(call.id);
      timer = w.clock.after(ACTIVITY_EVERY_MS, touch);
    };
    touch();
    let result;
    try {
      result = await w.runtime.exec(call.id, { command: ['sh', '-c', EXEC, 'sh', base, command], timeoutMs, maxOutputBytes: w.limits.execOutputBytes });
    } finally {
      timer?.cancel();
    }
    writeJson(res, 200, executeResponseOf(result));
  }

  async #upload(req: IncomingMessage, res: ServerResponse, call: RuntimeCall, base: string): Promise<void> {
    const contentType = req.headers['content-type'] ?? '';
    if ((contentType.split(';')[0] ?? '').trim().toLowerCase() !== 'multipart/form-data') {
      throw new AsbError('Invalid', `/upload takes multipart/form-data with a part named "file" (got ${contentType === '' ? 'no Content-Type' : `"${contentType}"`})`, { fields: [{ field: 'file', message: 'is required' }] });
    }
    const boundary = boundaryOf(contentType);
    const shell: PodShell = { spawn: (r) => this.#w.runtime.spawn(call.id, r), exec: (r) => this.#w.runtime.exec(call.id, r) };
    let written: string | undefined;
    try {
      for await (const part of parseMultipart(uploadChunks(req, this.#w.limits.uploadBytes), boundary)) {
        // Only the first part named "file" is the upload (FastAPI's File(...)); any other part is skipped unread.
        if (part.name !== 'file' || written !== undefined) continue;
        const name = part.filename ?? '';
        if (name === '') throw new AsbError('Invalid', '/upload: the "file" part needs a filename: the path to write, from the base directory', { fields: [{ field: 'file', message: 'needs a filename' }] });
        await writeFileFrom(shell, confinedPath(base, name, 'filename'), part.data);
        written = name;
      }
    } finally {
      discardRest(req);
    }
    if (written === undefined) throw new AsbError('Invalid', '/upload: the multipart body has no part named "file"', { fields: [{ field: 'file', message: 'is required' }] });
    writeJson(res, 200, { message: `File '${written}' uploaded successfully.` });
  }

  async #download(res: ServerResponse, call: RuntimeCall, path: string): Promise<void> {
    const maxBytes = this.#w.limits.uploadBytes;
    const result = await this.#w.runtime.exec(call.id, { command: ['sh', '-c', READ, 'sh', path], timeoutMs: FILE_OP_TIMEOUT_MS, maxOutputBytes: maxBytes });
    // A directory is not a file to download: 404, as upstream's isfile() check answers.
    if (result.exitCode === NOT_FOUND || result.exitCode === IS_DIR) throw new AsbError('NotFound', 'File not found');
    if (result.exitCode !== 0) throw fileFailure(result, 'download', path);
    if (result.truncated) throw new AsbError('PayloadTooLarge', `${path} is larger than ${maxBytes} bytes, the most one download carries`);
    const bytes = Buffer.from(result.stdout);
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': bytes.length, 'content-disposition': dispositionOf(path) });
    res.end(bytes);
  }

  async #list(res: ServerResponse, target: FsTarget, path: string): Promise<void> {
    let entries;
    try {
      entries = await listDir(target, path, 1);
    } catch (err) {
      // listDir's missing path (NotFound) and a file (BadRequest: not a directory) are upstream's one 404.
      if (err instanceof AsbError && (err.code === 'NotFound' || err.code === 'BadRequest')) throw new AsbError('NotFound', 'Path is not a directory', { cause: err });
      throw err;
    }
    writeJson(res, 200, listEntriesOf(entries));
  }

  async #exists(res: ServerResponse, call: RuntimeCall, asked: string, path: string): Promise<void> {
    const result = await this.#w.runtime.exec(call.id, { command: ['sh', '-c', EXISTS, 'sh', path], timeoutMs: FILE_OP_TIMEOUT_MS, maxOutputBytes: 4096 });
    if (result.exitCode !== 0 && result.exitCode !== 1) throw fileFailure(result, 'exists', path);
    writeJson(res, 200, { path: asked, exists: result.exitCode === 0 });
  }
}

function writeJson(res: ServerResponse, status: number, value: unknown, headers: Record<string, string> = {}): void {
  const json = JSON.stringify(value);
  res.writeHead(status, { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  res.end(json);
}
