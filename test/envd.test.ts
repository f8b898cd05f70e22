// envd served by the worker: a real worker process (store, operator, local runtime) with real
// sandboxes, called the way the router forwards E2B SDK requests for port 49983 (x-asb-sandbox-id
// set), with raw HTTP and hand-built Connect envelopes. Its own tag, bridge and subnet (envd:
// 10.26/16; through the router and Envoy: envs, 10.244/16), so other test files and `make up`
// never collide.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { gunzipSync, gzipSync } from 'node:zlib';
import { request } from 'node:http';
import { randomBytes } from 'node:crypto';
import { baseTemplate } from '../src/api/builtin.ts';
import { LABEL } from '../src/api/types.ts';
import { sandboxFromTemplate } from '../src/operator/blueprint.ts';
import { createAccessTokens } from '../src/worker/access-token.ts';
import { MAX_ARG_BYTES } from '../src/worker/input.ts';
import { ENVD_ANNOTATION, routeEntryOf } from '../src/worker/route-entry.ts';
import { startTestSystem } from './support/local-system.ts';
import { api, removeDataDir, startWorkerProcess, type WorkerProcess } from './support/worker-process.ts';
import { waitFor } from './support/wait.ts';

let w: WorkerProcess;
let id: string;
let token: string;

before(async () => {
  w = await startWorkerProcess({ clusterTag: 'envd', subnetOctet: 26, basePool: 1 });
  const created = await api<{ id: string; accessToken: string }>(w, 'POST', '/v1/sandboxes', { template: 'base', wait: true });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  id = created.body.id;
  token = created.body.accessToken;
});

after(async () => {
  await w.stop();
  removeDataDir(w.dataDir);
});

function headers(extra: Record<string, string> = {}): Record<string, string> {
  return { 'x-asb-sandbox-id': id, 'x-access-token': token, 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983', ...extra };
}

async function unary<T = Record<string, unknown>>(method: string, message: unknown, extra: Record<string, string> = {}): Promise<{ status: number; body: T }> {
  const res = await fetch(`${w.apiUrl}/${method}`, {
    method: 'POST',
    headers: headers({ 'content-type': 'application/json', 'connect-protocol-version': '1', ...extra }),
    body: JSON.stringify(message),
  });
  return { status: res.status, body: (await res.json()) as T };
}

function envelope(message: unknown, flags = 0): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}

interface Frame {
  flags: number;
  message: Record<string, unknown>;
}

/** An open server stream: frames as they arrive. */
class Stream {
  readonly frames: Frame[] = [];
  readonly status: number;
  readonly contentType: string | null;
  readonly done: Promise<void>;
  readonly #abort: AbortController;
  #waiters: (() => void)[] = [];

  constructor(res: Response, abort: AbortController) {
    this.status = res.status;
    this.contentType = res.headers.get('content-type');
    this.#abort = abort;
    const body = res.body;
    this.done = (async () => {
      if (body === null) return;
      let buf = Buffer.alloc(0);
      try {
        for await (const chunk of body) {
          buf = Buffer.concat([buf, Buffer.from(chunk)]);
          while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
            const len = buf.readUInt32BE(1);
            this.frames.push({ flags: buf.readUInt8(0), message: JSON.parse(buf.subarray(5, 5 + len).toString('utf8')) as Record<string, unknown> });
            buf = buf.subarray(5 + len);
            for (const wake of this.#waiters.splice(0)) wake();
          }
        }
      } catch (err) {
        if (!abort.signal.aborted) throw err;
      } finally {
        for (const wake of this.#waiters.splice(0)) wake();
      }
    })();
  }

  /** Waits (bounded) until some frame satisfies `pred`. */
  async until(what: string, pred: (f: Frame) => boolean, timeoutMs = 20_000): Promise<Frame> {
    const deadline = Date.now() + timeoutMs;
    for (let i = 0; i < 10_000; i++) {
      const found = this.frames.find(pred);
      if (found !== undefined) return found;
      const left = deadline - Date.now();
      if (left <= 0) break;
      let timer: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        this.done.then(() => true),
        new Promise<boolean>((resolve) => {
          this.#waiters.push(() => resolve(false));
          timer = setTimeout(() => resolve(false), left);
        }),
      ]);
      clearTimeout(timer);
      if (ended) {
        const last = this.frames.find(pred);
        if (last !== undefined) return last;
        break;
      }
    }
    throw new Error(`no ${what} in the stream; frames: ${JSON.stringify(this.frames).slice(0, 2000)}`);
  }

  abort(): void {
    this.#abort.abort();
  }

  /** Bytes of one data kind (stdout, stderr, pty) so far. */
  output(kind: 'stdout' | 'stderr' | 'pty'): string {
    return this.frames
      .map((f) => ((f.message.event as { data?: Record<string, string> } | undefined)?.data?.[kind]))
      .filter((d): d is string => d !== undefined)
      .map((d) => Buffer.from(d, 'base64').toString('utf8'))
      .join('');
  }
}

async function openStream(method: string, message: unknown, extra: Record<string, string> = {}): Promise<Stream> {
  const abort = new AbortController();
  const res = await fetch(`${w.apiUrl}/${method}`, {
    method: 'POST',
    headers: headers({ 'content-type': 'application/connect+json', 'connect-protocol-version': '1', 'keepalive-ping-interval': '50', ...extra }),
    body: envelope(message),
    signal: abort.signal,
  });
  return new Stream(res, abort);
}

