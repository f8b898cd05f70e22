// Checks a JSON request body against a small field table: every problem (unknown field, wrong
// type, out of range) is collected and reported at once as 422 Invalid, each naming its field,
// before the route touches anything.
import { AsbError, type FieldProblem } from '../errors.ts';
import { isObjectName } from './access.ts';

interface KindTypes {
  string: string;
  boolean: boolean;
  integer: number;
  stringMap: Record<string, string>;
  /** An argv array, or a string run with `sh -c`. */
  command: string[] | string;
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

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

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
