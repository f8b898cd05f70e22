// The examples README.md and docs/ tell users to apply must stay valid.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import { parseManifests } from '../src/api/manifest.ts';

const dir = new URL('../examples/', import.meta.url);

test('every file under examples/ parses and validates', () => {
  const files = readdirSync(dir).filter((f) => f.endsWith('.yaml'));
  assert.ok(files.length > 0);
  for (const file of files) {
    const objects = parseManifests(readFileSync(new URL(file, dir), 'utf8'), file);
    assert.ok(objects.length > 0, `${file} holds objects`);
  }
});
