// One process owns an embedded store: every read is served from that process's memory, so a
// second writer would make both caches wrong. The owner writes its pid to `<db>.lock`; another
// process finds a live pid there and refuses to open. A lock left by a process that died
// (kill -9) names a pid that no longer runs (or is no longer ours), and is taken over. A start
// may wait a bounded time for an owner that is exiting (acquireOwnerLockWaiting). `make up` holds
// its state directory the same way (src/assembly/up.ts), so a second one on it stops before starting
// anything.
import { closeSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { AsbError } from '../errors.ts';

export interface OwnerLock {
  release(): void;
}

/** The start time of a pid (field 22 of /proc/<pid>/stat), or undefined if it is not running. */
function startTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

/** Who holds the lock: a live process, by pid and start time. */
interface Holder {
  pid: number;
  started: string;
}

/** Takes the lock, or names the live process that holds it. */
function tryAcquire(dbPath: string): OwnerLock | Holder {
  const path = `${dbPath}.lock`;
  const me = `${process.pid} ${startTime(process.pid) ?? '?'}\n`;
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(path, 'wx', 0o600);
      writeSync(fd, me);
      closeSync(fd);
      return { release: () => rmSync(path, { force: true }) };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw new AsbError('Unavailable', `store ${dbPath}: cannot create ${path}: ${String(err)}`, { cause: err });
    }
    let holder = '';
    try {
      holder = readFileSync(path, 'utf8').trim();
    } catch {
      continue; // released between our open and read: try again
    }
    const [pidText, started] = holder.split(' ');
    const pid = Number(pidText);
    if (Number.isInteger(pid) && pid > 0 && started !== undefined && startTime(pid) === started) return { pid, started };
    rmSync(path, { force: true }); // stale: its owner is gone
  }
  throw new AsbError('Unavailable', `store ${dbPath}: could not take the lock ${path}`);
}

/** The holder's command line, for the message (empty when it is gone or unreadable). */
function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter((a) => a !== '').join(' ').slice(0, 200);
  } catch {
    return '';
  }
}

/** The lock is held by a live process: `pid`, named in the message with its command line. */
export class OwnerLockHeld extends AsbError {
  readonly pid: number;

  constructor(message: string, pid: number) {
    super('Unavailable', message);
    this.name = 'OwnerLockHeld';
    this.pid = pid;
  }
}

function inUse(dbPath: string, holder: Holder, waitedMs: number, what: string): OwnerLockHeld {
  const command = commandOf(holder.pid);
  const waited = waitedMs > 0 ? `, and it did not exit within ${waitedMs / 1000} s` : '';
  return new OwnerLockHeld(`${what} is in use by process ${holder.pid}${command === '' ? '' : ` (${command})`}${waited}; stop it first (lock file ${dbPath}.lock)`, holder.pid);
}

/** Takes the lock `<path>.lock` or refuses, naming the process that holds it; `what` names the thing locked in that message (default: the store at path). */
export function acquireOwnerLock(dbPath: string, what = `store ${dbPath}`): OwnerLock {
  const got = tryAcquire(dbPath);
  if ('release' in got) return got;
  throw inUse(dbPath, got, 0, what);
}

// How often a waiting start looks again: a process that is exiting frees the lock on its way out.
const POLL_MS = 50;

/**
 * Takes the lock, waiting up to `waitMs` for a live holder to exit: `make up` right after a stop
 * finds the old hub or worker still closing its store (hibernating sandboxes takes seconds).
 * Then refuses, naming the process that holds it.
 */
export async function acquireOwnerLockWaiting(dbPath: string, waitMs: number): Promise<OwnerLock> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const got = tryAcquire(dbPath);
    if ('release' in got) return got;
    if (Date.now() >= deadline) throw inUse(dbPath, got, waitMs, `store ${dbPath}`);
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}
