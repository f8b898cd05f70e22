// The whole local system (worker, router, Envoy) for end-to-end tests and benchmarks, on its own
// ports, data directory, bridge and subnet, so it never collides with `make up` or another file.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { ensureEdgeTls } from '../../src/edge/tls.ts';
import { testImages } from './test-images.ts';
import { silentLogger } from '../../src/base/log.ts';
import { startLocalSystem, type LocalSystem } from '../../src/assembly/local-system.ts';
import { removeDataDir, teamKeyIn, tempDataDir } from './worker-process.ts';

export interface TestSystem extends LocalSystem {
  /** Stops it and removes its data and bridge; idempotent. */
  cleanup(): Promise<void>;
  /** An API key per team named in `teams`, written into the store before the worker started. */
  teamKeys: Record<string, string>;
}

/**
 * tag: 4 chars [a-z0-9] (id prefix, bridge asb<tag>); subnetOctet: 10.<octet>.0.0/16; basePool:
 * warm `base` sandboxes; https: also an HTTPS edge listener, its certificate signed by a test CA
 * (caCertPath); teams: a key for each (teamKeys); workerArgs: more flags for the worker.
 */
export async function startTestSystem(tag: string, subnetOctet: number, clusterName = 'local', basePool = 0, https = false, teams: readonly string[] = [], workerArgs: readonly string[] = []): Promise<TestSystem & { caCertPath: string | undefined }> {
  const stateDir = tempDataDir(tag);
  const teamKeys: Record<string, string> = {};
  for (const team of teams) teamKeys[team] = await teamKeyIn(stateDir, team);
  const tls = https ? await ensureEdgeTls(join(stateDir, 'tls'), 'asb.localhost') : undefined;
  const system = await startLocalSystem({
    stateDir,
    log: silentLogger(),
    apiPort: 0,
    edgePort: 0,
    envoyAdminPort: 0,
    routerPort: 0,
    domain: 'asb.localhost',
    clusterName,
    ...(tls === undefined ? {} : { edgeTls: { port: 0, files: tls } }),
    workerArgs: [...(await testImages()).workerArgs, '--cluster-tag', tag, '--bridge', `asb${tag}`, '--subnet', `10.${subnetOctet}.0.0/16`, '--base-pool', String(basePool), '--log-level', 'warn', ...workerArgs],
  });
  let cleaned: Promise<void> | undefined;
  return Object.assign(system, {
    caCertPath: tls?.caCertPath,
    teamKeys,
    cleanup() {
      cleaned ??= (async () => {
        await system.stop();
        removeDataDir(stateDir);
        try {
          execFileSync('ip', ['link', 'del', `asb${tag}`], { stdio: 'ignore' });
        } catch {
          // no bridge
        }
      })();
      return cleaned;
    },
  });
}
