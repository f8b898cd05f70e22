// What a pod uses, from its cgroup's files (src/runtime/local/pod-usage.ts), pure: the parsing and
// the working set, on cgroup v1's and v2's names.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseFlatKeyed, workingSet } from '../src/runtime/local/pod-usage.ts';

test('memory.stat: the working set is usage less the inactive page cache, on v1 (hierarchical total_*) and v2', () => {
  const v1 = parseFlatKeyed('cache 1000\nrss 9000\ninactive_file 300\ntotal_cache 5000\ntotal_rss 9000\ntotal_inactive_file 4000\nhierarchical_memory_limit 9223372036854771712\n');
  assert.deepEqual(workingSet(20_000, v1), { workingSetBytes: 16_000, cacheBytes: 5000 }, 'v1 uses the total_* counters, which include child cgroups');
  const v2 = parseFlatKeyed('anon 9000\nfile 5000\nshmem 2000\ninactive_file 4000\n');
  assert.deepEqual(workingSet(20_000, v2), { workingSetBytes: 16_000, cacheBytes: 5000 });
  assert.deepEqual(workingSet(100, v2), { workingSetBytes: 0, cacheBytes: 5000 }, 'never negative (usage is sampled apart from the stat)');
});

test('cpu.stat and the like: key value lines, anything else skipped', () => {
  assert.deepEqual([...parseFlatKeyed('usage_usec 1234\nuser_usec 1000\n\nbad line here\nnr_periods x\n')], [['usage_usec', 1234], ['user_usec', 1000]]);
});
