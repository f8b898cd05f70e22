// Kubernetes label selectors in their string form, parsed once and matched many times.
// Grammar (the apiserver's): comma-separated requirements, each one of
//   key=value  key==value  key!=value  key  !key  key in (v1,v2)  key notin (v1,v2)
// All requirements must hold. An empty selector matches everything.
import { AsbError } from '../errors.ts';

export type Requirement =
  | { op: 'eq' | 'neq'; key: string; value: string }
  | { op: 'in' | 'notin'; key: string; values: readonly string[] }
  | { op: 'exists' | 'notexists'; key: string };

export interface Selector {
  readonly requirements: readonly Requirement[];
}

export const EVERYTHING: Selector = Object.freeze({ requirements: Object.freeze([]) });

// Label keys are an optional DNS prefix plus a name; values are the name part. We accept the
// apiserver's character set and leave length limits to validation of the objects themselves.
const KEY = /^([a-z0-9]([-a-z0-9.]*[a-z0-9])?\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/;

function bad(selector: string, why: string): AsbError {
  return new AsbError('BadRequest', `invalid label selector "${selector}": ${why}`);
}

/** Splits on commas that are not inside a parenthesised value set. */
function splitTopLevel(selector: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < selector.length; i++) {
    const ch = selector[i];
    if (ch === '(') depth++;
    else if (ch === ')') depth--;
    else if (ch === ',' && depth === 0) {
      parts.push(selector.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(selector.slice(start));
  return parts;
}

function checkKey(selector: string, key: string): string {
  if (!KEY.test(key)) throw bad(selector, `"${key}" is not a valid label key`);
  return key;
}

function checkValue(selector: string, value: string): string {
  if (!VALUE.test(value)) throw bad(selector, `"${value}" is not a valid label value`);
  return value;
}

const SET_FORM = /^(\S+)\s+(in|notin)\s*\((.*)\)$/;

function parseRequirement(selector: string, raw: string): Requirement {
  const part = raw.trim();
  if (part === '') throw bad(selector, 'empty requirement');
  const set = SET_FORM.exec(part);
  if (set !== null) {
    const [, key = '', op = '', inner = ''] = set;
    const values = inner.split(',').map((v) => checkValue(selector, v.trim()));
    return { op: op === 'in' ? 'in' : 'notin', key: checkKey(selector, key), values };
  }
  if (part.startsWith('!')) return { op: 'notexists', key: checkKey(selector, part.slice(1).trim()) };
  const neq = part.indexOf('!=');
  if (neq >= 0) {
    return { op: 'neq', key: checkKey(selector, part.slice(0, neq).trim()), value: checkValue(selector, part.slice(neq + 2).trim()) };
  }
  const eq = part.indexOf('=');
  if (eq >= 0) {
    const valueStart = part[eq + 1] === '=' ? eq + 2 : eq + 1;
    return { op: 'eq', key: checkKey(selector, part.slice(0, eq).trim()), value: checkValue(selector, part.slice(valueStart).trim()) };
  }
  return { op: 'exists', key: checkKey(selector, part) };
}

/** Parses a selector string; throws AsbError BadRequest naming the selector when malformed. */
export function parseSelector(selector: string | undefined): Selector {
  if (selector === undefined || selector.trim() === '') return EVERYTHING;
  return { requirements: splitTopLevel(selector).map((p) => parseRequirement(selector, p)) };
}

function holds(req: Requirement, labels: Readonly<Record<string, string>>): boolean {
  const value = Object.hasOwn(labels, req.key) ? labels[req.key] : undefined;
  switch (req.op) {
    case 'eq':
      return value === req.value;
    case 'neq':
      return value !== req.value;
    case 'in':
      return value !== undefined && req.values.includes(value);
    case 'notin':
      return value === undefined || !req.values.includes(value);
    case 'exists':
      return value !== undefined;
    case 'notexists':
      return value === undefined;
  }
}

export function matchesSelector(selector: Selector, labels: Readonly<Record<string, string>> | undefined): boolean {
  const actual = labels ?? {};
  return selector.requirements.every((req) => holds(req, actual));
}
