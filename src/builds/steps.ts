// The build steps, pure: their validation (all of it before anything runs), the image config each
// one leaves (ENV, WORKDIR and USER change only the config; later steps see it), and each step's
// cache key, which names everything the layer it makes depends on.
import { createHash } from 'node:crypto';
import { posix } from 'node:path';
import { AsbError, type FieldProblem } from '../errors.ts';
import { STEP_TYPES, type BuildStep, type FileStore } from './contract.ts';

/** The image config a step sees and leaves. */
export interface BuildConfig {
  /** KEY=VALUE, the base image's first, in order. */
  env: string[];
  workingDir?: string;
  user?: string;
}

const TYPES: ReadonlySet<string> = new Set(STEP_TYPES);
const HASH = /^[a-f0-9]{64}$/;
const MODE = /^0?[0-7]{3,4}$/;
const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** `step N (TYPE)`, as every message about a step starts. */
export function stepName(index: number, step: BuildStep): string {
  return `step ${String(index + 1)} (${step.type})`;
}

/** Every problem of every step at once, as BadRequest naming each step; nothing has run yet. */
export function validateSteps(team: string, steps: readonly BuildStep[], files: FileStore): void {
  const problems: FieldProblem[] = [];
  const bad = (i: number, message: string): void => {
    problems.push({ field: `steps[${String(i)}]`, message: `step ${String(i + 1)}: ${message}` });
  };
  for (const [i, step] of steps.entries()) {
    if (typeof step !== 'object' || !TYPES.has(step.type)) {
      bad(i, `unknown step type ${JSON.stringify((step as { type?: unknown } | null)?.type)} (RUN, COPY, ENV, WORKDIR, USER)`);
      continue;
    }
    if (!Array.isArray(step.args) || !step.args.every((a) => typeof a === 'string')) {
      bad(i, `${step.type} args must be a list of strings`);
      continue;
    }
    const a = step.args;
    switch (step.type) {
      case 'RUN':
        if (a.length < 1 || a.length > 2 || (a[0] ?? '').trim() === '') bad(i, 'RUN takes [command, user?] with a command');
        break;
      case 'COPY':
        if (a.length < 2 || a.length > 4 || a[0] === '' || a[1] === '') bad(i, 'COPY takes [src, dest, user?, mode?] with a src and a dest');
        else if ((a[3] ?? '') !== '' && !MODE.test(a[3] ?? '')) bad(i, `COPY mode must be octal such as 0755, got ${JSON.stringify(a[3])}`);
        else if (posix.isAbsolute(a[0] ?? '') || (a[0] ?? '').split('/').includes('..')) bad(i, `COPY src ${JSON.stringify(a[0])} must be relative to the build context, without ..`);
        if (step.filesHash === undefined || !HASH.test(step.filesHash)) bad(i, 'COPY needs filesHash, the sha256 (64 hex digits) of its uploaded files');
        else if (!files.has(team, step.filesHash)) bad(i, `COPY files ${step.filesHash} were never uploaded`);
        break;
      case 'ENV':
        if (a.length === 0 || a.length % 2 !== 0) bad(i, 'ENV takes [key1, value1, key2, value2, ...]');
        else for (let k = 0; k < a.length; k += 2) if (!ENV_KEY.test(a[k] ?? '')) bad(i, `ENV key ${JSON.stringify(a[k])} must match ${ENV_KEY.source}`);
        break;
      case 'WORKDIR':
        if (a.length !== 1 || a[0] === '') bad(i, 'WORKDIR takes [dir]');
        break;
      case 'USER':
        if (a.length !== 1 || !/^[A-Za-z0-9_.][A-Za-z0-9_.-]*(:[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$/.test(a[0] ?? '')) bad(i, `USER takes [user] as a name or uid (optionally :group), got ${JSON.stringify(a[0])}`);
        break;
    }
  }
  if (problems.length > 0) throw new AsbError('BadRequest', `bad build steps: ${problems.map((p) => p.message).join('; ')}`, { fields: problems });
}

/** The config after a step: ENV, WORKDIR and USER set theirs; RUN and COPY leave it. */
export function nextConfig(config: BuildConfig, step: BuildStep): BuildConfig {
  switch (step.type) {
    case 'ENV': {
      const env = [...config.env];
      for (let k = 0; k + 1 < step.args.length; k += 2) {
        const key = step.args[k] ?? '';
        const value = expand(step.args[k + 1] ?? '', env);
        const at = env.findIndex((e) => e.startsWith(`${key}=`));
        if (at === -1) env.push(`${key}=${value}`);
        else env[at] = `${key}=${value}`;
      }
      return { ...config, env };
    }
    case 'WORKDIR':
      return { ...config, workingDir: posix.resolve(config.workingDir ?? '/', step.args[0] ?? '/') };
    case 'USER':
      return { ...config, user: step.args[0] ?? '' };
    default:
      return config;
  }
}

/** Docker's ENV expansion of $VAR and ${VAR} from the env so far (PATH=/x:$PATH). */
function expand(value: string, env: readonly string[]): string {
  const get = (name: string): string => env.find((e) => e.startsWith(`${name}=`))?.slice(name.length + 1) ?? '';
  return value.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (_m, a: string | undefined, b: string | undefined) => get(a ?? b ?? ''));
}

/**
 * The cache key of a step: its parent (the base image's manifest digest, or the previous step's
 * key), its type and args, the hash of its files, and the config it runs with. The team is not in
 * it: each team's cache is a directory of its own (layer-cache.ts).
 */
export function stepKey(parent: string, step: BuildStep, config: BuildConfig): string {
  const h = createHash('sha256');
  h.update(JSON.stringify({ v: 1, parent, type: step.type, args: step.args, files: step.filesHash ?? null, env: config.env, workingDir: config.workingDir ?? null, user: config.user ?? null }));
  return h.digest('hex');
}
