// A build's own egress policy (`asb template build --egress`) is what its RUN steps get, enforced
// on the build sandbox as a sandbox's policy is: the whole local system (worker with the real build
// engine, Envoy, router) whose --build-egress is the default (the internet), and a stand-in
// internet in a network namespace this file makes (test/support/egress-world.ts: 203.0.113.10 and
// 198.51.100.10 answer HTTP). A build that narrows to one address reaches that one only.
// Its own system: tag bg02, bridge asbbg02, subnet 10.205.0.0/16 (world link 10.205.254.0/30,
// routing table 2052).
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { PUBLIC_A, PUBLIC_B, startWorld } from './support/egress-world.ts';
import { startTestSystem } from './support/local-system.ts';
import { emptyDir, runAsb } from './support/run-asb.ts';

const TAG = 'bg02';

/** The exit code curl gave for `address` in the probe step's output. */
function probe(output: string, address: string): string | undefined {
  return new RegExp(`probe ${address.replaceAll('.', '\\.')} exit=(\\d+)`).exec(output)?.[1];
}

test('asb template build --egress ADDRESS: the build\'s RUN steps reach that address and nothing else, on a worker whose own --build-egress allows the internet', async (t) => {
  const system = await startTestSystem(TAG, 205, 'local', 0, false, ['team-a']);
  t.after(() => system.cleanup());
  const world = await startWorld({ bridge: `asb${TAG}`, netns: 'asbbg-world', veth: 'asbbgw2', table: 2052, link: '10.205.254.0/30' });
  t.after(() => world.close());
  const dir = emptyDir();
  writeFileSync(join(dir, 'Dockerfile'), [
    'FROM agent-sandbox/base',
    'USER root',
    `RUN for a in ${PUBLIC_A} ${PUBLIC_B}; do curl -sS -o /dev/null --max-time 5 "http://$a/" 2>/dev/null; echo "probe $a exit=$?"; done`,
    '',
  ].join('\n'));
  const env = { ASB_API_URL: system.edgeUrl, ASB_API_KEY: system.teamKeys['team-a'] ?? '' };
  const narrow = await runAsb(['template', 'build', 'narrow', '--egress', PUBLIC_B, '.'], { cwd: dir, env });
  assert.equal(narrow.code, 0, narrow.stderr);
  assert.deepEqual([probe(narrow.stderr, PUBLIC_A), probe(narrow.stderr, PUBLIC_B)], ['7', '0'], narrow.stderr);
  // The same step without --egress: the worker's policy, a different cache key, so it runs again and reaches both.
  const open = await runAsb(['template', 'build', 'open', '.'], { cwd: dir, env });
  assert.equal(open.code, 0, open.stderr);
  assert.doesNotMatch(open.stderr, /#2 CACHED/, open.stderr);
  assert.deepEqual([probe(open.stderr, PUBLIC_A), probe(open.stderr, PUBLIC_B)], ['0', '0'], open.stderr);
});
