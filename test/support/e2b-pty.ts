// The E2B SDK's terminal round trip, shared by the runc (e2b-sdk) and gVisor (e2e-gvisor) tests:
// a PTY with a size, input echoed back, a resize the program inside sees, and a kill.
import assert from 'node:assert/strict';
import type { Sandbox } from 'e2b';
import { waitFor } from './wait.ts';

/** Sandbox.pty of either SDK version the tests load (they share this surface). */
export async function checkPtyRoundTrip(pty: Sandbox['pty']): Promise<void> {
  let screen = '';
  const decoder = new TextDecoder();
  const term = await pty.create({ cols: 80, rows: 24, onData: (d) => { screen += decoder.decode(d); } });
  await pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo mark-$((6*7))\n'));
  await waitFor('the pty size and the echo', () => Promise.resolve(/24 80/.test(screen) && screen.includes('mark-42') ? true : undefined), 10_000);
  await pty.resize(term.pid, { cols: 100, rows: 30 });
  await pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'));
  await waitFor('the new size', () => Promise.resolve(/30 100/.test(screen) ? true : undefined), 10_000);
  assert.equal(await pty.kill(term.pid), true);
}
