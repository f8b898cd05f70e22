// Facts as core/v1 Events in the object store: on the embedded store the Kubernetes API serves
// them (src/kubeapi/events.ts); on the kube store they are written to the real API server, where
// kubectl reads them as it reads the kubelet's.
//
// Aggregated as client-go's recorder aggregates: one Event per (object, reason, message), named
// from that key, whose count and lastTimestamp go up each time the fact recurs. Bounded: once
// `max` Events are passed by a tenth, this writer drops the oldest (by lastTimestamp) down to
// `max`, as the apiserver's TTL would; a warm pool that churns must not grow the store without end.
import { createHash } from 'node:crypto';
import { EventType, type KubeEvent } from '../api/event.ts';
import { LABEL } from '../api/types.ts';
import { isAsbError } from '../errors.ts';
import type { ObjectStore } from '../store/store.ts';
import { isoNow, type Clock } from '../base/clock.ts';
import type { Fact } from './facts.ts';

export const DEFAULT_MAX_EVENTS = 1000;
export const EVENT_COMPONENT = 'agent-sandbox-controller';
/** On every Event this writer makes, so it lists its own (to trim them) without the kubelet's and others'. */
const MANAGED_BY = 'app.kubernetes.io/managed-by';

export interface KubeEventWriterOptions {
  store: ObjectStore;
  clock: Clock;
  /** Who reports: the cluster's tag (reportingInstance). */
  instance: string;
  max?: number;
}

export class KubeEventWriter {
  readonly #o: KubeEventWriterOptions;
  readonly #max: number;
  /** namespace/name → lastTimestamp of the Events this writer knows of, loaded on first use. */
  #known: Map<string, { namespace: string; name: string; last: string }> | undefined;

  constructor(opts: KubeEventWriterOptions) {
    this.#o = opts;
    this.#max = opts.max ?? DEFAULT_MAX_EVENTS;
  }

  async write(fact: Fact): Promise<void> {
    const { store, clock } = this.#o;
    const known = await this.#load();
    const { involved } = fact;
    const name = `${involved.name}.${createHash('sha256').update(`${involved.kind}\0${involved.uid}\0${fact.reason}\0${fact.message}`).digest('hex').slice(0, 16)}`;
    const now = isoNow(clock);
    const event: KubeEvent = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name, namespace: involved.namespace, labels: { [MANAGED_BY]: EVENT_COMPONENT, ...(fact.team === undefined ? {} : { [LABEL.owner]: fact.team }) } },
      involvedObject: { apiVersion: involved.apiVersion, kind: involved.kind, name: involved.name, namespace: involved.namespace, uid: involved.uid },
      reason: fact.reason,
      message: fact.message,
      type: fact.type,
      count: 1,
      firstTimestamp: now,
      lastTimestamp: now,
      source: { component: EVENT_COMPONENT },
      reportingComponent: EVENT_COMPONENT,
      reportingInstance: this.#o.instance,
    };
    // Most facts are new: one create. A fact that recurs (a sandbox Ready again) counts on its Event.
    await store.create(EventType, event).catch(async (err: unknown) => {
      if (!isAsbError(err, 'AlreadyExists')) throw err;
      const existing = await store.tryGet<KubeEvent>(EventType, involved.namespace, name);
      // Trimmed in the instant between: made again on the next write of the fact.
      if (existing !== undefined) await store.update<KubeEvent>(EventType, { ...existing, count: existing.count + 1, lastTimestamp: now });
    });
    known.set(`${involved.namespace}/${name}`, { namespace: involved.namespace, name, last: now });
    await this.#trim(known);
  }

  async #load(): Promise<Map<string, { namespace: string; name: string; last: string }>> {
    if (this.#known !== undefined) return this.#known;
    const known = new Map<string, { namespace: string; name: string; last: string }>();
    let cont: string | undefined;
    for (let page = 0; page < 100; page++) {
      const listed = await this.#o.store.list<KubeEvent>(EventType, { labelSelector: `${MANAGED_BY}=${EVENT_COMPONENT}`, limit: 500, ...(cont === undefined ? {} : { continue: cont }) });
      for (const e of listed.items) {
        known.set(`${e.metadata.namespace ?? ''}/${e.metadata.name}`, { namespace: e.metadata.namespace ?? '', name: e.metadata.name, last: e.lastTimestamp });
      }
      cont = listed.continue;
      if (cont === undefined) break;
    }
    this.#known = known;
    return known;
  }

  async #trim(known: Map<string, { namespace: string; name: string; last: string }>): Promise<void> {
    // Past the bound by a tenth, down to the bound: one sort per hundred writes, not one per write.
    if (known.size <= this.#max + Math.ceil(this.#max / 10)) return;
    const oldest = [...known.entries()].sort((a, b) => (a[1].last < b[1].last ? -1 : a[1].last > b[1].last ? 1 : 0)).slice(0, known.size - this.#max);
    for (const [key, e] of oldest) {
      known.delete(key);
      try {
        await this.#o.store.delete(EventType, e.namespace, e.name);
      } catch (err) {
        if (!isAsbError(err, 'NotFound')) throw err;
      }
    }
  }
}
