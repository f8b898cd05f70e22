// Uploads stream into the sandbox: a real worker process with real sandboxes, uploads through
// envd's POST /files and the REST PUT /v1/sandboxes/{id}/files.
// - The worker holds no upload whole: 8 concurrent 60 MiB uploads grew a buffering worker's peak
//   RSS by over 1 GB; streamed, the peak grows by the garbage between two collections (~75 MiB).
// - Uploads at once are bounded per key: the 9th from one sandbox token (or API key) is 429 with
//   Retry-After, while another key is still served.
// - The size limit holds while streaming (raw and inflated bytes): 413, and no file or temporary
//   file is left; an upload that fails or is aborted leaves the old file as it was.
// Its own tag, bridge and subnet (10.197/16), so other test files never collide.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { request, type IncomingHttpHeaders } from 'node:http';
import { after, before, test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { OpenApiChecker } from './support/openapi-check.ts';
import { api, removeDataDir, startWorkerProcess, type ExecOut, type WorkerProcess } from './support/worker-process.ts';
import { waitFor } from './support/wait.ts';

const MiB = 1024 * 1024;
/** The worker's default upload limit (DEFAULT_UPLOAD_LIMIT_BYTES). */
const LIMIT = 64 * MiB;
/** The worker's default bound per key (DEFAULT_UPLOADS_PER_KEY). */
const PER_KEY = 8;

const openapi = new OpenApiChecker(new URL('../docs/openapi.yaml', import.meta.url).pathname);
let w: WorkerProcess;
const sandboxes: { id: string; token: string }[] = [];

before(async () => {
  w = await startWorkerProcess({ clusterTag: 'upld', subnetOctet: 197, basePool: 2 });
  for (let i = 0; i < 2; i++) {
    const created = await api<{ id: string; accessToken: string }>(w, 'POST', '/v1/sandboxes', { template: 'base', wait: true });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    sandboxes.push({ id: created.body.id, token: created.body.accessToken });
  }
});

after(async () => {
  await w.stop();
  removeDataDir(w.dataDir);
});

function sandbox(i: number): { id: string; token: string } {
  const s = sandboxes[i];
  assert.ok(s !== undefined);
  return s;
}

function envdHeaders(i: number, extra: Record<string, string> = {}): Record<string, string> {
  const s = sandbox(i);
  return { 'x-asb-sandbox-id': s.id, 'x-access-token': s.token, ...extra };
}

async function sh(i: number, command: string): Promise<ExecOut> {
  const res = await api<ExecOut>(w, 'POST', `/v1/sandboxes/${sandbox(i).id}/exec`, { command });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body;
}

/** Names in a sandbox directory, dot files included ('' when it does not exist). */
async function names(i: number, dir: string): Promise<string[]> {
  const out = await sh(i, `ls -A ${dir} 2>/dev/null || true`);
  return out.stdout.split('\n').filter((n) => n !== '');
}

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** An upload whose body the test sends when it likes: `send` writes, `finish` ends and resolves with the answer. */
interface OpenUpload {
  send(chunk: Buffer): Promise<void>;
  finish(): Promise<Answer>;
  abort(): void;
  /** Resolves with the answer if the server answers before the body is done. */
  answered: Promise<Answer>;
}

function openUpload(url: string, method: string, headers: Record<string, string>): OpenUpload {
  const req = request(url, { method, headers, agent: false });
  const answered = new Promise<Answer>((resolve, reject) => {
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
  answered.catch(() => undefined); // an aborted upload's answer is never read
  return {
    send: (chunk) => new Promise((resolve, reject) => req.write(chunk, (err) => (err ? reject(err) : resolve()))),
    finish: () => {
      req.end();
      return answered;
    },
    abort: () => req.destroy(),
    answered,
  };
}

/** `size` bytes made of one random MiB repeated (so the test holds 1 MiB, not the upload), with its sha256. */
function repeated(size: number): { block: Buffer; sha256: string } {
  const block = randomBytes(MiB);
  const hash = createHash('sha256');
  for (let sent = 0; sent < size; sent += MiB) hash.update(block.subarray(0, Math.min(MiB, size - sent)));
  return { block, sha256: hash.digest('hex') };
}

async function sendRepeated(upload: OpenUpload, block: Buffer, size: number): Promise<void> {
  for (let sent = 0; sent < size; sent += MiB) await upload.send(block.subarray(0, Math.min(MiB, size - sent)));
}

/** The worker's resident set now and its peak since the last reset (VmRSS, VmHWM), in bytes. */
function memoryOf(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string): number => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kb('VmRSS'), peak: kb('VmHWM') };
}

test('8 concurrent 60 MiB uploads: the worker streams them, its peak RSS grows by less than 160 MiB (a buffering worker: > 480 MiB)', async (t) => {
  const pid = w.proc.pid;
  assert.ok(pid !== undefined);
  const size = 60 * MiB;
  const { block, sha256 } = repeated(size);
  await sh(0, 'mkdir -p /tmp/big');
  // "5" resets the peak (VmHWM) to the current RSS: the peak read afterwards is this test's.
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
  const before = memoryOf(pid);
  const answers = await Promise.all(Array.from({ length: 8 }, async (_, n) => {
    const upload = openUpload(`${w.apiUrl}/files?path=/tmp/big/up${n}`, 'POST', envdHeaders(0, { 'content-type': 'application/octet-stream', 'content-length': String(size) }));
    await sendRepeated(upload, block, size);
    return upload.finish();
  }));
  const during = memoryOf(pid);
  for (const answer of answers) assert.equal(answer.status, 200, answer.body);
  const growth = during.peak - before.rss;
  t.diagnostic(`worker RSS ${(before.rss / MiB).toFixed(0)} MiB before, peak ${(during.peak / MiB).toFixed(0)} MiB during 8 × 60 MiB uploads`);
  // Streamed, the growth is garbage between collections (V8 collects after ~64 MiB of new
  // external buffers: socket reads passed on and dropped), ~75 MiB whatever the uploads' size; a
  // worker that held the bodies would need their 480 MiB.
  assert.ok(growth < 160 * MiB, `the worker's peak RSS grew by ${(growth / MiB).toFixed(0)} MiB (from ${(before.rss / MiB).toFixed(0)} MiB) during 8 × 60 MiB uploads`);
  // Every byte arrived, in order.
  const sums = await sh(0, 'cd /tmp/big && sha256sum up0 up7 && ls -A');
  assert.match(sums.stdout, new RegExp(`^${sha256}  up0\n${sha256}  up7\n`));
  assert.deepEqual(sums.stdout.split('\n').slice(2).filter((n) => n !== ''), ['up0', 'up1', 'up2', 'up3', 'up4', 'up5', 'up6', 'up7']);
  await sh(0, 'rm -rf /tmp/big');
});

const FIRST_BYTES = 300 * 1024;

/**
 * Opens PER_KEY uploads that stay in flight, and waits (10 s at most) until the worker has staged
 * each: its temporary file exists, so its slot is held. A worker that buffers bodies stages
 * nothing before a body ends; the test then goes on and finds the next upload served, not refused.
 */
async function fillSlots(url: (n: number) => string, method: string, headers: Record<string, string>, dir: string): Promise<OpenUpload[]> {
  const open = Array.from({ length: PER_KEY }, (_, n) => openUpload(url(n), method, { ...headers, 'content-length': String(MiB) }));
  // Past the 256 KiB a worker reads before it decides to stage (WHOLE_BODY_BYTES).
  for (const upload of open) await upload.send(Buffer.alloc(FIRST_BYTES, 1));
  const staged = async (): Promise<true | undefined> => ((await names(0, dir)).filter((n) => n.startsWith('.asb-upload-')).length === PER_KEY ? true : undefined);
  await waitFor(`${PER_KEY} uploads staged in ${dir}`, staged, 10_000).catch(() => undefined);
  return open;
}

/** A whole upload at once. */
async function upload(url: string, method: string, headers: Record<string, string>, body: Buffer): Promise<Answer> {
  const u = openUpload(url, method, { ...headers, 'content-length': String(body.length) });
  await u.send(body);
  return u.finish();
}

/** Sends the rest of each open upload and checks it was written. */
async function drain(open: OpenUpload[]): Promise<void> {
  for (const u of open) await u.send(Buffer.alloc(MiB - FIRST_BYTES, 1));
  for (const answer of await Promise.all(open.map((u) => u.finish()))) assert.ok(answer.status === 200 || answer.status === 204, answer.body);
}

test(`envd /files: the ${PER_KEY + 1}th concurrent upload with one sandbox's token is 429 with Retry-After; another sandbox's is served; a slot frees when an upload ends`, async () => {
  await sh(0, 'mkdir -p /tmp/slots');
  const headers = envdHeaders(0, { 'content-type': 'application/octet-stream' });
  const open = await fillSlots((n) => `${w.apiUrl}/files?path=/tmp/slots/f${n}`, 'POST', headers, '/tmp/slots');
  const extra = Buffer.from('one more');
  const refused = await upload(`${w.apiUrl}/files?path=/tmp/slots/extra`, 'POST', headers, extra);
  assert.equal(refused.status, 429, refused.body);
  assert.equal(refused.headers['retry-after'], '1');
  assert.match((JSON.parse(refused.body) as { message: string }).message, /already has 8 uploads in flight/);
  // Another sandbox's token is another key.
  const other = await upload(`${w.apiUrl}/files?path=/tmp/other.txt`, 'POST', envdHeaders(1, { 'content-type': 'application/octet-stream' }), extra);
  assert.equal(other.status, 200, other.body);
  await drain(open);
  const again = await upload(`${w.apiUrl}/files?path=/tmp/slots/extra`, 'POST', headers, extra);
  assert.equal(again.status, 200, again.body);
  assert.deepEqual((await names(0, '/tmp/slots')).sort(), ['extra', 'f0', 'f1', 'f2', 'f3', 'f4', 'f5', 'f6', 'f7']);
  await sh(0, 'rm -rf /tmp/slots');
});

test(`PUT /v1/sandboxes/{id}/files: the ${PER_KEY + 1}th concurrent upload with one API key is 429 with Retry-After`, async () => {
  await sh(0, 'mkdir -p /tmp/rest-slots');
  const headers = { authorization: `Bearer ${w.adminKey}`, 'content-type': 'application/octet-stream' };
  const url = (path: string): string => `${w.apiUrl}/v1/sandboxes/${sandbox(0).id}/files?path=${encodeURIComponent(path)}`;
  const open = await fillSlots((n) => url(`/tmp/rest-slots/f${n}`), 'PUT', headers, '/tmp/rest-slots');
  const refused = await upload(url('/tmp/rest-slots/extra'), 'PUT', headers, Buffer.from('x'));
  assert.equal(refused.status, 429, refused.body);
  assert.equal(refused.headers['retry-after'], '1');
  assert.equal((JSON.parse(refused.body) as { code: string }).code, 'TooManyRequests');
  // As docs/openapi.yaml says (the Problem schema, with TooManyRequests among its codes).
  const bytes = Buffer.from(refused.body);
  const headersOf = new Headers(Object.entries(refused.headers).flatMap(([k, v]) => (typeof v === 'string' ? [[k, v] as [string, string]] : [])));
  openapi.check('PUT', new URL(url('/tmp/rest-slots/extra')).pathname + '?path=x', { status: refused.status, headers: headersOf, json: JSON.parse(refused.body), text: refused.body, bytes });
  await drain(open);
  assert.equal((await upload(url('/tmp/rest-slots/extra'), 'PUT', headers, Buffer.from('x'))).status, 204);
  await sh(0, 'rm -rf /tmp/rest-slots');
});

test('the limit holds while streaming: 413 for a chunked body past 64 MiB and for a gzip that inflates past it; the old file stays, no temporary file is left', async () => {
  await sh(0, 'mkdir -p /tmp/limit && printf old > /tmp/limit/kept');
  const headers = envdHeaders(0, { 'content-type': 'application/octet-stream' });
  // No Content-Length (chunked): refused only once the limit is passed, while streaming.
  const chunked = openUpload(`${w.apiUrl}/files?path=/tmp/limit/kept`, 'POST', headers);
  const { block } = repeated(MiB);
  await sendRepeated(chunked, block, LIMIT + MiB);
  const tooBig = await chunked.finish();
  assert.equal(tooBig.status, 413, tooBig.body);
  assert.match(tooBig.body, /larger than the limit of 67108864 bytes/);
  // 65 MiB of zeros is a 65 KiB gzip: the limit is on what it inflates to.
  const bomb = gzipSync(Buffer.alloc(LIMIT + MiB));
  const inflated = await upload(`${w.apiUrl}/files?path=/tmp/limit/kept`, 'POST', { ...headers, 'content-encoding': 'gzip' }, bomb);
  assert.equal(inflated.status, 413, inflated.body);
  assert.match(inflated.body, /inflated request body is larger than the limit/);
  // The REST route too.
  const rest = openUpload(`${w.apiUrl}/v1/sandboxes/${sandbox(0).id}/files?path=/tmp/limit/kept`, 'PUT', { authorization: `Bearer ${w.adminKey}`, 'content-type': 'application/octet-stream' });
  await sendRepeated(rest, block, LIMIT + MiB);
  assert.equal((await rest.finish()).status, 413);
  assert.deepEqual(await names(0, '/tmp/limit'), ['kept']);
  assert.equal((await sh(0, 'cat /tmp/limit/kept')).stdout, 'old');
  await sh(0, 'rm -rf /tmp/limit');
});

test('a multipart upload is all or nothing: a second file for a single ?path= is 400 and the first is not written; a client that aborts leaves no file', async () => {
  await sh(0, 'mkdir -p /tmp/multi');
  const form = new FormData();
  form.append('file', new Blob(['first']), 'a.txt');
  form.append('file', new Blob(['second']), 'b.txt');
  const res = await fetch(`${w.apiUrl}/files?path=/tmp/multi/one.txt`, { method: 'POST', headers: envdHeaders(0), body: form });
  assert.equal(res.status, 400);
  assert.match(((await res.json()) as { message: string }).message, /names one file but the body holds more than one/);
  // Refused while the body still streams in: the 400 comes at once, not after the 32 MiB (the
  // server may then close the connection rather than read the rest).
  const early = openUpload(`${w.apiUrl}/files?path=/tmp/multi/one.txt`, 'POST', envdHeaders(0, { 'content-type': 'multipart/form-data; boundary=bnd' }));
  const part = (name: string): string => `--bnd\r\nContent-Disposition: form-data; name="file"; filename="${name}"\r\n\r\n`;
  const sending = (async () => {
    await early.send(Buffer.from(`${part('a')}first\r\n${part('b')}`));
    await sendRepeated(early, randomBytes(MiB), 32 * MiB);
  })().catch(() => undefined);
  assert.equal((await early.answered).status, 400);
  early.abort();
  await sending;
  // Streamed parts: a 3 MiB part arrives intact, split across many chunks.
  const big = randomBytes(3 * MiB);
  const multi = new FormData();
  multi.append('note', 'a plain field, skipped');
  multi.append('file', new Blob([big]), '/tmp/multi/big.bin');
  multi.append('file', new Blob(['small']), '/tmp/multi/small.txt');
  const ok = await fetch(`${w.apiUrl}/files`, { method: 'POST', headers: envdHeaders(0), body: multi });
  assert.equal(ok.status, 200, await ok.clone().text());
  assert.deepEqual(await ok.json(), [
    { path: '/tmp/multi/big.bin', name: 'big.bin', type: 'file' },
    { path: '/tmp/multi/small.txt', name: 'small.txt', type: 'file' },
  ]);
  assert.equal((await sh(0, 'sha256sum < /tmp/multi/big.bin')).stdout.split(' ')[0], createHash('sha256').update(big).digest('hex'));
  // An upload the client gives up half way: its temporary file is removed, nothing is written.
  const aborted = openUpload(`${w.apiUrl}/files?path=/tmp/multi/aborted.bin`, 'POST', envdHeaders(0, { 'content-type': 'application/octet-stream', 'content-length': String(4 * MiB) }));
  await aborted.send(randomBytes(MiB));
  await waitFor('the aborted upload to be staged', async () => ((await names(0, '/tmp/multi')).some((n) => n.startsWith('.asb-upload-')) ? true : undefined), 20_000);
  aborted.abort();
  await waitFor('the aborted upload\'s temporary file to go', async () => ((await names(0, '/tmp/multi')).some((n) => n.startsWith('.asb-upload-')) ? undefined : true), 20_000);
  assert.deepEqual((await names(0, '/tmp/multi')).sort(), ['big.bin', 'small.txt']);
  await sh(0, 'rm -rf /tmp/multi');
});

test('a write replaces the file only at the end, keeping its mode; through a symlink it writes the file linked to', async () => {
  await sh(0, 'mkdir -p /tmp/modes && printf old > /tmp/modes/script && chmod 750 /tmp/modes/script && ln -s script /tmp/modes/link');
  // A small body is written by one command, a large one staged and committed: both the same way.
  for (const body of [Buffer.from('new'), Buffer.alloc(300 * 1024, 'n')]) {
    const answer = await upload(`${w.apiUrl}/files?path=/tmp/modes/link`, 'POST', envdHeaders(0, { 'content-type': 'application/octet-stream' }), body);
    assert.equal(answer.status, 200, answer.body);
    const out = await sh(0, 'cd /tmp/modes && stat -c "%a %F %s" script && readlink link && head -c 3 script && ls -A');
    assert.equal(out.stdout, `750 regular file ${body.length}\nscript\nnnnlink\nscript\n`.replace('nnn', body.subarray(0, 3).toString()));
  }
  await sh(0, 'rm -rf /tmp/modes');
});
