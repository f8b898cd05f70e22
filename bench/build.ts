// Template builds on the local runtime (make bench's `build` part): a three-step build from
// debian:12 (one run, one copy, one env), built from scratch (noCache) and fully cached, beside its
// floor (the same run command exec'd in a sandbox already running debian:12), and the time from a
// build's end to the first sandbox running the new image (its pull from the registry, unpack and
// start). Its own bridge and subnet (asbbe1, 10.240.1.0/24).
import { performance } from 'node:perf_hooks';
import type { BuildStep } from '../src/builds/contract.ts';
import { request, startBuildFixture } from '../test/support/build-fixture.ts';

export interface BuildFigures {
  firstMs: number[];
  cachedMs: number[];
  floorMs: number[];
  toSandboxMs: number[];
}

const RUN = 'seq 1 200000 > /opt/numbers && sha256sum /opt/numbers > /opt/numbers.sha256';

export async function benchBuild(rounds = 3, cachedRounds = 10): Promise<BuildFigures> {
  const f = await startBuildFixture('asb-be-bench-', 'asbbe1', '10.240.1.0/24');
  const rt = f.runtime.rt;
  try {
    const hash = f.files.add('team-bench', { 'app/main.py': 'print("hello")\n', 'app/lib/util.py': 'X = 1\n' });
    const steps: BuildStep[] = [
      { type: 'RUN', args: [RUN] },
      { type: 'COPY', args: ['app', '/opt/app', '', ''], filesHash: hash },
      { type: 'ENV', args: ['APP_HOME', '/opt/app'] },
    ];
    const figures: BuildFigures = { firstMs: [], cachedMs: [], floorMs: [], toSandboxMs: [] };
    // The floor: the same command in a sandbox of the base image that runs already.
    const floorState = await rt.start({ id: 'floor', uid: 'floor', namespace: 'bench', hostname: 'floor', spec: { containers: [{ name: 'main', image: 'debian:12', command: ['sleep', 'infinity'] }] } });
    if (floorState.phase !== 'Running') throw new Error(`floor sandbox: ${JSON.stringify(floorState)}`);
    for (let i = 0; i < rounds; i++) {
      const t = performance.now();
      const r = await rt.exec('floor', { command: ['sh', '-c', RUN], user: 0 }); // as the build runs it: debian:12 names no USER
      figures.floorMs.push(performance.now() - t);
      if (r.exitCode !== 0) throw new Error('floor command failed');
    }
    await rt.remove('floor');
    // A warm-up build pulls the base into the image cache, as a worker that runs debian:12 has it.
    await f.engine.build(request(f, { team: 'team-bench', baseImage: 'debian:12', steps, repository: 'bench/app', tag: 'warm', noCache: true }));
    for (let i = 0; i < rounds; i++) {
      let t = performance.now();
      const result = await f.engine.build(request(f, { team: 'team-bench', baseImage: 'debian:12', steps, repository: 'bench/app', tag: `first${String(i)}`, noCache: true }));
      figures.firstMs.push(performance.now() - t);
      t = performance.now();
      const id = `new${String(i)}`;
      const state = await rt.start({ id, uid: id, namespace: 'bench', hostname: id, spec: { containers: [{ name: 'main', image: result.image, command: ['sleep', 'infinity'] }] } });
      const r = await rt.exec(id, { command: ['cat', '/opt/app/main.py'] });
      figures.toSandboxMs.push(performance.now() - t);
      if (state.phase !== 'Running' || r.exitCode !== 0) throw new Error(`sandbox of the new image: ${JSON.stringify(state)}`);
      await rt.remove(id);
    }
    for (let i = 0; i < cachedRounds; i++) {
      const t = performance.now();
      const result = await f.engine.build(request(f, { team: 'team-bench', baseImage: 'debian:12', steps, repository: 'bench/app', tag: 'cached' }));
      figures.cachedMs.push(performance.now() - t);
      if (result.cachedSteps !== steps.length) throw new Error(`cached rebuild ran ${String(steps.length - result.cachedSteps)} steps`);
    }
    return figures;
  } finally {
    await f.close();
  }
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}

if (import.meta.main) {
  const figures = await benchBuild();
  console.log(JSON.stringify({ ...figures, median: { firstMs: median(figures.firstMs), cachedMs: median(figures.cachedMs), floorMs: median(figures.floorMs), toSandboxMs: median(figures.toSandboxMs) } }, null, 2));
}
