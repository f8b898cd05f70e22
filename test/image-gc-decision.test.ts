// Image GC's rules (src/images/gc-decision.ts), without a cache: what goes and what stays given
// the records, trees, pins and times. test/image-gc.test.ts runs them on a real cache and pods.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chainOfTree, decideGc, type GcInput, type GcPin } from '../src/images/gc-decision.ts';

const HOUR = 3_600_000;
const NOW = 100 * HOUR;
const LONG_AGO = NOW - 10 * HOUR;

const BASE = 'docker.io/agent-sandbox/base:latest';
const PYTHON = 'docker.io/library/python:3.11';
const BUSYBOX = 'docker.io/library/busybox:latest';

/** base and python:3.11 share chain A; busybox is chain B; each has a plain and an id-mapped tree. */
function input(over: Partial<GcInput> = {}): GcInput {
  return {
    now: NOW,
    graceMs: HOUR,
    keep: new Set(),
    records: [
      { tag: 'rbase', reference: BASE, chainDir: 'sha256-a', usedAt: LONG_AGO },
      { tag: 'rpython', reference: PYTHON, chainDir: 'sha256-a', usedAt: LONG_AGO },
      { tag: 'rbusybox', reference: BUSYBOX, chainDir: 'sha256-b', usedAt: LONG_AGO },
    ],
    trees: [
      { dir: 'sha256-a', usedAt: LONG_AGO },
      { dir: 'sha256-a_u100000-65536', usedAt: LONG_AGO },
      { dir: 'sha256-b', usedAt: LONG_AGO },
      { dir: 'sha256-b_u100000-65536', usedAt: LONG_AGO },
    ],
    pins: [],
    ...over,
  };
}

function pin(file: string, references: string[], trees: string[], podDirExists = true, pinnedAt = LONG_AGO): GcPin {
  return { file, podDirExists, pinnedAt, references, trees };
}

test('nothing pinned, nothing recent: every record and tree goes', () => {
  const plan = decideGc(input());
  assert.deepEqual([...plan.records].sort(), ['rbase', 'rbusybox', 'rpython']);
  assert.equal(plan.trees.length, 4);
  assert.deepEqual(plan.stalePins, []);
});

test('a live pin (running or hibernated pod: its dir exists) keeps its reference and every tree of its chain', () => {
  const plan = decideGc(input({ pins: [pin('p1', [BUSYBOX], ['sha256-b_u100000-65536'])] }));
  assert.deepEqual([...plan.records].sort(), ['rbase', 'rpython']);
  assert.deepEqual([...plan.trees].sort(), ['sha256-a', 'sha256-a_u100000-65536']);
});

test('two references of one chain: the tree stays while either is kept; the other record goes', () => {
  const plan = decideGc(input({ pins: [pin('p1', [PYTHON], [])] }));
  assert.deepEqual([...plan.records].sort(), ['rbase', 'rbusybox']);
  assert.deepEqual([...plan.trees].sort(), ['sha256-b', 'sha256-b_u100000-65536']);
});

test('a hibernated pod whose tag moved keeps the tree it ran, though no record names that chain any more', () => {
  // base:latest now names chain C; the pod ran chain A and pinned its id-mapped tree.
  const records = [{ tag: 'rbase', reference: BASE, chainDir: 'sha256-c', usedAt: LONG_AGO }];
  const trees = [{ dir: 'sha256-a_u100000-65536', usedAt: LONG_AGO }, { dir: 'sha256-c', usedAt: LONG_AGO }];
  const plan = decideGc(input({ records, trees, pins: [pin('p1', [BASE], ['sha256-a_u100000-65536'])] }));
  assert.deepEqual(plan.records, []);
  assert.deepEqual(plan.trees, []);
});

test('a pin whose pod dir is gone (its worker was killed before unpinning) is stale: removed, and it keeps nothing', () => {
  const plan = decideGc(input({ pins: [pin('dead', [BUSYBOX], ['sha256-b'], false)] }));
  assert.deepEqual(plan.stalePins, ['dead']);
  assert.ok(plan.records.includes('rbusybox'));
  assert.ok(plan.trees.includes('sha256-b'));
});

test('a pin younger than the grace counts even before its pod dir exists', () => {
  const plan = decideGc(input({ pins: [pin('new', [BUSYBOX], [], false, NOW - 1000)] }));
  assert.deepEqual(plan.stalePins, []);
  assert.ok(!plan.records.includes('rbusybox'));
});

test('grace: an image pulled or used within it stays unpinned (pulled for a sandbox not started yet); one a second older goes', () => {
  const records = input().records.map((r) => (r.tag === 'rbusybox' ? { ...r, usedAt: NOW - HOUR + 1 } : r.tag === 'rbase' ? { ...r, usedAt: NOW - HOUR } : r));
  const plan = decideGc(input({ records }));
  assert.ok(!plan.records.includes('rbusybox'));
  assert.ok(!plan.trees.includes('sha256-b') && !plan.trees.includes('sha256-b_u100000-65536'));
  assert.ok(plan.records.includes('rbase'));
  // python:3.11 shares base's chain and is just as old: the chain's trees go with both.
  assert.ok(plan.trees.includes('sha256-a'));
});

test('a tree unpacked within the grace stays even with no record (an unpack of pull policy Never)', () => {
  const trees = [{ dir: 'sha256-d', usedAt: NOW - 1000 }];
  assert.deepEqual(decideGc(input({ trees })).trees, []);
  assert.deepEqual(decideGc(input({ trees, graceMs: 0 })).trees, ['sha256-d']);
});

test('keep names references whatever the pins say', () => {
  const plan = decideGc(input({ keep: new Set([BASE]) }));
  assert.deepEqual([...plan.records].sort(), ['rbusybox', 'rpython']);
  assert.deepEqual([...plan.trees].sort(), ['sha256-b', 'sha256-b_u100000-65536']);
});

test('an id-mapped tree belongs to its chain', () => {
  assert.equal(chainOfTree('sha256-abc_u100000-65536'), 'sha256-abc');
  assert.equal(chainOfTree('sha256-abc'), 'sha256-abc');
});
