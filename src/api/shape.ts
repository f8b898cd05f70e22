// Shape checks for user-written objects. Each check records a problem and returns undefined
// instead of throwing, so one pass over an object lists every problem at once (the user fixes
// a manifest in one round trip, not one error at a time).
import type { FieldProblem } from '../errors.ts';

export type Problems = FieldProblem[];
export type Fields = Record<string, unknown>;

export interface IntRange {
  min?: number;
  max?: number;
}

/** `spec` + `replicas` → `spec.replicas`; `containers` + 0 → `containers[0]`; odd keys are quoted. */
export function join(path: string, key: string | number): string {
  if (typeof key === 'number') return `${path}[${key}]`;
  if (!/^[A-Za-z_$][\w$-]*$/.test(key)) return `${path}[${JSON.stringify(key)}]`;
  return path === '' ? key : `${path}.${key}`;
}

export function report(problems: Problems, field: string, message: string): void {
  problems.push({ field, message });
}

/** The JSON type name a user would recognise: null and array are not "object". */
export function typeOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  return typeof value;
}

export function isFields(value: unknown): value is Fields {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function wrongType(problems: Problems, path: string, want: string, value: unknown): undefined {
  report(problems, path, `must be ${want}, got ${typeOf(value)}`);
  return undefined;
}

function missing(problems: Problems, path: string): undefined {
  report(problems, path, 'is required');
  return undefined;
}

export function optObject(problems: Problems, path: string, value: unknown): Fields | undefined {
  if (value === undefined) return undefined;
  return isFields(value) ? value : wrongType(problems, path, 'an object', value);
}

export function reqObject(problems: Problems, path: string, value: unknown): Fields | undefined {
  return value === undefined ? missing(problems, path) : optObject(problems, path, value);
}

export function optString(problems: Problems, path: string, value: unknown): string | undefined {
  if (value === undefined) return undefined;
  return typeof value === 'string' ? value : wrongType(problems, path, 'a string', value);
}

/** Required and non-empty: an empty name is as useless as a missing one. */
export function reqString(problems: Problems, path: string, value: unknown): string | undefined {
  if (value === undefined || value === '') return missing(problems, path);
  return optString(problems, path, value);
}

export function optBoolean(problems: Problems, path: string, value: unknown): boolean | undefined {
  if (value === undefined) return undefined;
  return typeof value === 'boolean' ? value : wrongType(problems, path, 'a boolean', value);
}

export function optInt(problems: Problems, path: string, value: unknown, range: IntRange = {}): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'number') return wrongType(problems, path, 'an integer', value);
  if (!Number.isInteger(value)) {
    report(problems, path, `must be an integer, got ${value}`);
    return undefined;
  }
  if (range.min !== undefined && value < range.min) {
    report(problems, path, `must be at least ${range.min}, got ${value}`);
    return undefined;
  }
  if (range.max !== undefined && value > range.max) {
    report(problems, path, `must be at most ${range.max}, got ${value}`);
    return undefined;
  }
  return value;
}

export function optArray(problems: Problems, path: string, value: unknown): unknown[] | undefined {
  if (value === undefined) return undefined;
  return Array.isArray(value) ? value : wrongType(problems, path, 'an array', value);
}

export function optStringArray(problems: Problems, path: string, value: unknown): string[] | undefined {
  const list = optArray(problems, path, value);
  if (list === undefined) return undefined;
  let ok = true;
  for (const [i, item] of list.entries()) {
    if (typeof item === 'string') continue;
    wrongType(problems, join(path, i), 'a string', item);
    ok = false;
  }
  return ok ? (list as string[]) : undefined;
}

export function optEnum<T extends string>(problems: Problems, path: string, value: unknown, allowed: readonly T[]): T | undefined {
  const s = optString(problems, path, value);
  if (s === undefined) return undefined;
  if ((allowed as readonly string[]).includes(s)) return s as T;
  report(problems, path, `must be one of ${allowed.join(', ')}, got ${JSON.stringify(s)}`);
  return undefined;
}

/**
 * Rejects keys outside `allowed` at the levels this API defines. A typo such as `replica`
 * would otherwise be dropped silently and the user would get a default they did not ask for.
 */
export function onlyKnown(problems: Problems, path: string, fields: Fields, allowed: readonly string[]): void {
  for (const key of Object.keys(fields)) {
    if (allowed.includes(key)) continue;
    const guess = closest(key, allowed);
    const hint = guess === undefined ? `known fields: ${allowed.join(', ')}` : `did you mean ${JSON.stringify(guess)}?`;
    report(problems, join(path, key), `unknown field; ${hint}`);
  }
}

/** A string→string map such as labels; `check` returns a problem for one entry, if any. */
export function optStringMap(
  problems: Problems,
  path: string,
  value: unknown,
  check?: (key: string, value: string) => string | undefined,
): Record<string, string> | undefined {
  const map = optObject(problems, path, value);
  if (map === undefined) return undefined;
  let ok = true;
  for (const [key, v] of Object.entries(map)) {
    const at = join(path, key);
    if (typeof v !== 'string') {
      wrongType(problems, at, 'a string', v);
      ok = false;
      continue;
    }
    const problem = check?.(key, v);
    if (problem !== undefined) {
      report(problems, at, problem);
      ok = false;
    }
  }
  return ok ? (map as Record<string, string>) : undefined;
}

/** Records a problem at every entry whose name an earlier entry already used. */
export function noDuplicates(problems: Problems, entries: readonly { name: string; path: string }[]): void {
  const first = new Map<string, string>();
  for (const { name, path } of entries) {
    const prev = first.get(name);
    if (prev === undefined) first.set(name, path);
    else report(problems, path, `duplicate name ${JSON.stringify(name)}: ${prev} already uses it`);
  }
}

// Suggest a known field within edit distance 2 (or differing only in case): catches
// `warmPool`/`warmpool` and `replica`/`replicas` without suggesting nonsense.
function closest(key: string, allowed: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = 3;
  for (const candidate of allowed) {
    const d = candidate.toLowerCase() === key.toLowerCase() ? 0 : editDistance(key, candidate);
    if (d < bestDistance) {
      best = candidate;
      bestDistance = d;
    }
  }
  return best;
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      row.push(Math.min((prev[j] ?? 0) + 1, (row[j - 1] ?? 0) + 1, (prev[j - 1] ?? 0) + cost));
    }
    prev = row;
  }
  return prev[b.length] ?? 0;
}
