// The test kubelet (tools/kube/test-kubelet, built into .tools/kube/bin by `make kube-tools`)
// against a KubeApiServer from kube-apiserver.ts: it registers a Node, binds unscheduled Pods to
// it, reports them Running and Ready with a 127.x pod IP, serves pods/exec (run as host
// processes in a per-pod directory: it plays the kubelet, it isolates nothing) and finalizes
// deleted Pods. See tools/kube/test-kubelet/main.go for what it does not do.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { AsbError } from '../../src/errors.ts';
import { diesWithTest, KUBE_BIN_DIR, logTail, type KubeApiServer } from './kube-apiserver.ts';

export interface TestKubeletOptions {
  /** Default asb-test-node. */
  nodeName?: string;
  /** Pod IPs come from here; default 127.77.0.0/16. */
  podCidr?: string;
  /** Only Pods of this namespace; default every namespace. */
  namespace?: string;
  /** How long the binary may take to register its node; default 60 s. */
  readyTimeoutMs?: number;
}

export interface TestKubelet {
  readonly nodeName: string;
  /** The HTTPS port the API server dials for pods/exec. */
  readonly port: number;
  /** Pod directories (pods/<ns>/<name>-<uid>) and claim volumes (volumes/<ns>/<claim>). */
  readonly root: string;
  readonly logPath: string;
  /** Ends the kubelet (it kills what it ran) and removes its directory. Idempotent. */
  stop(): Promise<void>;
}

const live = new Set<{ proc: ChildProcess; root: string }>();
process.once('exit', () => {
  for (const k of live) {
    k.proc.kill('SIGKILL');
    rmSync(k.root, { recursive: true, force: true });
  }
});

export async function startTestKubelet(kube: KubeApiServer, opts: TestKubeletOptions = {}): Promise<TestKubelet> {
  const binary = join(KUBE_BIN_DIR, 'test-kubelet');
  if (!existsSync(binary)) throw new AsbError('Unavailable', `test kubelet: ${binary} is missing; run \`make kube-tools\` (make test does) to build it`);
  const nodeName = opts.nodeName ?? 'asb-test-node';
  const root = mkdtempSync(join(tmpdir(), 'asb-kubelet-'));
  const logPath = join(root, 'test-kubelet.log');
  const args = ['--kubeconfig', kube.kubeconfigPath, '--root', root, '--node-name', nodeName, '--pod-cidr', opts.podCidr ?? '127.77.0.0/16'];
  if (opts.namespace !== undefined) args.push('--namespace', opts.namespace);
  const [command, argv] = diesWithTest(binary, args);
  const log = openSync(logPath, 'a');
  let proc: ChildProcess;
  try {
    proc = spawn(command, argv, { stdio: ['ignore', 'pipe', log] });
  } finally {
    closeSync(log);
  }
  const entry = { proc, root };
  live.add(entry);
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));

  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM'); // it kills the process groups of its execs, then exits
        const timer = setTimeout(() => proc.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }
      live.delete(entry);
      rmSync(root, { recursive: true, force: true });
    })();
    return stopping;
  };

  try {
    const port = await readyPort(proc, exited, logPath, opts.readyTimeoutMs ?? 60_000);
    return { nodeName, port, root, logPath, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The port from the binary's one stdout line, {"node":…,"port":…}. */
function readyPort(proc: ChildProcess, exited: Promise<void>, logPath: string, timeoutMs: number): Promise<number> {
  const stdout = proc.stdout;
  if (stdout === null) return Promise.reject(new Error('test kubelet has no stdout'));
  const lines = createInterface({ input: stdout });
  return new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => fail(`not ready within ${timeoutMs} ms`), timeoutMs);
    const fail = (why: string): void => {
      clearTimeout(timer);
      lines.close();
      reject(new AsbError('Unavailable', `test kubelet ${why}; ${logPath} ends:\n${logTail(logPath)}`));
    };
    lines.once('line', (line) => {
      clearTimeout(timer);
      lines.close();
      stdout.resume(); // nothing more is written there; never let the pipe fill
      try {
        resolve((JSON.parse(line) as { port: number }).port);
      } catch {
        fail(`printed ${JSON.stringify(line)} instead of its ready line`);
      }
    });
    void exited.then(() => fail(`exited (${String(proc.exitCode ?? proc.signalCode)}) before it was ready`));
  });
}
