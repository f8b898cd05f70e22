// `make up`: runs the local system in the foreground (src/system/local-system.ts: worker,
// router, Envoy), writes `.asb/env` when it is ready, prints the endpoints, and on Ctrl-C or
// SIGTERM stops everything it started, in order. A second signal kills at once.
//
// Settings (environment; the worker's own ASB_* variables in config.ts apply too):
//   ASB_STATE_DIR          where .asb lives (default <repo>/.asb)
//   ASB_API_PORT           worker REST API port (default 7080)
//   ASB_EDGE_PORT          Envoy's HTTP port on 127.0.0.1 (default 10000)
//   ASB_ENVOY_ADMIN_PORT   Envoy admin port on 127.0.0.1 (default 9901)
//   ASB_ROUTER_PORT        router gRPC port on 127.0.0.1 (default 9002)
//   ASB_DOMAIN             sandbox domain: <port>-<id>.<domain> (default asb.localhost)
//   ASB_CLUSTER_NAME       this cluster's name (default local)
import { renameSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLogger } from './log.ts';
import { startLocalSystem, type LocalSystem } from './local-system.ts';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

function port(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const text = env[name];
  if (text === undefined || text === '') return fallback;
  const value = Number(text);
  if (!Number.isInteger(value) || value < 0 || value > 65535) {
    console.error(`${name} must be a port number from 0 to 65535, got "${text}"`);
    process.exit(2);
  }
  return value;
}

async function main(): Promise<void> {
  const env = process.env;
  const stateDir = resolve(env.ASB_STATE_DIR ?? join(repoRoot, '.asb'));
  if (process.getuid?.() !== 0) {
    console.warn('warning: not running as root: sandboxes run in degraded mode (no network namespace, ports shared on 127.0.0.1). See README "Degraded mode".');
  }
  const log = createLogger({ level: env.ASB_LOG_LEVEL ?? 'warn' });
  console.log('starting: worker, router, Envoy…');
  let system: LocalSystem;
  try {
    system = await startLocalSystem({
      stateDir,
      log,
      apiPort: port(env, 'ASB_API_PORT', 7080),
      edgePort: port(env, 'ASB_EDGE_PORT', 10000),
      envoyAdminPort: port(env, 'ASB_ENVOY_ADMIN_PORT', 9901),
      routerPort: port(env, 'ASB_ROUTER_PORT', 9002),
      domain: env.ASB_DOMAIN ?? 'asb.localhost',
      clusterName: env.ASB_CLUSTER_NAME ?? 'local',
    });
  } catch (err) {
    console.error(`make up failed: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  }
  writeEnv(stateDir, system);
  announce(stateDir, system);

  let stopping = false;
  const stop = (sig: NodeJS.Signals): void => {
    if (stopping) {
      console.error('second signal: killing everything now');
      system.worker.proc.kill('SIGKILL');
      system.router.proc.kill('SIGKILL');
      system.envoy.destroy();
      process.exit(1);
    }
    stopping = true;
    console.log(`\n${sig}: stopping (Envoy, router, then the worker hibernates its sandboxes; Ctrl-C again to force)…`);
    system.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        console.error('stop failed:', err);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  for (const child of [system.worker, system.router]) {
    void child.exited.then((code) => {
      if (stopping) return;
      console.error(`${child.name} exited unexpectedly (${String(code)}); its log is in ${join(stateDir, 'logs')}. Stopping.`);
      stop('SIGTERM');
    });
  }
}

function writeEnv(stateDir: string, system: LocalSystem): void {
  const env = {
    ASB_API_URL: system.apiUrl,
    ASB_API_KEY: system.adminKey,
    ASB_CLUSTER: system.clusterName,
    ASB_EDGE_URL: system.edgeUrl,
    ASB_DOMAIN: system.domain,
  };
  const envPath = join(stateDir, 'env');
  const text = `${Object.entries(env).map(([k, v]) => `${k}=${v}`).join('\n')}\n`;
  // Written atomically so a reader never sees half a file.
  writeFileSync(`${envPath}.tmp`, text, { mode: 0o600 });
  renameSync(`${envPath}.tmp`, envPath);
}

function announce(stateDir: string, system: LocalSystem): void {
  console.log(`Agent Sandbox is up (cluster ${system.clusterName}, id tag ${system.clusterTag})
  worker API   ${system.apiUrl}
  edge         ${system.edgeUrl}   sandboxes at http://<port>-<id>.${system.domain}:${new URL(system.edgeUrl).port}
  metrics      ${system.apiUrl}/metrics  (needs the API key)
  env file     ${join(stateDir, 'env')}   (source it, or just run: npx asb status)
  logs         ${join(stateDir, 'logs')}
Try:  npx asb create --template base   then   npx asb exec <id> -- echo hello
Ctrl-C stops everything.`);
}

void main();
