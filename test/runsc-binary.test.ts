// runsc as scripts/runsc-build.sh builds it (make test builds it first; a worktree may point
// ASB_RUNSC_DIR elsewhere): the pinned version, and static, since a dynamically linked runsc builds
// but no sandbox of it starts (its re-exec after pivot_root finds no ELF interpreter).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_RUNSC_DIR, elfInterpreter, findRunscBinary, RUNSC_VERSION, runscVersion } from '../src/runtime/oci/runsc-binary.ts';
import { isAsbError } from '../src/errors.ts';

test('the built runsc runs: pinned version, statically linked', async () => {
  const binary = findRunscBinary(process.env.ASB_RUNSC_DIR ?? DEFAULT_RUNSC_DIR);
  assert.equal(await runscVersion(binary), RUNSC_VERSION);
  assert.equal(elfInterpreter(binary), undefined);
});

test('a missing runsc is reported with what to run', () => {
  assert.throws(() => findRunscBinary('/nonexistent'), (err: unknown) => isAsbError(err, 'Unavailable') && err.message.includes('make runsc'));
});

test('a dynamically linked runsc is refused before its first sandbox dies with "error executing umounter"', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-runsc-dyn-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(join(dir, 'bin'));
  // Debian's /bin/true is dynamically linked, as `go build` with cgo makes runsc.
  copyFileSync('/bin/true', join(dir, 'bin', 'runsc'));
  assert.match(elfInterpreter('/bin/true') ?? '', /^\/lib.*ld-linux.*\.so/);
  assert.throws(() => findRunscBinary(dir), (err: unknown) => isAsbError(err, 'Unavailable') && err.message.includes('CGO_ENABLED=0'));
});
