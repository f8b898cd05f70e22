// Our own steps file, the other front end of `asb template build` (-f steps.yaml / steps.json):
// a BuildSpec as YAML or JSON, E2B's wire steps written by hand, where a COPY names its source in
// the build context and no filesHash (the CLI packs and uploads it as for a Dockerfile):
//
//   from: { image: agent-sandbox/base }        # or { template: my-other-template }
//   steps:
//     - { type: COPY, args: [app, /srv/app/] }
//     - { type: RUN, args: [pip install -r /srv/app/requirements.txt] }
//     - { type: ENV, args: [MODE, production] }
//   startCmd: python3 /srv/app/main.py
//   readyCmd: curl -fs localhost:8000/
//
// Only the shape the CLI needs is checked here; the worker checks the whole spec (422 naming each
// field) before anything runs.
import { parse } from 'yaml';
import { AsbError } from '../errors.ts';
import type { BuildSpec, BuildStep } from './contract.ts';
import { contextPath, type ParsedDockerfile, type PlannedStep } from './dockerfile.ts';

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function fail(file: string, message: string): never {
  throw new AsbError('BadRequest', `${file}: ${message}`);
}

/** Whether a -f file is a steps file (by its extension) rather than a Dockerfile. */
export function isStepsFile(name: string): boolean {
  return /\.(ya?ml|json)$/i.test(name);
}

/** The steps file as the same plan a Dockerfile gives (a COPY's source to pack, each step's text). */
export function parseStepsFile(text: string, file: string): ParsedDockerfile & { extra: Pick<BuildSpec, 'cpuCount' | 'memoryMB' | 'noCache'> } {
  let raw: unknown;
  try {
    raw = parse(text);
  } catch (err) {
    fail(file, `not valid YAML or JSON: ${(err as Error).message.split('\n')[0] ?? ''}`);
  }
  if (!isRecord(raw)) fail(file, 'must be an object with from and steps');
  const from = raw.from;
  if (!isRecord(from) || (typeof from.image !== 'string' && typeof from.template !== 'string')) fail(file, 'from must be {image: <reference>} or {template: <name>}');
  const list = raw.steps ?? [];
  if (!Array.isArray(list)) fail(file, 'steps must be a list');
  const steps: PlannedStep[] = [];
  for (const [i, s] of (list as unknown[]).entries()) {
    if (!isRecord(s) || typeof s.type !== 'string' || !Array.isArray(s.args) || !s.args.every((a): a is string => typeof a === 'string')) {
      fail(file, `steps[${i}] must be {type: RUN|COPY|ENV|WORKDIR|USER, args: [strings]}`);
    }
    const step = { ...s, type: s.type.toUpperCase(), args: s.args } as BuildStep;
    const planned: PlannedStep = { step, line: 0, text: `${step.type} ${step.args.join(' ')}` };
    if (step.type === 'COPY' && step.filesHash === undefined) {
      const source = contextPath(step.args[0] ?? '');
      if (source === undefined || (step.args[0] ?? '') === '') fail(file, `steps[${i}]: COPY source "${step.args[0] ?? ''}" must be a path inside the build context`);
      planned.source = source;
    }
    steps.push(planned);
  }
  const str = (k: string): string | undefined => (typeof raw[k] === 'string' ? raw[k] : undefined);
  const startCmd = str('startCmd');
  const readyCmd = str('readyCmd');
  const extra: Pick<BuildSpec, 'cpuCount' | 'memoryMB' | 'noCache'> = {};
  if (typeof raw.cpuCount === 'number') extra.cpuCount = raw.cpuCount;
  if (typeof raw.memoryMB === 'number') extra.memoryMB = raw.memoryMB;
  if (raw.noCache === true) extra.noCache = true;
  return {
    from: typeof from.image === 'string' ? { image: from.image } : { template: String(from.template) },
    steps,
    ...(startCmd === undefined ? {} : { startCmd }),
    ...(readyCmd === undefined ? {} : { readyCmd }),
    warnings: [],
    extra,
  };
}
