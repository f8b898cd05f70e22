// Background commands for MCP tools, built on the REST exec (which returns when its command does):
// a command is started detached under nohup, its output goes to a log file inside the sandbox and
// its exit status to a second file when it ends; reading it later is one more exec. Everything
// lives in the sandbox (/tmp/.asb-mcp), runs with the sandbox's isolation, and goes with it. No
// host state: any MCP server (stdio, a worker's /mcp, the hub's) can read what another started.
import { randomBytes } from 'node:crypto';
import { shellQuote } from '../builds/dockerfile-lex.ts';

/** Inside the sandbox: <id>.log (stdout and stderr), <id>.exit (the exit status, once ended). */
export const BACKGROUND_DIR = '/tmp/.asb-mcp';

/** A command id: 12 lower-case hex characters (safe in a path and a shell word unquoted). */
export function newCommandId(): string {
  return randomBytes(6).toString('hex');
}

export function isCommandId(id: string): boolean {
  return /^[a-f0-9]{12}$/.test(id);
}

/**
 * The script that starts `command` detached and prints its pid. The command runs in a subshell
 * (so its own `exit` still lets the wrapper record the status) under setsid where the image has
 * it, so the pid is also its process group: `kill -- -<pid>` stops it and all it started.
 */
export function startScript(id: string, command: string): string {
  const f = `${BACKGROUND_DIR}/${id}`;
  // `< /dev/null` and the redirections leave the exec's pipes free, so the exec returns at once.
  const inner = `(\n${command}\n)\necho $? > ${f}.exit.tmp && mv ${f}.exit.tmp ${f}.exit`;
  return `mkdir -p ${BACKGROUND_DIR} || exit\nnohup $(command -v setsid) sh -c ${shellQuote(inner)} > ${f}.log 2>&1 < /dev/null &\necho $! > ${f}.pid\necho $!`;
}

/**
 * The script that reads up to `max` bytes of the log from byte `offset`: the chunk on stdout; on
 * stderr "<log size> <state>", read before the chunk, so an ended state means the chunk and what
 * follows it hold all the command wrote. State: the exit status; "-" while the wrapper runs; "?"
 * when it is gone without one (killed: kill -- -<pid> stops the wrapper too). A zombie (state Z in
 * /proc: the sandbox's init may not reap orphans) counts as gone. Exit 3: no such command.
 */
export function readScript(id: string, offset: number, max: number): string {
  const f = `${BACKGROUND_DIR}/${id}`;
  return [
    `[ -f ${f}.log ] || exit 3`,
    `if [ -f ${f}.exit ]; then st=$(cat ${f}.exit)`,
    `else p=$(cat ${f}.pid 2>/dev/null); z=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1)`,
    `  if [ -n "$p" ] && [ -n "$z" ] && [ "$z" != Z ]; then st=-; elif [ -f ${f}.exit ]; then st=$(cat ${f}.exit); else st='?'; fi`,
    'fi',
    `printf '%s %s' "$(wc -c < ${f}.log)" "$st" >&2`,
    `tail -c +${String(offset + 1)} ${f}.log | head -c ${String(max)}`,
  ].join('\n');
}

export interface ReadStatus {
  size: number;
  /** running, ended with a status, or ended without one (killed). */
  state: { running: true } | { running: false; exitCode: number | undefined };
}

export function parseReadStatus(stderr: string): ReadStatus | undefined {
  const m = /^\s*(\d+) (\d+|-|\?)\s*$/.exec(stderr);
  if (m === null) return undefined;
  const st = m[2] ?? '?';
  return { size: Number(m[1]), state: st === '-' ? { running: true } : { running: false, exitCode: st === '?' ? undefined : Number(st) } };
}
