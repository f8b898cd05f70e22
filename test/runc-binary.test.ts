// runc as scripts/runc-build.sh builds it (make test builds it first; a worktree may point
// ASB_RUNC_DIR elsewhere): the pinned version, linked with libseccomp, seccomp filters supported.
// Containers run with it in test/oci-runc.test.ts and the local runtime's tests.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DEFAULT_RUNC_DIR, findRuncBinary, RUNC_VERSION, runcInfo } from '../src/runtime/oci/runc-binary.ts';
import { isAsbError } from '../src/errors.ts';

test('the built runc runs: pinned version, with seccomp', async () => {
  const binary = findRuncBinary(process.env.ASB_RUNC_DIR ?? DEFAULT_RUNC_DIR);
  const info = await runcInfo(binary);
  assert.equal(info.version, RUNC_VERSION);
  assert.match(info.libseccomp ?? '', /^2\.\d+\.\d+$/);
  assert.equal(info.seccomp, true);
});

test('a missing runc is reported with what to run', () => {
  assert.throws(() => findRuncBinary('/nonexistent'), (err: unknown) => isAsbError(err, 'Unavailable') && err.message.includes('make runc'));
});
