// The user namespace map in a runc pod's CRIU image is moved to a new pod's host id range (a fork
// from a snapshot): the bytes below are a real userns-14.img CRIU 4.1.1 wrote for a pod whose range
// starts at host id 0x140000 (1310720).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isAsbError } from '../src/errors.ts';
import { remapUsernsImage } from '../src/runtime/local/criu-userns.ts';

const DUMPED = Buffer.from('194356540649475518000000' + '0a0a080010808050188080041' + '20a08001080805018808004', 'hex');
const mapOf = (image: Uint8Array): string => Buffer.from(image).toString('hex');

test('the map of a dumped pod is moved to another range, and back to the very same bytes', () => {
  const moved = remapUsernsImage(DUMPED, 0x140000, 0x4150000);
  assert.notEqual(mapOf(moved), mapOf(DUMPED));
  // 0x4150000 needs one more varint byte: the entry's size grows with it.
  assert.equal(Buffer.from(moved).readUInt32LE(8), moved.length - 12);
  assert.ok(moved.length > DUMPED.length);
  assert.equal(mapOf(remapUsernsImage(moved, 0x4150000, 0x140000)), mapOf(DUMPED));
  // Another range's extents are left alone.
  assert.equal(mapOf(remapUsernsImage(DUMPED, 0x150000, 0x160000)), mapOf(DUMPED));
});

test('an image it does not understand is refused, never passed on half-rewritten', () => {
  assert.throws(() => remapUsernsImage(DUMPED.subarray(0, 20), 0x140000, 0x150000), (err) => isAsbError(err, 'Internal') && /cannot be read: its entry says 24 bytes, 8 follow/.test(err.message));
  const unknown = Buffer.from(DUMPED);
  unknown[12] = 0x1a; // field 3, length-delimited
  assert.throws(() => remapUsernsImage(unknown, 0x140000, 0x150000), (err) => isAsbError(err, 'Internal') && /unknown field 3/.test(err.message));
});
