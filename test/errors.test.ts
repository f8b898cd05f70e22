// The error catalogue in src/errors.ts and the one users read in docs/errors.md must agree:
// a code missing from the docs, or documented with another status, misleads every client.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { ERRORS } from '../src/errors.ts';

test('docs/errors.md lists every error code with its status, and nothing else', () => {
  const doc = readFileSync(new URL('../docs/errors.md', import.meta.url), 'utf8');
  const documented = new Map<string, number>();
  for (const m of doc.matchAll(/^\| (\w+) \| (\d{3}) \|/gm)) documented.set(m[1]!, Number(m[2]));
  const actual = new Map<string, number>(Object.entries(ERRORS).map(([code, e]) => [code, e.status]));
  assert.deepEqual([...documented.entries()].sort(), [...actual.entries()].sort());
});
