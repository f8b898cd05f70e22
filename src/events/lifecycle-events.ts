// The lifecycle events of one worker, assembled: the event log, the recorder that fills it and
// writes Kubernetes Events, the webhook sender that drains its queue, and the hourly prune that
// keeps it to its retention.
//
// Shutdown order (close): the prune timer, the recorder (no new events), the sender (requests in
// flight abort and stay queued), then the log's database.
import type { ObjectStore } from '../store/store.ts';
import type { Clock } from '../system/clock.ts';
import type { Logger } from '../system/log.ts';
import { EventLog } from './event-log.ts';
import { KubeEventWriter } from './kube-events.ts';
import { EventRecorder } from './recorder.ts';
import { WebhookSender, type WebhookSenderOptions } from './webhook-sender.ts';

const PRUNE_EVERY_MS = 3600_000;

export interface LifecycleEventsOptions {
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  /** A private directory of the worker's state: events.db lives here. */
  dir: string;
  /** The cluster's tag, as the Events' reportingInstance. */
  instance: string;
  retentionMs?: number;
  /** Most Kubernetes Events kept; default 1000. */
  maxKubeEvents?: number;
  webhooks?: Omit<WebhookSenderOptions, 'events' | 'log'>;
}

export interface LifecycleEvents {
  readonly log: EventLog;
  readonly recorder: EventRecorder;
  readonly sender: WebhookSender;
  close(): Promise<void>;
}

export async function startLifecycleEvents(opts: LifecycleEventsOptions): Promise<LifecycleEvents> {
  const log = opts.log.child({ component: 'events' });
  const events = new EventLog({ dir: opts.dir, now: () => opts.clock.now(), ...(opts.retentionMs === undefined ? {} : { retentionMs: opts.retentionMs }) });
  const sender = new WebhookSender({ events, log, now: () => opts.clock.now(), ...opts.webhooks });
  const kube = new KubeEventWriter({ store: opts.store, clock: opts.clock, instance: opts.instance, ...(opts.maxKubeEvents === undefined ? {} : { max: opts.maxKubeEvents }) });
  let recorder: EventRecorder;
  try {
    events.prune();
    recorder = await EventRecorder.start({ store: opts.store, log, clock: opts.clock, events, kube, onRecorded: () => sender.kick() });
  } catch (err) {
    events.close();
    throw err;
  }
  // Deliveries left pending by the last run go out now.
  sender.kick();
  const prune = setInterval(() => {
    try {
      events.prune();
    } catch (err) {
      log.error({ err }, 'events: prune failed');
    }
  }, PRUNE_EVERY_MS);
  prune.unref();
  let closing: Promise<void> | undefined;
  return {
    log: events,
    recorder,
    sender,
    close() {
      closing ??= (async () => {
        clearInterval(prune);
        await recorder.close();
        sender.close();
        events.close();
      })();
      return closing;
    },
  };
}
