// Starts one pod's shim through the launcher and speaks its protocol (see oci-shim.c): it writes
// "pid N" once the pod's network namespace exists (N is a process in it), we attach the veth (when
// the pod has its own network) and answer "go", then it writes "ready" or "error <what>: <why>".
// Under runc N is also the container's init. Under runsc the namespace is made before the sandbox
// (netstack copies eth0's address when the sandbox is created), so N is a short-lived holder and a
// later "init M" names the pod's init: the sandbox process.
import type { Launched, Launcher } from './launcher.ts';

export type InitOutcome = { ok: true; pid: number } | { ok: false; message: string };

export interface PodLaunchHooks {
  /** Moves the veth peer into the pod's network namespace and installs its firewall rules; the shim waits for it (-n). A rejection fails the start. */
  attach?: (pid: number) => Promise<void>;
  /** the shim ended: the container's exit code (137 when the shim itself was killed). */
  exited(code: number): void;
  /** The launcher died before the shim ended: no exit() will come, the pod may still run. */
  lost(): void;
}

export interface PodLaunch {
  outcome: Promise<InitOutcome>;
  child: Launched;
  /** The host pid of the pod's own init, once known ("init M", else "pid N"). */
  pid(): number | undefined;
}

export function launchPodInit(launcher: Launcher, binary: string, args: readonly string[], hooks: PodLaunchHooks): PodLaunch {
  let buffered = '';
  let pid: number | undefined;
  let init: number | undefined;
  let error: string | undefined;
  let settle: (o: InitOutcome) => void = () => undefined;
  const outcome = new Promise<InitOutcome>((resolve) => (settle = resolve));
  const decoder = new TextDecoder();
  const child = launcher.launch([binary, ...args], {
    output(chunk) {
      buffered += decoder.decode(chunk, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (line.startsWith('pid ')) {
          const initPid = Number(line.slice(4));
          pid = initPid;
          // A failed attach (the pod's firewall rules refused) never says "go": the pod must not
          // run without its isolation, so the start fails and the shim is killed.
          const go = (): void => child.write('go\n');
          const refuse = (err: unknown): void => {
            settle({ ok: false, message: `pod network set-up failed: ${err instanceof Error ? err.message : String(err)}` });
            child.kill('SIGKILL');
          };
          if (hooks.attach !== undefined) void hooks.attach(initPid).then(go, refuse);
        } else if (line.startsWith('init ')) {
          init = Number(line.slice(5));
        } else if (line === 'ready') {
          settle({ ok: true, pid: init ?? pid ?? 0 });
        } else if (line.startsWith('error ')) {
          error = line.slice(6);
        }
      }
    },
    end: () => settle({ ok: false, message: `pod init failed: ${error ?? 'it ended before the pod was ready'}` }),
    exit(code, signal) {
      settle({ ok: false, message: `pod init failed: ${error ?? 'it ended before the pod was ready'}` });
      hooks.exited(code ?? (signal === null ? 1 : 137));
    },
    lost() {
      settle({ ok: false, message: 'pod init failed: the pod launcher went away while the pod was starting' });
      hooks.lost();
    },
  });
  return { outcome, child, pid: () => init ?? pid };
}
