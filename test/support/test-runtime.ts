// A real local runtime for a test file: its own root, bridge and subnet (so no other file, and no
// `make up`, collides with it), images from the tests' registry (test-images.ts); and its
// clean-up: every pod removed, the runtime closed, the bridge and the root deleted.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLocalRuntime, type LocalRuntime } from '../../src/runtime/local/local-runtime.ts';
import type { LocalRuntimeOptions } from '../../src/runtime/local/runtime-options.ts';
import { deleteBridge } from '../../src/runtime/local/network.ts';
import { silentLogger } from '../../src/base/log.ts';
import { testImageStore } from './test-images.ts';

export interface TestRuntime {
  root: string;
  rt: LocalRuntime;
  bridge: string;
}

export async function startTestRuntime(prefix: string, bridge: string, subnet: string, opts: Partial<LocalRuntimeOptions> = {}): Promise<TestRuntime> {
  const root = await mkdtemp(join(tmpdir(), prefix));
  try {
    const rt = await createLocalRuntime({ root, log: silentLogger(), images: await testImageStore(), bridge, subnet, ...opts });
    return { root, rt, bridge };
  } catch (err) {
    await rm(root, { recursive: true, force: true });
    throw err;
  }
}

export async function stopTestRuntime(t: TestRuntime): Promise<void> {
  for (const id of t.rt.list()) await t.rt.remove(id);
  await t.rt.close();
  await deleteBridge(t.bridge);
  await rm(t.root, { recursive: true, force: true });
}
