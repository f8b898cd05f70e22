// Checks a JSON request body against a small field table: every problem (unknown field, wrong
// type, out of range) is collected and reported at once as 422 Invalid, each naming its field,
// before the route touches anything. Also what a command may be given (spawnProblems): input
// execve cannot take is 400 BadRequest naming each field, checked by every caller that runs one
// (REST exec, envd process.Start, E2B create's envVars), so spawn never fails on it with a 500.
import { AsbError, isAsbError, type FieldProblem } from '../errors.ts';
import { parseEgressPolicy } from '../network/egress-policy.ts';
import { isObjectName } from '../api/names.ts';
import { isPlainObject } from '../http/body.ts';

interface KindTypes {
  string: string;
  boolean: boolean;
  integer: number;
  stringMap: Record<string, string>;
  /** An argv array, or a string run with `sh -c`. */
  command: string[] | string;
  /** An egress policy {internet?, allow?, deny?} (parseEgressPolicy accepts it; the route parses it again to use it). */
  egress: unknown;
}

export interface FieldSpec {
  kind: keyof KindTypes;
  required?: boolean;
  /** integer: inclusive bounds. string: length bounds. */
  min?: number;
  max?: number;
}

export type BodySpec = Record<string, FieldSpec>;

export type BodyOf<S extends BodySpec> = {
  [K in keyof S]: S[K] extends { required: true } ? KindTypes[S[K]['kind']] : KindTypes[S[K]['kind']] | undefined;
};

function typeName(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return `a ${typeof value}`;
}

function checkField(name: string, spec: FieldSpec, value: unknown): FieldProblem | undefined {
  const got = typeName(value);
  switch (spec.kind) {
    case 'string':
      if (typeof value !== 'string') return { field: name, message: `must be a string, got ${got}` };
      if (spec.min !== undefined && value.length < spec.min) return { field: name, message: `must be at least ${spec.min} characters` };
      if (spec.max !== undefined && value.length > spec.max) return { field: name, message: `must be at most ${spec.max} characters` };
      return undefined;
    case 'boolean':
      return typeof value === 'boolean' ? undefined : { field: name, message: `must be true or false, got ${got}` };
    case 'integer':
      if (typeof value !== 'number' || !Number.isSafeInteger(value)) return { field: name, message: `must be an integer, got ${typeof value === 'number' ? String(value) : got}` };
      if (spec.min !== undefined && value < spec.min) return { field: name, message: `must be at least ${spec.min}, got ${value}` };
      if (spec.max !== undefined && value > spec.max) return { field: name, message: `must be at most ${spec.max}, got ${value}` };
      return undefined;
    case 'stringMap':
      if (!isPlainObject(value)) return { field: name, message: `must be an object of strings, got ${got}` };
      for (const [k, v] of Object.entries(value)) {
        if (typeof v !== 'string') return { field: `${name}.${k}`, message: `must be a string, got ${typeName(v)}` };
      }
      return undefined;
    case 'egress':
      try {
        parseEgressPolicy(value, name);
        return undefined;
      } catch (err) {
        if (!isAsbError(err, 'Invalid')) throw err;
        const first = err.fields[0];
        return { field: first?.field ?? name, message: err.fields.map((f) => (f === first ? f.message : `${f.field}: ${f.message}`)).join('; ') };
      }
    case 'command':
      if (typeof value === 'string') return value.length > 0 ? undefined : { field: name, message: 'must not be empty' };
      if (!Array.isArray(value)) return { field: name, message: `must be an array of strings or a shell command string, got ${got}` };
      if (value.length === 0) return { field: name, message: 'must have at least one element (the program to run)' };
      for (const [i, v] of value.entries()) {
        if (typeof v !== 'string') return { field: `${name}[${i}]`, message: `must be a string, got ${typeName(v)}` };
      }
      return undefined;
  }
}

/**
 * The body as a typed record, or 422 naming every bad field. An absent body (undefined) is `{}`,
 * so routes whose fields are all optional accept an empty request.
 */
