// A pod process's stdout read line by line, for tests that drive a client inside a sandbox and
// read what it prints after each step (egress-cut, egress-proxy-cut).
import assert from 'node:assert/strict';
import type { PodProcess } from '../../src/runtime/runtime.ts';

/** The next `n` lines the process prints, each call bounded (30 s). */
export function lines(proc: PodProcess): (n: number) => Promise<string[]> {
  const seen: string[] = [];
  let buffered = '';
  let wake: (() => void) | undefined;
  proc.stdout.setEncoding('utf8');
  proc.stdout.on('data', (chunk: string) => {
    buffered += chunk;
    const parts = buffered.split('\n');
    buffered = parts.pop() ?? '';
    seen.push(...parts);
    wake?.();
  });
  return async (n) => {
    const deadline = Date.now() + 30_000;
    while (seen.length < n && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, 1000);
      });
    }
    assert.ok(seen.length >= n, `the pod's client printed ${String(seen.length)} of ${String(n)} lines: ${seen.join(' | ')}`);
    return seen.splice(0, n);
  };
}