const endOf = (f: Frame): boolean => (f.message.event as Record<string, unknown> | undefined)?.end !== undefined;

function bash(cmd: string, envs: Record<string, string> = {}): unknown {
  return { process: { cmd: '/bin/bash', args: ['-l', '-c', cmd], envs }, stdin: false };
}

test('health answers 204 without a token; envd paths without x-asb-sandbox-id are not envd', async () => {
  const res = await fetch(`${w.apiUrl}/health`, { headers: { 'x-asb-sandbox-id': id } });
  assert.equal(res.status, 204);
  // Without the router's header the worker's own API answers (and wants an API key).
  const plain = await fetch(`${w.apiUrl}/process.Process/List`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-access-token': token }, body: '{}' });
  assert.equal(plain.status, 401);
  assert.match(plain.headers.get('content-type') ?? '', /problem\+json/);
});

test('process.Start: start event first, stdout, exit code 0, end-stream envelope', async () => {
  const s = await openStream('process.Process/Start', bash('echo hello-$X; echo oops >&2', { X: 'envd' }), { 'connect-timeout-ms': '60000' });
  assert.equal(s.status, 200);
  assert.equal(s.contentType, 'application/connect+json');
  await s.done;
  const first = s.frames[0]?.message.event as { start?: { pid: number } } | undefined;
  assert.ok(first?.start !== undefined && first.start.pid > 0, JSON.stringify(s.frames[0]));
  assert.equal(s.output('stdout'), 'hello-envd\n');
  assert.equal(s.output('stderr'), 'oops\n');
  const end = (await s.until('end event', endOf)).message.event as { end: { exitCode?: number; exited: boolean; status: string } };
  assert.equal(end.end.exitCode ?? 0, 0);
  assert.equal(end.end.exited, true);
  const last = s.frames.at(-1);
  assert.equal(last?.flags, 2);
  assert.deepEqual(last.message, {});
});

test('process.Start: a non-zero exit code, cwd and the user from Basic auth', async () => {
  const s = await openStream('process.Process/Start', bash('exit 7'));
  await s.done;
  const end = (await s.until('end event', endOf)).message.event as { end: { exitCode: number; status: string } };
  assert.equal(end.end.exitCode, 7);
  assert.equal(end.end.status, 'exit status 7');

  const asRoot = await openStream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', 'id -u; pwd'], cwd: '/tmp' } }, { authorization: `Basic ${Buffer.from('root:').toString('base64')}` });
  await asRoot.done;
  assert.equal(asRoot.output('stdout'), '0\n/tmp\n');
  const asUser = await openStream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', 'id -u'] } }, { authorization: `Basic ${Buffer.from('user:').toString('base64')}` });
  await asUser.done;
  assert.notEqual(asUser.output('stdout'), '0\n');
});

test('process: a background sleep is listed, outlives its stream, is re-attached by Connect and killed by SendSignal', async () => {
  const s = await openStream('process.Process/Start', { process: { cmd: '/bin/sleep', args: ['300'] }, tag: 'napper' });
  const start = await s.until('start event', (f) => (f.message.event as Record<string, unknown> | undefined)?.start !== undefined);
  const pid = (start.message.event as { start: { pid: number } }).start.pid;
  s.abort(); // the SDK's disconnect(): the process keeps running
  await s.done;

  const listed = await unary<{ processes: { pid: number; tag?: string; config: { cmd: string; args: string[] } }[] }>('process.Process/List', {});
  assert.equal(listed.status, 200);
  const mine = listed.body.processes.find((p) => p.pid === pid);
  assert.deepEqual(mine, { pid, tag: 'napper', config: { cmd: '/bin/sleep', args: ['300'], envs: {} } });

  const again = await openStream('process.Process/Connect', { process: { pid } });
  await again.until('start event', (f) => (f.message.event as { start?: { pid: number } } | undefined)?.start?.pid === pid);
  const killed = await unary('process.Process/SendSignal', { process: { pid }, signal: 'SIGNAL_SIGKILL' });
  assert.equal(killed.status, 200);
  assert.deepEqual(killed.body, {});
  const end = (await again.until('end event', endOf)).message.event as { end: { exitCode: number; exited: boolean; status: string } };
  assert.equal(end.end.exited, false);
  assert.equal(end.end.status, 'signal: SIGKILL');
  await again.done;
  assert.equal(again.frames.at(-1)?.flags, 2);

  const gone = await unary<{ code: string }>('process.Process/SendSignal', { process: { pid }, signal: 'SIGNAL_SIGKILL' });
  assert.equal(gone.status, 404);
  assert.equal(gone.body.code, 'not_found');
  const missing = await openStream('process.Process/Connect', { process: { pid: 999_999 } });
  await missing.done;
  assert.deepEqual(missing.frames.at(-1)?.message.error, { code: 'not_found', message: `process with pid 999999 not found in sandbox ${id}` });
});

test('process: stdin through SendInput, then CloseStdin ends the reader', async () => {
  const s = await openStream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', 'cat; echo done'] }, stdin: true });
  const start = await s.until('start event', (f) => (f.message.event as Record<string, unknown> | undefined)?.start !== undefined);
  const pid = (start.message.event as { start: { pid: number } }).start.pid;
  const sent = await unary('process.Process/SendInput', { process: { pid }, input: { stdin: Buffer.from('typed line\n').toString('base64') } });
  assert.equal(sent.status, 200);
  await s.until('echoed stdin', () => s.output('stdout').includes('typed line\n'));
  assert.equal((await unary('process.Process/CloseStdin', { process: { pid } })).status, 200);
  await s.until('end event', endOf);
  assert.equal(s.output('stdout'), 'typed line\ndone\n');
});

test('process: a pty with its size, resized by Update, fed by SendInput', async () => {
  const s = await openStream('process.Process/Start', {
    process: { cmd: '/bin/bash', args: ['--norc', '--noprofile', '-i'], envs: { TERM: 'xterm-256color', PS1: '$ ' } },
    pty: { size: { cols: 100, rows: 30 } },
  });
  const start = await s.until('start event', (f) => (f.message.event as Record<string, unknown> | undefined)?.start !== undefined);
  const pid = (start.message.event as { start: { pid: number } }).start.pid;
  const input = (text: string): Promise<{ status: number }> => unary('process.Process/SendInput', { process: { pid }, input: { pty: Buffer.from(text).toString('base64') } });
  assert.equal((await input('stty size\n')).status, 200);
  await s.until('30 100', () => s.output('pty').includes('30 100'));
  assert.equal((await unary('process.Process/Update', { process: { pid }, pty: { size: { cols: 120, rows: 40 } } })).status, 200);
  await input('stty size; exit 3\n');
  await s.until('40 120', () => s.output('pty').includes('40 120'));
  const end = (await s.until('end event', endOf)).message.event as { end: { exitCode: number } };
  assert.equal(end.end.exitCode, 3);
  // A pty has no stdin to close.
  const closing = await unary<{ code: string }>('process.Process/CloseStdin', { process: { pid } });
  assert.equal(closing.status, 404);
});

test('process: keepalive events every Keepalive-Ping-Interval seconds while a command runs', async () => {
  const s = await openStream('process.Process/Start', bash('sleep 1.6; echo woke'), { 'keepalive-ping-interval': '1' });
  await s.done;
  const kinds = s.frames.map((f) => Object.keys((f.message.event as Record<string, unknown> | undefined) ?? { trailer: 1 })[0]);
  assert.equal(kinds[0], 'start');
  assert.ok(kinds.indexOf('keepalive') > 0 && kinds.indexOf('keepalive') < kinds.indexOf('end'), kinds.join(','));
  assert.equal(s.output('stdout'), 'woke\n');
});

test('process: the Connect-Timeout-Ms deadline kills the command and ends with deadline_exceeded', async () => {
  const s = await openStream('process.Process/Start', bash('sleep 300'), { 'connect-timeout-ms': '300' });
  await s.done;
  const last = s.frames.at(-1);
  assert.equal(last?.flags, 2);
  assert.equal((last.message.error as { code: string }).code, 'deadline_exceeded');
  const pid = (s.frames[0]?.message.event as { start: { pid: number } }).start.pid;
  await waitFor('the killed process to leave the list', async () => {
    const listed = await unary<{ processes: { pid: number }[] }>('process.Process/List', {});
    return listed.body.processes.some((p) => p.pid === pid) ? undefined : true;
  }, 10_000);
});

test('filesystem: MakeDir, Stat, ListDir with depth, Move, Remove', async () => {
  const made = await unary<{ entry: Record<string, unknown> }>('filesystem.Filesystem/MakeDir', { path: '/tmp/fs-test/a/b' });
  assert.equal(made.status, 200, JSON.stringify(made.body));
  assert.equal(made.body.entry.type, 'FILE_TYPE_DIRECTORY');
  assert.equal(made.body.entry.path, '/tmp/fs-test/a/b');
  assert.equal(made.body.entry.name, 'b');
  const again = await unary<{ code: string }>('filesystem.Filesystem/MakeDir', { path: '/tmp/fs-test/a/b' });
  assert.equal(again.status, 409);
  assert.equal(again.body.code, 'already_exists');

  const run = await openStream('process.Process/Start', bash('printf 12345 > /tmp/fs-test/a/f.txt; ln -s f.txt /tmp/fs-test/a/link'));
  await run.done;

  const stat = await unary<{ entry: Record<string, unknown> }>('filesystem.Filesystem/Stat', { path: '/tmp/fs-test/a/f.txt' });
  assert.equal(stat.status, 200);
  assert.equal(stat.body.entry.type, 'FILE_TYPE_FILE');
  assert.equal(stat.body.entry.size, 5);
  assert.match(String(stat.body.entry.permissions), /^-rw/);
  assert.ok(!Number.isNaN(Date.parse(String(stat.body.entry.modifiedTime))));
  const link = await unary<{ entry: Record<string, unknown> }>('filesystem.Filesystem/Stat', { path: '/tmp/fs-test/a/link' });
  assert.equal(link.body.entry.type, 'FILE_TYPE_SYMLINK');
  assert.equal(link.body.entry.symlinkTarget, 'f.txt');
  const missing = await unary<{ code: string; message: string }>('filesystem.Filesystem/Stat', { path: '/tmp/fs-test/nope' });
  assert.equal(missing.status, 404);
  assert.equal(missing.body.code, 'not_found');

  const shallow = await unary<{ entries: { path: string }[] }>('filesystem.Filesystem/ListDir', { path: '/tmp/fs-test', depth: 1 });
  assert.deepEqual(shallow.body.entries.map((e) => e.path), ['/tmp/fs-test/a']);
  const deep = await unary<{ entries: { path: string }[] }>('filesystem.Filesystem/ListDir', { path: '/tmp/fs-test', depth: 3 });
  assert.deepEqual(deep.body.entries.map((e) => e.path), ['/tmp/fs-test/a', '/tmp/fs-test/a/b', '/tmp/fs-test/a/f.txt', '/tmp/fs-test/a/link']);

  const moved = await unary<{ entry: Record<string, unknown> }>('filesystem.Filesystem/Move', { source: '/tmp/fs-test/a/f.txt', destination: '/tmp/fs-test/c/g.txt' });
  assert.equal(moved.status, 200);
  assert.equal(moved.body.entry.path, '/tmp/fs-test/c/g.txt');
  assert.equal(moved.body.entry.size, 5);
  const notThere = await unary<{ code: string }>('filesystem.Filesystem/Move', { source: '/tmp/fs-test/a/f.txt', destination: '/tmp/x' });
  assert.equal(notThere.body.code, 'not_found');

  assert.equal((await unary('filesystem.Filesystem/Remove', { path: '/tmp/fs-test' })).status, 200);
  assert.equal((await unary('filesystem.Filesystem/Stat', { path: '/tmp/fs-test' })).status, 404);
  const unknown = await unary<{ code: string }>('filesystem.Filesystem/Nope', {});
  assert.equal(unknown.body.code, 'unimplemented');
});

test('filesystem.WatchDir: start first, then create, write and remove events', async () => {
  assert.equal((await unary('filesystem.Filesystem/MakeDir', { path: '/tmp/watched' })).status, 200);
  const s = await openStream('filesystem.Filesystem/WatchDir', { path: '/tmp/watched', includeEntry: true }, { 'connect-timeout-ms': '60000' });
  await s.until('start', (f) => f.message.start !== undefined);
  assert.deepEqual(s.frames[0]?.message, { start: {} });
  const event = (type: string, name: string) => (f: Frame): boolean => {
    const fs = f.message.filesystem as { name: string; type: string } | undefined;
    return fs?.type === type && fs.name === name;
  };
  await (await openStream('process.Process/Start', bash('echo one > /tmp/watched/new.txt'))).done;
  const created = await s.until('create event', event('EVENT_TYPE_CREATE', 'new.txt'));
  assert.equal((created.message.filesystem as { entry: { path: string } }).entry.path, '/tmp/watched/new.txt');
  await (await openStream('process.Process/Start', bash('echo two-more >> /tmp/watched/new.txt'))).done;
  await s.until('write event', event('EVENT_TYPE_WRITE', 'new.txt'));
  await (await openStream('process.Process/Start', bash('rm /tmp/watched/new.txt'))).done;
  await s.until('remove event', event('EVENT_TYPE_REMOVE', 'new.txt'));
  s.abort();
  await s.done;
  const missing = await openStream('filesystem.Filesystem/WatchDir', { path: '/tmp/not-a-dir' });
  await missing.done;
  assert.equal((missing.frames.at(-1)?.message.error as { code: string }).code, 'not_found');
});

test('/files: octet-stream and multipart uploads (gzip too), downloads with and without gzip', async () => {
  const up = await fetch(`${w.apiUrl}/files?path=${encodeURIComponent('/tmp/files/raw.bin')}`, {
    method: 'POST',
    headers: headers({ 'content-type': 'application/octet-stream' }),
    body: Buffer.from([0, 1, 2, 255]),
  });
  assert.equal(up.status, 200);
  assert.deepEqual(await up.json(), [{ path: '/tmp/files/raw.bin', name: 'raw.bin', type: 'file' }]);

  const zipped = await fetch(`${w.apiUrl}/files?path=/tmp/files/z.txt`, {
    method: 'POST',
    headers: headers({ 'content-type': 'application/octet-stream', 'content-encoding': 'gzip' }),
    body: gzipSync(Buffer.from('inflated on arrival')),
  });
  assert.equal(zipped.status, 200);

  const form = new FormData();
  form.append('file', new Blob(['first file']), '/tmp/files/multi/one.txt');
  form.append('file', new Blob(['second file']), '/tmp/files/multi/two.txt');
  const multi = await fetch(`${w.apiUrl}/files`, { method: 'POST', headers: headers(), body: form });
  assert.equal(multi.status, 200);
  assert.deepEqual(await multi.json(), [
    { path: '/tmp/files/multi/one.txt', name: 'one.txt', type: 'file' },
    { path: '/tmp/files/multi/two.txt', name: 'two.txt', type: 'file' },
  ]);

  const raw = await fetch(`${w.apiUrl}/files?path=/tmp/files/raw.bin`, { headers: headers({ 'accept-encoding': 'identity' }) });
  assert.equal(raw.status, 200);
  assert.deepEqual([...Buffer.from(await raw.arrayBuffer())], [0, 1, 2, 255]);
  const two = await fetch(`${w.apiUrl}/files?path=/tmp/files/multi/two.txt`, { headers: headers() });
  assert.equal(await two.text(), 'second file');

  // fetch inflates gzip itself; read the raw bytes over node:http to see the encoding.
  const { request } = await import('node:http');
  const gz = await new Promise<{ encoding: string | undefined; body: Buffer }>((resolve, reject) => {
    const r = request(`${w.apiUrl}/files?path=/tmp/files/z.txt`, { headers: headers({ 'accept-encoding': 'gzip, deflate' }) }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ encoding: res.headers['content-encoding'], body: Buffer.concat(chunks) }));
    });
    r.on('error', reject);
    r.end();
  });
  assert.equal(gz.encoding, 'gzip');
  assert.equal(gunzipSync(gz.body).toString(), 'inflated on arrival');

  const missing = await fetch(`${w.apiUrl}/files?path=/tmp/files/none`, { headers: headers() });
  assert.equal(missing.status, 404);
  assert.equal(((await missing.json()) as { code: number }).code, 404);
});

