// The lifecycle events of one worker, assembled: the event log, the recorder that fills it and
// writes Kubernetes Events, the webhook sender that drains its queue, and the hourly prune that
// keeps it to its retention.
//
// Shutdown order (close): the prune timer, the recorder (no new events), then the sender
// (requests in flight abort and stay queued). The log's database is the caller's to close.
import type { Metrics } from '../metrics/metrics.ts';
import type { ObjectStore } from '../store/store.ts';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import type { EventLog } from './event-log.ts';
import { KubeEventWriter } from './kube-events.ts';
import { EventRecorder } from './recorder.ts';
import { WebhookSender, type WebhookSenderOptions } from './webhook-sender.ts';

const PRUNE_EVERY_MS = 3600_000;

export interface LifecycleEventsOptions {
  store: ObjectStore;
  log: Logger;
  clock: Clock;
  /** The event log to fill: the caller's, which it closes (kube: opened once, recorded into while this process leads). */
  events: EventLog;
  /** The cluster's tag, as the Events' reportingInstance. */
  instance: string;
  /** Most Kubernetes Events kept; default 1000. */
  maxKubeEvents?: number;
  webhooks?: Omit<WebhookSenderOptions, 'events' | 'log' | 'metrics'>;
  metrics?: Pick<Metrics, 'lifecycleEventsTotal' | 'kubeEventsTotal' | 'webhookAttemptsTotal'>;
}

export interface LifecycleEvents {
  readonly recorder: EventRecorder;
  readonly sender: WebhookSender;
  close(): Promise<void>;
}

export async function startLifecycleEvents(opts: LifecycleEventsOptions): Promise<LifecycleEvents> {
  const log = opts.log.child({ component: 'events' });
  const events = opts.events;
  const sender = new WebhookSender({ events, log, now: () => opts.clock.now(), ...opts.webhooks, ...(opts.metrics === undefined ? {} : { metrics: opts.metrics }) });
  const kube = new KubeEventWriter({ store: opts.store, clock: opts.clock, instance: opts.instance, ...(opts.maxKubeEvents === undefined ? {} : { max: opts.maxKubeEvents }) });
  events.prune();
  const metrics = opts.metrics;
  const recorder = await EventRecorder.start({
    store: opts.store, log, clock: opts.clock, events, kube,
    onRecorded: (written) => {
      for (const e of written) metrics?.lifecycleEventsTotal.inc({ type: e.type });
      sender.soon();
    },
    ...(metrics === undefined ? {} : { onKubeEvent: (ok: boolean) => metrics.kubeEventsTotal.inc({ result: ok ? 'ok' : 'error' }) }),
  });
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
    recorder,
    sender,
    close() {
      closing ??= (async () => {
        clearInterval(prune);
        await recorder.close();
        sender.close();
      })();
      return closing;
    },
  };
}
