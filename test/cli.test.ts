// The asb CLI, run as a user runs it: a child process with ASB_API_URL/ASB_API_KEY set, checked
// on its exit code, stdout and stderr. Pure pieces (durations, env files, tables) are checked
// in-process.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseDuration, ValueError } from '../src/cli/args.ts';
import { parseEnvFile, resolveClientConfig } from '../src/cli/env-file.ts';
import { formatAge, formatTable } from '../src/cli/output.ts';
import { sandboxTable } from '../src/cli/commands-sandbox.ts';
import { Spinner } from '../src/cli/progress.ts';
import { ApiError, createApiClient } from '../src/client/api-client.ts';
import type { Clock } from '../src/base/clock.ts';
import { freePort } from '../src/assembly/local-system.ts';
import { emptyDir, runAsb, type RunResult } from './support/run-asb.ts';
import { removeDataDir, startWorkerProcess } from './support/worker-process.ts';

const ASB = join(import.meta.dirname, '..', 'src', 'cli', 'asb.ts');

const asb = runAsb;

/** A port nothing listens on: bind one, then close it. */
type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

/** A stand-in worker for client-side error paths; the real worker is exercised end to end below. */
async function stubServer(t: { after(fn: () => Promise<void>): void }, handler: Handler): Promise<{ url: string; requests: { method: string; url: string; auth: string; body: string }[] }> {
  const requests: { method: string; url: string; auth: string; body: string }[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8').on('data', (d: string) => (body += d));
    req.on('end', () => {
      requests.push({ method: req.method ?? '', url: req.url ?? '', auth: req.headers.authorization ?? '', body });
      handler(req, res, body);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => new Promise<void>((r) => server.close(() => r())));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, requests };
}

function problem(res: ServerResponse, status: number, body: Record<string, unknown>): void {
  res.writeHead(status, { 'content-type': 'application/problem+json' }).end(JSON.stringify(body));
}

test('--help lists every command and exits 0; a command --help shows its usage', async () => {
  const top = await asb(['--help']);
  assert.equal(top.code, 0);
  for (const cmd of ['up', 'apply', 'create', 'ls', 'exec', 'pause', 'resume', 'rm', 'status', 'get', 'files', 'snapshot', 'fork']) {
    assert.match(top.stdout, new RegExp(`^  ${cmd}\\s`, 'm'), `asb --help lists ${cmd}`);
  }
  const exec = await asb(['exec', '--help']);
  assert.equal(exec.code, 0);
  assert.match(exec.stdout, /Usage: asb exec <id>/);
});

test('an unknown command or flag is a usage error: exit 2 with the usage line', async () => {
  const cmd = await asb(['frobnicate']);
  assert.equal(cmd.code, 2);
  assert.match(cmd.stderr, /unknown command "frobnicate"/);
  assert.match(cmd.stderr, /usage: asb <command>/);

  const flag = await asb(['ls', '--colour']);
  assert.equal(flag.code, 2);
  assert.match(flag.stderr, /unknown flag '--colour'/);
  assert.match(flag.stderr, /usage: asb ls/);
});

test('a duration without a unit is refused with an example of the right form', async () => {
  const r = await asb(['create', '--timeout', '10', '--url', 'http://127.0.0.1:9']);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--timeout: "10" has no unit/);
  assert.match(r.stderr, /e\.g\. 30s, 10m, 1h/);
});

test('parseDuration reads s, m, h, ms, d and combinations, and refuses junk', () => {
  assert.equal(parseDuration('30s', '--t'), 30_000);
  assert.equal(parseDuration('10m', '--t'), 600_000);
  assert.equal(parseDuration('1h', '--t'), 3_600_000);
  assert.equal(parseDuration('1h30m', '--t'), 5_400_000);
  assert.equal(parseDuration('250ms', '--t'), 250);
  assert.equal(parseDuration('1.5s', '--t'), 1500);
  assert.equal(parseDuration('2d', '--t'), 172_800_000);
  for (const bad of ['', '10', 'ten minutes', '5 m', '1x', '1h junk']) {
    assert.throws(() => parseDuration(bad, '--t'), ValueError, `"${bad}" is refused`);
  }
});

test('connection refused says the worker cannot be reached and asks whether make up runs', async () => {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const r = await asb(['ls'], { env: { ASB_API_URL: url, ASB_API_KEY: 'k' } });
  assert.equal(r.code, 1);
  assert.match(r.stderr, new RegExp(`cannot reach the worker at ${url}: is \`make up\` running\\?`));
});

test('with no URL anywhere the CLI says how to get one', async () => {
  const r = await asb(['ls']);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /no worker URL/);
  assert.match(r.stderr, /make up/);
});

