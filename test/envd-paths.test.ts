// Where a path an envd caller names lands: envd's ExpandAndResolve (relative paths and ~ from the
// requesting user's home), pinned without a sandbox. Regression: `files.write('notes/a.txt')`
// answered 403 "mkdir: cannot create directory '/notes'" because relative paths were taken from /.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AsbError } from '../src/errors.ts';
import { needsHome, pathField, resolvePath, userPath } from '../src/worker/envd/paths.ts';

const HOME = '/home/user';

test('relative paths, ~ and ~/x resolve against the home; absolute paths ignore it', () => {
  const cases: [string, string][] = [
    ['notes/a.txt', '/home/user/notes/a.txt'],
    ['./notes/a.txt', '/home/user/notes/a.txt'],
    ['.', '/home/user'],
    ['~', '/home/user'],
    ['~/', '/home/user'],
    ['~/notes/a.txt', '/home/user/notes/a.txt'],
    ['~/../other', '/home/other'],
    ['..', '/home'],
    ['../user2/x', '/home/user2/x'],
    ['', '/home/user'],
    ['/etc/hostname', '/etc/hostname'],
    ['/tmp/../etc/./hostname', '/etc/hostname'],
    ['/', '/'],
  ];
  for (const [path, want] of cases) assert.equal(resolvePath(path, HOME), want, JSON.stringify(path));
});

test('a relative climb above / stops at / (the sandbox\'s root), as an absolute one does', () => {
  assert.equal(resolvePath('../../../../etc/passwd', HOME), '/etc/passwd');
  assert.equal(resolvePath('~/../../../..', HOME), '/');
  assert.equal(resolvePath('/../../etc', HOME), '/etc');
});

test('root\'s relative paths land under its own home', () => {
  assert.equal(resolvePath('notes/a.txt', '/root'), '/root/notes/a.txt');
  assert.equal(resolvePath('~', '/root'), '/root');
});

test('~name is refused as envd refuses it ("cannot expand user-specific home dir"), naming the field', () => {
  for (const path of ['~root', '~root/x', '~user/notes']) {
    assert.throws(() => resolvePath(path, HOME, 'destination'), (err: unknown) => {
      assert.ok(err instanceof AsbError);
      assert.equal(err.code, 'BadRequest');
      assert.match(err.message, /^destination /);
      assert.deepEqual(err.fields.map((f) => f.field), ['destination']);
      return true;
    }, path);
  }
  // envd takes either separator after the tilde: ~\x is a file named \x in the home.
  assert.equal(resolvePath('~\\x', HOME), '/home/user/\\x');
});

test('a relative or empty home counts from /, as envd joins onto it', () => {
  assert.equal(resolvePath('a', ''), '/a');
  assert.equal(resolvePath('a', 'home/u'), '/home/u/a');
});

test('the home is asked for only when the path needs it', async () => {
  assert.equal(needsHome('/abs'), false);
  for (const path of ['', '.', 'rel', '~', '~/x', '~x']) assert.equal(needsHome(path), true, path);
  let asked = 0;
  const home = (): Promise<string> => {
    asked += 1;
    return Promise.resolve(HOME);
  };
  assert.equal(await userPath(home, '/tmp/x'), '/tmp/x');
  assert.equal(asked, 0);
  assert.equal(await userPath(home, 'x'), '/home/user/x');
  assert.equal(await userPath(home, undefined), '/home/user', 'a missing path is the home, as envd\'s empty path');
  assert.equal(asked, 2);
});

test('bad path fields: a clear 400 naming the field', () => {
  const bad: [unknown, RegExp][] = [
    [42, /^path must be a string/],
    ['a\0b', /^path contains a NUL byte/],
    ['x'.repeat(4097), /^path is longer than 4096/],
  ];
  for (const [value, message] of bad) {
    assert.throws(() => pathField(value), (err: unknown) => err instanceof AsbError && err.code === 'BadRequest' && message.test(err.message));
  }
  assert.throws(() => pathField('', 'path', true), /path is required/);
  assert.equal(pathField(undefined), '');
});