function signature(path: string, op: 'read' | 'write', user: string, expiration?: number): string {
  const raw = expiration === undefined ? `${path}:${op}:${user}:${token}` : `${path}:${op}:${user}:${token}:${expiration}`;
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

test('/files: signed URLs work without the token; a bad or expired signature is 401', async () => {
  const noToken = { 'x-asb-sandbox-id': id };
  const path = '/tmp/signed.txt';
  const write = await fetch(`${w.apiUrl}/files?path=${path}&username=user&signature=${encodeURIComponent(signature(path, 'write', 'user'))}`, {
    method: 'POST',
    headers: { ...noToken, 'content-type': 'application/octet-stream' },
    body: 'signed upload',
  });
  assert.equal(write.status, 200, await write.clone().text());
  const exp = Math.floor(Date.now() / 1000) + 600;
  const read = await fetch(`${w.apiUrl}/files?path=${path}&username=user&signature=${encodeURIComponent(signature(path, 'read', 'user', exp))}&signature_expiration=${exp}`, { headers: noToken });
  assert.equal(read.status, 200);
  assert.equal(await read.text(), 'signed upload');

  const wrongOp = await fetch(`${w.apiUrl}/files?path=${path}&username=user&signature=${encodeURIComponent(signature(path, 'write', 'user'))}`, { headers: noToken });
  assert.equal(wrongOp.status, 401);
  const past = Math.floor(Date.now() / 1000) - 10;
  const expired = await fetch(`${w.apiUrl}/files?path=${path}&username=user&signature=${encodeURIComponent(signature(path, 'read', 'user', past))}&signature_expiration=${past}`, { headers: noToken });
  assert.equal(expired.status, 401);
  assert.match(((await expired.json()) as { message: string }).message, /expired/);
});

test('security probe L1: a signed URL runs as the user it was signed for; an added Basic root is ignored', async () => {
  const rootBasic = `Basic ${Buffer.from('root:').toString('base64')}`;
  const secret = '/root/l1-secret.txt';
  const made = await openStream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', `echo root-only > ${secret} && chmod 600 ${secret}`] } }, { authorization: rootBasic });
  await made.done;
  assert.equal((made.frames.map((f) => f.message.event as { end?: { exitCode?: number } } | undefined).find((e) => e?.end !== undefined))?.end?.exitCode ?? 0, 0);
  const noToken = { 'x-asb-sandbox-id': id };
  // Signed without a user (the SDK's downloadUrl() with no user): the default user, who may not read it.
  const url = `${w.apiUrl}/files?path=${secret}&signature=${encodeURIComponent(signature(secret, 'read', ''))}`;
  const asDefault = await fetch(url, { headers: noToken });
  assert.ok(asDefault.status === 403 || asDefault.status === 404, `the default user reads a 0600 root file: ${asDefault.status}`);
  await asDefault.body?.cancel();
  const withRoot = await fetch(url, { headers: { ...noToken, authorization: rootBasic } });
  assert.notEqual(withRoot.status, 200, 'Basic root on a signed URL read the root-only file');
  assert.ok(withRoot.status === 403 || withRoot.status === 404, `status ${withRoot.status}`);
  assert.doesNotMatch(await withRoot.text(), /root-only/);
  // A write URL signed for "user" with Basic root added writes as the default user, not as root.
  const owned = '/tmp/l1-owner.txt';
  const write = await fetch(`${w.apiUrl}/files?path=${owned}&username=user&signature=${encodeURIComponent(signature(owned, 'write', 'user'))}`, {
    method: 'POST',
    headers: { ...noToken, authorization: rootBasic, 'content-type': 'application/octet-stream' },
    body: 'x',
  });
  assert.equal(write.status, 200, await write.clone().text());
  const stat = await openStream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', `stat -c %u ${owned}`] } });
  await stat.done;
  assert.notEqual(stat.output('stdout'), '0\n', 'the signed upload ran as root');
});

/** Runs `script` as root in the sandbox and returns its stdout; a non-zero exit fails the test. */
async function asRootSh(script: string): Promise<string> {
  const s = await openStream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', script] } }, { authorization: `Basic ${Buffer.from('root:').toString('base64')}` });
  await s.done;
  const end = s.frames.map((f) => f.message.event as { end?: { exitCode?: number } } | undefined).find((e) => e?.end !== undefined);
  assert.equal(end?.end?.exitCode ?? 0, 0, `${script}: ${s.output('stderr')}`);
  return s.output('stdout');
}

async function upload(query: string, body: string, extra: Record<string, string> = {}): Promise<{ status: number; paths: string[]; text: string }> {
  const res = await fetch(`${w.apiUrl}/files?${query}`, { method: 'POST', headers: { ...headers({ 'content-type': 'application/octet-stream' }), ...extra }, body });
  const text = await res.text();
  return { status: res.status, paths: res.status === 200 ? (JSON.parse(text) as { path: string }[]).map((p) => p.path) : [], text };
}

// Regression: relative paths were taken from /. envd takes them, and ~, from the home of the
// request's user: its Basic auth user, the `username` of /files, or the user a URL was signed for.
test('relative paths and ~ are the home of the request\'s user: Basic auth, /files username, the signed user (an added Basic root changes nothing)', async () => {
  const rootBasic = `Basic ${Buffer.from('root:').toString('base64')}`;
  const asUser = await upload('path=rel-home/a.txt', 'as user');
  assert.equal(asUser.status, 200, asUser.text);
  assert.deepEqual(asUser.paths, ['/home/user/rel-home/a.txt']);
  const asRoot = await upload('path=rel-home/a.txt&username=root', 'as root');
  assert.deepEqual(asRoot.paths, ['/root/rel-home/a.txt']);
  assert.equal(await asRootSh('cat /home/user/rel-home/a.txt; echo; cat /root/rel-home/a.txt'), 'as user\nas root');

  const stat = await unary<{ entry: { path: string } }>('filesystem.Filesystem/Stat', { path: '~/rel-home/a.txt' }, { authorization: rootBasic });
  assert.equal(stat.body.entry.path, '/root/rel-home/a.txt');
  const list = await unary<{ entries: { path: string }[] }>('filesystem.Filesystem/ListDir', { path: '' });
  assert.ok(list.body.entries.some((e) => e.path === '/home/user/rel-home'), 'an empty path lists the home');
  const other = await unary<{ code: string; message: string }>('filesystem.Filesystem/Stat', { path: '~root/rel-home/a.txt' });
  assert.equal(other.status, 400);
  assert.equal(other.body.code, 'invalid_argument');
  assert.match(other.body.message, /another user's home/);

  // Signed URLs: the home of the signed user; Basic root on a URL signed for no user is ignored.
  const noToken = { 'x-asb-sandbox-id': id };
  const rel = '~/rel-home/a.txt';
  const unsigned = await fetch(`${w.apiUrl}/files?path=${encodeURIComponent(rel)}&signature=${encodeURIComponent(signature(rel, 'read', ''))}`, { headers: { ...noToken, authorization: rootBasic } });
  assert.equal(await unsigned.text(), 'as user');
  const signedRoot = await fetch(`${w.apiUrl}/files?path=rel-home/a.txt&username=root&signature=${encodeURIComponent(signature('rel-home/a.txt', 'read', 'root'))}`, { headers: noToken });
  assert.equal(await signedRoot.text(), 'as root');

  // The process cwd too.
  const pwd = await openStream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', 'pwd'], cwd: '~/rel-home' } }, { authorization: rootBasic });
  await pwd.done;
  assert.equal(pwd.output('stdout'), '/root/rel-home\n');
});

test('a named user\'s home is its passwd entry in the sandbox; a home that climbs out stays inside the sandbox', async () => {
  const host = '/tmp/asb-issue15-mallory';
  await asRootSh([
    'echo "alice:x:1501:1501::/srv/alice:/bin/sh" >> /etc/passwd',
    'mkdir -p /srv/alice && chmod 777 /srv/alice',
    // A home written to leave the sandbox: ../ above / is / (the sandbox's), as for any path.
    `echo "mallory:x:1502:1502::../../../../../../..${host}:/bin/sh" >> /etc/passwd`,
    `mkdir -p ${host} && chmod 777 ${host}`,
  ].join(' && '));
  const alice = await upload('path=notes.txt&username=alice', 'alice');
  assert.equal(alice.status, 200, alice.text);
  assert.deepEqual(alice.paths, ['/srv/alice/notes.txt']);
  assert.equal(await asRootSh('stat -c %u /srv/alice/notes.txt'), '1501\n');
  const mallory = await upload('path=x.txt&username=mallory', 'inside');
  assert.deepEqual(mallory.paths, [`${host}/x.txt`]);
  assert.equal(await asRootSh(`cat ${host}/x.txt`), 'inside', 'in the sandbox\'s own /tmp');
  assert.equal(existsSync(`${host}/x.txt`), false, 'never on the host');
  const nobody = await upload('path=x.txt&username=nosuchuser', 'x');
  assert.equal(nobody.status, 400);
  assert.match((JSON.parse(nobody.text) as { message: string }).message, /no user "nosuchuser"/);
});

// What Node says when spawn is given a NUL byte or execve fails with E2BIG: never in an answer.
const NODE_MESSAGE = /null bytes|ERR_INVALID_ARG|E2BIG|spawn /;

test('security probe L2: REST exec with a NUL byte in any field, or an argument execve refuses, is 400 naming the field; nothing runs', async () => {
  const marker = '/tmp/l2-rest-ran';
  const run = ['/bin/sh', '-c', `touch ${marker}`];
  const cases: { name: string; body: Record<string, unknown>; field: string }[] = [
    { name: 'NUL in an argument', body: { command: [...run, 'a\0b'] }, field: 'command[3]' },
    { name: 'NUL in the program', body: { command: ['/bin/sh\0', '-c', `touch ${marker}`] }, field: 'command[0]' },
    { name: 'NUL in the string form', body: { command: `touch ${marker} a\0b` }, field: 'command' },
    { name: 'NUL in an env name', body: { command: run, env: { 'A\0B': 'x' } }, field: 'env.A\0B' },
    { name: 'NUL in an env value', body: { command: run, env: { A: 'x\0y' } }, field: 'env.A' },
    { name: 'NUL in cwd', body: { command: run, cwd: '/tmp\0/x' }, field: 'cwd' },
    // The probe's 900 KiB argument: one argv string over Linux's MAX_ARG_STRLEN (128 KiB) is E2BIG.
    { name: 'a 900 KiB argument', body: { command: [...run, 'x'.repeat(921_600)] }, field: 'command[3]' },
    { name: 'a 200 KiB env value', body: { command: run, env: { BIG: 'x'.repeat(200 * 1024) } }, field: 'env.BIG' },
  ];
  for (const c of cases) {
    const res = await api<{ code: string; detail: string; fields?: { field: string }[] }>(w, 'POST', `/v1/sandboxes/${id}/exec`, c.body);
    assert.equal(res.status, 400, `${c.name}: ${JSON.stringify(res.body).slice(0, 300)}`);
    assert.equal(res.body.code, 'BadRequest', c.name);
    assert.deepEqual(res.body.fields?.map((f) => f.field), [c.field], c.name);
    assert.doesNotMatch(res.body.detail, NODE_MESSAGE, c.name);
  }
  const check = await api<{ exitCode: number }>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['test', '-e', marker] });
  assert.equal(check.status, 200);
  assert.equal(check.body.exitCode, 1, 'a refused exec ran its command');
  // The limit is the kernel's own: an argument of exactly MAX_ARG_BYTES still runs.
  const longest = await api<{ stdout: string }>(w, 'POST', `/v1/sandboxes/${id}/exec`, { command: ['/bin/sh', '-c', 'echo ${#1}', 'sh', 'x'.repeat(MAX_ARG_BYTES)] });
  assert.equal(longest.status, 200, JSON.stringify(longest.body).slice(0, 300));
  assert.equal(longest.body.stdout, `${MAX_ARG_BYTES}\n`);
});