test('env file: sourceable lines parse; flags beat env vars, env vars beat the file', () => {
  const parsed = parseEnvFile('# made by make up\nASB_API_URL=http://127.0.0.1:7080\nexport ASB_API_KEY="asb_abc_def"\nASB_CLUSTER=local # comment\n\nnot a line\n');
  assert.deepEqual(parsed, { ASB_API_URL: 'http://127.0.0.1:7080', ASB_API_KEY: 'asb_abc_def', ASB_CLUSTER: 'local' });

  const dir = emptyDir();
  mkdirSync(join(dir, '.asb'));
  writeFileSync(join(dir, '.asb', 'env'), 'ASB_API_URL=http://file:1\nASB_API_KEY=filekey\n');
  const sub = join(dir, 'deep', 'er');
  mkdirSync(sub, { recursive: true });
  const noRepo = emptyDir();

  const fromFile = resolveClientConfig({ flags: {}, env: {}, cwd: sub, repoRoot: noRepo });
  assert.deepEqual(fromFile, { url: 'http://file:1', key: 'filekey', envFile: join(dir, '.asb', 'env') });

  const fromEnv = resolveClientConfig({ flags: {}, env: { ASB_API_URL: 'http://env:2' }, cwd: sub, repoRoot: noRepo });
  assert.equal(fromEnv.url, 'http://env:2');
  assert.equal(fromEnv.key, 'filekey', 'a key only in the file still applies');

  const fromFlags = resolveClientConfig({ flags: { url: 'http://flag:3', key: 'flagkey' }, env: { ASB_API_URL: 'http://env:2', ASB_API_KEY: 'envkey' }, cwd: sub, repoRoot: noRepo });
  assert.deepEqual([fromFlags.url, fromFlags.key], ['http://flag:3', 'flagkey']);

  const other = join(emptyDir(), 'my.env');
  writeFileSync(other, "ASB_API_URL='http://other:4'\n");
  assert.equal(resolveClientConfig({ flags: { envFile: other }, env: {}, cwd: sub, repoRoot: noRepo }).url, 'http://other:4');
  assert.throws(() => resolveClientConfig({ flags: { envFile: join(noRepo, 'missing') }, env: {}, cwd: sub, repoRoot: noRepo }), /no such file/);
});

