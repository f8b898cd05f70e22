// envd, the E2B SDK's in-sandbox API (port 49983), served by the worker on the sandbox's behalf:
// no agent runs in the sandbox image. The router sends requests for port 49983 of a sandbox to
// its owning worker's API upstream with `x-asb-sandbox-id: <id>` (a header a client cannot send
// through the router, which strips client x-asb-* headers); the worker answers them here and
// runs processes and file operations inside the sandbox through the pod runtime.
//
// The sandbox-id header alone grants nothing (anyone reaching the worker port directly can send
// it): every call but GET /health needs the sandbox's access token (X-Access-Token) or, on
// /files, a signed URL, as envd itself does.
//
//   GET  /health                          204 while the sandbox runs, 502 otherwise (isRunning)
//   GET|POST /files                       file download / upload (files.ts)
//   POST /process.Process/<Method>        Connect RPC (process.ts)
//   POST /filesystem.Filesystem/<Method>  Connect RPC (filesystem.ts; the *Watcher methods: watchers.ts)
import type { IncomingMessage, ServerResponse } from 'node:http';
import { AsbError } from '../../errors.ts';
import type { Sandbox } from '../../api/types.ts';
import { LABEL } from '../../api/types.ts';
import { e2bSandboxNotFoundJson, HEADER } from '../../router/contract.ts';
import { envVarsOf } from '../e2b/shape.ts';
import { isObjectName } from '../../api/names.ts';
import { readBody } from '../../http/body.ts';
import type { WorkerContext } from '../deps.ts';
import type { UploadSlots } from '../upload-slots.ts';
import { basicUser, checkSignature, requireToken } from './auth.ts';
import { ConnectError, keepaliveOf, parseJson, parseStreamRequest, ServerStream, streamMessages, timeoutOf, writeClientStreamReply, writeUnary, writeUnaryError } from './connect.ts';
import type { FsTarget } from './entries.ts';
import { getFile, postFiles, writeRestError } from './files.ts';
import { FILESYSTEM_UNARY, watchDir, type UnaryMethod } from './filesystem.ts';
import { PROCESS_STREAMS, PROCESS_UNARY, streamInput, type ProcessCall } from './process.ts';
import { ProcessTable } from './processes.ts';
import type { UserIds } from './users.ts';
import { WatcherTable } from './watchers.ts';

/** Connect request messages are a few fields, but SendInput and StreamInput carry input in base64 (4/3 its size): 4 MiB takes a 3 MiB write. */
const MESSAGE_LIMIT_BYTES = 4 * 1024 * 1024;

const PROCESS_PREFIX = '/process.Process/';
const FILESYSTEM_PREFIX = '/filesystem.Filesystem/';

/** Whether a request is for envd: it came through the router for a sandbox and its path is an envd path. */
export function isEnvdRequest(req: IncomingMessage): boolean {
  if (req.headers[HEADER.sandboxId] === undefined) return false;
  const path = pathOf(req);
  return path === '/health' || path === '/files' || path.startsWith(PROCESS_PREFIX) || path.startsWith(FILESYSTEM_PREFIX);
}

function pathOf(req: IncomingMessage): string {
  const url = req.url ?? '/';
  const q = url.indexOf('?');
  return q === -1 ? url : url.slice(0, q);
}

type Kind = 'health' | 'files' | 'rpc';

export class Envd {
  readonly #w: WorkerContext;
  readonly #uploads: UploadSlots;
  readonly #table = new ProcessTable();
  readonly #watchers: WatcherTable;
  readonly #users: UserIds;
  readonly #streams = new Set<ServerStream>();
  readonly #unwatch: () => void;
  #closed = false;