export function checkBody<S extends BodySpec>(raw: unknown, spec: S): BodyOf<S> {
  const body = raw ?? {};
  if (!isPlainObject(body)) {
    throw new AsbError('BadRequest', `request body must be a JSON object, got ${typeName(body)}`);
  }
  const problems: FieldProblem[] = [];
  for (const name of Object.keys(body)) {
    if (!Object.hasOwn(spec, name)) {
      problems.push({ field: name, message: `unknown field; allowed fields are ${Object.keys(spec).join(', ') || 'none'}` });
    }
  }
  const out: Record<string, unknown> = {};
  for (const [name, fieldSpec] of Object.entries(spec)) {
    const value = body[name];
    if (value === undefined) {
      if (fieldSpec.required === true) problems.push({ field: name, message: 'is required' });
      continue;
    }
    const problem = checkField(name, fieldSpec, value);
    if (problem === undefined) out[name] = value;
    else problems.push(problem);
  }
  if (problems.length > 0) {
    const detail = problems.map((p) => `${p.field}: ${p.message}`).join('; ');
    throw new AsbError('Invalid', `request body is invalid: ${detail}`, { fields: problems });
  }
  return out as BodyOf<S>;
}

/** A query parameter parsed as a positive integer within bounds, or 400 naming it. */
export function queryInt(query: URLSearchParams, name: string, min: number, max: number): number | undefined {
  const raw = query.get(name);
  if (raw === null || raw === '') return undefined;
  const n = Number(raw);
  if (!/^\d+$/.test(raw) || !Number.isSafeInteger(n) || n < min || n > max) {
    throw new AsbError('BadRequest', `query parameter ${name} must be an integer from ${min} to ${max}, got "${raw}"`, {
      fields: [{ field: name, message: `must be an integer from ${min} to ${max}` }],
    });
  }
  return n;
}

/** The `namespace` query parameter, or `fallback` when absent; 400 when it is not a DNS label. */
export function namespaceQuery(query: URLSearchParams, fallback: string): string {
  const ns = query.get('namespace');
  if (ns === null || ns === '') return fallback;
  if (!isObjectName(ns)) {
    throw new AsbError('BadRequest', `query parameter namespace must be a DNS label, got "${ns}"`, { fields: [{ field: 'namespace', message: 'not a valid name' }] });
  }
  return ns;
}

/** Objects one apply (`POST /v1/apply`, the worker's and the hub's) may carry. */
export const MAX_APPLY_OBJECTS = 500;

/** The `objects` array of an apply body `{"objects": [...]}`, or the error that names what is wrong. */
export function applyList(raw: unknown): unknown[] {
  if (!isPlainObject(raw)) throw new AsbError('BadRequest', 'request body must be a JSON object {"objects": [...]}');
  const unknown = Object.keys(raw).filter((k) => k !== 'objects');
  if (unknown.length > 0) throw new AsbError('Invalid', `request body is invalid: unknown field ${unknown.join(', ')}; the only field is objects`, { fields: unknown.map((field) => ({ field, message: 'unknown field' })) });
  const list = raw.objects;
  if (!Array.isArray(list)) throw new AsbError('Invalid', 'request body is invalid: objects: must be an array of objects', { fields: [{ field: 'objects', message: 'must be an array' }] });
  if (list.length > MAX_APPLY_OBJECTS) throw new AsbError('Invalid', `request body is invalid: objects: at most ${MAX_APPLY_OBJECTS} objects per apply`, { fields: [{ field: 'objects', message: `at most ${MAX_APPLY_OBJECTS}` }] });
  return list;
}

/**
 * Linux MAX_ARG_STRLEN (32 pages of 4 KiB): the longest single argument or environment string
 * ("NAME=value") execve takes, its terminating NUL included; past it the spawn fails with E2BIG.
 */
export const MAX_ARG_BYTES = 32 * 4096 - 1;
/**
 * Every argument and environment string of one command together. execve allows a quarter of the
 * stack limit (ARG_MAX: 2 MiB under the usual 8 MiB); keeping callers to half of that leaves room
 * for the wrapper we run the command under (nsenter, setpriv, env: ~20 strings, ~4 KiB of paths)
 * and the pod's own environment, so a command under this never meets E2BIG.
 */
export const MAX_SPAWN_BYTES = 1024 * 1024;

