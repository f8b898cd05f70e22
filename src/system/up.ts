// `make up`: runs the local system in the foreground. It starts the worker as a child process
// (so it can be killed and restarted like any real cluster member), waits until it is ready,
// writes `.asb/env`, prints the endpoints, and on Ctrl-C or SIGTERM stops everything it started.
//
// Shutdown order: worker (it hibernates its sandboxes, closes the API, then the store); a second
// signal, or 20 s without an exit, kills it outright.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, openSync, readFileSync, writeFileSync, renameSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const stateDir = resolve(process.env.ASB_STATE_DIR ?? join(repoRoot, '.asb'));
const SHUTDOWN_DEADLINE_MS = 20_000;

interface ReadyLine {
  ready: true;
  apiUrl: string;
  clusterName: string;
  clusterTag: string;
}

function main(): void {
  mkdirSync(join(stateDir, 'logs'), { recursive: true });
  if (process.getuid?.() !== 0) {
    console.warn('warning: not running as root: sandboxes run in degraded mode (no network namespace, ports shared on 127.0.0.1). See README "Degraded mode".');
  }
  const logPath = join(stateDir, 'logs', 'worker.log');
  const logFd = openSync(logPath, 'a');
  const worker = spawn(
    process.execPath,
    [join(repoRoot, 'src/system/worker-main.ts'), '--data-dir', join(stateDir, 'data'), '--admin-key-file', join(stateDir, 'admin.key'), ...process.argv.slice(2)],
    { stdio: ['ignore', 'pipe', logFd], env: process.env },
  );
  let stopping = false;
  if (worker.stdout === null) throw new Error('worker stdout is not piped');
  const lines = createInterface({ input: worker.stdout });
  lines.on('line', (line) => {
    const ready = parseReady(line);
    if (ready !== undefined) announce(ready);
  });
  worker.on('exit', (code, signal) => {
    if (!stopping) console.error(`worker exited unexpectedly (${signal ?? `code ${code ?? '?'}`}); its log is ${logPath}`);
    process.exit(stopping ? 0 : 1);
  });

  const stop = (sig: NodeJS.Signals): void => {
    if (stopping) {
      console.error('second signal: killing the worker now');
      worker.kill('SIGKILL');
      return;
    }
    stopping = true;
    console.log(`\n${sig}: stopping (hibernating sandboxes; Ctrl-C again to force)…`);
    terminate(worker);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

function terminate(worker: ChildProcess): void {
  worker.kill('SIGTERM');
  setTimeout(() => {
    console.error(`worker did not stop within ${SHUTDOWN_DEADLINE_MS / 1000} s: killing it`);
    worker.kill('SIGKILL');
  }, SHUTDOWN_DEADLINE_MS).unref();
}

function parseReady(line: string): ReadyLine | undefined {
  try {
    const value = JSON.parse(line) as Partial<ReadyLine>;
    return value.ready === true && typeof value.apiUrl === 'string' ? (value as ReadyLine) : undefined;
  } catch {
    return undefined;
  }
}

function announce(ready: ReadyLine): void {
  const adminKey = readFileSync(join(stateDir, 'admin.key'), 'utf8').trim();
  const env = {
    ASB_API_URL: ready.apiUrl,
    ASB_API_KEY: adminKey,
    ASB_CLUSTER: ready.clusterName,
  };
  const envPath = join(stateDir, 'env');
  const text = `${Object.entries(env).map(([k, v]) => `${k}=${v}`).join('\n')}\n`;
  // Written atomically so a reader never sees half a file.
  writeFileSync(`${envPath}.tmp`, text, { mode: 0o600 });
  renameSync(`${envPath}.tmp`, envPath);
  console.log(`Agent Sandbox is up (cluster ${ready.clusterName}, id tag ${ready.clusterTag})
  worker API   ${ready.apiUrl}
  metrics      ${ready.apiUrl}/metrics  (needs the API key)
  env file     ${envPath}   (source it, or just run: npx asb status)
  logs         ${join(stateDir, 'logs')}
Try:  npx asb create --template base   then   npx asb exec <id> -- echo hello
Ctrl-C stops everything.`);
}

main();
