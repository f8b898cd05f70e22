// `node bench/run.ts refill`: only the refill row and its floor, several times in turn (the runtime
// part measures them once among its other rows). Each round runs the floor (bench/refill-floor.ts)
// and then our refill (bench/runtime.ts refillPods) on the same machine a few seconds apart, so
// other load moves both: the ratio is the figure to compare across runs.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLocalRuntime, type LocalRuntime } from '../src/runtime/local/local-runtime.ts';
import { ROOT_ID_MAP } from '../src/runtime/oci/spec.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { silentLogger } from '../src/base/log.ts';
import { round } from './claims.ts';
import { BASE_IMAGE, startBenchRegistry } from './images.ts';
import { floorInputs, refillFloor, type RefillFloor } from './refill-floor.ts';
import { cached, cleanupRuntime, refillPods, REFILL, type Refill } from './runtime.ts';

/** The runtime's own bridge and subnet for this part: the other half of the floor's 10.222.0.0/16. */
const BRIDGE = 'asbrf1';
const SUBNET = '10.222.128.0/17';
const ROUNDS = 3;

export interface RefillRound {
  floor: RefillFloor;
  ours: Refill;
  /** ours.ms / floor.ms */
  ratio: number;
}

export async function benchRefillRounds(rounds = ROUNDS): Promise<RefillRound[]> {
  const registry = await startBenchRegistry();
  const root = await mkdtemp(join(tmpdir(), 'asb-bench-refill-'));
  const runtimeRoot = join(root, 'runtime');
  let rt: LocalRuntime | undefined;
  try {
    const images = registry.store(join(root, 'images'));
    rt = await createLocalRuntime({ root: runtimeRoot, log: silentLogger(), images, bridge: BRIDGE, subnet: SUBNET });
    if (rt.unavailable !== undefined) throw new Error(`the local runtime starts no pod here: ${rt.unavailable}`);
    const req: PodRequest = { id: 'rf-warmup', uid: 'uid-rf-warmup', namespace: 'default', hostname: 'rf-warmup', spec: { containers: [{ name: 'main', image: BASE_IMAGE, command: ['sleep', 'infinity'], ...cached }] } };
    const state = await rt.start(req);
    if (state.phase !== 'Running') throw new Error(`the warm-up pod did not start: ${JSON.stringify(state)}`);
    const inputs = await floorInputs(runtimeRoot, req.id, req, images.get(BASE_IMAGE, ROOT_ID_MAP)?.rootfs ?? '');
    const out: RefillRound[] = [];
    for (let i = 0; i < rounds; i++) {
      const floor = await refillFloor(inputs, REFILL);
      if (floor.failed > 0) throw new Error(`the floor's refill failed for ${floor.failed} pods: ${floor.firstError ?? ''}`);
      const ours = await refillPods(rt, `rf-${i}`, cached);
      out.push({ floor, ours, ratio: round(ours.ms / floor.ms, 2) });
    }
    await rt.remove(req.id);
    return out;
  } finally {
    await cleanupRuntime(rt, runtimeRoot, BRIDGE);
    await rm(root, { recursive: true, force: true });
    await registry.close();
  }
}