test('the CLI reads .asb/env from the working directory and sends the key from it', async (t) => {
  const stub = await stubServer(t, (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"items":[]}'));
  const dir = emptyDir();
  mkdirSync(join(dir, '.asb'));
  writeFileSync(join(dir, '.asb', 'env'), `ASB_API_URL=${stub.url}\nASB_API_KEY=asb_test1234_secret\n`);
  // No ASB_STATE_DIR here: the lookup walks up from the working directory.
  const r = await new Promise<RunResult>((resolve, reject) => {
    const child = spawn(process.execPath, [ASB, 'ls', '--json'], { cwd: dir, env: { PATH: process.env.PATH ?? '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), { items: [] });
  assert.equal(stub.requests[0]?.auth, 'Bearer asb_test1234_secret');
});

test('an API problem prints error: <detail> and one line per field, exit 1', async (t) => {
  const stub = await stubServer(t, (_req, res) =>
    problem(res, 422, { type: 'about:blank', title: 'Invalid object', status: 422, code: 'Invalid', detail: 'sandbox request is invalid', fields: [{ field: 'template', message: 'no template named "nope"' }] }),
  );
  const r = await asb(['create', '--template', 'nope', '--no-wait'], { env: { ASB_API_URL: stub.url, ASB_API_KEY: 'k' } });
  assert.equal(r.code, 1);
  assert.equal(r.stderr, 'error: sandbox request is invalid\n  template: no template named "nope"\n');
  assert.deepEqual(JSON.parse(stub.requests[0]?.body ?? ''), { template: 'nope', wait: false, coldStart: true });
});

test('the API client throws a coded ApiError carrying the server code, detail and fields', async (t) => {
  const stub = await stubServer(t, (_req, res) => problem(res, 404, { code: 'NotFound', detail: 'sandbox "x" not found', status: 404, title: 'Not found' }));
  const client = createApiClient({ url: stub.url, key: 'k' });
  await assert.rejects(client.getSandbox('x'), (err: unknown) => {
    assert.ok(err instanceof ApiError);
    assert.equal(err.code, 'NotFound');
    assert.equal(err.httpStatus, 404);
    assert.equal(err.detail, 'sandbox "x" not found');
    assert.deepEqual(err.fields, []);
    return true;
  });
});

test('ls prints the table columns users scan: ID, TEMPLATE, PHASE, READY, MEMORY (kept by a hibernated one or not), AGE, OWNER, and REASON for a failed one', () => {
  const now = Date.parse('2025-01-01T01:00:00Z');
  const table = sandboxTable(
    [
      { id: 'loc1aaaa', namespace: 'default', template: 'base', phase: 'Running', ready: true, launchType: 'warm', owner: 'team-a', labels: {}, createdAt: '2025-01-01T00:59:30Z' },
      { id: 'loc1bbbbbbbb', namespace: 'default', template: 'python', phase: 'Hibernated', ready: false, launchType: 'cold', owner: '', labels: {}, createdAt: '2024-12-30T01:00:00Z', memory: 'kept' },
      { id: 'loc1cccc', namespace: 'default', template: 'big', phase: 'Failed', ready: false, launchType: 'cold', owner: 'team-a', labels: {}, createdAt: '2025-01-01T00:59:00Z', reason: 'OOMKilled', message: 'the container was killed for using more memory than its limit' },
    ],
    now,
  );
  assert.equal(
    table,
    'ID            TEMPLATE  PHASE       READY  MEMORY  AGE  OWNER   REASON\n' +
      'loc1aaaa      base      Running     true   -       30s  team-a\n' +
      'loc1bbbbbbbb  python    Hibernated  false  kept    2d   -\n' +
      'loc1cccc      big       Failed      false  -       60s  team-a  OOMKilled\n',
  );
  assert.equal(formatTable(['A'], []), 'A\n');
  assert.equal(formatAge('2025-01-01T00:00:00Z', now), '60m');
  assert.equal(formatAge(undefined, now), '<unknown>');
});

/** A clock the test advances by hand; timers fire when their time is reached. */
function manualClock(): { clock: Clock; advance: (ms: number) => void } {
  let now = 0;
  let timers: { at: number; fn: () => void; live: boolean }[] = [];
  return {
    clock: {
      now: () => now,
      after(ms, fn) {
        const timer = { at: now + ms, fn, live: true };
        timers.push(timer);
        return { cancel: () => (timer.live = false) };
      },
    },
    advance: (ms) => {
      now += ms;
      const due = timers.filter((t) => t.live && t.at <= now);
      timers = timers.filter((t) => t.live && t.at > now);
      for (const t of due) t.fn();
    },
  };
}

test('the spinner shows elapsed time on a terminal, erases itself, and writes nothing to a pipe', () => {
  const { clock, advance } = manualClock();
  const tty: string[] = [];
  const spinner = new Spinner({ isTTY: true, write: (s: string) => tty.push(s) }, clock, 'creating');
  advance(1000);
  advance(1000);
  spinner.close();
  spinner.close();
  assert.match(tty[0] ?? '', /creating 0\.0s/);
  assert.ok(tty.some((s) => s.includes('creating 1.0s')), 'the elapsed time advances');
  assert.equal(tty.at(-1), '\r\x1b[K', 'the line is erased once, on close');
  assert.equal(tty.filter((s) => s === '\r\x1b[K').length, 1);

  const pipe: string[] = [];
  const quiet = new Spinner({ isTTY: false, write: (s: string) => pipe.push(s) }, clock, 'creating');
  advance(1000);
  quiet.close();
  assert.deepEqual(pipe, []);
});

test('a bad manifest names the document and field path, exits 1 and sends nothing', async (t) => {
  const stub = await stubServer(t, (_req, res) => res.writeHead(500).end());
  const yaml = [
    'apiVersion: extensions.agents.x-k8s.io/v1alpha1',
    'kind: SandboxTemplate',
    'metadata: {name: fine}',
    'spec: {podTemplate: {spec: {containers: [{name: main, image: python:3.11}]}}}',
    '---',
    'apiVersion: extensions.agents.x-k8s.io/v1alpha1',
    'kind: SandboxWarmPool',
    'metadata: {name: broken}',
    'spec: {replicas: -3, sandboxTemplateRef: {name: fine}}',
    '',
  ].join('\n');
  const r = await asb(['apply', '-f', '-'], { env: { ASB_API_URL: stub.url, ASB_API_KEY: 'k' }, input: yaml });
  assert.equal(r.code, 1);
  assert.match(r.stderr, /^error: <stdin> is invalid; nothing was applied$/m);
  assert.match(r.stderr, /^ {2}<stdin>#2\.spec\.replicas: /m);
  assert.deepEqual(stub.requests, []);
});

// ---- End to end: the CLI against a real worker (store, operator, local runtime, REST API).

test('end to end: apply, create, ls, exec, pause, resume, status, rm against a real worker', async (t) => {
  // Its own tag, bridge and subnet (10.201/16), so neither other test files nor `make up` collide.
  const worker = await startWorkerProcess({ clusterTag: 'clit', subnetOctet: 201, basePool: 0 });
  t.after(async () => {
    await worker.stop();
    removeDataDir(worker.dataDir);
  });
  const env = { ASB_API_URL: worker.apiUrl, ASB_API_KEY: worker.adminKey };
  const run = (args: string[], input?: string): Promise<RunResult> => asb(args, { env, ...(input === undefined ? {} : { input }) });

  const manifests = [
    'apiVersion: extensions.agents.x-k8s.io/v1alpha1',
    'kind: SandboxTemplate',
    'metadata: {name: cli}',
    'spec:',
    '  podTemplate:',
    '    spec:',
    '      containers: [{name: main, image: python:3.11, command: [sleep, infinity]}]',
    '---',
    'apiVersion: extensions.agents.x-k8s.io/v1alpha1',
    'kind: SandboxWarmPool',
    'metadata: {name: cli}',
    'spec: {replicas: 1, sandboxTemplateRef: {name: cli}}',
    '',
  ].join('\n');
  const file = join(emptyDir(), 'cli.yaml');
  writeFileSync(file, manifests);
  const applied = await run(['apply', '-f', file]);
  assert.equal(applied.code, 0, applied.stderr);
  assert.equal(applied.stdout, 'sandboxtemplate/cli created\nsandboxwarmpool/cli created\n');
  const again = await run(['apply', '-f', '-'], manifests);
  assert.equal(again.stdout, 'sandboxtemplate/cli unchanged\nsandboxwarmpool/cli unchanged\n');

  const created = await run(['create', '--template', 'cli', '--label', 'task=e2e', '--timeout', '1h', '--json']);
  assert.equal(created.code, 0, created.stderr);
  assert.equal(created.stderr, '', 'no spinner when stderr is not a terminal');
  const sb = JSON.parse(created.stdout) as { id: string; ready: boolean; labels: Record<string, string>; shutdownTime?: string };
  assert.match(sb.id, /^clit[a-z0-9]+$/);
  assert.equal(sb.ready, true);
  assert.equal(sb.labels.task, 'e2e');
  assert.ok(sb.shutdownTime !== undefined);
  const reach = JSON.parse(created.stdout) as { accessToken?: string; url?: string };
  assert.match(reach.accessToken ?? '', /^[A-Za-z0-9_-]{32}$/, 'create --json carries the data-plane access token');
  assert.equal(reach.url, `http://49983-${sb.id}.asb.localhost:10000`, 'and the URL through the edge (defaults: asb.localhost, 127.0.0.1:10000)');
  const url = await run(['url', sb.id, '--port', '8080']);
  assert.deepEqual([url.code, url.stdout], [0, `http://8080-${sb.id}.asb.localhost:10000\n`]);
  const urlJson = await run(['url', sb.id, '--json']);
  assert.deepEqual(JSON.parse(urlJson.stdout), { url: reach.url, port: 49983, accessToken: reach.accessToken });
  const badPort = await run(['url', sb.id, '--port', '70000']);
  assert.equal(badPort.code, 2, 'a port out of range is a usage error');

  const listed = await run(['ls', '--json', '-l', 'task=e2e', '--all-pages']);
  assert.equal(listed.code, 0, listed.stderr);
  assert.deepEqual((JSON.parse(listed.stdout) as { items: { id: string }[] }).items.map((s) => s.id), [sb.id]);
  const table = await run(['ls']);
  assert.match(table.stdout, /^ID\s+TEMPLATE\s+PHASE\s+READY\s+MEMORY\s+AGE\s+OWNER\s+REASON$/m);
  assert.match(table.stdout, new RegExp(`^${sb.id}\\s+cli\\s+Running\\s+true\\s`, 'm'));

  const hi = await run(['exec', sb.id, '--', 'echo', 'hi']);
  assert.deepEqual([hi.code, hi.stdout], [0, 'hi\n']);
  const seven = await run(['exec', sb.id, '--', 'sh', '-c', 'echo oops >&2; exit 7']);
  assert.deepEqual([seven.code, seven.stderr], [7, 'oops\n']);
  const piped = await run(['exec', sb.id, '-e', 'GREETING=hello', '--', 'sh', '-c', 'printf "%s " "$GREETING"; cat'], 'from stdin');
  assert.equal(piped.stdout, 'hello from stdin');

  const put = await run(['files', 'put', sb.id, '-', '/tmp/note.txt'], 'kept across hibernation');
  assert.equal(put.code, 0, put.stderr);

  const before = JSON.parse((await run(['url', sb.id, '--json'])).stdout) as { accessToken: string };
  const rotated = await run(['url', sb.id, '--rotate-token', '--json']);
  assert.equal(rotated.code, 0, rotated.stderr);
  const renewed = JSON.parse(rotated.stdout) as { accessToken: string };
  assert.ok(renewed.accessToken !== '' && renewed.accessToken !== before.accessToken, 'url --rotate-token prints a new token');
  assert.equal((JSON.parse((await run(['url', sb.id, '--json'])).stdout) as { accessToken: string }).accessToken, renewed.accessToken);

  // A runc pod cannot keep its memory yet: --memory says so and leaves it running.
  const withMemory = await run(['pause', sb.id, '--memory']);
  assert.notEqual(withMemory.code, 0);
  assert.match(withMemory.stderr, /cannot be paused with its memory.*--filesystem.*gvisor/s);
  const still = JSON.parse((await run(['get', sb.id, '--json'])).stdout) as { phase: string; ready: boolean; suspension?: { suspended: boolean; reason: string } };
  assert.deepEqual([still.phase, still.ready, still.suspension?.suspended, still.suspension?.reason], ['Running', true, false, 'MemoryNotSupported']);
  const both = await run(['pause', sb.id, '--memory', '--filesystem']);
  assert.match(both.stderr, /exclude each other/);

  const paused = await run(['pause', sb.id, '--filesystem', '--json']);
  assert.equal(paused.code, 0, paused.stderr);
  const pausedView = JSON.parse(paused.stdout) as { phase: string; memory?: string };
  assert.deepEqual([pausedView.phase, pausedView.memory], ['Hibernated', 'not kept']);
  const resumed = await run(['resume', sb.id, '--json']);
  assert.equal(resumed.code, 0, resumed.stderr);
  assert.equal((JSON.parse(resumed.stdout) as { ready: boolean }).ready, true);
  const after = await run(['exec', sb.id, '--', 'echo', 'awake']);
  assert.deepEqual([after.code, after.stdout], [0, 'awake\n'], `exec right after resume: ${after.stderr}`);
  const note = await run(['files', 'get', sb.id, '/tmp/note.txt']);
  assert.deepEqual([note.code, note.stdout], [0, 'kept across hibernation']);

  // Snapshots: a runc sandbox keeps its files only (by default: no error), a new sandbox starts
  // from them; a fork, which needs memory, says why it cannot be done here.
  const snapped = await run(['snapshot', sb.id, '--name', 'cli-snap', '--json']);
  assert.equal(snapped.code, 0, snapped.stderr);
  const snap = JSON.parse(snapped.stdout) as { id: string; memory: boolean; phase: string };
  assert.deepEqual([snap.memory, snap.phase], [false, 'Ready']);
  assert.match((await run(['snapshot', 'ls'])).stdout, new RegExp(`^${snap.id}\\s+cli-snap\\s+${sb.id}\\s+Ready\\s+no\\s`, 'm'));
  const fromSnap = await run(['snapshot', 'start', 'cli-snap', '--json']);
  assert.equal(fromSnap.code, 0, fromSnap.stderr);
  const copy = JSON.parse(fromSnap.stdout) as { id: string; ready: boolean };
  assert.equal(copy.ready, true);
  assert.deepEqual(await run(['files', 'get', copy.id, '/tmp/note.txt']).then((r) => [r.code, r.stdout]), [0, 'kept across hibernation']);
  const forked = await run(['fork', sb.id, '-n', '2']);
  assert.equal(forked.code, 1, forked.stdout);
  assert.match(forked.stderr, /CRIU/);
  assert.equal((await run(['snapshot', 'rm', 'cli-snap'])).code, 0);
  assert.equal((await run(['snapshot', 'get', 'cli-snap'])).code, 1);
  assert.equal((await run(['rm', copy.id])).code, 0);

  const status = await run(['status', '--json']);
  assert.equal(status.code, 0, status.stderr);
  const st = JSON.parse(status.stdout) as { cluster: { tag: string }; pools: { name: string; replicas: number }[]; sandboxes: Record<string, number> };
  assert.equal(st.cluster.tag, 'clit');
  assert.equal(st.pools.find((p) => p.name === 'cli')?.replicas, 1);
  assert.ok((st.sandboxes.Running ?? 0) >= 1);

  const removed = await run(['rm', sb.id]);
  assert.deepEqual([removed.code, removed.stdout], [0, `${sb.id} deleted\n`]);
  const missing = await run(['rm', 'clitnosuchsandbox000']);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /^error: clitnosuchsandbox000: /);
});
