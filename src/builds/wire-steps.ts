// A build's steps checked before anything runs: each problem names its step (1-based, as E2B's
// status reports it), so a bad request is a 400 that leaves no build behind.
import { AsbError } from '../errors.ts';
import { MAX_STEPS, STEP_TYPES, type BuildStep, type FileStore } from './contract.ts';

const TYPES: ReadonlySet<string> = new Set(STEP_TYPES);
const MAX_ARG_BYTES = 256 * 1024;

function stepError(n: number, message: string): AsbError {
  return new AsbError('BadRequest', `step ${String(n)}: ${message}`);
}

/** The steps as the engine takes them, from the JSON the SDK sent; 400 naming the first bad step. */
export function checkSteps(raw: unknown, team: string, files: FileStore): BuildStep[] {
  if (raw === undefined || raw === null) return [];
  if (!Array.isArray(raw)) throw new AsbError('BadRequest', 'steps must be an array of {type, args, filesHash?, force?}');
  if (raw.length > MAX_STEPS) throw new AsbError('BadRequest', `a build has at most ${String(MAX_STEPS)} steps, this one has ${String(raw.length)}`);
  return (raw as unknown[]).map((item, i) => checkStep(item, i + 1, team, files));
}

function checkStep(item: unknown, n: number, team: string, files: FileStore): BuildStep {
  if (typeof item !== 'object' || item === null || Array.isArray(item)) throw stepError(n, 'must be an object {type, args, filesHash?, force?}');
  const s = item as Record<string, unknown>;
  const type = s.type;
  if (typeof type !== 'string' || !TYPES.has(type)) throw stepError(n, `unknown step type ${JSON.stringify(type)}: expected one of ${[...TYPES].join(', ')}`);
  const rawArgs = s.args ?? [];
  if (!Array.isArray(rawArgs) || !rawArgs.every((a): a is string => typeof a === 'string')) throw stepError(n, `${type} args must be an array of strings`);
  const args: string[] = rawArgs;
  if (args.reduce((sum, a) => sum + Buffer.byteLength(a), 0) > MAX_ARG_BYTES) throw stepError(n, `${type} args exceed ${String(MAX_ARG_BYTES)} bytes`);
  if (args.some((a) => a.includes('\0'))) throw stepError(n, `${type} args may not contain NUL bytes`);
  const force = s.force;
  if (force !== undefined && force !== null && typeof force !== 'boolean') throw stepError(n, 'force must be a boolean');
  const step: BuildStep = { type: type as BuildStep['type'], args };
  if (force === true) step.force = true;
  switch (type) {
    case 'RUN':
      if (args.length < 1 || args.length > 2 || args[0] === '') throw stepError(n, 'RUN takes [command, user?] with a non-empty command');
      break;
    case 'COPY': {
      if (args.length < 2 || args.length > 4 || args[0] === '' || args[1] === '') throw stepError(n, 'COPY takes [src, dest, user?, mode?]');
      const mode = args[3];
      if (mode !== undefined && mode !== '' && !/^[0-7]{1,4}$/.test(mode) && !/^\d+$/.test(mode)) throw stepError(n, `COPY mode ${JSON.stringify(mode)} is not a file mode`);
      const hash = s.filesHash;
      if (typeof hash !== 'string' || hash === '') throw stepError(n, 'COPY needs the filesHash of its uploaded files');
      if (!files.has(team, hash)) throw stepError(n, `COPY ${args[0] ?? ''}: files hash ${hash} was never uploaded (GET /templates/{id}/files/${hash} gives the upload URL)`);
      step.filesHash = hash;
      break;
    }
    case 'ENV':
      if (args.length === 0 || args.length % 2 !== 0) throw stepError(n, 'ENV takes [key1, value1, key2, value2, ...]');
      for (let k = 0; k < args.length; k += 2) {
        if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(args[k] ?? '')) throw stepError(n, `ENV name ${JSON.stringify(args[k])} is not a variable name`);
      }
      break;
    case 'WORKDIR':
      if (args.length !== 1 || args[0] === '') throw stepError(n, 'WORKDIR takes [dir]');
      break;
    case 'USER':
      if (args.length !== 1 || args[0] === '' || /[\s:]/.test(args[0] ?? '') && !/^[\w.-]+:[\w.-]+$/.test(args[0] ?? '')) throw stepError(n, 'USER takes [user]');
      break;
  }
  return step;
}