/** What a caller asks to run, each part with the field of the request it came from. */
export interface SpawnInput {
  /** The command's field (named when all of it is too long) and its arguments, program first, each with its own field (`command[1]`, `process.args[0]`). */
  argv?: { field: string; args: readonly { field: string; value: string }[] };
  /** The environment and the field its names hang off (`env` → `env.PATH`). */
  env?: { field: string; vars: Readonly<Record<string, string>> };
  cwd?: { field: string; value: string };
}

/** argv entries named `<field>[i]`, or one entry named `<field>` for a string run by a shell. */
export function argvFields(field: string, command: readonly string[] | string): NonNullable<SpawnInput['argv']> {
  return { field, args: typeof command === 'string' ? [{ field, value: command }] : command.map((value, i) => ({ field: `${field}[${i}]`, value })) };
}

const NUL_MESSAGE = 'must not contain a NUL byte (a program cannot be given one)';

/**
 * What execve would refuse, as problems naming each field: a NUL byte anywhere (Node throws before
 * spawning), an environment name that is empty or holds "=", one string over MAX_ARG_BYTES, or
 * all of them together over MAX_SPAWN_BYTES (both E2BIG).
 */
export function spawnProblems(input: SpawnInput): FieldProblem[] {
  const problems: FieldProblem[] = [];
  const tooLong = (field: string, bytes: number): void => {
    problems.push({ field, message: `is ${bytes} bytes; one argument or environment variable may be at most ${MAX_ARG_BYTES} bytes (Linux MAX_ARG_STRLEN); pass large data through stdin or a file` });
  };
  let argvBytes = 0;
  for (const { field, value } of input.argv?.args ?? []) {
    const bytes = Buffer.byteLength(value, 'utf8');
    argvBytes += bytes + 1;
    if (value.includes('\0')) problems.push({ field, message: NUL_MESSAGE });
    else if (bytes > MAX_ARG_BYTES) tooLong(field, bytes);
  }
  let envBytes = 0;
  if (input.env !== undefined) {
    const { field, vars } = input.env;
    for (const [name, value] of Object.entries(vars)) {
      const bytes = Buffer.byteLength(name, 'utf8') + 1 + Buffer.byteLength(value, 'utf8');
      envBytes += bytes + 1;
      if (name === '') problems.push({ field, message: 'a variable name must not be empty' });
      else if (name.includes('\0')) problems.push({ field: `${field}.${name}`, message: `the name ${NUL_MESSAGE}` });
      else if (name.includes('=')) problems.push({ field: `${field}.${name}`, message: 'the name must not contain "="' });
      else if (value.includes('\0')) problems.push({ field: `${field}.${name}`, message: NUL_MESSAGE });
      else if (bytes > MAX_ARG_BYTES) tooLong(`${field}.${name}`, bytes);
    }
  }
  if (input.cwd?.value.includes('\0') === true) problems.push({ field: input.cwd.field, message: NUL_MESSAGE });
  if (problems.length === 0 && argvBytes + envBytes > MAX_SPAWN_BYTES) {
    const field = (argvBytes >= envBytes ? input.argv?.field : undefined) ?? input.env?.field ?? 'command';
    problems.push({ field, message: `arguments (${argvBytes} bytes) and environment (${envBytes} bytes) together may be at most ${MAX_SPAWN_BYTES} bytes; pass large data through stdin or a file` });
  }
  return problems;
}

/** Throws 400 naming every field execve would refuse (spawnProblems), before anything runs. */
export function checkSpawnInput(input: SpawnInput): void {
  const problems = spawnProblems(input);
  if (problems.length === 0) return;
  throw new AsbError('BadRequest', `cannot run the command: ${problems.map((p) => `${p.field}: ${p.message}`).join('; ')}`, { fields: problems });
}

/**
 * A spawn failure that is the caller's input after all (E2BIG: the pod's environment or a kernel
 * with a smaller limit pushed it over), as 400 naming `field`; any other error unchanged.
 */
export function spawnFailure(err: unknown, field: string): unknown {
  if (err instanceof AsbError || !(err instanceof Error) || (err as NodeJS.ErrnoException).code !== 'E2BIG') return err;
  const message = 'arguments and environment are too long for the kernel (E2BIG); pass large data through stdin or a file';
  return new AsbError('BadRequest', `cannot run the command: ${field}: ${message}`, { fields: [{ field, message }], cause: err });
}
