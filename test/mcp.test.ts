// The MCP server end to end on a real local system (worker, router, Envoy, real sandboxes): the
// MCP SDK's own client drives `asb mcp` on stdio and the worker's /mcp over streamable HTTP, as
// an agent's host would. A team sees and touches only its own sandboxes through MCP; bad input
// is a tool error naming the argument; and one scripted agent loop calls the tools in sequence.
// Its own system: bridge asbmcpa, subnet 10.144.0.0/16.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { baseTemplate } from '../src/api/builtin.ts';
import { startTestSystem, type TestSystem } from './support/local-system.ts';
import { httpClient, stdioClient, type McpTestClient } from './support/mcp-client.ts';
import { edgeGet } from './support/web-sandbox.ts';
import { waitFor } from './support/wait.ts';
import { api } from './support/worker-process.ts';

const TEAM_A = 'mcp-team-a';
const TEAM_B = 'mcp-team-b';

const TOOLS = [
  'create_sandbox', 'fork_sandbox', 'get_sandbox', 'get_url', 'kill_sandbox', 'list_files', 'list_sandboxes', 'list_snapshots', 'list_templates',
  'pause_sandbox', 'read_command_output', 'read_file', 'resume_sandbox', 'run_command', 'snapshot_sandbox', 'start_command', 'start_from_snapshot', 'write_file',
];

let system: TestSystem;
let keyA = '';
let keyB = '';

before(async () => {
  system = await startTestSystem('mcpa', 144, 'local', 0, false, [TEAM_A, TEAM_B]);
  keyA = system.teamKeys[TEAM_A] ?? '';
  keyB = system.teamKeys[TEAM_B] ?? '';
});
after(() => system.cleanup());

async function sandboxIds(c: McpTestClient): Promise<string[]> {
  const listed = await c.ok('list_sandboxes');
  return (listed.sandboxes as { id: string }[]).map((s) => s.id);
}

test('asb mcp on stdio: the SDK client lists every tool with a schema, creates a sandbox, runs a command, uploads a local file', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-mcp-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'notes.txt'), 'from the host\n');
  const c = await stdioClient(t, system.apiUrl, keyA, dir);

  const { tools } = await c.client.listTools();
  assert.deepEqual(tools.map((x) => x.name).sort(), [...TOOLS, 'upload_file'].sort());
  for (const tool of tools) {
    assert.ok((tool.description ?? '').length > 20, `${tool.name} has a description`);
    assert.equal(tool.inputSchema.type, 'object');
  }
  const run = tools.find((x) => x.name === 'run_command');
  assert.deepEqual(run?.inputSchema.required, ['sandbox_id', 'command']);

  const sb = await c.ok('create_sandbox', { timeout_seconds: 600 });
  const id = String(sb.id);
  assert.equal(sb.phase, 'Running');
  assert.equal(sb.ready, true);
  const ran = await c.ok('run_command', { sandbox_id: id, command: 'echo hello from $(hostname) && echo oops >&2; exit 3' });
  assert.equal(ran.exit_code, 3);
  assert.equal(ran.stdout, `hello from ${id}\n`);
  assert.equal(ran.stderr, 'oops\n');
  assert.equal(ran.output_cut, false);

  const up = await c.ok('upload_file', { sandbox_id: id, local_path: 'notes.txt', path: '/tmp/notes.txt' });
  assert.equal(up.bytes, 14);
  const read = await c.ok('read_file', { sandbox_id: id, path: '/tmp/notes.txt' });
  assert.equal(read.content, 'from the host\n');
  const missing = await c.call('upload_file', { sandbox_id: id, local_path: 'no-such-file', path: '/tmp/x' });
  assert.ok(missing.isError);
  assert.match(missing.text, /local_path "no-such-file".*ENOENT/);

  assert.deepEqual(await sandboxIds(c), [id]);
  const killed = await c.ok('kill_sandbox', { sandbox_id: id });
  assert.equal(killed.killed, true);
});

