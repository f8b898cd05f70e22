// Template builds: the contract between the build engine (steps → an image in a registry), the
// build service that owns builds (records, logs, the SandboxTemplate it makes) and the surfaces
// that start them (E2B's build API, our REST API and `asb template build`).
//
import type { EgressPolicy } from '../network/egress-policy.ts';

// A step is E2B's wire step (`TemplateStep` of the e2b SDK): its SDKs already reduce every
// builder call (aptInstall, pipInstall, mkdir, symlink, remove, rename, gitClone, ...) and every
// Dockerfile instruction to these five types, so the engine runs one language and the Dockerfile
// front end of `asb` emits the same steps.

/** The five step types, in the order messages list them. */
export const STEP_TYPES = ['RUN', 'COPY', 'ENV', 'WORKDIR', 'USER'] as const;
/** Steps in one build: E2B's SDK emits one per builder call, a Dockerfile one per instruction; a few hundred is already a lot. */
export const MAX_STEPS = 500;

/**
 * One build step.
 * - RUN      args: [command, user?]: `sh -c command`, as user (default: the current USER)
 * - COPY     args: [src, dest, user?, mode?] with filesHash: the uploaded tar with that sha256
 *            (FileStore) holds src, relative to the build context; it is unpacked into dest
 * - ENV      args: [key1, value1, key2, value2, ...]
 * - WORKDIR  args: [dir]
 * - USER     args: [user]
 * `force` rebuilds this step and every later one instead of using the cache (E2B's skipCache).
 */
export interface BuildStep {
  type: (typeof STEP_TYPES)[number];
  args: string[];
  filesHash?: string;
  force?: boolean;
}

export interface BuildSpec {
  /** An image reference the worker can pull, or an existing template of the same team (its image). */
  from: { image: string } | { template: string };
  steps: BuildStep[];
  /** Run when a sandbox of the template starts (E2B's startCmd); metadata, not a layer. */
  startCmd?: string;
  /** The template's readiness check (E2B's readyCmd): `sh -c`, ready when it exits 0. */
  readyCmd?: string;
  /** Ignore the cache for every step (E2B's top-level force / skipCache, `--no-cache`). */
  noCache?: boolean;
  /** Resources of the sandbox that runs the steps, and of the template's sandboxes. */
  cpuCount?: number;
  memoryMB?: number;
  /**
   * What this build's RUN steps may reach, within the worker's --build-egress (build-egress.ts:
   * a request that would widen it is refused, 403). Absent: the worker's. E2B's build API has no
   * field for it, so E2B builds always get the worker's.
   */
  egress?: EgressPolicy;
}

/** Uploaded build files, by the sha256 the SDK names them with; one store per team. */
export interface FileStore {
  /** Whether a tar with this hash was uploaded by this team. */
  has(team: string, hash: string): boolean;
  /** The path of the uploaded tar (plain or gzip), readable by the worker; undefined when absent. */
  path(team: string, hash: string): string | undefined;
}

export type BuildPhase = 'waiting' | 'building' | 'ready' | 'error';

export interface BuildLogEntry {
  /** ISO 8601. */
  timestamp: string;
  level: 'debug' | 'info' | 'warn' | 'error';
  /** Which step said it (1-based), absent for the build's own lines. */
  step?: number;
  message: string;
}

export interface BuildStatus {
  templateId: string;
  buildId: string;
  phase: BuildPhase;
  /** Set when phase is error: what failed, naming the step. */
  reason?: { message: string; step?: number };
  /** The image the build produced, once ready (a reference with its digest). */
  image?: string;
}

/**
 * The build service one worker runs. Builds of a team see only that team's templates, files and
 * cache; another team's ids answer as absent.
 */
export interface BuildService {
  /**
   * The egress policy a build of `spec` runs its RUN steps under: the worker's, or spec.egress
   * within it. Forbidden naming each entry and rule when spec.egress would widen the worker's.
   */
  buildEgress(spec: BuildSpec): EgressPolicy | undefined;
  /** Starts a build of the template (made or updated as a SandboxTemplate when it succeeds). */
  start(team: string, templateId: string, buildId: string, spec: BuildSpec): Promise<void>;
  status(team: string, templateId: string, buildId: string): BuildStatus | undefined;
  /** Log entries from `offset` on (0-based), in order. */
  logs(team: string, templateId: string, buildId: string, offset: number): BuildLogEntry[];
  /** Stops every build and waits for them; idempotent. */
  close(): Promise<void>;
}

/** What the engine needs for one build; the service resolves names, the engine runs steps. */
export interface EngineRequest {
  team: string;
  /** The base image as the worker's pods would pull it (a from-template is resolved to its image). */
  baseImage: string;
  steps: BuildStep[];
  noCache: boolean;
  /** Where the image goes: a repository of the registry this worker's pods pull from, and a tag. */
  target: { repository: string; tag: string };
  /** The runtime class the RUN steps run under (the template's); default the worker's default. */
  runtimeClassName?: string;
  /**
   * What the build sandbox's steps may reach (src/network/egress-policy.ts): the worker's
   * --build-egress, or the build's own within it (BuildSpec.egress). In each RUN step's cache
   * key. Absent: a sandbox's default (the internet; no private range, other pod or
   * the host). The egress floor applies whatever it allows.
   */
  egress?: EgressPolicy;
  /** Limits of the sandbox that runs the steps; a step that exceeds them fails the build. */
  limits: { cpu: number; memoryBytes: number; diskBytes: number; timeoutMs: number };
  files: FileStore;
  log(entry: Omit<BuildLogEntry, 'timestamp'>): void;
  signal: AbortSignal;
}

export interface EngineResult {
  /** `<registry>/<repository>@sha256:…`, pullable by this worker's pods. */
  image: string;
  /** The image's config after every ENV, WORKDIR and USER step. */
  config: { env: string[]; workingDir?: string; user?: string };
  /** How many steps were served from the cache (the first ones; a miss runs every later step). */
  cachedSteps: number;
  /** Each step's layer cache key, in order: what the cache keeps while a tag names the build. */
  cacheKeys?: string[];
}

export interface BuildEngine {
  /** Rejects with an AsbError naming the step that failed (BadRequest for bad input, BuildFailed for a failing step). */
  build(req: EngineRequest): Promise<EngineResult>;
}

/** One of the team's built templates as GET /v1/built-templates shows it (`asb template ls`). */
export interface BuiltTemplateView {
  name: string;
  templateId: string;
  /** tag → build id; `default` names the build `name` starts. */
  tags: Record<string, string>;
  /** The newest build requested, whatever its phase. */
  latestBuild: { buildId: string; phase: BuildStatus['phase']; createdAt: string; finishedAt?: string; reason?: BuildStatus['reason'] } | undefined;
  /** The latest build's phase, `none` before any build was requested. */
  status: BuildStatus['phase'] | 'none';
  cpuCount: number;
  memoryMB: number;
  createdAt: string;
  updatedAt: string;
}
