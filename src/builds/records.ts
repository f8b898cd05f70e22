// Template and build records, one JSON file per template under the worker's data directory
// (0700 directory, 0600 files, written whole to a temporary name and renamed), so templates,
// builds and their logs survive a worker restart. A build that was waiting or running when the
// worker stopped cannot go on (its engine run died with the process): loadRecords ends it as
// error "interrupted by a worker restart".
import { existsSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { privateDir } from '../base/private-files.ts';
import type { BuildLogEntry, BuildPhase, BuildSpec } from './contract.ts';

/** Log entries kept per build: the newest MAX_LOG_ENTRIES; older ones are counted in `logsDropped`. */
export const MAX_LOG_ENTRIES = 5000;
/** Builds kept per template (the newest); older builds' records and logs go. */
export const MAX_BUILDS = 10;
export const INTERRUPTED = 'interrupted by a worker restart';

export interface BuildRecord {
  buildId: string;
  phase: BuildPhase;
  reason?: { message: string; step?: number };
  image?: string;
  /** Its steps' layer cache keys, once ready: kept in the cache while a tag names the build (liveCacheKeys). */
  cacheKeys?: string[];
  /** The image's config the engine reported, once ready: what a pinned build's SandboxTemplate is made from. */
  config?: { env: string[]; workingDir?: string; user?: string };
  createdAt: string;
  updatedAt: string;
  finishedAt?: string;
  cpuCount: number;
  memoryMB: number;
  /** Steps the service ran before the caller's (E2B's user creation): engine step n is the caller's n - stepOffset. */
  stepOffset?: number;
  /** Tags the build takes once ready (named in its request). */
  pendingTags?: string[];
  /** What the build was started with (absent while waiting for its steps). */
  spec?: BuildSpec;
  logs: BuildLogEntry[];
  /** Entries dropped from the front (offsets stay absolute: offset - logsDropped indexes logs). */
  logsDropped: number;
}

export interface TemplateRecord {
  templateId: string;
  team: string;
  /** The team's name for it (E2B's alias), unique within the team. */
  name: string;
  /** E2B tags assigned to builds of it: tag → buildId. `default` names the build `name` starts (the newest ready one unless a tag assignment moved it). */
  tags: Record<string, string>;
  cpuCount: number;
  memoryMB: number;
  createdAt: string;
  updatedAt: string;
  /** The build whose image the template's own SandboxTemplate runs (the one `default` names), once one succeeded. */
  readyBuildId?: string;
  builds: BuildRecord[];
}

export class RecordFiles {
  readonly #dir: string;

  constructor(dir: string) {
    this.#dir = dir;
    privateDir(dir);
  }

  #path(templateId: string): string {
    return join(this.#dir, `${templateId}.json`);
  }

  save(rec: TemplateRecord): void {
    const path = this.#path(rec.templateId);
    const tmp = `${path}.tmp`;
    writeFileSync(tmp, JSON.stringify(rec), { mode: 0o600 });
    renameSync(tmp, path);
  }

  remove(templateId: string): void {
    rmSync(this.#path(templateId), { force: true });
  }

  /** Every record, with builds the restart interrupted ended as errors (and saved so). */
  load(now: string): TemplateRecord[] {
    if (!existsSync(this.#dir)) return [];
    const out: TemplateRecord[] = [];
    for (const name of readdirSync(this.#dir)) {
      if (!name.endsWith('.json')) continue;
      const rec = JSON.parse(readFileSync(join(this.#dir, name), 'utf8')) as TemplateRecord;
      let changed = false;
      for (const b of rec.builds) {
        if (b.phase === 'waiting' || b.phase === 'building') {
          b.phase = 'error';
          b.reason = { message: INTERRUPTED };
          b.finishedAt = now;
          b.updatedAt = now;
          b.logs.push({ timestamp: now, level: 'error', message: `Build failed: ${INTERRUPTED}` });
          changed = true;
        }
      }
      if (changed) this.save(rec);
      out.push(rec);
    }
    return out;
  }
}