test('security probe L2: envd process.Start with a NUL byte in any field, or arguments execve refuses, is invalid_argument naming the field', async () => {
  const endError = async (message: unknown): Promise<{ code: string; message: string }> => {
    const s = await openStream('process.Process/Start', message);
    await s.done;
    const last = s.frames.at(-1);
    assert.equal(last?.flags, 2, 'an end-stream envelope');
    const error = last.message.error as { code: string; message: string } | undefined;
    assert.ok(error !== undefined, `an error in the end-stream: ${JSON.stringify(last.message).slice(0, 300)}`);
    assert.equal(s.output('stdout'), '', 'nothing ran');
    return error;
  };
  const sh = (args: string[], extra: Record<string, unknown> = {}): unknown => ({ process: { cmd: '/bin/sh', args: ['-c', 'echo ran', ...args], ...extra } });
  const cases: { name: string; message: unknown; field: string }[] = [
    { name: 'NUL in cmd', message: { process: { cmd: '/bin/s\0h', args: ['-c', 'echo ran'] } }, field: 'process.cmd' },
    { name: 'NUL in an argument', message: sh(['a\0b']), field: 'process.args[2]' },
    { name: 'NUL in an env name', message: sh([], { envs: { 'A\0B': 'x' } }), field: 'process.envs.A\0B' },
    { name: 'NUL in an env value', message: sh([], { envs: { A: 'x\0y' } }), field: 'process.envs.A' },
    { name: 'NUL in cwd', message: sh([], { cwd: '/tmp\0/x' }), field: 'process.cwd' },
    { name: 'NUL in a pty argument', message: { ...(sh(['a\0b']) as object), pty: { size: { cols: 80, rows: 24 } } }, field: 'process.args[2]' },
    { name: 'a 900 KiB argument', message: sh(['x'.repeat(921_600)]), field: 'process.args[2]' },
    // Each under MAX_ARG_STRLEN, 2.4 MB together: over ARG_MAX (2 MiB), E2BIG from execve.
    { name: '2.4 MB of arguments', message: sh(Array.from({ length: 20 }, () => 'y'.repeat(120 * 1024))), field: 'process.args' },
  ];
  for (const c of cases) {
    const error = await endError(c.message);
    assert.equal(error.code, 'invalid_argument', `${c.name}: ${error.message.slice(0, 300)}`);
    assert.ok(error.message.includes(`${c.field}:`), `${c.name} names ${c.field}: ${error.message.slice(0, 300)}`);
    assert.doesNotMatch(error.message, NODE_MESSAGE, c.name);
  }
});

