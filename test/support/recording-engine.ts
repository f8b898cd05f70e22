// A test-only BuildEngine for the build service's and the build API's tests: it runs nothing and
// pushes nothing. Each step is logged ("step N: the test engine ran TYPE args"), a RUN of `exit N`
// fails naming its step, `sleep forever` waits until the build is aborted, and the "image" is the
// base image pinned to a digest of the steps, with the config the ENV, WORKDIR and USER steps
// give. The real engine (src/builds/engine*.ts) is exercised by test/e2b-builds.test.ts.
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import type { BuildEngine, EngineRequest, EngineResult } from '../../src/builds/contract.ts';
import { TeamFileStore } from '../../src/builds/files.ts';
import { TemplateBuilds, type TemplateBuildsOptions } from '../../src/builds/service.ts';
import type { EgressPolicy } from '../../src/network/egress-policy.ts';
import type { ObjectStore } from '../../src/store/store.ts';
import { systemClock } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';

export class RecordingEngine implements BuildEngine {
  readonly requests: EngineRequest[] = [];

  async build(req: EngineRequest): Promise<EngineResult> {
    this.requests.push(req);
    const env: string[] = [];
    let workingDir: string | undefined;
    let user: string | undefined;
    for (const [i, step] of req.steps.entries()) {
      const n = i + 1;
      req.log({ level: 'info', step: n, message: `step ${String(n)}: the test engine ran ${step.type} ${step.args.join(' ')}` });
      if (step.type === 'RUN') {
        const exit = /^exit (\d+)$/.exec(step.args[0] ?? '');
        if (exit !== null) throw new Error(`step ${String(n)}: RUN ${step.args[0] ?? ''} exited with ${exit[1] ?? ''}`);
        if (step.args[0] === 'sleep forever') {
          await new Promise<void>((_res, rej) => {
            if (req.signal.aborted) rej(req.signal.reason as Error);
            req.signal.addEventListener('abort', () => rej(req.signal.reason as Error), { once: true });
          });
        }
      }
      if (step.type === 'ENV') for (let k = 0; k + 1 < step.args.length; k += 2) env.push(`${step.args[k] ?? ''}=${step.args[k + 1] ?? ''}`);
      if (step.type === 'WORKDIR') workingDir = step.args[0];
      if (step.type === 'USER') user = step.args[0];
    }
    const digest = createHash('sha256').update(JSON.stringify([req.baseImage, req.steps])).digest('hex');
    return {
      image: `${req.baseImage.split('@')[0] ?? req.baseImage}@sha256:${digest}`,
      config: { env, ...(workingDir === undefined ? {} : { workingDir }), ...(user === undefined ? {} : { user }) },
      cachedSteps: 0,
    };
  }
}

/** The real build service over `engine`, its records and files under `dir`, as a worker makes it (with `egress` as its --build-egress). */
export function testBuildService(store: ObjectStore, dir: string, engine: BuildEngine, timeoutMs?: number, egress?: EgressPolicy): TemplateBuilds {
  return new TemplateBuilds(testBuildServiceOptions(store, dir, engine, timeoutMs, egress));
}

export function testBuildServiceOptions(store: ObjectStore, dir: string, engine: BuildEngine, timeoutMs?: number, egress?: EgressPolicy): TemplateBuildsOptions {
  return {
    recordsDir: join(dir, 'builds', 'templates'),
    files: new TeamFileStore({ dir: join(dir, 'builds', 'files'), now: () => Date.now() }),
    store,
    engine,
    namespace: 'default',
    clusterTag: 'tst1',
    clock: systemClock,
    log: silentLogger(),
    ...(timeoutMs === undefined ? {} : { limits: { timeoutMs } }),
    ...(egress === undefined ? {} : { egress }),
  };
}
