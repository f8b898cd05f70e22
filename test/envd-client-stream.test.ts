// Connect client streams as envd reads them (process.StreamInput, the Python SDK's stream_input):
// envelopes come in whatever pieces the network cuts them into. test/e2b-python.test.ts runs
// stream_input end to end.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AsbError } from '../src/errors.ts';
import { envelope, streamMessages } from '../src/worker/envd/connect.ts';

async function* chunks(bytes: Buffer, size: number): AsyncGenerator<Buffer> {
  for (let i = 0; i < bytes.length; i += size) {
    yield bytes.subarray(i, i + size);
    await Promise.resolve();
  }
}

async function read(bytes: Buffer, size: number, max = 1024): Promise<unknown[]> {
  const out: unknown[] = [];
  for await (const m of streamMessages(chunks(bytes, size), max)) out.push(m);
  return out;
}

const messages = [{ start: { process: { pid: 1000 } } }, { data: { input: { stdin: 'b25lCg==' } } }, { keepalive: {} }];
const body = Buffer.concat(messages.map((m) => envelope(0, m)));

test('messages come out whole however the body is cut', async () => {
  for (const size of [1, 2, 5, 7, body.length]) assert.deepEqual(await read(body, size), messages, `cut every ${String(size)} bytes`);
});

test('an end-stream envelope from the client ends the messages', async () => {
  assert.deepEqual(await read(Buffer.concat([envelope(0, { a: 1 }), envelope(2, {}), envelope(0, { b: 2 })]), 3), [{ a: 1 }]);
});

test('a cut-off, oversized or compressed envelope is refused with the reason', async () => {
  const refused = (code: string, re: RegExp) => (err: unknown) => err instanceof AsbError && err.code === code && re.test(err.message);
  await assert.rejects(read(body.subarray(0, body.length - 2), 4), refused('BadRequest', /ended inside a Connect envelope/));
  await assert.rejects(read(envelope(0, { big: 'x'.repeat(100) }), 16, 50), refused('PayloadTooLarge', /over the 50-byte limit/));
  await assert.rejects(read(envelope(1, {}), 16), refused('BadRequest', /compressed/));
});
