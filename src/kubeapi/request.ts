// Parsing a Kubernetes API request: the resource path and the list/watch query, as pure
// functions of the URL (tested without sockets).
import { AsbError } from '../errors.ts';
import { findResource, type ServedResource } from './resources.ts';

export interface ResourcePath {
  served: ServedResource;
  group: string;
  version: string;
  /** Undefined: every namespace (a list or watch across namespaces). */
  namespace: string | undefined;
  name: string | undefined;
  /** As the path names it; the server answers NotFound for one the resource does not have (subresources.ts). */
  subresource: string | undefined;
}

/** Paths that are the Kubernetes API's (on the worker and through the edge). */
export function isKubeApiPath(path: string): boolean {
  return path === '/api' || path.startsWith('/api/') || path === '/apis' || path.startsWith('/apis/') || path === '/version' || path === '/openapi/v3' || path.startsWith('/openapi/v3/');
}

/** A path segment decoded; 400 naming it when its percent-encoding is bad. */
export function segment(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new AsbError('BadRequest', `path segment "${raw}" is not valid percent-encoding`);
  }
}

/**
 * `/apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>[/<subresource>]]`, or undefined when
 * the path names no resource we serve (the apiserver answers those 404 "page not found").
 */
export function parseResourcePath(path: string): ResourcePath | undefined {
  const parts = path.split('/').slice(1).map(segment);
  if (parts[0] !== 'apis' || parts.length < 4) return undefined;
  const [, group = '', version = ''] = parts;
  let rest = parts.slice(3);
  let namespace: string | undefined;
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    namespace = rest[1];
    rest = rest.slice(2);
  }
  const [plural = '', name, sub, ...extra] = rest;
  const served = findResource(group, version, plural);
  if (served === undefined || extra.length > 0) return undefined;
  if (name !== undefined && namespace === undefined) return undefined;
  if (name === '' || namespace === '' || sub === '') return undefined;
  return { served, group, version, namespace, name, subresource: sub };
}

export interface FieldSelector {
  name?: { op: '=' | '!='; value: string };
  namespace?: { op: '=' | '!='; value: string };
}

export interface FieldTerm {
  field: string;
  op: '=' | '!=';
  value: string;
}

/** `a=x,b!=y` (`==` is `=`) as its terms, empty terms skipped; 400 naming a term that is neither. */
export function fieldSelectorTerms(text: string | null): FieldTerm[] {
  const terms: FieldTerm[] = [];
  for (const term of (text ?? '').split(',')) {
    if (term.trim() === '') continue;
    const m = /^\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*$/.exec(term);
    if (m === null) throw new AsbError('BadRequest', `invalid field selector term ${JSON.stringify(term)}: expected field=value or field!=value`);
    const [, field = '', op = '', value = ''] = m;
    terms.push({ field, op: op === '!=' ? '!=' : '=', value });
  }
  return terms;
}

/** `metadata.name=x,metadata.namespace!=y`: the fields a custom resource selects on (no others). */
export function parseFieldSelector(text: string | null): FieldSelector {
  const out: FieldSelector = {};
  for (const { field, op, value } of fieldSelectorTerms(text)) {
    if (field === 'metadata.name') out.name = { op, value };
    else if (field === 'metadata.namespace') out.namespace = { op, value };
    else throw new AsbError('BadRequest', `field label not supported: ${field}`);
  }
  return out;
}

export function matchesFields(sel: FieldSelector, namespace: string | undefined, name: string): boolean {
  const ok = (r: { op: '=' | '!='; value: string } | undefined, v: string): boolean => r === undefined || (r.op === '=' ? v === r.value : v !== r.value);
  return ok(sel.name, name) && ok(sel.namespace, namespace ?? '');
}

/** `true`, `1` (kubectl, client-go) and `True` (older Python clients) all mean true. */
export function boolParam(query: URLSearchParams, name: string): boolean {
  const v = query.get(name);
  return v !== null && ['true', '1', 'True'].includes(v);
}

/** A non-negative integer parameter, or undefined when absent; 400 naming it otherwise. */
export function intParam(query: URLSearchParams, name: string): number | undefined {
  const v = query.get(name);
  if (v === null || v === '') return undefined;
  if (!/^\d+$/.test(v)) throw new AsbError('BadRequest', `${name} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return Number(v);
}

/** Write parameters we do not honour are refused rather than ignored: a dry run that wrote would be worse than an error. */
export function refuseDryRun(query: URLSearchParams): void {
  if (query.has('dryRun')) throw new AsbError('BadRequest', 'dryRun is not supported by this server; nothing was written');
}
