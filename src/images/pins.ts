// Who uses what in the image cache, on disk so every process sharing the cache sees it (the two
// workers of `make up`, test files): one file per pod under <cache>/pins/, naming the references
// and unpacked trees that pod runs. A runtime pins before it looks the image up and keeps the pin
// while the pod exists, hibernated or not; it unpins when it deletes the pod (after its dir).
//
// A worker killed with -9 leaves its pins; they stay valid while the pod dir they name exists (the
// next worker on that state dir re-adopts or wakes those pods) and become stale once it does not
// (gc-decision.ts), so nothing is pinned for ever by a process that is gone.
//
// Files are written once, never rewritten: a new pin of the same pod is a new file (a random name),
// and the older ones go after it. GC removes a stale pin by the file name it judged, so it can never
// remove the fresh pin of a pod re-created under the same id in between.
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { GcPin } from './gc-decision.ts';

/** A pin's contents. */
export interface PinFile {
  /** The user's directory: the pin is live while it exists (a local pod's dir). */
  readonly podDir: string;
  readonly references: readonly string[];
  /** rootfs/ directory names. */
  readonly trees: readonly string[];
}

export function pinsDir(cacheRoot: string): string {
  return join(cacheRoot, 'pins');
}

function prefixOf(podDir: string): string {
  return createHash('sha256').update(resolve(podDir)).digest('hex').slice(0, 32);
}

async function ownPins(dir: string, prefix: string): Promise<string[]> {
  try {
    return (await readdir(dir)).filter((f) => f.startsWith(`${prefix}.`) && f.endsWith('.json'));
  } catch {
    return [];
  }
}

async function readPin(path: string): Promise<PinFile | undefined> {
  try {
    return JSON.parse(await readFile(path, 'utf8')) as PinFile;
  } catch {
    return undefined; // removed in between (GC, or the pod's next pin)
  }
}

/**
 * Adds references and trees to podDir's pin. Returns whether anything was written: a pin that
 * already names them is left alone (a wake pins what its pod ran, and writes nothing).
 */
export async function addPin(cacheRoot: string, podDir: string, references: readonly string[], trees: readonly string[]): Promise<boolean> {
  const dir = pinsDir(cacheRoot);
  const prefix = prefixOf(podDir);
  const existing = await ownPins(dir, prefix);
  const refs = new Set<string>();
  const dirs = new Set<string>();
  for (const file of existing) {
    const pin = await readPin(join(dir, file));
    for (const r of pin?.references ?? []) refs.add(r);
    for (const t of pin?.trees ?? []) dirs.add(t);
  }
  if (existing.length === 1 && references.every((r) => refs.has(r)) && trees.every((t) => dirs.has(t))) return false;
  for (const r of references) refs.add(r);
  for (const t of trees) dirs.add(t);
  const pin: PinFile = { podDir: resolve(podDir), references: [...refs].sort(), trees: [...dirs].sort() };
  const name = `${prefix}.${randomBytes(8).toString('hex')}.json`;
  await writeFile(join(dir, `.${name}.tmp`), JSON.stringify(pin));
  await rename(join(dir, `.${name}.tmp`), join(dir, name));
  await Promise.all(existing.map((file) => rm(join(dir, file), { force: true })));
  return true;
}

/** Removes podDir's pins; returns what they named (so their last use can be recorded). */
export async function removePins(cacheRoot: string, podDir: string): Promise<PinFile[]> {
  const dir = pinsDir(cacheRoot);
  const files = await ownPins(dir, prefixOf(podDir));
  const pins = (await Promise.all(files.map((file) => readPin(join(dir, file))))).filter((p): p is PinFile => p !== undefined);
  await Promise.all(files.map((file) => rm(join(dir, file), { force: true })));
  return pins;
}

/** Every pin, as GC judges them (synchronous: GC reads them under the cache lock, twice). */
export function scanPins(cacheRoot: string): GcPin[] {
  const dir = pinsDir(cacheRoot);
  const pins: GcPin[] = [];
  for (const file of readdirSync(dir)) {
    if (file.startsWith('.') || !file.endsWith('.json')) continue;
    let pin: PinFile;
    let pinnedAt: number;
    try {
      pinnedAt = statSync(join(dir, file)).mtimeMs;
      pin = JSON.parse(readFileSync(join(dir, file), 'utf8')) as PinFile;
    } catch {
      continue; // replaced by a newer pin in between
    }
    pins.push({ file, podDirExists: existsSync(pin.podDir), pinnedAt, references: pin.references, trees: pin.trees });
  }
  return pins;
}

export function removePinFile(cacheRoot: string, file: string): void {
  rmSync(join(pinsDir(cacheRoot), file), { force: true });
}
