// The python-runtime API's request parsing and response shaping (src/worker/python-runtime/protocol.ts),
// pinned to what k8s-agent-sandbox 1.0.8 sends and accepts (shared research k8s-sigs-sdk.md §3.2).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Sandbox } from '../src/api/types.ts';
import { AsbError } from '../src/errors.ts';
import { baseDirOf, callOf, confinedPath, dispositionOf, EXEC_LIMIT_MS, executeRequestOf, executeResponseOf, listEntriesOf, TIMED_OUT_EXIT_CODE } from '../src/worker/python-runtime/protocol.ts';

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof AsbError, String(err));
    return `${err.code} ${err.status}`;
  }
  return 'no error';
}

test('callOf: the five calls and the health check, paths decoded exactly once', () => {
  assert.deepEqual(callOf('GET', '/'), { op: 'health' });
  assert.deepEqual(callOf('POST', '/execute'), { op: 'execute' });
  assert.deepEqual(callOf('POST', '/upload'), { op: 'upload' });
  // The SDK's quote(path, safe=''): "/" arrives as %2F.
  assert.deepEqual(callOf('GET', '/download/dir%2Ftest.txt'), { op: 'download', path: 'dir/test.txt' });
  assert.deepEqual(callOf('GET', '/exists/a%20b%3Fc'), { op: 'exists', path: 'a b?c' });
  // list(".") arrives as /list/ once requests removed the dot segment: the base directory.
  assert.deepEqual(callOf('GET', '/list/'), { op: 'list', path: '' });
  assert.deepEqual(callOf('GET', '/list'), { op: 'list', path: '' });
  // Once, not twice as the reference does: a name holding "%2F" keeps it.
  assert.deepEqual(callOf('GET', '/download/100%252F.txt'), { op: 'download', path: '100%2F.txt' });
  assert.deepEqual(callOf('GET', '/download/x?ignored=1'), { op: 'download', path: 'x' });
  assert.deepEqual(callOf('HEAD', '/download/x'), { op: 'download', path: 'x' });
});

test('callOf: unknown paths 404, wrong methods 405, bad encoding and NUL 400', () => {
  assert.equal(code(() => callOf('GET', '/agent')), 'NotFound 404');
  assert.equal(code(() => callOf('GET', '/downloads/x')), 'NotFound 404');
  assert.equal(code(() => callOf('GET', '/execute')), 'MethodNotAllowed 405');
  assert.equal(code(() => callOf('POST', '/download/x')), 'MethodNotAllowed 405');
  assert.equal(code(() => callOf('DELETE', '/list/x')), 'MethodNotAllowed 405');
  assert.equal(code(() => callOf('GET', '/download/%E0%A4%A')), 'BadRequest 400');
  assert.equal(code(() => callOf('GET', '/download/a%00b')), 'BadRequest 400');
});

test('confinedPath: from the base, leading slashes dropped; climbing out is 403 Access denied', () => {
  assert.equal(confinedPath('/home/user', ''), '/home/user');
  assert.equal(confinedPath('/home/user', 'dir/test.txt'), '/home/user/dir/test.txt');
  assert.equal(confinedPath('/home/user', '/etc/passwd'), '/home/user/etc/passwd');
  assert.equal(confinedPath('/home/user', '//x'), '/home/user/x');
  assert.equal(confinedPath('/home/user', 'a/../b'), '/home/user/b');
  assert.equal(confinedPath('/home/user', 'a/..'), '/home/user');
  assert.equal(code(() => confinedPath('/home/user', '..')), 'Forbidden 403');
  assert.equal(code(() => confinedPath('/home/user', '../user2/x')), 'Forbidden 403');
  assert.equal(code(() => confinedPath('/home/user', '/../../etc/passwd')), 'Forbidden 403');
  assert.equal(code(() => confinedPath('/home/user', 'a/../../x')), 'Forbidden 403');
  // A sibling whose name starts with the base's is outside it.
  assert.equal(code(() => confinedPath('/app', '../app2/x')), 'Forbidden 403');
  assert.throws(() => confinedPath('/app', '../x'), /^AsbError: Access denied|Access denied/);
  // A base of / confines nothing more than the sandbox does.
  assert.equal(confinedPath('/', '../../etc'), '/etc');
});