test('streamable HTTP at the worker: the caller\'s key is the bearer; no key is 401; long output is cut and the result says so', async (t) => {
  const noKey = await fetch(`${system.apiUrl}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }) });
  assert.equal(noKey.status, 401);
  assert.equal(((await noKey.json()) as { code: string }).code, 'Unauthorized');
  const badKey = await fetch(`${system.apiUrl}/mcp`, { method: 'POST', headers: { authorization: 'Bearer asb_nope0000_00000000000000000000000000000000', 'content-type': 'application/json' }, body: '{}' });
  assert.equal(badKey.status, 401);

  const c = await httpClient(t, system.apiUrl, keyA);
  const { tools } = await c.client.listTools();
  assert.deepEqual(tools.map((x) => x.name).sort(), TOOLS, 'no upload_file over HTTP: the server\'s disk is not the caller\'s');

  const sb = await c.ok('create_sandbox', { timeout_seconds: 600 });
  const id = String(sb.id);
  t.after(() => api(system, 'DELETE', `/v1/sandboxes/${id}`));
  const long = await c.ok('run_command', { sandbox_id: id, command: 'seq 1 100000', max_output_chars: 1000 });
  assert.equal(long.exit_code, 0);
  assert.equal(long.output_cut, true);
  const stdout = String(long.stdout);
  assert.ok(stdout.startsWith('1\n2\n3\n'), 'the head is kept');
  assert.ok(stdout.endsWith('99999\n100000\n'), 'and the tail');
  assert.match(stdout, /\[\.\.\. \d+ characters cut \.\.\.\]/);
  assert.match(String(long.note), /max_output_chars=1000/);
  const slow = await c.ok('run_command', { sandbox_id: id, command: 'sleep 30', timeout_seconds: 1 });
  assert.equal(slow.timed_out, true);
  assert.match(String(slow.note), /timeout_seconds.*start_command/);
});

test('tenancy through MCP: another team\'s key neither sees nor touches the sandbox', async (t) => {
  const a = await httpClient(t, system.apiUrl, keyA);
  const b = await httpClient(t, system.apiUrl, keyB);
  const sb = await a.ok('create_sandbox', { timeout_seconds: 600 });
  const id = String(sb.id);
  t.after(() => api(system, 'DELETE', `/v1/sandboxes/${id}`));

  assert.ok(!(await sandboxIds(b)).includes(id), 'B\'s list leaves A\'s sandbox out');
  for (const [tool, args] of [
    ['get_sandbox', {}],
    ['run_command', { command: 'echo pwned > /tmp/pwned' }],
    ['write_file', { path: '/tmp/pwned', content: 'x' }],
    ['read_file', { path: '/etc/hostname' }],
    ['get_url', { port: 8000 }],
    ['snapshot_sandbox', {}],
    ['pause_sandbox', {}],
    ['kill_sandbox', {}],
  ] as const) {
    const r = await b.call(tool, { sandbox_id: id, ...args });
    assert.ok(r.isError, `${tool} by team B is refused`);
    assert.match(r.text, new RegExp(`^NotFound: sandbox "${id}" not found`), tool);
    assert.match(r.text, /list_sandboxes/, 'the error names the tool to call instead');
  }
  const still = await a.ok('get_sandbox', { sandbox_id: id });
  assert.equal(still.phase, 'Running', 'A\'s sandbox still runs');
  const clean = await a.ok('run_command', { sandbox_id: id, command: 'test ! -e /tmp/pwned && echo clean' });
  assert.equal(clean.stdout, 'clean\n');
});

test('bad input is a tool error a model can act on, naming the argument to change', async (t) => {
  const c = await httpClient(t, system.apiUrl, keyA);
  const BAD = { bad: 'input' };
  const cases: [string, Record<string, unknown>, RegExp][] = [
    ['create_sandbox', { timeout_seconds: -5, labels: BAD }, /timeout_seconds/],
    ['create_sandbox', { template: 'no-such-template', labels: BAD }, /template "no-such-template" not found[\s\S]*list_templates/],
    ['create_sandbox', { network: { allow: ['not a cidr!!'] }, labels: BAD }, /network\.allow\[0\]/],
    ['create_sandbox', { env: { 'A=B': 'x' }, labels: BAD }, /env/],
    ['run_command', { sandbox_id: 'x' }, /command/],
    ['run_command', { sandbox_id: 'mcpanosuchsandbox', command: 'true' }, /NotFound: sandbox "mcpanosuchsandbox" not found[\s\S]*list_sandboxes/],
    ['read_command_output', { sandbox_id: 'x', command_id: '../../etc/passwd' }, /command_id/],
    ['get_url', { sandbox_id: 'x', port: 70000 }, /port/],
  ];
  for (const [tool, args, pattern] of cases) {
    const r = await c.call(tool, args);
    assert.ok(r.isError, `${tool} ${JSON.stringify(args)} is an error`);
    assert.match(r.text, pattern, `${tool} ${JSON.stringify(args)}: ${r.text}`);
  }
  assert.deepEqual((await c.ok('list_sandboxes', { label_selector: 'bad=input' })).sandboxes, [], 'no bad create left a sandbox behind');
  // The REST create's env (what create_sandbox sends) is checked as an exec's: 422 naming the variable.
  const rest = await api<{ code: string; fields: { field: string }[] }>(system, 'POST', '/v1/sandboxes', { env: { 'A=B': 'x' }, labels: BAD }, keyA);
  assert.equal(rest.status, 422);
  assert.deepEqual(rest.body.fields.map((f) => f.field), ['env.A=B']);
});

test('an agent loop: create, write code, run it, serve it in the background, reach it through the edge, snapshot, pause and resume, fork, kill', async (t) => {
  // The base image under gVisor: fork keeps memory, which runc's shim-made user namespace cannot (docs/criu.md).
  const template = baseTemplate();
  template.metadata.name = 'mcp-gvisor';
  template.spec.podTemplate.spec.runtimeClassName = 'gvisor';
  const applied = await api(system, 'POST', '/v1/apply', { objects: [template] });
  assert.equal(applied.status, 200, JSON.stringify(applied.body));
  const c = await httpClient(t, system.apiUrl, keyA);
  const templates = await c.ok('list_templates');
  assert.ok((templates.templates as string[]).includes('mcp-gvisor'), JSON.stringify(templates));
  const created = await c.ok('create_sandbox', { template: 'mcp-gvisor', timeout_seconds: 900, env: { GREETING: 'hi from env' }, labels: { task: 'mcp-loop' } });
  const id = String(created.id);
  const made = [id];
  t.after(async () => {
    for (const s of made) await api(system, 'DELETE', `/v1/sandboxes/${s}`);
  });

  const code = 'import os\nfib = [0, 1]\nwhile len(fib) < 20:\n    fib.append(fib[-1] + fib[-2])\nprint(os.environ["GREETING"], fib[-1])\n';
  const written = await c.ok('write_file', { sandbox_id: id, path: '/home/user/app/fib.py', content: code });
  assert.equal(written.bytes, code.length);
  const listed = await c.ok('list_files', { sandbox_id: id, path: '/home/user/app' });
  assert.deepEqual(listed.entries, [{ name: 'fib.py', type: 'file', size: code.length, mtime: (listed.entries as { mtime: string }[])[0]?.mtime }]);
  const ran = await c.ok('run_command', { sandbox_id: id, command: 'python3 fib.py', cwd: '/home/user/app' });
  assert.deepEqual([ran.exit_code, ran.stdout, ran.stderr], [0, 'hi from env 4181\n', '']);

  // A server in the background, its output read later.
  const started = await c.ok('start_command', { sandbox_id: id, command: 'echo serving; exec python3 -u -m http.server 8000 --directory /home/user/app', cwd: '/home/user' });
  const commandId = String(started.command_id);
  const url = await c.ok('get_url', { sandbox_id: id, port: 8000 });
  assert.equal(url.url, system.edgeUrl.replace('//127.0.0.1', `//8000-${id}.asb.localhost`));
  const headers = url.headers as Record<string, string>;
  const host = new URL(url.url).hostname;
  const page = await waitFor('the server in the sandbox to answer through the edge', async () => {
    const got = await edgeGet(system.edgeUrl, host, { headers, path: '/fib.py' });
    return got.status === 200 ? got : undefined;
  }, 30_000, 200);
  assert.match(page.body, /fib\.append/);
  assert.equal((await edgeGet(system.edgeUrl, host, { path: '/fib.py' })).status, 401, 'without the header get_url returned, refused');
  const out = await c.ok('read_command_output', { sandbox_id: id, command_id: commandId });
  assert.equal(out.running, true);
  assert.match(String(out.output), /^serving\n[\s\S]*"GET \/fib\.py HTTP\/1\.1" 200/);
  const rest = await c.ok('read_command_output', { sandbox_id: id, command_id: commandId, offset: out.next_offset });
  assert.equal(rest.output, '', 'from next_offset on, only what is new');
  const stop = await c.ok('run_command', { sandbox_id: id, command: `kill -- -${String(started.pid)}` });
  assert.equal(stop.exit_code, 0, String(stop.stderr));
  const stopped = await waitFor('the server to be gone', async () => {
    const r = await c.ok('read_command_output', { sandbox_id: id, command_id: commandId, offset: rest.next_offset });
    return r.running === false ? r : undefined;
  }, 20_000, 200);
  assert.equal(stopped.exit_code, null, 'killed: no exit status');
  const port = await c.ok('run_command', { sandbox_id: id, command: 'python3 -c "import socket; socket.create_connection((\'127.0.0.1\', 8000), 1)"' });
  assert.notEqual(port.exit_code, 0, 'nothing listens on 8000 any more');

  // A background command that ends: its exit status is reported.
  const job = await c.ok('start_command', { sandbox_id: id, command: 'echo done; exit 7' });
  const ended = await waitFor('the job to end', async () => {
    const r = await c.ok('read_command_output', { sandbox_id: id, command_id: job.command_id });
    return r.running === false ? r : undefined;
  }, 20_000, 200);
  assert.deepEqual([ended.exit_code, ended.output], [7, 'done\n']);

  // Snapshot (files) and a new sandbox from it.
  const snap = await c.ok('snapshot_sandbox', { sandbox_id: id, name: 'mcp-loop-snap', keep_memory: false });
  assert.equal(snap.memory, false);
  assert.equal(snap.phase, 'Ready');
  const snaps = await c.ok('list_snapshots');
  assert.ok((snaps.snapshots as { name?: string }[]).some((s) => s.name === 'mcp-loop-snap'));
  const copy = await c.ok('start_from_snapshot', { snapshot: 'mcp-loop-snap', timeout_seconds: 600 });
  made.push(String(copy.id));
  assert.notEqual(copy.id, id);
  const copied = await c.ok('read_file', { sandbox_id: copy.id, path: '/home/user/app/fib.py' });
  assert.match(String(copied.content), /fib\.append/);

  // Pause (files) and resume: the files are there after.
  const paused = await c.ok('pause_sandbox', { sandbox_id: id, keep_memory: false });
  assert.equal(paused.phase, 'Hibernated');
  const asleep = await c.call('run_command', { sandbox_id: id, command: 'true' });
  assert.ok(asleep.isError);
  assert.match(asleep.text, /resume_sandbox/);
  const resumed = await c.ok('resume_sandbox', { sandbox_id: id });
  assert.deepEqual([resumed.phase, resumed.ready], ['Running', true]);
  const again = await c.ok('run_command', { sandbox_id: id, command: 'python3 app/fib.py', cwd: '/home/user' });
  assert.equal(again.stdout, 'hi from env 4181\n');

  // Fork: a copy with its own id.
  const forked = await c.ok('fork_sandbox', { sandbox_id: id, count: 1, timeout_seconds: 600 });
  const [fork] = forked.forks as { id?: string; error?: string }[];
  assert.ok(fork?.id !== undefined, JSON.stringify(forked));
  made.push(fork.id);
  const forkRead = await c.ok('run_command', { sandbox_id: fork.id, command: 'cat /home/user/app/fib.py | wc -l; hostname' });
  assert.equal(forkRead.stdout, `5\n${fork.id}\n`);

  for (const s of made) assert.equal((await c.ok('kill_sandbox', { sandbox_id: s })).killed, true);
  const left = await c.ok('list_sandboxes', { label_selector: 'task=mcp-loop', phase: 'Running' });
  assert.deepEqual(left.sandboxes, []);
});
