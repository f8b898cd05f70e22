// A BuildSpec from a request body, checked before anything runs: every problem (an unknown step
// type, the wrong number of arguments, a COPY whose files were never uploaded, an unknown field)
// is collected and reported at once as 422 Invalid, each naming its field (`steps[3].filesHash`).
import { AsbError, isAsbError, type FieldProblem } from '../errors.ts';
import { parseBuildEgressInput } from './build-egress.ts';
import { isObjectName } from '../api/names.ts';
import { isPlainObject } from '../http/body.ts';
import { MAX_STEPS, STEP_TYPES, type BuildSpec, type BuildStep } from './contract.ts';

/** One argument (a RUN's script, an ENV value): Linux's MAX_ARG_STRLEN, the most `sh -c` takes. */
export const MAX_ARG_BYTES = 32 * 4096 - 1;
const SHA256 = /^[0-9a-f]{64}$/;
/** Arguments each type takes: [min, max]; ENV takes pairs. */
const ARITY: Readonly<Record<BuildStep['type'], readonly [number, number]>> = {
  RUN: [1, 2],
  COPY: [2, 4],
  ENV: [2, Number.MAX_SAFE_INTEGER],
  WORKDIR: [1, 1],
  USER: [1, 1],
};
const SPEC_FIELDS = ['from', 'steps', 'startCmd', 'readyCmd', 'noCache', 'cpuCount', 'memoryMB', 'egress'];
const STEP_FIELDS = ['type', 'args', 'filesHash', 'force'];

export function isSha256(value: string): boolean {
  return SHA256.test(value);
}

function typeName(value: unknown): string {
  if (value === null) return 'null';
  return Array.isArray(value) ? 'an array' : `a ${typeof value}`;
}

function checkStep(raw: unknown, at: string, hasFile: (hash: string) => boolean, problems: FieldProblem[]): BuildStep | undefined {
  const bad = (field: string, message: string): undefined => {
    problems.push({ field: `${at}${field}`, message });
    return undefined;
  };
  if (!isPlainObject(raw)) return bad('', `must be an object {type, args, filesHash?, force?}, got ${typeName(raw)}`);
  for (const k of Object.keys(raw)) if (!STEP_FIELDS.includes(k)) bad(`.${k}`, `unknown field; a step has ${STEP_FIELDS.join(', ')}`);
  const type = raw.type;
  if (typeof type !== 'string' || !(STEP_TYPES as readonly string[]).includes(type)) {
    return bad('.type', `unknown step type ${JSON.stringify(type)}; the types are ${STEP_TYPES.join(', ')}`);
  }
  const t = type as BuildStep['type'];
  const args = raw.args;
  if (!Array.isArray(args)) return bad('.args', `must be an array of strings, got ${typeName(args)}`);
  const strings: string[] = [];
  for (const [i, a] of (args as unknown[]).entries()) {
    if (typeof a !== 'string') bad(`.args[${i}]`, `must be a string, got ${typeName(a)}`);
    else if (a.includes('\0')) bad(`.args[${i}]`, 'must not contain a NUL byte');
    else if (Buffer.byteLength(a) > MAX_ARG_BYTES) bad(`.args[${i}]`, `is longer than ${MAX_ARG_BYTES} bytes`);
    else strings.push(a);
  }
  if (strings.length !== args.length) return undefined;
  const [min, max] = ARITY[t];
  if (strings.length < min || strings.length > max) return bad('.args', `${t} takes ${min === max ? String(min) : max === Number.MAX_SAFE_INTEGER ? `${min} or more` : `${min} to ${max}`} arguments, got ${strings.length}`);
  if (t === 'ENV' && strings.length % 2 !== 0) return bad('.args', 'ENV takes name, value pairs; the last name has no value');
  if (t !== 'ENV' && t !== 'COPY' && (strings[0] ?? '') === '') return bad('.args[0]', 'must not be empty');
  if (t === 'COPY' && ((strings[0] ?? '') === '' || (strings[1] ?? '') === '')) return bad('.args', 'COPY needs a source and a destination');
  if (t === 'COPY' && (strings[3] ?? '') !== '' && !/^[0-7]{3,4}$/.test(strings[3] ?? '')) bad('.args[3]', `must be an octal mode such as 0755, got "${strings[3] ?? ''}"`);
  const step: BuildStep = { type: t, args: strings };
  const hash = raw.filesHash;
  if (t === 'COPY') {
    if (typeof hash !== 'string' || !isSha256(hash)) return bad('.filesHash', `a COPY needs filesHash, the sha256 (64 lower-case hex digits) of the uploaded tar of its files, got ${hash === undefined ? 'none' : JSON.stringify(hash)}`);
    if (!hasFile(hash)) return bad('.filesHash', `no files with sha256 ${hash} were uploaded by this team; upload the tar first (PUT /v1/templates/{name}/files/${hash})`);
    step.filesHash = hash;
  } else if (hash !== undefined) {
    return bad('.filesHash', `only a COPY step takes filesHash, not ${t}`);
  }
  if (raw.force !== undefined) {
    if (typeof raw.force !== 'boolean') return bad('.force', `must be true or false, got ${typeName(raw.force)}`);
    step.force = raw.force;
  }
  return step;
}

