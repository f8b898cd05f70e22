// Waiting for a pod runtime's state: checked on every change the runtime reports, with a bound.
import type { PodRuntime, PodState } from '../../src/runtime/runtime.ts';

/** Resolves once pred holds for the pod's state, or fails after timeoutMs saying what was awaited and the state. */
export function waitForPodState(rt: Pick<PodRuntime, 'state' | 'onChange'>, id: string, pred: (s: PodState) => boolean, what: string, timeoutMs = 15_000): Promise<PodState> {
  return new Promise((resolve, reject) => {
    const check = (): boolean => {
      const s = rt.state(id);
      if (!pred(s)) return false;
      clearTimeout(timer);
      off();
      resolve(s);
      return true;
    };
    const timer = setTimeout(() => {
      off();
      reject(new Error(`pod ${id}: ${what} not reached in ${String(timeoutMs)} ms; state ${JSON.stringify(rt.state(id))}`));
    }, timeoutMs);
    const off = rt.onChange((changed) => changed === id && check());
    check();
  });
}
