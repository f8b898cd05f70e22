// The upload path without sockets or sandboxes: how much of a body it holds at once (the writer
// into the sandbox and the multipart parser, each against a slow consumer), that the incremental
// multipart parser finds the same parts wherever the chunks split, and the concurrency bounds.
import assert from 'node:assert/strict';
import { Readable, Writable } from 'node:stream';
import { test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { stageFile, writeFileFrom, type PodShell } from '../src/runtime/file-upload.ts';
import type { ExecRequest, ExecResult, PodProcess } from '../src/runtime/runtime.ts';
import { parseMultipart } from '../src/worker/envd/multipart.ts';
import { UploadSlots } from '../src/worker/upload-slots.ts';

const KiB = 1024;
const MiB = 1024 * KiB;
const CHUNK = 64 * KiB;

/** One turn of the event loop: lets streams move on, no timer. */
const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** A process whose stdin takes a chunk only when the test releases it: a sandbox that writes slowly. */
function slowProcess(): { proc: PodProcess; released: () => number; release: () => boolean; execs: ExecRequest[]; shell: PodShell } {
  const waiting: (() => void)[] = [];
  let released = 0;
  let finished!: () => void;
  const exited = new Promise<{ exitCode: number }>((resolve) => (finished = () => resolve({ exitCode: 0 })));
  const stdin = new Writable({
    highWaterMark: CHUNK,
    write: (chunk: Buffer, _enc, cb) => waiting.push(() => {
      released += chunk.length;
      cb();
    }),
    final: (cb) => {
      cb();
      stdout.push(`${released}\n`); // STAGE's last line: the size it received
      stdout.push(null);
      finished();
    },
  });
  const stdout = new Readable({ read: () => undefined });
  stdout.push('/up/.asb-upload-0123456789abcdef\0/up/file\0');
  const proc: PodProcess = {
    stdin,
    stdout,
    stderr: Readable.from([]),
    kill: () => undefined,
    exited,
  };
  const execs: ExecRequest[] = [];
  const ok: ExecResult = { exitCode: 0, stdout: new Uint8Array(), stderr: new Uint8Array(), timedOut: false, truncated: false };
  return {
    proc,
    released: () => released,
    release: () => {
      const next = waiting.shift();
      next?.();
      return next !== undefined;
    },
    execs,
    shell: { spawn: () => Promise.resolve(proc), exec: (req) => (execs.push(req), Promise.resolve(ok)) },
  };
}

test('stageFile holds at most ~3 chunks of a 16 MiB body when the sandbox takes it slowly: the producer waits for the pipe to drain', async () => {
  const slow = slowProcess();
  let produced = 0;
  let most = 0;
  async function* body(): AsyncGenerator<Uint8Array> {
    for (let i = 0; i < 256; i++) {
      await Promise.resolve();
      produced += CHUNK;
      most = Math.max(most, produced - slow.released());
      yield new Uint8Array(CHUNK);
    }
  }
  const staged = stageFile(slow.shell, '/up/file', body());
  const state = { done: false };
  void staged.then(() => (state.done = true), () => (state.done = true));
  for (let i = 0; i < 10_000 && !state.done; i++) {
    await turn();
    slow.release();
  }
  assert.deepEqual(await staged, { path: '/up/file', target: '/up/file', temp: '/up/.asb-upload-0123456789abcdef', size: 256 * CHUNK });
  assert.equal(slow.released(), 256 * CHUNK);
  // The pipe's high-water mark (one chunk), the chunk being written and the one just produced.
  assert.ok(most <= 3 * CHUNK, `the writer held ${most / KiB} KiB at once`);
});

test('stageFile: a body that fails half way removes the temporary file and throws the body\'s error', async () => {
  const slow = slowProcess();
  const gone = new Error('the client went away');
  async function* body(): AsyncGenerator<Uint8Array> {
    yield new Uint8Array(CHUNK);
    await Promise.resolve();
    throw gone;
  }
  const staged = stageFile(slow.shell, '/up/file', body());
  const state = { settled: false };
  void staged.catch(() => undefined).finally(() => (state.settled = true));
  for (let i = 0; i < 1000 && !state.settled; i++) {
    await turn();
    slow.release();
  }
  await assert.rejects(staged, (err) => err === gone);
  assert.deepEqual(slow.execs.map((e) => e.command.slice(-1)), [['/up/.asb-upload-0123456789abcdef']]);
  assert.match(slow.execs[0]?.command[2] ?? '', /rm -f/);
});

function form(boundary: string, parts: { headers: string; data: Buffer }[]): Buffer {
  const pieces: Buffer[] = [Buffer.from('preamble, ignored\r\n')];
  for (const part of parts) pieces.push(Buffer.from(`--${boundary}\r\n${part.headers}\r\n`), part.data, Buffer.from('\r\n'));
  pieces.push(Buffer.from(`--${boundary}--\r\nepilogue`));
  return Buffer.concat(pieces);
}

async function* split(body: Buffer, size: number): AsyncGenerator<Buffer> {
  for (let at = 0; at < body.length; at += size) {
    await Promise.resolve();
    yield body.subarray(at, at + size);
  }
}

async function collect(chunks: AsyncIterable<Buffer>, boundary: string): Promise<{ name: string | undefined; filename: string | undefined; data: string }[]> {
  const out = [];
  for await (const part of parseMultipart(chunks, boundary)) {
    const data: Buffer[] = [];
    for await (const chunk of part.data) data.push(chunk);
    out.push({ name: part.name, filename: part.filename, data: Buffer.concat(data).toString('latin1') });
  }
  return out;
}

test('multipart: the same parts whatever the chunk size, including data that nearly matches the delimiter', async () => {
  const boundary = 'XyZ-boundary';
  const tricky = Buffer.from(`almost\r\n--XyZ-bound\r\n--XyZ-boundar and \r\n-- end`);
  const body = form(boundary, [
    { headers: 'Content-Disposition: form-data; name="note"\r\n', data: Buffer.from('a field') },
    { headers: 'Content-Disposition: form-data; name="file"; filename="/tmp/a.txt"\r\nContent-Type: text/plain\r\n', data: tricky },
    { headers: '', data: Buffer.from('no headers at all') },
    { headers: 'Content-Disposition: form-data; name="file"; filename="/tmp/empty"\r\n', data: Buffer.alloc(0) },
  ]);
  const expected = [
    { name: 'note', filename: undefined, data: 'a field' },
    { name: 'file', filename: '/tmp/a.txt', data: tricky.toString('latin1') },
    { name: undefined, filename: undefined, data: 'no headers at all' },
    { name: 'file', filename: '/tmp/empty', data: '' },
  ];
  for (let size = 1; size <= body.length; size++) assert.deepEqual(await collect(split(body, size), boundary), expected, `chunks of ${size} bytes`);
});

test('multipart: a 16 MiB part is passed on as it arrives; the parser holds one chunk and a delimiter\'s length', async () => {
  const boundary = 'b0undary';
  const size = 16 * 1024 * KiB;
  const head = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="/big"\r\n\r\n`);
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  let pulled = 0;
  let taken = 0;
  let most = 0;
  async function* body(): AsyncGenerator<Buffer> {
    yield head;
    for (let sent = 0; sent < size; sent += CHUNK) {
      await Promise.resolve();
      pulled += CHUNK;
      yield Buffer.alloc(CHUNK, 7);
    }
    yield tail;
  }
  for await (const part of parseMultipart(body(), boundary)) {
    for await (const chunk of part.data) {
      taken += chunk.length;
      most = Math.max(most, pulled - taken);
    }
  }
  assert.equal(taken, size);
  assert.ok(most <= CHUNK + boundary.length + 4, `the parser held ${most} bytes at once`);
});

test('multipart: malformed bodies are 400 naming what is wrong; a part\'s unread data is skipped, not kept', async () => {
  const cases: [string, string][] = [
    ['no delimiter at all', 'no --b delimiter'],
    ['--b\r\nContent-Disposition: form-data; name="x"\r\n\r\nnever closed', 'not closed by a delimiter'],
    [`--b\r\n${'X-Long: y\r\n'.repeat(2000)}\r\ndata\r\n--b--`, 'no blank line after its headers'],
    ['--b', 'ends right after a delimiter'],
  ];
  for (const [text, message] of cases) {
    await assert.rejects(collect(split(Buffer.from(text), 7), 'b'), (err) => isAsbError(err, 'BadRequest') && err.message.includes(message), message);
  }
  const body = form('b', [
    { headers: 'Content-Disposition: form-data; name="skip"\r\n', data: Buffer.alloc(300 * KiB, 1) },
    { headers: 'Content-Disposition: form-data; name="read"\r\n', data: Buffer.from('read me') },
  ]);
  const names = [];
  for await (const part of parseMultipart(split(body, 1000), 'b')) {
    names.push(part.name);
    if (part.name === 'read') for await (const chunk of part.data) assert.equal(chunk.toString(), 'read me');
  }
  assert.deepEqual(names, ['skip', 'read']);
});

test('upload slots: at most perKey per key and total in all; a refusal names its bound; release is idempotent', () => {
  const slots = new UploadSlots({ perKey: 2, total: 3 });
  const a1 = slots.admit('a');
  assert.ok(a1.kind === 'admitted');
  assert.equal(slots.admit('a').kind, 'admitted');
  assert.deepEqual(slots.admit('a'), { kind: 'refused', scope: 'key', limit: 2 });
  const b1 = slots.admit('b');
  assert.equal(b1.kind, 'admitted');
  assert.deepEqual(slots.admit('c'), { kind: 'refused', scope: 'worker', limit: 3 });
  a1.release();
  a1.release();
  assert.equal(slots.inFlight('a'), 1);
  assert.equal(slots.inFlight(), 2);
  assert.equal(slots.admit('c').kind, 'admitted');
});

test('upload slots: run() answers TooManyRequests with Retry-After and frees the slot when the upload fails', async () => {
  const slots = new UploadSlots({ perKey: 1, total: 10 });
  let finish!: () => void;
  const first = slots.run('k', 'API key k', () => new Promise<void>((resolve) => (finish = resolve)));
  await assert.rejects(slots.run('k', 'API key k', () => Promise.resolve()), (err) => isAsbError(err, 'TooManyRequests') && err.retryAfterS === 1 && err.message.includes('API key k already has 1 uploads in flight'));
  finish();
  await first;
  await assert.rejects(slots.run('k', 'API key k', () => Promise.reject(new Error('write failed'))), /write failed/);
  assert.equal(slots.inFlight('k'), 0);
});

test('a small write refused before the script named its temporary file says why, once, naming the path (regression: the message was garbled)', async () => {
  const denied = "mkdir: cannot create directory '/root/x': Permission denied\n";
  const shell: PodShell = {
    exec: () => Promise.resolve({ exitCode: 1, stdout: new Uint8Array(), stderr: Buffer.from(denied), timedOut: false, truncated: false }),
    spawn: () => Promise.reject(new Error('not used for a small body')),
  };
  await assert.rejects(writeFileFrom(shell, '/root/x/a.txt', Buffer.from('x')), (err) => {
    assert.ok(isAsbError(err, 'Forbidden'), String(err));
    assert.equal(err.message, `write /root/x/a.txt: ${denied.trim()}`);
    return true;
  });
});

/**
 * A sandbox that takes every write at once but whose `cat` saw end-of-file early: what containerd
 * did to a runc Pod's exec when the staging command's stdout closed (`exec cat > file`): 163 840
 * of 1 MiB arrived and `cat` exited 0.
 */
function cutShort(kept: number): { shell: PodShell; execs: ExecRequest[] } {
  const stdout = new Readable({ read: () => undefined });
  stdout.push('/up/.asb-upload-0123456789abcdef\0/up/file\0');
  let finish!: () => void;
  const exited = new Promise<{ exitCode: number }>((resolve) => (finish = () => resolve({ exitCode: 0 })));
  const stdin = new Writable({
    write: (_chunk: Buffer, _enc, cb) => cb(),
    final: (cb) => {
      cb();
      stdout.push(`${kept}\n`);
      stdout.push(null);
      finish();
    },
  });
  const proc: PodProcess = { stdin, stdout, stderr: Readable.from([]), kill: () => undefined, exited };
  const execs: ExecRequest[] = [];
  const ok: ExecResult = { exitCode: 0, stdout: new Uint8Array(), stderr: new Uint8Array(), timedOut: false, truncated: false };
  return { shell: { spawn: () => Promise.resolve(proc), exec: (req) => (execs.push(req), Promise.resolve(ok)) }, execs };
}

async function* chunks(count: number, size: number): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < count; i++) {
    await Promise.resolve(); // a stream: each chunk on its own turn
    yield new Uint8Array(size);
  }
}

test('stageFile: a sandbox that received fewer bytes than were sent is a failed write (Unavailable), its temporary file removed, never a success', async () => {
  const short = cutShort(160 * KiB);
  await assert.rejects(stageFile(short.shell, '/up/file', chunks(64, 16 * KiB)), (err) => isAsbError(err) && err.code === 'Unavailable' && /received 163840 of 1048576 bytes/.test(err.message));
  assert.deepEqual(short.execs.map((e) => e.command.slice(-1)), [['/up/.asb-upload-0123456789abcdef']]);
  assert.match(short.execs[0]?.command[2] ?? '', /rm -f/);
});

test('writeFileFrom commits a staged file only at the size that was sent: the commit refuses a temporary file of another size', async () => {
  const short = cutShort(MiB);
  await writeFileFrom(short.shell, '/up/file', chunks(64, 16 * KiB));
  const commit = short.execs.at(-1);
  assert.ok(commit !== undefined, 'the commit ran');
  assert.deepEqual(commit.command.slice(-4), ['/up/.asb-upload-0123456789abcdef', '/up/file', '', String(MiB)]);
  assert.match(commit.command[2] ?? '', /wc -c < "\$t"/);
});
