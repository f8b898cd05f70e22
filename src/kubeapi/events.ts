// core/v1 Events on the Kubernetes API, read-only: what `kubectl get events` and `kubectl
// describe <kind> <name>` read. describe lists /api/v1/namespaces/<ns>/events with a field
// selector on involvedObject.{kind,name,namespace,uid}; get asks for a Table with the
// apiserver's event columns (LAST SEEN, TYPE, REASON, OBJECT, MESSAGE; the rest at -o wide).
// The controllers write Events (src/events/kube-events.ts); nothing else may, so this serves
// get and list only.
//
// Tenancy as for the objects they are about: a team key sees the Events of its own sandboxes
// (labelled with its team) and of the warm pools, which every team may read; an admin key all.
import { EventType, type KubeEvent } from '../api/event.ts';
import { LABEL, SandboxWarmPoolType } from '../api/types.ts';
import type { Principal } from '../auth/keyring.ts';
import { AsbError } from '../errors.ts';
import type { WorkerContext } from '../worker/deps.ts';
import { fieldSelectorTerms, intParam, segment } from './request.ts';
import { humanDuration, includeObjectOf, type IncludeObject } from './table.ts';

export interface EventsPath {
  namespace: string | undefined;
  name: string | undefined;
}

/** `/api/v1/events`, `/api/v1/namespaces/<ns>/events[/<name>]`, or undefined. */
export function parseEventsPath(path: string): EventsPath | undefined {
  const parts = path.replace(/\/+$/, '').split('/').slice(1);
  if (parts[0] !== 'api' || parts[1] !== 'v1') return undefined;
  if (parts.length === 3 && parts[2] === 'events') return { namespace: undefined, name: undefined };
  if (parts[2] === 'namespaces' && parts[4] === 'events' && parts[3] !== undefined && parts[3] !== '' && (parts.length === 5 || (parts.length === 6 && parts[5] !== ''))) {
    return { namespace: segment(parts[3]), name: parts[5] === undefined ? undefined : segment(parts[5]) };
  }
  return undefined;
}

const FIELDS: Record<string, (e: KubeEvent) => string> = {
  'metadata.name': (e) => e.metadata.name,
  'metadata.namespace': (e) => e.metadata.namespace ?? '',
  'involvedObject.kind': (e) => e.involvedObject.kind,
  'involvedObject.name': (e) => e.involvedObject.name,
  'involvedObject.namespace': (e) => e.involvedObject.namespace,
  'involvedObject.uid': (e) => e.involvedObject.uid,
  'involvedObject.apiVersion': (e) => e.involvedObject.apiVersion,
  'involvedObject.resourceVersion': (e) => e.involvedObject.resourceVersion ?? '',
  'involvedObject.fieldPath': () => '',
  reason: (e) => e.reason,
  type: (e) => e.type,
  'source': (e) => e.source.component,
  reportingComponent: (e) => e.reportingComponent,
};

/** An Event field selector (the fields the apiserver indexes for Events) as a predicate; 400 naming an unknown field. */
export function eventFieldFilter(text: string | null): (e: KubeEvent) => boolean {
  const terms = fieldSelectorTerms(text).map(({ field, op, value }) => {
    const get = FIELDS[field];
    if (get === undefined) throw new AsbError('BadRequest', `"${field}" is not a known field selector: only ${Object.keys(FIELDS).join(', ')}`);
    return { get, op, value };
  });
  return (e) => terms.every((t) => (t.get(e) === t.value) === (t.op === '='));
}

function visibleTo(p: Principal, e: KubeEvent): boolean {
  if (p.admin) return true;
  const owner = e.metadata.labels?.[LABEL.owner];
  return owner === p.team || (owner === undefined && e.involvedObject.kind === SandboxWarmPoolType.kind);
}

function notFound(name: string): AsbError {
  return new AsbError('NotFound', `events "${name}" not found`);
}

export interface EventsAnswer {
  status: number;
  body: unknown;
}

export async function getEvents(w: WorkerContext, p: Principal, path: EventsPath, query: URLSearchParams, table: boolean): Promise<EventsAnswer> {
  if (path.name !== undefined) {
    const e = await w.store.tryGet<KubeEvent>(EventType, path.namespace ?? '', path.name);
    if (e === undefined || !visibleTo(p, e)) throw notFound(path.name);
    return { status: 200, body: table ? eventTable([e], w.clock.now(), includeObjectOf(query.get('includeObject'))) : e };
  }
  const match = eventFieldFilter(query.get('fieldSelector'));
  const listed = await w.store.list<KubeEvent>(EventType, path.namespace === undefined ? {} : { namespace: path.namespace });
  const limit = intParam(query, 'limit');
  const items = listed.items.filter((e) => visibleTo(p, e) && match(e))
    .sort((a, b) => (a.lastTimestamp < b.lastTimestamp ? -1 : a.lastTimestamp > b.lastTimestamp ? 1 : 0))
    .slice(0, limit === undefined || limit === 0 ? undefined : limit);
  if (table) return { status: 200, body: eventTable(items, w.clock.now(), includeObjectOf(query.get('includeObject')), listed.resourceVersion) };
  return { status: 200, body: { apiVersion: 'v1', kind: 'EventList', metadata: { resourceVersion: listed.resourceVersion }, items } };
}

const COLUMNS = [
  { name: 'Last Seen', type: 'string', priority: 0 },
  { name: 'Type', type: 'string', priority: 0 },
  { name: 'Reason', type: 'string', priority: 0 },
  { name: 'Object', type: 'string', priority: 0 },
  { name: 'Message', type: 'string', priority: 0 },
  { name: 'First Seen', type: 'string', priority: 1 },
  { name: 'Count', type: 'integer', priority: 1 },
  { name: 'Name', type: 'string', priority: 1 },
];

/**
 * The apiserver's Event table (its printers' columns, in its order), each row with the Event's
 * metadata, the whole Event (`includeObject=Object`: kubectl's --sort-by sorts on it) or nothing.
 */
export function eventTable(events: readonly KubeEvent[], now: number, include: IncludeObject, resourceVersion?: string): unknown {
  const age = (t: string): string => humanDuration(now - Date.parse(t));
  const rows = events.map((e) => ({
    cells: [age(e.lastTimestamp), e.type, e.reason, `${e.involvedObject.kind.toLowerCase()}/${e.involvedObject.name}`, e.message, age(e.firstTimestamp), e.count, e.metadata.name],
    ...(include === 'None' ? {} : { object: include === 'Object' ? e : { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: e.metadata } }),
  }));
  return {
    kind: 'Table', apiVersion: 'meta.k8s.io/v1', metadata: resourceVersion === undefined ? {} : { resourceVersion },
    columnDefinitions: COLUMNS.map((c) => ({ ...c, format: '', description: c.name })), rows,
  };
}

/** The core group's Event resource, as discovery lists it. */
export const EVENTS_RESOURCE = { name: 'events', singularName: 'event', namespaced: true, kind: 'Event', verbs: ['get', 'list'], shortNames: ['ev'] };
export const EVENTS_DISCOVERY = {
  resource: 'events', responseKind: { group: '', version: 'v1', kind: 'Event' }, scope: 'Namespaced', singularResource: 'event', verbs: ['get', 'list'], shortNames: ['ev'],
};
