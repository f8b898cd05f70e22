// The build steps, pure: their validation (all of it before anything runs), the image config each
// one leaves (ENV, WORKDIR and USER change only the config; later steps see it), and each step's
// cache key, which names everything the layer it makes depends on.
import { createHash } from 'node:crypto';
import { posix } from 'node:path';
import { AsbError, type FieldProblem } from '../errors.ts';
import { STEP_TYPES, type BuildStep, type FileStore } from './contract.ts';
import { substitute } from './dockerfile-lex.ts';
import { DEFAULT_EGRESS_POLICY, type EgressPolicy } from '../network/egress-policy.ts';

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
/** A USER value: a name or uid, optionally `:group` (a name or gid). */
export const USER = /^[A-Za-z0-9_.][A-Za-z0-9_.-]*(:[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$/;

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
        else for (let k = 0; k < a.length; k += 2) {
          if (!ENV_KEY.test(a[k] ?? '')) bad(i, `ENV key ${JSON.stringify(a[k])} must match ${ENV_KEY.source}`);
          const problem = stepValueProblem(a[k + 1] ?? '');
          if (problem !== undefined) bad(i, `ENV ${a[k] ?? ''}: ${problem}`);
        }
        break;
      case 'WORKDIR':
        if (a.length !== 1 || a[0] === '') bad(i, 'WORKDIR takes [dir]');
        else if (stepValueProblem(a[0] ?? '') !== undefined) bad(i, `WORKDIR: ${stepValueProblem(a[0] ?? '') ?? ''}`);
        break;
      case 'USER': {
        // A reference ($APP_USER) is expanded when the step runs; what it gives is checked then (build-pod.ts).
        const user = a[0] ?? '';
        if (a.length !== 1 || (!user.includes('$') && !USER.test(user))) bad(i, `USER takes [user] as a name or uid (optionally :group), got ${JSON.stringify(a[0])}`);
        else if (stepValueProblem(user) !== undefined) bad(i, `USER: ${stepValueProblem(user) ?? ''}`);
        break;
      }
    }
  }
  if (problems.length > 0) throw new AsbError('BadRequest', `bad build steps: ${problems.map((p) => p.message).join('; ')}`, { fields: problems });
}

/**
 * The config after a step: ENV, WORKDIR and USER set theirs (their values expanded, stepValue);
 * RUN and COPY leave it. A `${NAME:?message}` of an unset NAME fails the step (BuildFailed).
 */
export function nextConfig(config: BuildConfig, step: BuildStep): BuildConfig {
  switch (step.type) {
    case 'ENV': {
      const env = [...config.env];
      // Every value of one step reads the env as it was before the step (Docker's ENV A=1 B=$A).
      const values: [string, string][] = [];
      for (let k = 0; k + 1 < step.args.length; k += 2) values.push([step.args[k] ?? '', stepValue(step.args[k + 1] ?? '', config.env, `ENV ${step.args[k] ?? ''}`)]);
      for (const [key, value] of values) {
        const at = env.findIndex((e) => e.startsWith(`${key}=`));
        if (at === -1) env.push(`${key}=${value}`);
        else env[at] = `${key}=${value}`;
      }
      return { ...config, env };
    }
    case 'WORKDIR':
      return { ...config, workingDir: posix.resolve(config.workingDir ?? '/', stepValue(step.args[0] ?? '/', config.env, 'WORKDIR') || '/') };
    case 'USER': {
      const user = stepValue(step.args[0] ?? '', config.env, 'USER');
      if (!USER.test(user)) throw new AsbError('BuildFailed', `USER ${JSON.stringify(step.args[0] ?? '')} is ${JSON.stringify(user)}, not a name or uid (optionally :group)`);
      return { ...config, user };
    }
    default:
      return config;
  }
}

/**
 * An ENV value, WORKDIR or USER as E2B's build reads it (its orchestrator prints each through a
 * shell's double quotes): `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME-word}`, `${NAME:+word}`,
 * `${NAME+word}`, `${NAME:?message}` expand from the image's env so far (the base image's
 * included); `\` escapes `$`, `"`, `` ` `` and itself, and is literal before anything else;
 * quotes are literal characters. Unlike E2B, no command runs: `$(...)` and backticks stay as
 * written (the value is computed on the host, not in the build sandbox), and `%` is not printf's.
 * The Dockerfile front end writes its literal `$` and `\` escaped (dockerfile.ts).
 */
export function stepValue(value: string, env: readonly string[], what: string): string {
  const lookup = (name: string): string | undefined => {
    const entry = env.find((e) => e.startsWith(`${name}=`));
    return entry?.slice(name.length + 1);
  };
  try {
    return substitute(value, '\\', lookup, { stepValue: true });
  } catch (err) {
    throw new AsbError('BuildFailed', `${what}: ${(err as Error).message}`);
  }
}

/** The syntax problem of a step value, or undefined: every variable set, so only malformed references fail. */
function stepValueProblem(value: string): string | undefined {
  try {
    substitute(value, '\\', () => 'x', { stepValue: true });
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
}

/**
 * The cache key of a step: its parent (the base image's manifest digest, or the previous step's
 * key), its type and args, the hash of its files, the config it runs with, and for a RUN the
 * egress policy it ran under (canonical: what it downloads may differ; later steps inherit it
 * through the parent). The team is not in it: each team's cache is a directory of its own
 * (layer-cache.ts). v2: step values expand as stepValue says (v1 expanded escaped `$` too).
 */
export function stepKey(parent: string, step: BuildStep, config: BuildConfig, egress: EgressPolicy = DEFAULT_EGRESS_POLICY): string {
  const h = createHash('sha256');
  const network = step.type === 'RUN' ? canonicalEgress(egress) : null;
  h.update(JSON.stringify({ v: 2, parent, type: step.type, args: step.args, files: step.filesHash ?? null, env: config.env, workingDir: config.workingDir ?? null, user: config.user ?? null, network }));
  return h.digest('hex');
}

/** One spelling per policy: the same entries in any order are the same policy (sameEgressPolicy). */
export function canonicalEgress(p: EgressPolicy): string {
  return JSON.stringify({ internet: p.internet, allow: [...p.allow].sort(), deny: [...p.deny].sort() });
}
