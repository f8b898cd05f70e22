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

// How long the binary may take to register its node.
const READY_TIMEOUT_MS = 60_000;

export interface TestKubelet {
  /** The Node it registered (its default name, asb-test-node); every Pod is bound to it. */
  readonly nodeName: string;
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

/** Its pod directories (pods/<ns>/<name>-<uid>), claim volumes (volumes/<ns>/<claim>) and log go in a temporary directory. */
export async function startTestKubelet(kube: KubeApiServer): Promise<TestKubelet> {
  const binary = join(KUBE_BIN_DIR, 'test-kubelet');
  if (!existsSync(binary)) throw new AsbError('Unavailable', `test kubelet: ${binary} is missing; run \`make kube-tools\` (make test does) to build it`);
  const root = mkdtempSync(join(tmpdir(), 'asb-kubelet-'));
  const logPath = join(root, 'test-kubelet.log');
  const [command, argv] = diesWithTest(binary, ['--kubeconfig', kube.kubeconfigPath, '--root', root]);
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
    const nodeName = await readyNode(proc, exited, logPath);
    return { nodeName, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The node name from the binary's one stdout line, {"node":…,"port":…}. */
function readyNode(proc: ChildProcess, exited: Promise<void>, logPath: string): Promise<string> {
  const stdout = proc.stdout;
  if (stdout === null) return Promise.reject(new Error('test kubelet has no stdout'));
  const lines = createInterface({ input: stdout });
  return new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => fail(`not ready within ${READY_TIMEOUT_MS} ms`), READY_TIMEOUT_MS);
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
        resolve((JSON.parse(line) as { node: string }).node);
      } catch {
        fail(`printed ${JSON.stringify(line)} instead of its ready line`);
      }
    });
    void exited.then(() => fail(`exited (${String(proc.exitCode ?? proc.signalCode)}) before it was ready`));
  });
}
