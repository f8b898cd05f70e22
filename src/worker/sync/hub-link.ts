// Whether this cluster's link to the hub is up, for every process of the cluster, not only the
// one that holds it. On Kubernetes the sync agent runs in the operator Lease holder, while the
// worker API Deployment serves the route feed that tells the routers "the hub is reachable: send
// creates and lists there". So the agent records each change of its link in the status of the
// SyncState object (`hub`), and the other processes watch that object.
// - Only transitions are written (connect, disconnect, agent closed): a few writes a day.
// - A leader killed with its link up leaves `hubConnected: true` until the next leader's agent
//   writes; meanwhile the routers keep sending creates to the hub, which answers if it is up and
//   is a 503 at once if it is not. That beats turning placement off for every restart.
import { isAsbError } from '../../errors.ts';
import { CLUSTER_SCOPE, type ObjectStore } from '../../store/store.ts';
import { isoNow, type Clock } from '../../base/clock.ts';
import type { Logger } from '../../base/log.ts';
import { Informer } from '../../store/informer.ts';
import { STATE_NAME, SyncStateType, newSyncState, type SyncState } from './sync-apply.ts';

/** The worker's sync link to the hub, as the sync agent (sync-agent.ts) reports it and this module publishes it. */
export interface SyncStatus {
  connected: boolean;
  /** Last hub version applied and persisted here (0: never synced). */
  appliedVersion: number;
  /** The hub's version as it last said (absent before the first message). */
  hubVersion?: number;
}

const WRITE_ATTEMPTS = 5;
const RETRY_MS = 1_000;

/** Writes `hubConnected` into the SyncState's status (creating the object if need be). */
async function writeLink(store: ObjectStore, connected: boolean, clock: Clock): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      const state =
        (await store.tryGet<SyncState>(SyncStateType, CLUSTER_SCOPE, STATE_NAME)) ??
        (await store.create<SyncState>(SyncStateType, newSyncState(0)));
      if (state.status?.hubConnected === connected) return;
      await store.updateStatus<SyncState>(SyncStateType, { ...state, status: { hubConnected: connected, lastTransitionTime: isoNow(clock) } });
      return;
    } catch (err) {
      // Another writer in between (the applied version, a racing create): read again.
      if (attempt >= WRITE_ATTEMPTS || !(isAsbError(err, 'Conflict') || isAsbError(err, 'AlreadyExists'))) throw err;
    }
  }
}

export interface LinkPublisher {
  set(connected: boolean): void;
  /** Writes `false` once (the agent is going away) and stops retrying. */
  close(): Promise<void>;
}

/** The sync agent's side: the latest value wins; a failed write is retried every second. */
export function publishHubLink(store: ObjectStore, clock: Clock, log: Logger): LinkPublisher {
  let wanted = false;
  let written: boolean | undefined;
  let writing: Promise<void> | undefined;
  let closed = false;
  const flush = (): Promise<void> => {
    writing ??= (async () => {
      while (written !== wanted) {
        const value = wanted;
        try {
          await writeLink(store, value, clock);
          written = value;
        } catch (err) {
          log.warn({ err, hubConnected: value }, 'could not record the hub link in the SyncState');
          if (closed) return;
          await new Promise<void>((resolve) => clock.after(RETRY_MS, resolve));
        }
      }
    })().finally(() => {
      writing = undefined;
    });
    return writing;
  };
  return {
    set(connected) {
      if (closed) return;
      wanted = connected;
      void flush();
    },
    async close() {
      closed = true;
      wanted = false;
      await writing;
      await flush();
    },
  };
}

export interface HubLinkWatch {
  /** The link as the SyncState says, and the hub version applied. */
  status(): SyncStatus;
  close(): void;
}

/** The other processes' side: the SyncState object, watched. */
export async function watchHubLink(store: ObjectStore, clock: Clock, log: Logger): Promise<HubLinkWatch> {
  const states = new Informer<SyncState>({ store, type: SyncStateType, clock, log: log.child({ component: 'hub-link' }) });
  states.start();
  await states.synced();
  return {
    status() {
      const state = states.getByName(CLUSTER_SCOPE, STATE_NAME);
      return { connected: state?.status?.hubConnected ?? false, appliedVersion: state?.spec.appliedVersion ?? 0 };
    },
    close: () => states.close(),
  };
}
