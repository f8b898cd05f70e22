// Which OCI runtime a local pod runs under, from its runtimeClassName (src/runtime/local/runtime-class.ts).
// test/runtime-gvisor.test.ts runs both for real.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decideRuntimeClass } from '../src/runtime/local/runtime-class.ts';

test('no runtimeClassName runs under runc, gvisor under runsc, whatever else fails naming what is offered', () => {
  for (const none of [undefined, null, '']) assert.deepEqual(decideRuntimeClass(none, undefined), { ok: true, kind: 'runc' });
  assert.deepEqual(decideRuntimeClass('gvisor', undefined), { ok: true, kind: 'runsc' });
  for (const name of ['kata', 'runc', 'gVisor', 'gvisor ']) {
    assert.deepEqual(decideRuntimeClass(name, undefined), {
      ok: false,
      reason: 'RuntimeClassNotFound',
      message: `RuntimeClass ${JSON.stringify(name)} not found: the local runtime runs a pod with no runtimeClassName under runc, and runtimeClassName "gvisor" under gVisor`,
    });
  }
  assert.match((decideRuntimeClass(7, undefined) as { message: string }).message, /^RuntimeClass of type number not found/);
});

test('gvisor on a worker without runsc fails the pod saying why, never falling back to runc', () => {
  assert.deepEqual(decideRuntimeClass('gvisor', 'runsc is not built: run `make runsc`'), {
    ok: false,
    reason: 'RuntimeUnavailable',
    message: 'runtimeClassName "gvisor" needs gVisor, which this worker cannot run: runsc is not built: run `make runsc`',
  });
  assert.deepEqual(decideRuntimeClass(undefined, 'runsc is not built'), { ok: true, kind: 'runc' });
});
