// What the build engine's tests share: a real local runtime (its own bridge and subnet), the
// tests' registry for base images, a registry of their own the built images are pushed to, the
// engine, a FileStore of tars made here, and a runtime wrapper that counts pod starts.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import type { BuildLogEntry, BuildStep, EngineRequest, FileStore } from '../../src/builds/contract.ts';
import { createLocalBuildEngine, type LocalBuildEngine } from '../../src/builds/engine.ts';
import type { ImageStore } from '../../src/images/image-store.ts';
import type { EgressPolicy } from '../../src/network/egress-policy.ts';
import { RegistryProcess } from '../../src/images/registry-process.ts';
import type { PodRuntime } from '../../src/runtime/runtime.ts';
import { silentLogger } from '../../src/base/log.ts';
import { startTestRuntime, stopTestRuntime, type TestRuntime } from './test-runtime.ts';
import { testImageStore } from './test-images.ts';

export interface BuildFixture {
  runtime: TestRuntime;
  /** The runtime as the engine sees it: counts start() calls. */
  counted: PodRuntime;
  starts: () => number;
  images: ImageStore;
  registry: RegistryProcess;
  engine: LocalBuildEngine;
  files: TestFiles;
  dir: string;
  /** Another engine on the same state dir, as a restarted worker makes. */
  restartedEngine(): LocalBuildEngine;
  close(): Promise<void>;
}

export class TestFiles implements FileStore {
  readonly #tars = new Map<string, string>();
  readonly #dir: string;
  constructor(dir: string) {
    this.#dir = dir;
  }
  /** A tar (gzip'ed when asked) of these files, uploaded by `team`; returns its hash. */
  add(team: string, files: Record<string, string>, gzip = false): string {
    const ctx = mkdtempSync(join(this.#dir, 'ctx-'));
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(ctx, path)), { recursive: true });
      writeFileSync(join(ctx, path), text);
    }
    const tar = `${ctx}.tar${gzip ? '.gz' : ''}`;
    execFileSync('tar', [gzip ? '-czf' : '-cf', tar, '-C', ctx, ...Object.keys(files).map((p) => p.split('/')[0] ?? p).filter((v, i, a) => a.indexOf(v) === i)]);
    rmSync(ctx, { recursive: true, force: true });
    const hash = createHash('sha256').update(readFileSync(tar)).digest('hex');
    this.#tars.set(`${team}/${hash}`, tar);
    return hash;
  }
  /** The same upload (the same bytes) made by another team too. */
  share(from: string, hash: string, to: string): void {
    const tar = this.#tars.get(`${from}/${hash}`);
    if (tar !== undefined) this.#tars.set(`${to}/${hash}`, tar);
  }
  has(team: string, hash: string): boolean {
    return this.#tars.has(`${team}/${hash}`);
  }
  path(team: string, hash: string): string | undefined {
    return this.#tars.get(`${team}/${hash}`);
  }
}

export async function startBuildFixture(prefix: string, bridge: string, subnet: string): Promise<BuildFixture> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const runtime = await startTestRuntime(`${prefix}rt-`, bridge, subnet, { probeIntervalMs: 100, pollIntervalMs: 100 });
  const registry = new RegistryProcess({ stateDir: join(dir, 'registry'), logger: silentLogger() });
  await registry.start();
  const images = await testImageStore();
  let starts = 0;
  const rt = runtime.rt;
  const counted = new Proxy(rt, {
    get(target, prop): unknown {
      const value: unknown = Reflect.get(target, prop, target);
      if (typeof value !== 'function') return value;
      const fn = value as (...args: unknown[]) => unknown;
      if (prop === 'start') return (...args: unknown[]) => { starts++; return fn.apply(target, args); };
      return fn.bind(target);
    },
  }) as PodRuntime;
  const make = (): LocalBuildEngine => createLocalBuildEngine({ runtime: counted, images, registry: registry.address, stateDir: join(dir, 'engine') });
  const engine = make();
  return {
    runtime, counted, starts: () => starts, images, registry, engine, files: new TestFiles(dir), dir, restartedEngine: make,
    async close() {
      await stopTestRuntime(runtime);
      await registry.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A request with the tests' defaults; its log lines land in `log`. */
export function request(f: BuildFixture, fields: { team?: string; baseImage?: string; steps: BuildStep[]; tag?: string; repository?: string; noCache?: boolean; runtimeClassName?: string; egress?: EgressPolicy; limits?: Partial<EngineRequest['limits']>; signal?: AbortSignal }, log: Omit<BuildLogEntry, 'timestamp'>[] = []): EngineRequest {
  return {
    team: fields.team ?? 'team-a',
    baseImage: fields.baseImage ?? 'debian:12',
    steps: fields.steps,
    noCache: fields.noCache ?? false,
    target: { repository: fields.repository ?? 'builds/team-a/app', tag: fields.tag ?? 'v1' },
    ...(fields.runtimeClassName === undefined ? {} : { runtimeClassName: fields.runtimeClassName }),
    ...(fields.egress === undefined ? {} : { egress: fields.egress }),
    limits: { cpu: 1, memoryBytes: 1024 * 2 ** 20, diskBytes: 2 * 2 ** 30, timeoutMs: 240_000, ...fields.limits },
    files: f.files,
    log: (entry) => log.push(entry),
    signal: fields.signal ?? new AbortController().signal,
  };
}

let checks = 0;

/** Starts a sandbox of the image (as a template's pod would be), runs the script as its default user, removes it: stdout and stderr. */
export async function inSandbox(f: BuildFixture, image: string, script: string, runtimeClassName?: string): Promise<string> {
  const id = `check${String(++checks)}`;
  const rt = f.runtime.rt;
  try {
    const state = await rt.start({ id, uid: `u-${id}`, namespace: 'd', hostname: id, spec: { ...(runtimeClassName === undefined ? {} : { runtimeClassName }), containers: [{ name: 'main', image, command: ['sleep', 'infinity'] }] } });
    assert.equal(state.phase, 'Running', JSON.stringify(state));
    const r = await rt.exec(id, { command: ['sh', '-c', script] });
    return Buffer.from(r.stdout).toString() + Buffer.from(r.stderr).toString();
  } finally {
    await rt.remove(id);
  }
}
