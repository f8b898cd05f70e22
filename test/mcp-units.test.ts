// The MCP tools' pure parts, without sockets: how long output is cut, how a background command's
// state is read, how a command is quoted for the shell, and how a REST failure becomes a tool error
// that names the tool's own argument and the tool to call next.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';
import { ApiError, ApiUnreachableError } from '../src/client/api-client.ts';
import { shellQuote } from '../src/builds/dockerfile-lex.ts';
import { parseReadStatus, startScript } from '../src/mcp/background.ts';
import { failure } from '../src/mcp/tool-result.ts';
import { capOutput } from '../src/mcp/tools.ts';

const textOf = (r: ReturnType<typeof failure>): string => (r.content[0] as { text: string }).text;

test('long output keeps its head and its tail and says how much was cut', () => {
  assert.deepEqual(capOutput('short', 10), { text: 'short', cut: 0 });
  const out = capOutput('a'.repeat(50) + 'b'.repeat(50), 10);
  assert.equal(out.cut, 90);
  assert.equal(out.text, 'aaaaa\n[... 90 characters cut ...]\nbbbbb');
});

test('a background command\'s state: running, ended with a status, or killed without one', () => {
  assert.deepEqual(parseReadStatus('12 -'), { size: 12, state: { running: true } });
  assert.deepEqual(parseReadStatus('0 7'), { size: 0, state: { running: false, exitCode: 7 } });
  assert.deepEqual(parseReadStatus('5 ?'), { size: 5, state: { running: false, exitCode: undefined } });
  assert.equal(parseReadStatus('sh: wc: not found'), undefined);
});

test('a command is one shell word whatever it holds, and the start script carries it unchanged', () => {
  for (const text of ["it's", "'; rm -rf / #", '$(id) `id` "$HOME" \\n', 'a\nb']) {
    assert.equal(execFileSync('sh', ['-c', `printf %s ${shellQuote(text)}`], { encoding: 'utf8' }), text);
  }
  const script = startScript('0123456789ab', "echo 'x'; exit 7");
  assert.match(script, /^mkdir -p \/tmp\/\.asb-mcp \|\| exit\nnohup/);
  assert.ok(script.includes(shellQuote("(\necho 'x'; exit 7\n)\necho $? > /tmp/.asb-mcp/0123456789ab.exit.tmp && mv /tmp/.asb-mcp/0123456789ab.exit.tmp /tmp/.asb-mcp/0123456789ab.exit")));
});

test('a REST failure becomes a tool error naming the tool\'s argument and what to call next', () => {
  const invalid = failure(new ApiError(422, 'Invalid', 'request body is invalid: timeoutMs: must be at least 1', [{ field: 'timeoutMs', message: 'must be at least 1' }]), { timeoutMs: 'timeout_seconds' });
  assert.equal(invalid.isError, true);
  assert.equal(textOf(invalid), 'Invalid: request body is invalid: timeoutMs: must be at least 1\nArguments to fix: timeout_seconds: must be at least 1');

  const noTemplate = failure(new ApiError(404, 'NotFound', 'template "x" not found in namespace "default"; list templates with GET /v1/templates', []));
  assert.equal(textOf(noTemplate), 'NotFound: template "x" not found in namespace "default"\nCall list_templates to see the templates you can create sandboxes from.');

  const noSandbox = failure(new ApiError(404, 'NotFound', 'sandbox "abc" not found; list yours with GET /v1/sandboxes', []));
  assert.equal(textOf(noSandbox), 'NotFound: sandbox "abc" not found\nCall list_sandboxes to see the ids of your sandboxes.');

  const paused = failure(new ApiError(409, 'SandboxNotRunning', 'sandbox "abc" is Hibernated', []));
  assert.match(textOf(paused), /resume_sandbox/);

  const down = failure(new ApiUnreachableError('http://127.0.0.1:1', new Error('ECONNREFUSED')));
  assert.match(textOf(down), /^Unavailable: cannot reach the Agent Sandbox API at http:\/\/127\.0\.0\.1:1\. Is it running/);
});