test('baseDirOf: the main container\'s SANDBOX_BASE_DIR, trimmed; blank or absent is undefined', () => {
  const sandbox = (env: { name: string; value?: string }[] | undefined): Sandbox => ({
    apiVersion: 'agents.x-k8s.io/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: 's' },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'x', ...(env === undefined ? {} : { env }) }, { name: 'side', image: 'y', env: [{ name: 'SANDBOX_BASE_DIR', value: '/side' }] }] } } },
  });
  assert.equal(baseDirOf(sandbox([{ name: 'SANDBOX_BASE_DIR', value: ' /workspace/ ' }])), '/workspace');
  assert.equal(baseDirOf(sandbox([{ name: 'SANDBOX_BASE_DIR', value: 'rel' }])), '/rel');
  assert.equal(baseDirOf(sandbox([{ name: 'SANDBOX_BASE_DIR', value: '  ' }])), undefined);
  assert.equal(baseDirOf(sandbox(undefined)), undefined);
});

test('executeRequestOf: command required as a string, timeout_seconds > 0 and capped at the server limit; 422 naming the field', () => {
  assert.deepEqual(executeRequestOf({ command: 'echo hi' }), { command: 'echo hi', timeoutMs: EXEC_LIMIT_MS });
  assert.deepEqual(executeRequestOf({ command: 'sleep 5', timeout_seconds: 1 }), { command: 'sleep 5', timeoutMs: 1000 });
  assert.deepEqual(executeRequestOf({ command: 'x', timeout_seconds: 0.0011 }), { command: 'x', timeoutMs: 2 });
  assert.deepEqual(executeRequestOf({ command: 'x', timeout_seconds: 10_000 }), { command: 'x', timeoutMs: EXEC_LIMIT_MS });
  assert.deepEqual(executeRequestOf({ command: 'x', timeout_seconds: null }), { command: 'x', timeoutMs: EXEC_LIMIT_MS });
  for (const bad of [null, [], 'echo', {}, { command: 3 }, { command: 'a\0b' }, { command: 'x', timeout_seconds: 0 }, { command: 'x', timeout_seconds: -1 }, { command: 'x', timeout_seconds: '5' }]) {
    assert.equal(code(() => executeRequestOf(bad)), 'Invalid 422', JSON.stringify(bad));
  }
  try {
    executeRequestOf({ command: 'x', timeout_seconds: 'soon' });
  } catch (err) {
    assert.deepEqual((err as AsbError).fields.map((f) => f.field), ['timeout_seconds']);
  }
});

test('executeResponseOf: text, exit code, timed_out with 124', () => {
  const out = (s: string): Uint8Array => Buffer.from(s);
  assert.deepEqual(executeResponseOf({ exitCode: 3, stdout: out('é\n'), stderr: out('oops'), timedOut: false, truncated: false }), { stdout: 'é\n', stderr: 'oops', exit_code: 3, timed_out: false });
  assert.deepEqual(executeResponseOf({ exitCode: 137, stdout: out('partial'), stderr: out(''), timedOut: true, truncated: false, signal: 'SIGKILL' }), { stdout: 'partial', stderr: '', exit_code: TIMED_OUT_EXIT_CODE, timed_out: true });
});

test('listEntriesOf: only "file" and "directory" (the SDK refuses any other type), mod_time as epoch seconds', () => {
  const entry = (name: string, type: 'FILE_TYPE_FILE' | 'FILE_TYPE_DIRECTORY' | 'FILE_TYPE_SYMLINK' | 'FILE_TYPE_UNSPECIFIED', size: number) => ({ name, type, path: `/b/${name}`, size, mode: 0, permissions: '', owner: '', group: '', modifiedTime: '2026-01-02T03:04:05.678Z' });
  assert.deepEqual(listEntriesOf([entry('d', 'FILE_TYPE_DIRECTORY', 4096), entry('f', 'FILE_TYPE_FILE', 4), entry('l', 'FILE_TYPE_SYMLINK', 9), entry('p', 'FILE_TYPE_UNSPECIFIED', 0)]), [
    { name: 'd', size: 4096, type: 'directory', mod_time: 1767323045.678 },
    { name: 'f', size: 4, type: 'file', mod_time: 1767323045.678 },
    { name: 'l', size: 9, type: 'file', mod_time: 1767323045.678 },
    { name: 'p', size: 0, type: 'file', mod_time: 1767323045.678 },
  ]);
});

test('dispositionOf: the file\'s own name, percent-encoded', () => {
  assert.equal(dispositionOf('/b/dir/a b"é.txt'), 'attachment; filename*=utf-8\'\'a%20b%22%C3%A9.txt');
  assert.equal(dispositionOf('/'), 'attachment; filename*=utf-8\'\'download');
});
