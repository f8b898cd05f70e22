// A build's own egress policy is bounded by the worker's --build-egress (src/builds/build-egress.ts),
// and the policy a RUN step ran under is part of its cache key (src/builds/steps.ts): pure, no sockets.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { narrowEgress, NO_EGRESS, parseEgressText } from '../src/builds/build-egress.ts';
import type { BuildStep } from '../src/builds/contract.ts';
import { stepKey } from '../src/builds/steps.ts';
import { isAsbError } from '../src/errors.ts';
import { DEFAULT_EGRESS_POLICY, parseEgressPolicy, type EgressPolicy } from '../src/network/egress-policy.ts';

/** The message of the Forbidden a widening request gets. */
function widening(requested: EgressPolicy, worker: EgressPolicy): string {
  try {
    narrowEgress(requested, worker, 'egress');
  } catch (err) {
    assert.ok(isAsbError(err, 'Forbidden'), String(err));
    assert.equal(err.status, 403);
    return err.message;
  }
  return assert.fail('the request widened the worker\'s policy and was accepted');
}

const allow = (text: string): EgressPolicy => parseEgressText(text, 'egress');

test('under a worker that allows the internet a build may narrow to none, a list of public hosts, or keep the internet; a private range is a widening (default-private)', () => {
  const worker = DEFAULT_EGRESS_POLICY;
  assert.deepEqual(narrowEgress(NO_EGRESS, worker, 'egress'), { internet: false, allow: [], deny: [] });
  assert.deepEqual(narrowEgress(allow('pypi.org,203.0.113.0/24'), worker, 'egress'), { internet: false, allow: ['pypi.org', '203.0.113.0/24'], deny: [] });
  assert.deepEqual(narrowEgress(DEFAULT_EGRESS_POLICY, worker, 'egress'), DEFAULT_EGRESS_POLICY);
  assert.match(widening(allow('10.0.0.0/8'), worker), /egress\.allow\[0\]: "10\.0\.0\.0\/8" is not allowed by this worker's --build-egress \(rule default-private\)/);
  assert.match(widening(allow('169.254.169.254'), worker), /rule default-private/, 'the metadata address');
  assert.match(widening(allow('0.0.0.0/0'), worker), /rule default-private/, 'a catch-all allow would open the private ranges too');
});

test('under a worker allow-list a build may name what it covers (a CIDR inside, a name under a wildcard) and nothing else; the internet is a widening (default-no-internet)', () => {
  const worker = allow('203.0.113.0/24,*.debian.org,pypi.org');
  assert.deepEqual(narrowEgress(allow('203.0.113.128/25,deb.debian.org,*.security.debian.org,pypi.org'), worker, 'egress').allow, ['203.0.113.128/25', 'deb.debian.org', '*.security.debian.org', 'pypi.org']);
  const message = widening(allow('203.0.112.0/23,debian.org,files.pythonhosted.org'), worker);
  assert.match(message, /egress\.allow\[0\]: "203\.0\.112\.0\/23" is not allowed .*\(rule default-no-internet\)/);
  assert.match(message, /egress\.allow\[1\]: "debian\.org"/, 'a wildcard covers the names below it, not the name itself');
  assert.match(message, /egress\.allow\[2\]: "files\.pythonhosted\.org"/);
  assert.match(widening(DEFAULT_EGRESS_POLICY, worker), /egress\.internet: the internet is closed to builds on this worker \(rule default-no-internet of its --build-egress\)/);
  assert.match(widening(DEFAULT_EGRESS_POLICY, NO_EGRESS), /rule default-no-internet/);
  assert.match(widening(allow('pypi.org'), NO_EGRESS), /"pypi\.org" is not allowed/);
});

test('the worker\'s deny entries stay in force: a request cannot allow what they deny, and the effective policy keeps them', () => {
  const worker = parseEgressPolicy({ internet: true, deny: ['198.51.100.0/24', '*.tracker.example'] }, 'worker');
  assert.match(widening(allow('198.51.100.7'), worker), /rule deny 198\.51\.100\.0\/24/);
  assert.match(widening(allow('ads.tracker.example'), worker), /rule deny \*\.tracker\.example/);
  const effective = narrowEgress(parseEgressPolicy({ internet: true, deny: ['203.0.113.9'] }, 'egress'), worker, 'egress');
  assert.deepEqual(effective, { internet: true, allow: [], deny: ['198.51.100.0/24', '*.tracker.example', '203.0.113.9'] });
});

test('a RUN step built under one egress policy is not served from the cache under another; the same policy in any order is the same key; steps that reach no network keep theirs', () => {
  const run: BuildStep = { type: 'RUN', args: ['pip install requests'] };
  const config = { env: ['PATH=/usr/bin'] };
  const open = stepKey('sha256:base', run, config, DEFAULT_EGRESS_POLICY);
  assert.notEqual(stepKey('sha256:base', run, config, NO_EGRESS), open, '--build-egress none and the internet: different layers');
  assert.equal(stepKey('sha256:base', run, config), open, 'no policy given is the default policy');
  assert.notEqual(stepKey('sha256:base', run, config, allow('pypi.org')), stepKey('sha256:base', run, config, allow('pypi.org,files.pythonhosted.org')));
  assert.equal(stepKey('sha256:base', run, config, allow('pypi.org,203.0.113.0/24')), stepKey('sha256:base', run, config, allow('203.0.113.0/24,pypi.org')));
  const env: BuildStep = { type: 'ENV', args: ['A', '1'] };
  assert.equal(stepKey('sha256:base', env, config, NO_EGRESS), stepKey('sha256:base', env, config, DEFAULT_EGRESS_POLICY));
});
