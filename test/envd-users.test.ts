// The home a relative envd path starts from (UserIds.homeOf): its lookup script run by a real
// POSIX shell on this machine (the runtime's exec stands in for the sandbox's), and what is kept
// per sandbox and pod start. test/envd.test.ts does the same in real sandboxes.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { userInfo } from 'node:os';
import { test } from 'node:test';
import { AsbError } from '../src/errors.ts';
import type { ExecRequest, ExecResult, PodRuntime, PodState } from '../src/runtime/runtime.ts';
import { UserIds } from '../src/worker/envd/users.ts';

/** A runtime whose exec runs the command here, with `env` as its whole environment. */
function localRuntime(env: Record<string, string>): { runtime: PodRuntime; execs: string[][]; restart: () => void } {
  const execs: string[][] = [];
  let startedAt = '2026-01-01T00:00:00Z';
  const exec = (_id: string, req: ExecRequest): Promise<ExecResult> => {
    execs.push(req.command);
    const [cmd = '', ...args] = req.command;
    const r = spawnSync(cmd, args, { env, timeout: 10_000 });
    return Promise.resolve({ exitCode: r.status ?? 1, stdout: r.stdout, stderr: r.stderr, timedOut: false, truncated: false });
  };
  const state = (): PodState => ({ phase: 'Running', ready: true, startedAt });
  return {
    runtime: { exec, state, onChange: () => () => undefined } as unknown as PodRuntime,
    execs,
    restart: () => { startedAt = new Date(Date.parse(startedAt) + 1000).toISOString(); },
  };
}

const PATH = process.env.PATH ?? '/usr/bin:/bin';

test('the default user\'s home is the HOME its processes get, else the passwd entry of its uid', async () => {
  assert.equal(await new UserIds(localRuntime({ PATH, HOME: '/home/user' }).runtime).homeOf('s', undefined), '/home/user');
  assert.equal(await new UserIds(localRuntime({ PATH, HOME: '/home/user' }).runtime).homeOf('s', 'user'), '/home/user', '"user" is the default user');
  assert.equal(await new UserIds(localRuntime({ PATH }).runtime).homeOf('s', undefined), userInfo().homedir, 'no HOME: passwd by uid');
});

test('a named user\'s home is its passwd entry; an unknown one is a 400 naming it', async () => {
  const users = new UserIds(localRuntime({ PATH, HOME: '/home/user' }).runtime);
  assert.equal(await users.homeOf('s', 'root'), '/root');
  await assert.rejects(users.homeOf('s', 'nosuchuser15'), (err: unknown) => err instanceof AsbError && err.code === 'BadRequest' && /no user "nosuchuser15"/.test(err.message));
  await assert.rejects(users.homeOf('s', 'a b'), (err: unknown) => err instanceof AsbError && err.code === 'BadRequest' && /not a user name/.test(err.message));
});

test('a home is asked once per sandbox, user and pod start', async () => {
  const fake = localRuntime({ PATH, HOME: '/home/user' });
  const users = new UserIds(fake.runtime);
  await users.homeOf('s1', 'root');
  await users.homeOf('s1', 'root');
  await users.homeOf('s1', undefined);
  await users.homeOf('s1', 'user');
  assert.equal(fake.execs.length, 2, 'root once, the default user once');
  await users.homeOf('s2', 'root');
  assert.equal(fake.execs.length, 3, 'another sandbox asks its own');
  fake.restart();
  await users.homeOf('s1', 'root');
  assert.equal(fake.execs.length, 4, 'a pod started again may hold other users');
  users.forget('s1');
  await users.homeOf('s1', 'root');
  assert.equal(fake.execs.length, 5);
});
