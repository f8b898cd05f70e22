// A streaming process inside a pod: the runtime's spawn(). Unlike exec() nothing is captured;
// the caller reads stdout and stderr as they come (envd's process.Start sends them on at once).
// The process leads its own group (spawnInPod), so kill() reaches a shell and all it started.
import { constants } from 'node:os';
import type { PodProcess, SpawnRequest } from '../runtime.ts';
import { EXEC_FAILED_CODE, signalOfCode, spawnInPod, type PodTarget } from './exec.ts';
import { agentRequest, agentSpawn } from './agent.ts';

export function spawnPodProcess(target: PodTarget, req: SpawnRequest): Promise<PodProcess> {
  if (target.agent !== undefined) return agentSpawn(target.agent, agentRequest(target, req));
  const proc = spawnInPod(target, req.command, req);
  const child = proc.child;
  const { stdin, stdout, stderr } = child;
  if (stdin === null || stdout === null || stderr === null) return Promise.reject(new Error('spawned process has no pipes'));
  // A process that exits or closes stdin early makes writes fail with EPIPE: `exited` reports the end.
  stdin.on('error', () => undefined);
  const exited = new Promise<{ exitCode: number; signal?: string }>((resolve) => {
    // 'exit', not 'close': a background child holding the pipes open must not delay the end.
    child.on('exit', (code, signal) => {
      // Under gVisor a command that never started: runc's code for it (its message is lost to a stream that has ended).
      if (proc.startFailure() !== undefined) {
        resolve({ exitCode: EXEC_FAILED_CODE });
        return;
      }
      const exitCode = signal === null ? code ?? 1 : 128 + constants.signals[signal];
      const died = signal ?? signalOfCode(exitCode);
      resolve(died === undefined ? { exitCode } : { exitCode, signal: died });
    });
    child.on('error', () => resolve({ exitCode: 127 }));
  });
  return new Promise((resolve, reject) => {
    child.once('spawn', () => resolve({ stdin, stdout, stderr, exited, kill: (signal) => proc.kill(signal) }));
    child.once('error', reject);
  });
}