  constructor(w: WorkerContext, uploads: UploadSlots, users: UserIds) {
    this.#w = w;
    this.#uploads = uploads;
    this.#watchers = new WatcherTable(w.log.child({ component: 'envd-watchers' }));
    this.#users = users;
    // What is kept per sandbox goes with its pod, so a worker's tables do not grow with every sandbox it ever ran.
    this.#unwatch = w.runtime.onChange((id) => {
      if (w.runtime.state(id).phase !== 'Absent') return;
      this.#table.forget(id);
    });
  }

  /** The node:http handler for a request isEnvdRequest accepted. */
  handle(req: IncomingMessage, res: ServerResponse): void {
    const path = pathOf(req);
    const kind: Kind = path === '/health' ? 'health' : path === '/files' ? 'files' : 'rpc';
    this.#serve(kind, path, req, res).catch((err: unknown) => {
      if (res.headersSent) {
        this.#w.log.error({ err, path }, 'envd request failed after its reply began');
        res.destroy();
      } else if (kind === 'rpc') {
        writeUnaryError(res, this.#answerable(err, path));
      } else {
        writeRestError(res, this.#answerable(err, path));
      }
    });
  }

  /** Ends every open stream (unavailable), so the server can close; processes keep running in their sandboxes. Idempotent. */
  close(): void {
    this.#closed = true;
    this.#unwatch();
    for (const stream of this.#streams) stream.end(new ConnectError('unavailable', 'the worker is shutting down'));
    this.#streams.clear();
  }

  async #serve(kind: Kind, path: string, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const w = this.#w;
    const id = String(req.headers[HEADER.sandboxId]);
    const sandbox = await this.#sandbox(id);
    if (sandbox === undefined) {
      // What E2B's proxy answers before envd is ever reached: the SDKs make SandboxNotFoundError
      // of it (and isRunning() false); a 404 would read as a missing RPC.
      const json = e2bSandboxNotFoundJson(id);
      res.writeHead(502, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
      res.end(json);
      return;
    }
    const running = w.runtime.state(id).phase === 'Running';
    if (kind === 'health') {
      // The SDK's isRunning(): any 2xx is true, 502 false.
      if (running) {
        res.writeHead(204);
        res.end();
      } else {
        writeRestError(res, new AsbError('Unavailable', `sandbox ${id} is not running`), 502);
      }
      return;
    }
    const token = w.dataPlane.tokens.accessToken(sandbox);
    const url = new URL(req.url ?? '/', 'http://envd.invalid');
    const signature = kind === 'files' ? url.searchParams.get('signature') : null;
    const signed = signature !== null && signature !== '';
    if (kind === 'files') {
      if (signed) {
        checkSignature({
          path: url.searchParams.get('path') ?? '',
          signature,
          username: url.searchParams.get('username') ?? undefined,
          expiration: url.searchParams.get('signature_expiration') ?? undefined,
        }, req.method === 'GET' ? 'read' : 'write', token, w.clock.now());
      } else {
        requireToken(req, token, id);
      }
    } else {
      requireToken(req, token, id);
      if (req.method !== 'POST') throw new ConnectError('unimplemented', `envd RPCs are POST requests, not ${req.method ?? ''}`);
    }
    if (!running) throw new AsbError('Unavailable', `sandbox ${id} is not running (hibernated, starting or stopped); resume it and retry`);
    w.operator.activity.touch(id);
    // A signed URL runs as the user its signature names (none: the default user), never as a
    // Basic auth header added by whoever holds the URL: the header is not part of the signature.
    const user = signed ? url.searchParams.get('username') ?? undefined : url.searchParams.get('username') ?? basicUser(req);
    const name = user === '' ? undefined : user;
    const uid = await this.#users.uidOf(id, name);
    // Relative paths and ~ are the user's home, as under envd: looked up only for a path that needs it.
    const home = (): Promise<string> => this.#users.homeOf(id, name);
    const target: FsTarget = { runtime: w.runtime, id, uid, home };
    if (kind === 'files') {
      const call = { target, req, res, query: url.searchParams, maxBytes: w.limits.uploadBytes };
      if (req.method === 'GET') await getFile(call);
      // One key per sandbox: its access token and every URL signed with it are one credential.
      else if (req.method === 'POST') await this.#uploads.run(`sandbox:${id}`, `the access token of sandbox ${id}`, () => postFiles(call));
      else throw new AsbError('MethodNotAllowed', `/files takes GET or POST, not ${req.method ?? ''}`);
      return;
    }
    await this.#rpc(path, req, res, { runtime: w.runtime, table: this.#table, id, uid, user: uid === undefined ? undefined : name, home, envs: envVarsOf(sandbox) }, target);
  }

  /** A claimed, live sandbox of this worker, or undefined. */
  async #sandbox(id: string): Promise<Sandbox | undefined> {
    if (!isObjectName(id)) return undefined;
    const sandbox = await this.#w.index.find(id, [this.#w.defaultNamespace]);
    const owner = sandbox?.metadata.labels?.[LABEL.owner];
    if (sandbox === undefined || owner === undefined || owner === '' || sandbox.metadata.deletionTimestamp !== undefined) return undefined;
    return sandbox;
  }

  async #rpc(path: string, req: IncomingMessage, res: ServerResponse, call: ProcessCall, target: FsTarget): Promise<void> {
    const service = path.startsWith(PROCESS_PREFIX) ? 'process' : 'filesystem';
    const method = path.slice(service === 'process' ? PROCESS_PREFIX.length : FILESYSTEM_PREFIX.length);
    const processStream = service === 'process' ? PROCESS_STREAMS[method] : undefined;
    const isWatch = service === 'filesystem' && method === 'WatchDir';
    if (service === 'process' && method === 'StreamInput') {
      await this.#clientStream(req, res, (messages) => streamInput(call, messages));
      return;
    }
    if (processStream !== undefined || isWatch) {
      const message = parseStreamRequest(await readBody(req, MESSAGE_LIMIT_BYTES));
      await this.#stream(req, res, call.id, (stream) => (processStream !== undefined ? processStream(call, message, stream) : watchDir(target, message, stream, (ms) => this.#sleep(ms))));
      return;
    }
    const unary = service === 'process' ? PROCESS_UNARY[method] : undefined;
    const fsUnary = service === 'filesystem' ? FILESYSTEM_UNARY[method] ?? this.#watcherMethod(method) : undefined;
    if (unary === undefined && fsUnary === undefined) throw new ConnectError('unimplemented', `${service}.${service === 'process' ? 'Process' : 'Filesystem'}/${method} is not implemented`);
    const message = parseJson(await readBody(req, MESSAGE_LIMIT_BYTES));
    writeUnary(res, unary !== undefined ? await unary(call, message) : await fsUnary?.(target, message));
  }

  /** A client stream: messages as they arrive, one reply at the end; past Connect-Timeout-Ms, deadline_exceeded. */
  async #clientStream(req: IncomingMessage, res: ServerResponse, run: (messages: AsyncIterable<unknown>) => Promise<unknown>): Promise<void> {
    const timeoutMs = timeoutOf(req);
    const deadline = timeoutMs === undefined ? undefined : this.#w.clock.after(timeoutMs, () => {
      if (!res.headersSent) writeClientStreamReply(res, { error: new ConnectError('deadline_exceeded', `the input stream passed its deadline of ${timeoutMs} ms (Connect-Timeout-Ms)`) });
      req.destroy();
    });
    try {
      const message = await run(streamMessages(req, MESSAGE_LIMIT_BYTES));
      if (!res.headersSent) writeClientStreamReply(res, { message });
    } catch (err) {
      if (!res.headersSent) writeClientStreamReply(res, { error: this.#answerable(err, req.url ?? '') });
    } finally {
      deadline?.cancel();
    }
  }

  #watcherMethod(method: string): UnaryMethod | undefined {
    const watchers = this.#watchers;
    switch (method) {
      case 'CreateWatcher': return (t, msg) => watchers.create(t, msg);
      case 'GetWatcherEvents': return (t, msg) => watchers.events(t, msg);
      case 'RemoveWatcher': return (t, msg) => Promise.resolve(watchers.remove(t, msg));
      default: return undefined;
    }
  }

  async #stream(req: IncomingMessage, res: ServerResponse, id: string, run: (stream: ServerStream) => Promise<void>): Promise<void> {
    const w = this.#w;
    const stream = new ServerStream(res, {
      clock: w.clock,
      keepaliveMs: keepaliveOf(req),
      // A long command is activity: each keepalive holds off idle hibernation.
      keepalive: () => {
        w.operator.activity.touch(id);
        return req.url?.startsWith(FILESYSTEM_PREFIX) === true ? { keepalive: {} } : { event: { keepalive: {} } };
      },
      timeoutMs: timeoutOf(req),
    });
    if (this.#closed) {
      stream.end(new ConnectError('unavailable', 'the worker is shutting down'));
      return;
    }
    this.#streams.add(stream);
    try {
      await run(stream);
      stream.end();
    } catch (err) {
      // Once streaming, errors go in the end-stream envelope: the SDK reads their code there.
      stream.end(this.#answerable(err, req.url ?? ''));
    } finally {
      this.#streams.delete(stream);
    }
  }

  /**
   * An error as the caller may see it: ours (coded, written for users) as they are; anything else
   * (Node's own messages name its internals: `args[19] must be a string without null bytes`) is
   * logged here and answered as a plain internal error.
   */
  #answerable(err: unknown, path: string): unknown {
    if (err instanceof AsbError || err instanceof ConnectError) return err;
    this.#w.log.error({ err, path }, 'envd request failed');
    return new AsbError('Internal', 'internal error in envd; the worker log has the details', { cause: err });
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.#w.clock.after(ms, resolve));
  }
}
