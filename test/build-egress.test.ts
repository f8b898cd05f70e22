// What a template build's RUN steps may reach is the worker's --build-egress, enforced on the build
// sandbox like any sandbox's egress policy: the whole local system (worker with the real build
// engine, Envoy, router) builds with `asb template build`, and a stand-in internet in a network
// namespace this file makes (test/support/egress-world.ts: 203.0.113.10 and 198.51.100.10 answer
// HTTP with "world <address>"). With the default (`internet`) a step reaches the world; with an
// allow-list naming one address, only that one (the internet is off, as with `none`); with `none`,
// nothing, and a step that needs the network fails the build with curl's error in its output.
// Its own systems, one after the other: tag bt02, bridge asbbt02, subnet 10.241.0.0/16 (world link
// 10.241.254.0/30, routing table 2412).
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { PUBLIC_A, PUBLIC_B, startWorld } from './support/egress-world.ts';
import { startTestSystem } from './support/local-system.ts';
import { emptyDir, runAsb, type RunResult } from './support/run-asb.ts';

const TAG = 'bt02';

/** A Dockerfile whose one RUN step tries both world addresses and prints curl's exit code for each (7: refused). */
const PROBE = [
  'FROM agent-sandbox/base',
  'USER root',
  `RUN for a in ${PUBLIC_A} ${PUBLIC_B}; do curl -sS -o /dev/null --max-time 5 "http://$a/" 2>/dev/null; echo "probe $a exit=$?"; done`,
  '',
].join('\n');

/** Builds `dockerfile` as template `name` on a fresh system whose worker gets `workerArgs`; the CLI's result. */
async function buildOn(t: TestContext, workerArgs: string[], name: string, dockerfile: string): Promise<RunResult> {
  const system = await startTestSystem(TAG, 241, 'local', 0, false, ['team-a'], workerArgs);
  t.after(() => system.cleanup());
  const world = await startWorld({ bridge: `asb${TAG}`, netns: 'asbbt-world', veth: 'asbbtw2', table: 2412, link: '10.241.254.0/30' });
  t.after(() => world.close());
  const dir = emptyDir();
  writeFileSync(join(dir, 'Dockerfile'), dockerfile);
  const result = await runAsb(['template', 'build', name, '.'], { cwd: dir, env: { ASB_API_URL: system.edgeUrl, ASB_API_KEY: system.teamKeys['team-a'] ?? '' } });
  await world.close();
  await system.cleanup();
  return result;
}

/** The exit code curl gave for `address` in the probe step's output. */
function probe(output: string, address: string): string | undefined {
  return new RegExp(`probe ${address.replaceAll('.', '\\.')} exit=(\\d+)`).exec(output)?.[1];
}

test('a build\'s RUN steps reach what --build-egress allows: the internet by default, one address of an allow-list and nothing else, nothing with none', async (t) => {
  await t.test('default (internet): the step reaches both world addresses', async (t) => {
    const r = await buildOn(t, [], 'open', PROBE);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual([probe(r.stderr, PUBLIC_A), probe(r.stderr, PUBLIC_B)], ['0', '0'], r.stderr);
  });

  await t.test(`--build-egress ${PUBLIC_B}: only that address; the rest of the internet is refused`, async (t) => {
    const r = await buildOn(t, ['--build-egress', PUBLIC_B], 'walled', PROBE);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual([probe(r.stderr, PUBLIC_A), probe(r.stderr, PUBLIC_B)], ['7', '0'], r.stderr);
  });

  await t.test('--build-egress none: a step that needs the network fails the build, showing why', async (t) => {
    const r = await buildOn(t, ['--build-egress', 'none'], 'offline', ['FROM agent-sandbox/base', `RUN curl -sS --max-time 5 http://${PUBLIC_B}/`, ''].join('\n'));
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /Failed to connect to 198\.51\.100\.10 port 80/);
    assert.match(r.stderr, /ERROR: build of template offline failed at step 1\/1 \(Dockerfile line 2: RUN curl/);
  });
});