test('a missing or wrong token is 401; an unknown sandbox gets E2B proxy\'s 502 "not found"', async () => {
  const none = await fetch(`${w.apiUrl}/process.Process/List`, { method: 'POST', headers: { 'x-asb-sandbox-id': id, 'content-type': 'application/json' }, body: '{}' });
  assert.equal(none.status, 401);
  assert.equal(((await none.json()) as { code: string }).code, 'unauthenticated');
  const wrong = await unary<{ code: string }>('process.Process/List', {}, { 'x-access-token': 'not-the-token' });
  assert.equal(wrong.status, 401);
  const files = await fetch(`${w.apiUrl}/files?path=/etc/hostname`, { headers: { 'x-asb-sandbox-id': id } });
  assert.equal(files.status, 401);
  assert.equal(((await files.json()) as { code: number }).code, 401);

  const unknown = await fetch(`${w.apiUrl}/process.Process/List`, { method: 'POST', headers: { 'x-asb-sandbox-id': 'envdnosuchsandbox000', 'x-access-token': token, 'content-type': 'application/json' }, body: '{}' });
  assert.equal(unknown.status, 502, 'what the SDKs read as SandboxNotFoundError');
  assert.deepEqual(await unknown.json(), { sandboxId: 'envdnosuchsandbox000', message: 'The sandbox was not found', code: 502 });
  const health = await fetch(`${w.apiUrl}/health`, { headers: { 'x-asb-sandbox-id': 'envdnosuchsandbox000' } });
  assert.equal(health.status, 502, 'isRunning() false');
});

