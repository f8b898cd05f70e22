// The body of POST /v1/sandboxes, checked the same way by the worker (which creates) and the hub
// (which places, then forwards it to a worker), so a bad body gets the same 422 naming the same
// fields wherever it is sent.
import { dnsLabelProblem } from '../api/names.ts';
import { AsbError } from '../errors.ts';
import { isObjectName } from '../api/names.ts';
import { checkBody, spawnProblems, type BodyOf } from './input.ts';
import { userLabelProblems } from './labels.ts';
import { isTaggedName } from '../builds/template-names.ts';

// A year: anything longer is a typo, and shutdownTime must stay a valid ISO date.
export const MAX_TIMEOUT_MS = 365 * 24 * 3600 * 1000;

export const CREATE_BODY = {
  template: { kind: 'string', min: 1, max: 253 },
  namespace: { kind: 'string', min: 1, max: 63 },
  labels: { kind: 'stringMap' },
  timeoutMs: { kind: 'integer', min: 1, max: MAX_TIMEOUT_MS },
  idleTimeoutMs: { kind: 'integer', min: 0, max: MAX_TIMEOUT_MS },
  wait: { kind: 'boolean' },
  coldStart: { kind: 'boolean' },
  /** At the hub: the preferred region. At a worker: must be the worker's own. */
  region: { kind: 'string', min: 1, max: 63 },
  /** At the hub: the only cluster to try. At a worker: must be the worker's own name. */
  cluster: { kind: 'string', min: 1, max: 63 },
  /** Replaces the template's egress policy: {internet?, allow?, deny?} (src/network/egress-policy.ts). */
  network: { kind: 'egress' },
  /** Environment for every command the API runs in the sandbox (exec, E2B's processes); an exec's own env wins. */
  env: { kind: 'stringMap' },
} as const;

export type CreateBody = BodyOf<typeof CREATE_BODY>;

/** The body with every field checked (names, labels, types, ranges), or 422 naming each bad one. */
export function checkCreateBody(raw: unknown): CreateBody {
  const body = checkBody(raw, CREATE_BODY);
  const problems = userLabelProblems(body.labels ?? {}, 'labels');
  if (body.namespace !== undefined && !isObjectName(body.namespace)) problems.push({ field: 'namespace', message: 'must be a DNS label: lower-case letters, digits and -' });
  if (body.template !== undefined && !isObjectName(body.template) && !isTaggedName(body.template)) problems.push({ field: 'template', message: 'must be a template name (a lower-case DNS name), or a built template\'s name:tag' });
  for (const field of ['region', 'cluster'] as const) {
    const value = body[field];
    const problem = value === undefined ? undefined : dnsLabelProblem(value);
    if (problem !== undefined) problems.push({ field, message: problem });
  }
  if (body.env !== undefined) problems.push(...spawnProblems({ env: { field: 'env', vars: body.env } }));
  if (problems.length > 0) throw new AsbError('Invalid', `request body is invalid: ${problems.map((f) => `${f.field}: ${f.message}`).join('; ')}`, { fields: problems });
  return body;
}
