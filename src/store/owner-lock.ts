// One process owns an embedded store: every read is served from that process's memory, so a
// second writer would make both caches wrong. The owner writes its pid to `<db>.lock`; another
// process finds a live pid there and refuses to open. A lock left by a process that died
// (kill -9) names a pid that no longer runs (or is no longer ours), and is taken over.
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

export function acquireOwnerLock(dbPath: string): OwnerLock {
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
    if (Number.isInteger(pid) && pid > 0 && startTime(pid) === started) {
      throw new AsbError('Unavailable', `store ${dbPath} is in use by process ${pid}; stop it first (lock file ${path})`);
    }
    rmSync(path, { force: true }); // stale: its owner is gone
  }
  throw new AsbError('Unavailable', `store ${dbPath}: could not take the lock ${path}`);
}
