// The users envd calls run as, inside a sandbox: `root` runs as uid 0, a missing user or `user`
// (E2B's default user) as the pod's own user, any other name as the uid `id -u` gives inside the
// sandbox. Each user's home is where relative paths and ~ start (paths.ts). Both are asked once
// per sandbox, name and pod start.
import { posix } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { PodRuntime } from '../../runtime/runtime.ts';
import { MAX_PATH_LENGTH } from './paths.ts';

/** E2B's name for the sandbox's default (non-root) user. */
export const DEFAULT_USER = 'user';

const USER_NAME = /^[a-z_][a-z0-9_.-]{0,31}\$?$/i;

/** Named users whose uids (and homes) are kept per sandbox; past it, each call for another name asks the sandbox. */
const MAX_KEPT_USERS = 64;

/**
 * A user's home inside the sandbox, written by a POSIX shell with builtins only (and `id` when
 * the default user has no HOME): $1 is the user's name, or empty for the default user (the pod's
 * own user), whose home is the HOME its processes get (the same `~` commands.run sees), else the
 * passwd entry of its uid. A named user's is its passwd entry, as envd's user.Lookup gives it.
 * Exit 3: no such entry.
 */
const HOME_SCRIPT = [
  'name=$1; uid=',
  'if [ -z "$name" ]; then',
  '  if [ -n "$HOME" ]; then printf \'%s\' "$HOME"; exit 0; fi',
  '  uid=$(id -u) || exit 3',
  'fi',
  '[ -r /etc/passwd ] || exit 3',
  'while IFS=: read -r n _ u _ _ h _ || [ -n "$n" ]; do',
  '  if { [ -n "$name" ] && [ "$n" = "$name" ]; } || { [ -z "$name" ] && [ "$u" = "$uid" ]; }; then printf \'%s\' "$h"; exit 0; fi',
  '  n=',
  'done < /etc/passwd',
  'exit 3',
].join('\n');

const NO_ENTRY = 3;

/** What is known about one sandbox's users while the pod that started at `startedAt` runs. */
interface Kept {
  startedAt: string | undefined;
  uids: Map<string, number>;
  /** By user name; '' is the default user. */
  homes: Map<string, string>;
}

/**
 * The uid to run as for a user name (undefined: the pod's own user), and the user's home. A named
 * user's uid comes from `id -u` inside the sandbox and a home from its passwd, each an exec
 * (nsenter locally, a pods/exec round trip on Kubernetes), so both are kept for as long as the
 * pod runs: a pod started again may hold other users. The sandbox owns its /etc/passwd, so a
 * home is only ever used as a path inside the sandbox, like any path a caller sends (paths.ts).
 */
export class UserIds {
  readonly #runtime: PodRuntime;
  readonly #bySandbox = new Map<string, Kept>();
  readonly #unwatch: () => void;

  /** One per worker, shared by envd and the python-runtime API: a user's uid and home are looked up once per pod. */
  constructor(runtime: PodRuntime) {
    this.#runtime = runtime;
    // What is kept per sandbox goes with its pod, so the cache does not grow with every sandbox the worker ever ran.
    this.#unwatch = runtime.onChange((id) => {
      if (runtime.state(id).phase === 'Absent') this.forget(id);
    });
  }

  /** Stops following pods. Idempotent. */
  close(): void {
    this.#unwatch();
  }

  async uidOf(id: string, user: string | undefined): Promise<number | undefined> {
    if (user === undefined || user === DEFAULT_USER) return undefined;
    if (user === 'root') return 0;
    checkName(user);
    const kept = this.#kept(id);
    const known = kept.uids.get(user);
    if (known !== undefined) return known;
    const result = await this.#runtime.exec(id, { command: ['id', '-u', '--', user], timeoutMs: 10_000 });
    const uid = Buffer.from(result.stdout).toString('utf8').trim();
    if (result.exitCode !== 0 || !/^\d+$/.test(uid)) throw new AsbError('BadRequest', `sandbox ${id} has no user "${user}"`);
    if (kept.uids.size < MAX_KEPT_USERS) kept.uids.set(user, Number(uid));
    return Number(uid);
  }

  /** The home directory of a user (undefined or `user`: the default user), where relative paths and ~ start. */
  async homeOf(id: string, user: string | undefined): Promise<string> {
    const name = user === undefined || user === DEFAULT_USER ? '' : user;
    if (name !== '') checkName(name);
    const kept = this.#kept(id);
    const known = kept.homes.get(name);
    if (known !== undefined) return known;
    const result = await this.#runtime.exec(id, { command: ['sh', '-c', HOME_SCRIPT, 'sh', name], timeoutMs: 10_000, maxOutputBytes: 2 * MAX_PATH_LENGTH });
    let home = Buffer.from(result.stdout).toString('utf8');
    if (result.exitCode === NO_ENTRY && name === 'root') home = '/root'; // an image without /etc/passwd still has a root
    else if (result.exitCode === NO_ENTRY) throw new AsbError('BadRequest', name === '' ? `sandbox ${id} has no home for its default user (no HOME, no passwd entry for its uid)` : `sandbox ${id} has no user "${name}"`);
    else if (result.exitCode !== 0) throw new AsbError('Internal', `cannot look up the home of ${name === '' ? 'the default user' : `"${name}"`} in sandbox ${id}: exit ${result.exitCode}: ${Buffer.from(result.stderr).toString('utf8').trim().slice(0, 200)}`);
    if (home.length > MAX_PATH_LENGTH) throw new AsbError('BadRequest', `the home of ${name === '' ? 'the default user' : `"${name}"`} in sandbox ${id} is longer than ${MAX_PATH_LENGTH} characters`);
    // As envd joins onto it: a relative (or empty) home counts from /.
    home = posix.resolve('/', home);
    if (kept.homes.size < MAX_KEPT_USERS) kept.homes.set(name, home);
    return home;
  }

  /** Drops what is kept for a sandbox whose pod is gone. */
  forget(id: string): void {
    this.#bySandbox.delete(id);
  }

  #kept(id: string): Kept {
    const startedAt = this.#runtime.state(id).startedAt;
    let kept = this.#bySandbox.get(id);
    if (kept === undefined || kept.startedAt !== startedAt) this.#bySandbox.set(id, (kept = { startedAt, uids: new Map(), homes: new Map() }));
    return kept;
  }
}

function checkName(user: string): void {
  if (!USER_NAME.test(user)) throw new AsbError('BadRequest', `"${user.slice(0, 40)}" is not a user name`);
}
