// Server-side printing: `kubectl get` asks for a meta.k8s.io/v1 Table
// (Accept: application/json;as=Table;v=v1;g=meta.k8s.io,…) and prints its columns, so the CRD's
// printer columns (src/api/crd.ts) reach the terminal only through this conversion. As in the
// apiserver's CRD table convertor: a Name column first, each printer column by its JSONPath (the
// first match; none is null), `date` cells as ages ("5m"), and each row carrying the object's
// metadata (includeObject=Metadata, the default), the whole object (Object) or nothing (None).
import type { PrinterColumn } from '../api/crd.ts';
import type { KubeObject } from '../api/meta.ts';
import { AsbError } from '../errors.ts';


/** Whether the Accept header asks for a meta.k8s.io Table (v1 or v1beta1). */
export function wantsTable(accept: string | undefined): boolean {
  return (accept ?? '').split(',').some((part) => /;\s*as=Table\b/.test(part) && /;\s*g=meta\.k8s\.io\b/.test(part));
}

type Step = { kind: 'field'; name: string } | { kind: 'index'; index: number } | { kind: 'filter'; field: string; value: string };

// The JSONPath forms printer columns use: .a.b, [n], [?(@.k=="v")]. Anything else is a bug in
// our CRDs, caught by the unit test that converts every column.
const STEP = /^(?:\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_-]+)=="([^"]*)"\)\])/;

export function parseJsonPath(path: string): Step[] {
  const steps: Step[] = [];
  let rest = path;
  while (rest !== '') {
    const m = STEP.exec(rest);
    if (m === null) throw new AsbError('Internal', `unsupported printer column JSONPath ${JSON.stringify(path)}`);
    if (m[1] !== undefined) steps.push({ kind: 'field', name: m[1] });
    else if (m[2] !== undefined) steps.push({ kind: 'index', index: Number(m[2]) });
    else steps.push({ kind: 'filter', field: m[3] ?? '', value: m[4] ?? '' });
    rest = rest.slice(m[0].length);
  }
  return steps;
}

/** The first value the path selects, or undefined. */
export function evalJsonPath(steps: readonly Step[], root: unknown): unknown {
  let cur: unknown = root;
  for (const step of steps) {
    if (cur === null || typeof cur !== 'object') return undefined;
    if (step.kind === 'field') {
      cur = Array.isArray(cur) ? undefined : (cur as Record<string, unknown>)[step.name];
    } else if (step.kind === 'index') {
      cur = Array.isArray(cur) ? cur[step.index] : undefined;
    } else {
      cur = Array.isArray(cur) ? cur.find((e: unknown) => typeof e === 'object' && e !== null && String((e as Record<string, unknown>)[step.field]) === step.value) : undefined;
    }
  }
  return cur;
}

/** k8s.io/apimachinery duration.HumanDuration: "45s", "3m20s", "5h", "3d4h", "2y". */
export function humanDuration(ms: number): string {
  const seconds = Math.floor(ms / 1000);
  if (seconds < -1) return '<invalid>';
  if (seconds < 0) return '0s';
  if (seconds < 120) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 10) return seconds % 60 === 0 ? `${minutes}m` : `${minutes}m${seconds % 60}s`;
  if (minutes < 180) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  if (hours < 8) return minutes % 60 === 0 ? `${hours}h` : `${hours}h${minutes % 60}m`;
  if (hours < 48) return `${hours}h`;
  if (hours < 24 * 8) return hours % 24 === 0 ? `${Math.floor(hours / 24)}d` : `${Math.floor(hours / 24)}d${hours % 24}h`;
  if (hours < 24 * 365 * 2) return `${Math.floor(hours / 24)}d`;
  const days = Math.floor(hours / 24);
  if (hours < 24 * 365 * 8) return days % 365 === 0 ? `${Math.floor(days / 365)}y` : `${Math.floor(days / 365)}y${days % 365}d`;
  return `${Math.floor(days / 365)}y`;
}

function cell(column: PrinterColumn, value: unknown, now: number): unknown {
  if (value === undefined || value === null) return null;
  switch (column.type) {
    case 'string':
      return typeof value === 'string' ? value : JSON.stringify(value);
    case 'integer':
      return typeof value === 'number' ? Math.trunc(value) : null;
    case 'number':
      return typeof value === 'number' ? value : null;
    case 'boolean':
      return typeof value === 'boolean' ? value : null;
    case 'date': {
      const t = typeof value === 'string' ? Date.parse(value) : NaN;
      return Number.isNaN(t) ? null : humanDuration(now - t);
    }
  }
}

export type IncludeObject = 'None' | 'Metadata' | 'Object';

export function includeObjectOf(value: string | null): IncludeObject {
  if (value === null || value === '' || value === 'Metadata') return 'Metadata';
  if (value === 'None' || value === 'Object') return value;
  throw new AsbError('BadRequest', `includeObject must be None, Metadata or Object, got ${JSON.stringify(value)}`);
}

const NAME_COLUMN = {
  name: 'Name', type: 'string', format: 'name', priority: 0,
  description: 'Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names',
};

export interface TableOptions {
  columns: readonly PrinterColumn[];
  now: number;
  include: IncludeObject;
  resourceVersion?: string;
  continue?: string;
  /** Watch events after the first leave the definitions out, as the apiserver does. */
  noHeaders?: boolean;
}

export function toTable(objects: readonly KubeObject[], opts: TableOptions): unknown {
  const compiled = opts.columns.map((c) => ({ column: c, steps: parseJsonPath(c.jsonPath) }));
  const columnDefinitions = opts.noHeaders === true ? [] : [NAME_COLUMN, ...opts.columns.map((c) => ({
    name: c.name, type: c.type, format: '', description: c.description ?? `Custom resource definition column (in JSONPath format): ${c.jsonPath}`, priority: c.priority ?? 0,
  }))];
  const rows = objects.map((obj) => {
    const row: Record<string, unknown> = { cells: [obj.metadata.name, ...compiled.map(({ column, steps }) => cell(column, evalJsonPath(steps, obj), opts.now))] };
    if (opts.include === 'Object') row.object = obj;
    else if (opts.include === 'Metadata') row.object = { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: obj.metadata };
    return row;
  });
  const metadata: Record<string, string> = {};
  if (opts.resourceVersion !== undefined) metadata.resourceVersion = opts.resourceVersion;
  if (opts.continue !== undefined) metadata.continue = opts.continue;
  return { kind: 'Table', apiVersion: 'meta.k8s.io/v1', metadata, columnDefinitions, rows };
}