/** The spec, or 422 naming every bad field. `hasFile` tells whether the caller's team uploaded a tar. */
export function checkBuildSpec(raw: unknown, hasFile: (hash: string) => boolean): BuildSpec {
  if (!isPlainObject(raw)) throw new AsbError('BadRequest', `request body must be a JSON object {from, steps, startCmd?, readyCmd?, noCache?, cpuCount?, memoryMB?, egress?}, got ${typeName(raw)}`);
  const problems: FieldProblem[] = [];
  for (const k of Object.keys(raw)) if (!SPEC_FIELDS.includes(k)) problems.push({ field: k, message: `unknown field; allowed fields are ${SPEC_FIELDS.join(', ')}` });
  let from: BuildSpec['from'] | undefined;
  const f = raw.from;
  if (!isPlainObject(f) || Object.keys(f).length !== 1 || (typeof f.image !== 'string' && typeof f.template !== 'string')) {
    problems.push({ field: 'from', message: 'must be {"image": "<reference>"} or {"template": "<name>"}' });
  } else if (typeof f.image === 'string') {
    if (f.image === '' || f.image.length > 1024 || /\s/.test(f.image)) problems.push({ field: 'from.image', message: `must be an image reference, got ${JSON.stringify(f.image.slice(0, 200))}` });
    else from = { image: f.image };
  } else if (typeof f.template === 'string') {
    if (!isObjectName(f.template)) problems.push({ field: 'from.template', message: `must be a template name (a DNS label), got ${JSON.stringify(f.template.slice(0, 200))}` });
    else from = { template: f.template };
  }
  const steps: BuildStep[] = [];
  if (raw.steps !== undefined && !Array.isArray(raw.steps)) problems.push({ field: 'steps', message: `must be an array of steps, got ${typeName(raw.steps)}` });
  else if (Array.isArray(raw.steps)) {
    if (raw.steps.length > MAX_STEPS) problems.push({ field: 'steps', message: `at most ${MAX_STEPS} steps, got ${raw.steps.length}` });
    else for (const [i, s] of (raw.steps as unknown[]).entries()) {
      const step = checkStep(s, `steps[${i}]`, hasFile, problems);
      if (step !== undefined) steps.push(step);
    }
  }
  const spec: BuildSpec = { from: from ?? { image: '' }, steps };
  for (const k of ['startCmd', 'readyCmd'] as const) {
    const v = raw[k];
    if (v === undefined) continue;
    if (typeof v !== 'string' || v.trim() === '' || v.includes('\0') || Buffer.byteLength(v) > MAX_ARG_BYTES) problems.push({ field: k, message: `must be a non-empty shell command of at most ${MAX_ARG_BYTES} bytes without NUL` });
    else spec[k] = v;
  }
  if (raw.noCache !== undefined) {
    if (typeof raw.noCache !== 'boolean') problems.push({ field: 'noCache', message: `must be true or false, got ${typeName(raw.noCache)}` });
    else spec.noCache = raw.noCache;
  }
  const int = (k: 'cpuCount' | 'memoryMB', min: number, max: number): void => {
    const v = raw[k];
    if (v === undefined) return;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) problems.push({ field: k, message: `must be an integer from ${min} to ${max}, got ${JSON.stringify(v)}` });
    else spec[k] = v;
  };
  int('cpuCount', 1, 64);
  int('memoryMB', 128, 262_144);
  if (raw.egress !== undefined) {
    try {
      spec.egress = parseBuildEgressInput(raw.egress, 'egress');
    } catch (err) {
      if (!isAsbError(err)) throw err;
      problems.push(...(err.fields.length > 0 ? err.fields : [{ field: 'egress', message: err.message }]));
    }
  }
  if (problems.length > 0) throw new AsbError('Invalid', `build is invalid: ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}`, { fields: problems });
  return spec;
}
