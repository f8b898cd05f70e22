// `make up` as a user runs it (make, then src/assembly/up.ts): stopped by a SIGTERM to its process
// group (make forwards it to up.ts, which then gets it twice), or by SIGINT as a terminal's
// Ctrl-C sends it, it returns only once every process it started has exited, having stopped
// them in order, and a start right after comes up, also in a shell that sourced the env file the
// first one wrote; a second make up while one runs on the same state dir names it and starts
// nothing. Its own ports (kernel-picked),
// state dir, bridge and subnet, so it never meets a `make up` a developer is running.
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { KUBECTL } from './support/kubectl.ts';
import { removeDataDir, tempDataDir } from './support/worker-process.ts';

const REPO = resolve(import.meta.dirname, '..');
const BRIDGE = 'asbupt0';

interface Up {
  proc: ChildProcess;
  output: () => string;
  /** make's exit: its code, or the signal it ended itself with (make re-raises a SIGTERM it got). */
  exited: Promise<number | string | null>;
}

/** `sourced`: what the shell holds before `make up` (`set -a; . .asb/env; set +a`). */
function startUp(stateDir: string, sourced: Record<string, string> = {}): Up {
  const env = {
    ...process.env,
    ...sourced,
    ASB_STATE_DIR: stateDir,
    ASB_FEDERATION: 'off',
    ASB_API_PORT: '0',
    ASB_EDGE_PORT: '0',
    ASB_EDGE_TLS_PORT: '0',
    ASB_ENVOY_ADMIN_PORT: '0',
    ASB_ROUTER_PORT: '0',
    ASB_BRIDGE: BRIDGE,
    ASB_SUBNET: '10.235.0.0/16',
    ASB_BASE_POOL_REPLICAS: '1',
    // The egress proxy is on by default; a free port, so a developer's make up (15001) is not met.
    ASB_EGRESS_PROXY_PORT: '0',
  };
  // Its own process group, as a shell gives a foreground job: the test signals the group.
  const proc = spawn('make', ['--no-print-directory', 'up'], { cwd: REPO, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let out = '';
  proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | string | null>((res) => proc.once('exit', (code, signal) => res(code ?? signal)));
  return { proc, output: () => out, exited };
}

async function untilUp(up: Up): Promise<void> {
  const deadline = Date.now() + 120_000;
  while (!up.output().includes('Agent Sandbox is up')) {
    if (up.proc.exitCode !== null) throw new Error(`make up exited (${up.proc.exitCode}):\n${up.output()}`);
    if (Date.now() > deadline) throw new Error(`make up did not come up:\n${up.output()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** After a failed assertion: nothing of it may be left running. */
function killGroup(up: Up): void {
  if (up.proc.exitCode !== null || up.proc.signalCode !== null) return;
  try {
    process.kill(-(up.proc.pid ?? 0), 'SIGKILL');
  } catch {
    // gone meanwhile
  }
}

/** A process's command line, or '' once it has gone (make up's short-lived commands end any time). */
function cmdlineOf(pid: number | string): string {
  try {
    return readFileSync(`/proc/${String(pid)}/cmdline`, 'utf8');
  } catch {
    return '';
  }
}

/** Processes whose command line names the state dir: what this make up started. */
function processesOf(stateDir: string): number[] {
  return readdirSync('/proc').filter((entry) => /^\d+$/.test(entry) && cmdlineOf(entry).includes(stateDir)).map(Number);
}

function envOf(stateDir: string): Record<string, string> {
  return Object.fromEntries(readFileSync(join(stateDir, 'env'), 'utf8').trim().split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
}

test('make up holds its state dir against a second one, stops on a SIGTERM to its process group after everything it started, and starts again at once in a shell that sourced its env file', { timeout: 280_000 }, async (t) => {
  const stateDir = tempDataDir('up');
  // One hook, in this order: a failed assertion leaves make up running, and its pods' mounts make
  // the state dir's removal throw, which skipped any hook after it (the test then hung).
  const ups: Up[] = [];
  t.after(() => {
    for (const up of ups) killGroup(up);
    removeDataDir(stateDir);
    try {
      execFileSync('ip', ['link', 'del', BRIDGE], { stdio: 'ignore' });
    } catch {
      // no bridge
    }
  });
  const first = startUp(stateDir);
  ups.push(first);
  await untilUp(first);
  const env = envOf(stateDir);
  // .asb/kubeconfig, named by ASB_KUBECONFIG, takes kubectl to the TLS edge's Kubernetes API.
  assert.equal(env.ASB_KUBECONFIG, join(stateDir, 'kubeconfig'));
  assert.match(first.output(), /kubectl {6}KUBECONFIG=.*kubeconfig kubectl get sandboxes/);
  const templates = await new Promise<string>((res, rej) => {
    execFile(KUBECTL, ['get', 'sandboxtemplates', '-o', 'name'], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: stateDir, KUBECONFIG: env.ASB_KUBECONFIG ?? '' }, timeout: 60_000 }, (err, stdout, stderr) => (err === null ? res(stdout) : rej(new Error(`${err.message}\n${stderr}`))));
  });
  assert.equal(templates, 'sandboxtemplate.extensions.agents.x-k8s.io/base\n');
  // A running sandbox makes the stop take a while: the worker hibernates it before exiting.
  const created = await fetch(`${env.ASB_API_URL}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${env.ASB_API_KEY}`, 'content-type': 'application/json' }, body: '{"template":"base"}' });
  assert.equal(created.status, 201, await created.text());
  // The egress proxy runs by default: a policy naming a domain is taken (with it off, refused 422).
  assert.match(first.output(), /egress proxy on <pods' gateway>:\d+/);
  const named = await fetch(`${env.ASB_API_URL}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${env.ASB_API_KEY}`, 'content-type': 'application/json' }, body: '{"template":"base","network":{"deny":["evil.example"]}}' });
  assert.equal(named.status, 201, await named.text());
  // A registry killed with -9 is started again on its port, as make up's other processes are (it
  // used to stay down: every later start of an image named by tag failed until make up restarted).
  const registryOf = (): number[] => processesOf(stateDir).filter((pid) => cmdlineOf(pid).startsWith('/usr/bin/docker-registry'));
  const [registry] = registryOf();
  assert.ok(registry !== undefined, 'the registry runs');
  process.kill(registry, 'SIGKILL');
  for (let i = 0; i < 300 && !/the image registry is back on 127\.0\.0\.1:\d+/.test(first.output()); i++) await new Promise((r) => setTimeout(r, 100));
  assert.match(first.output(), /supervisor: the image registry exited \(SIGKILL\); restarting it/);
  assert.match(first.output(), /the image registry is back on 127\.0\.0\.1:\d+/);
  assert.equal(registryOf().filter((pid) => pid !== registry).length, 1, 'one new registry process');
  const cold = await fetch(`${env.ASB_API_URL}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${env.ASB_API_KEY}`, 'content-type': 'application/json' }, body: '{"template":"base","coldStart":true,"wait":true}' });
  assert.equal(cold.status, 201, `a cold start pulls base:latest from the restarted registry: ${await cold.text()}`);
  const started = processesOf(stateDir);
  assert.ok(started.length >= 2, `make up's processes are visible: ${started.join(' ')}`);

  // A second make up on the held state dir names the make up that holds it and starts nothing
  // (it used to get as far as the registry's port, and fail on that).
  const rival = startUp(stateDir);
  ups.push(rival);
  assert.equal(await rival.exited, 2, `make reports the failed recipe:\n${rival.output()}`);
  const holder = /another make up is running on this state directory: state directory (\S+) is in use by process (\d+) \(([^)]*)\)/.exec(rival.output());
  assert.ok(holder !== null, rival.output());
  assert.equal(holder[1], stateDir);
  assert.match(readFileSync(`/proc/${holder[2] ?? ''}/cmdline`, 'utf8'), /src\/assembly\/up\.ts/, 'the pid named is the running make up');
  assert.match(holder[3] ?? '', /up\.ts/);
  assert.doesNotMatch(rival.output(), /starting:|registry|address already in use/, 'nothing was started');
  const stillUp = await fetch(`${env.ASB_API_URL}/v1/status`, { headers: { authorization: `Bearer ${env.ASB_API_KEY}` } });
  assert.equal(stillUp.status, 200, 'the first make up is untouched');
  await stillUp.body?.cancel();

  // What the stop says, after the registry's crash above said its own.
  const stopFrom = first.output().length;
  process.kill(-(first.proc.pid ?? 0), 'SIGTERM');
  assert.ok(['SIGTERM', 0].includes((await first.exited) ?? -1), first.output());
  assert.match(first.output(), /SIGTERM: stopping/);
  assert.deepEqual(processesOf(stateDir).filter((pid) => started.includes(pid)), [], 'nothing it started outlives make up');
  assert.doesNotMatch(first.output().slice(stopFrom), /exited unexpectedly|killing everything/, 'a stop is neither a crash nor a forced kill');

  // Started as a user does after sourcing the env file the first one wrote (its banner says to):
  // ASB_KUBECONFIG, ASB_HUB_URL, ASB_EDGE_URL... are client settings, never the worker's own.
  const second = startUp(stateDir, env);
  ups.push(second);
  await untilUp(second);
  assert.match(second.output(), /ignoring client settings in the environment .*ASB_KUBECONFIG/);
  const status = await fetch(`${envOf(stateDir).ASB_API_URL}/v1/status`, { headers: { authorization: `Bearer ${env.ASB_API_KEY}` } });
  assert.equal(status.status, 200);
  await status.body?.cancel();
  const beforeStop = processesOf(stateDir);
  process.kill(-(second.proc.pid ?? 0), 'SIGINT');
  assert.ok(['SIGINT', 0, 2].includes((await second.exited) ?? -1), second.output());
  assert.deepEqual(processesOf(stateDir).filter((pid) => beforeStop.includes(pid)), [], 'after Ctrl-C too');
});