/** One request through the edge Envoy with a chosen Host (fetch cannot set it). */
function viaEdge(edgeUrl: string, host: string, method: string, path: string, hdrs: Record<string, string>, body?: Buffer): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = request(`${edgeUrl}${path}`, { method, headers: { host, ...hdrs } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

function frames(body: Buffer): Frame[] {
  const out: Frame[] = [];
  for (let pos = 0; pos + 5 <= body.length && out.length < 10_000;) {
    const len = body.readUInt32BE(pos + 1);
    out.push({ flags: body.readUInt8(pos), message: JSON.parse(body.subarray(pos + 5, pos + 5 + len).toString('utf8')) as Record<string, unknown> });
    pos += 5 + len;
  }
  return out;
}

test('through the router and Envoy: 49983-<id>.<domain> and the E2B headers both reach envd on the worker', async (t) => {
  const system = await startTestSystem('envs', 244);
  t.after(() => system.cleanup());
  const created = await api<{ id: string; accessToken: string }>(system, 'POST', '/v1/sandboxes', { template: 'base', wait: true });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  const sb = created.body;
  const rpc = { 'x-access-token': sb.accessToken, 'connect-protocol-version': '1' };

  // Host routing, a server stream; a forged x-asb-sandbox-id is overwritten by the router.
  const start = await viaEdge(system.edgeUrl, `49983-${sb.id}.asb.localhost`, 'POST', '/process.Process/Start',
    { ...rpc, 'content-type': 'application/connect+json', 'x-asb-sandbox-id': 'somebody-else' }, envelope(bash('echo via-envoy; hostname')));
  assert.equal(start.status, 200, start.body.toString());
  const got = frames(start.body);
  assert.ok((got[0]?.message.event as Record<string, unknown> | undefined)?.start !== undefined);
  const stdout = got.map((f) => (f.message.event as { data?: { stdout?: string } } | undefined)?.data?.stdout).filter((d) => d !== undefined).map((d) => Buffer.from(d, 'base64').toString()).join('');
  assert.equal(stdout.split('\n')[0], 'via-envoy');
  assert.equal(got.at(-1)?.flags, 2);

  // E2B header routing (the SDK with E2B_SANDBOX_URL), unary and REST.
  const e2b = { 'e2b-sandbox-id': sb.id, 'e2b-sandbox-port': '49983' };
  const health = await viaEdge(system.edgeUrl, '127.0.0.1', 'GET', '/health', e2b);
  assert.equal(health.status, 204);
  const stat = await viaEdge(system.edgeUrl, '127.0.0.1', 'POST', '/filesystem.Filesystem/Stat', { ...rpc, ...e2b, 'content-type': 'application/json' }, Buffer.from(JSON.stringify({ path: '/tmp' })));
  assert.equal(stat.status, 200, stat.body.toString());
  assert.equal((JSON.parse(stat.body.toString()) as { entry: { type: string } }).entry.type, 'FILE_TYPE_DIRECTORY');
  const upload = await viaEdge(system.edgeUrl, '127.0.0.1', 'POST', '/files?path=/tmp/edge.txt', { ...e2b, 'x-access-token': sb.accessToken, 'content-type': 'application/octet-stream' }, Buffer.from('through envoy'));
  assert.equal(upload.status, 200, upload.body.toString());
  const download = await viaEdge(system.edgeUrl, '127.0.0.1', 'GET', '/files?path=/tmp/edge.txt', { ...e2b, 'x-access-token': sb.accessToken });
  assert.equal(download.body.toString(), 'through envoy');

  const noToken = await viaEdge(system.edgeUrl, `49983-${sb.id}.asb.localhost`, 'POST', '/process.Process/List', { 'content-type': 'application/json' }, Buffer.from('{}'));
  assert.equal(noToken.status, 401);
});

test('route entries: envd stays on the worker unless the pod template says its image runs envd (asb.dev/envd: pod)', () => {
  const tokens = createAccessTokens(randomBytes(32));
  const base = baseTemplate();
  assert.ok(base.spec.podTemplate.spec.containers[0]?.ports?.some((p) => p.containerPort === 49983), 'the base template declares the envd port');
  const plain = sandboxFromTemplate(base, { name: 'sbx-plain', namespace: 'default', labels: { [LABEL.owner]: 'team-a' } });
  plain.metadata.uid = 'uid-plain'; // as the store gives every object: tokens derive from it
  assert.equal(routeEntryOf(plain, 'c1', tokens)?.envdInPod, undefined);
  base.spec.podTemplate.metadata = { annotations: { [ENVD_ANNOTATION]: 'pod' } };
  const own = sandboxFromTemplate(base, { name: 'sbx-own', namespace: 'default', labels: { [LABEL.owner]: 'team-a' } });
  own.metadata.uid = 'uid-own';
  assert.equal(routeEntryOf(own, 'c1', tokens)?.envdInPod, true);
});
