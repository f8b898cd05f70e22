// A whole local federation for end-to-end tests (src/assembly/federation.ts): a hub and two
// clusters, each with its own worker, router and Envoy (edge + mutual-TLS ingress), on ports the
// kernel picks, with bridges and subnets no other test uses.
import { execFileSync } from 'node:child_process';
import { systemClock } from '../../src/base/clock.ts';
import { testImages } from './test-images.ts';
import { silentLogger } from '../../src/base/log.ts';
import type { SupervisorOptions } from '../../src/assembly/supervisor.ts';
import { startFederation, type Federation, type FederatedClusterOptions } from '../../src/assembly/federation.ts';
import { removeDataDir, tempDataDir } from './worker-process.ts';

export interface TestFederation extends Federation {
  /** Stops it and removes its state and bridges; idempotent. */
  cleanup(): Promise<void>;
}

/** Each cluster: [name, 4-char tag (bridge asb<tag>), second octet of its 10.x.0.0/16 subnet, or its subnet in CIDR]. */
/** `supervise`: restart crashed processes as make up does, with this policy (the clock is real time). */
export async function startTestFederation(clusters: readonly (readonly [string, string, number | string])[], basePool = 0, supervise?: Omit<SupervisorOptions, 'clock'>): Promise<TestFederation> {
  const stateDir = tempDataDir('fed');
  const images = await testImages();
  const options: FederatedClusterOptions[] = clusters.map(([name, tag, octet]) => ({
    name,
    region: name,
    tag,
    apiPort: 0,
    edgePort: 0,
    ingressPort: 0,
    routerPort: 0,
    envoyAdminPort: 0,
    bridge: `asb${tag}`,
    subnet: typeof octet === 'string' ? octet : `10.${String(octet)}.0.0/16`,
    workerArgs: [...images.workerArgs, '--base-pool', String(basePool), '--log-level', 'warn'],
  }));
  const removeBridges = (): void => {
    for (const o of options) {
      try {
        execFileSync('ip', ['link', 'del', o.bridge], { stdio: 'ignore' });
      } catch {
        // no bridge
      }
    }
  };
  let fed: Federation;
  try {
    fed = await startFederation({ stateDir, log: silentLogger(), domain: 'asb.localhost', hubPort: 0, clusters: options, ...(supervise === undefined ? {} : { supervise: { ...supervise, clock: systemClock } }) });
  } catch (err) {
    removeDataDir(stateDir);
    removeBridges();
    throw err;
  }
  let cleaned: Promise<void> | undefined;
  return Object.assign(fed, {
    cleanup() {
      cleaned ??= (async () => {
        await fed.stop();
        removeDataDir(stateDir);
        removeBridges();
      })();
      return cleaned;
    },
  });
}
