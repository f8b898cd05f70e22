// Writing a file into a sandbox from a stream, in both runtimes and for envd: the bytes go into
// the stdin of a `cat` inside the sandbox as they arrive, with backpressure (a write waits for the
// pipe to drain), so the worker holds a pipe's worth of an upload, never all of it (8 concurrent
// 60 MiB uploads took a buffering worker from 150 MB to 1.3 GB).
//
// A write is staged, then committed: `cat` fills a temporary file next to the target
// (`.asb-upload-<random>` in the same directory, so the rename is atomic), and only once the whole
// body has arrived does a second command rename it over the target. Ending stdin early is then
// harmless: a body that stops half way (413, an aborted client) is a partial temporary file that
// is removed, and the target keeps its old content. Signals would save the second command but
// race: `cat` may see end-of-file and the rename run before a kill lands (on Kubernetes the kill
// is itself an exec). A body known complete before the write starts (a Uint8Array, or a stream
// that ended within WHOLE_BODY_BYTES) needs no staging: one command writes and renames.
//
// Nothing acknowledged is lost, so the staging command keeps its stdout open while it reads:
// containerd's CRI exec (2.4, runc) ends a session's stdin as soon as the process's stdout
// reaches end-of-file (ExecIO.Attach closes the stdin stream when an output copy ends). STAGE once
// ran `exec cat > "$t"`, which closed the last writer of stdout: stdin was cut wherever the copy
// was, `cat` exited 0, and a 1 MiB stream in 16 KiB chunks left 163 840 bytes (gVisor Pods, where
// the sandbox holds the pipe until exit, kept it all). And every write checks the bytes the
// sandbox received against the bytes sent before the rename: a short file is an error
// (Unavailable, the target untouched), never a success.
import { randomBytes } from 'node:crypto';
import type { Readable } from 'node:stream';
import { AsbError } from '../errors.ts';
import { CappedBuffer } from './capped-buffer.ts';
import type { ExecRequest, ExecResult, PodProcess, SpawnRequest } from './runtime.ts';
import { fileFailure, IS_DIR } from './shell-files.ts';

/** What a write needs of a runtime, for one sandbox. */
export interface PodShell {
  spawn(req: SpawnRequest): Promise<PodProcess>;
  exec(req: ExecRequest): Promise<ExecResult>;
}

/** A script's exit code: the file holds fewer (or more) bytes than were sent. */
const SHORT = 46;

export interface WriteOptions {
  /** Run as this uid inside the sandbox; default the pod's user. */
  user?: number | undefined;
  /** The file's mode; default an existing file's own, else the user's umask. */
  mode?: number | undefined;
}

/** A body written to its temporary file, not yet renamed over its target. */
export interface StagedFile {
  /** The target as given. */
  path: string;
  /** The target with a symlink resolved: what the rename replaces. */
  target: string;
  temp: string;
  /** The bytes sent: the commit refuses a temporary file of another size. */
  size: number;
}

// $1 path, $2 random suffix. A symlink is followed (as `cat > link` does), so the rename replaces
// the file it points to, not the link. Prints "temp\0target\0", copies stdin into the temp file,
// then prints its size. `cat` runs as a child, not exec'd: the shell keeps stdout open until stdin
// has ended (see the top of this file).
const STAGE = [
  'p=$1',
  'if [ -L "$p" ]; then p=$(readlink -f -- "$p") && [ -n "$p" ] || exit 1; fi',
  `if [ -d "$p" ]; then exit ${IS_DIR}; fi`,
  'case "$p" in */*) d=${p%/*}/; mkdir -p -- "$d" || exit 1;; *) d=;; esac',
  't="$d.asb-upload-$2"',
  'printf "%s\\0%s\\0" "$t" "$p"',
  'cat > "$t" || exit 1',
  'wc -c < "$t"',
].join('\n');

// (temp, target, mode or '', size) quadruples. An existing file keeps its mode and, where the
// caller may (root), its owner: what `cat > file` kept before writes were renamed into place. A
// temporary file of another size than the bytes sent is not renamed (exit SHORT).
const COMMIT = [
  'while [ "$#" -ge 4 ]; do',
  '  t=$1 p=$2 m=$3 n=$4; shift 4',
  `  s=$(wc -c < "$t") || exit 1; if [ "$s" -ne "$n" ]; then echo "received $s of $n bytes" >&2; exit ${SHORT}; fi`,
  `  if [ -d "$p" ]; then exit ${IS_DIR}; fi`,
  '  if [ -f "$p" ]; then o=$(stat -c "%a %u:%g" -- "$p") || exit 1; [ -n "$m" ] || m=${o%% *}; chown -- "${o#* }" "$t" 2>/dev/null; fi',
  '  if [ -n "$m" ]; then chmod -- "$m" "$t" || exit 1; fi',
  '  mv -f -- "$t" "$p" || exit 1',
  'done',
].join('\n');

/** One command for a body already in hand ($3 mode, $4 size): STAGE's first part, then the commit of that file. */
const WRITE_WHOLE = `${STAGE.replace('cat > "$t" || exit 1\nwc -c < "$t"', 'cat > "$t" || { rm -f -- "$t"; exit 1; }')}\nset -- "$t" "$p" "$3" "$4"\n${COMMIT.replace(`exit ${SHORT}`, `rm -f -- "$t"; exit ${SHORT}`)}`;

/** A failed write's error; the temporary name in a message is the user's path. */
function failure(result: ExecResult, op: string, path: string, temp: string | undefined): AsbError {
  const message = Buffer.from(result.stderr).toString('utf8');
  if (result.exitCode === SHORT) return shortWrite(op, path, message.trim());
  // An empty name (the script failed before it printed one) must not be replaced: replaceAll('')
  // put the path between every character of the message.
  const cleaned = temp === undefined || temp === '' ? result : { ...result, stderr: Buffer.from(message.replaceAll(temp, path)) };
  const err = fileFailure(cleaned, op, path);
  if (err.code === 'Internal' && /No space left|Disk quota/.test(message)) return new AsbError('PayloadTooLarge', `${op} ${path}: no space left in the sandbox`);
  return err;
}

/** The sandbox received another number of bytes than were sent: the write failed, and may be retried. */
function shortWrite(op: string, path: string, detail: string): AsbError {
  return new AsbError('Unavailable', `${op} ${path}: the sandbox did not receive the whole body (${detail}); the file was not changed`);
}

function userOf(opts: WriteOptions): { user?: number } {
  return opts.user === undefined ? {} : { user: opts.user };
}

function modeArg(mode: number | undefined): string {
  return mode === undefined ? '' : (mode & 0o7777).toString(8);
}

function suffix(): string {
  return randomBytes(8).toString('hex');
}

/** Whether a path is an upload's temporary file (STAGE's `.asb-upload-<16 hex>`). */
export function isUploadTemp(path: string): boolean {
  return /(^|\/)\.asb-upload-[0-9a-f]{16}$/.test(path);
}

/** Collects a pipe's output up to a cap, and resolves when it ends. */
function collect(stream: Readable, max: number): { buffer: CappedBuffer; ended: Promise<void> } {
  const buffer = new CappedBuffer(max);
  stream.on('data', (chunk: Buffer) => buffer.push(chunk));
  const ended = new Promise<void>((resolve) => {
    stream.once('end', resolve);
    stream.once('close', resolve);
    stream.once('error', () => resolve());
  });
  return { buffer, ended };
}

/**
 * Waits for `proc`'s stdin to drain: resolves false when it can take more, true when it never
 * will (closed, or the process exited). One listener on the exit for all waits, not one per wait
 * (a 64 MiB upload waits ~1000 times).
 */
function drainWaiter(proc: PodProcess): () => Promise<boolean> {
  let exited = false;
  let wake: (() => void) | undefined;
  void proc.exited.then(() => {
    exited = true;
    wake?.();
  });
  return () => new Promise((resolve) => {
    if (exited || proc.stdin.destroyed) {
      resolve(true);
      return;
    }
    const settle = (gone: boolean): void => {
      proc.stdin.off('drain', onDrain);
      proc.stdin.off('close', onClose);
      wake = undefined;
      resolve(gone);
    };
    const onDrain = (): void => settle(false);
    const onClose = (): void => settle(true);
    proc.stdin.once('drain', onDrain);
    proc.stdin.once('close', onClose);
    wake = () => settle(true);
  });
}

/** Removes temporary files a failed upload left. A failure here (the sandbox just stopped) leaves them; nothing else can be done. */
export async function discardFiles(shell: PodShell, files: readonly Pick<StagedFile, 'temp'>[], opts: WriteOptions = {}): Promise<void> {
  if (files.length === 0) return;
  await shell.exec({ command: ['sh', '-c', 'rm -f -- "$@"', 'sh', ...files.map((f) => f.temp)], ...userOf(opts) }).catch(() => undefined);
}

/**
 * Streams `source` into a temporary file beside `path`. If the source fails (413, an aborted
 * client), the temporary file is removed and the source's error thrown; the target is untouched.
 */
export async function stageFile(shell: PodShell, path: string, source: AsyncIterable<Uint8Array>, opts: WriteOptions = {}): Promise<StagedFile> {
  const proc = await shell.spawn({ command: ['sh', '-c', STAGE, 'sh', path, suffix()], ...userOf(opts) });
  const stdout = collect(proc.stdout, 16 * 1024);
  const stderr = collect(proc.stderr, 64 * 1024);
  const drained = drainWaiter(proc);
  let sourceError: Error | undefined;
  let exitedEarly = false;
  let sent = 0;
  try {
    for await (const chunk of source) {
      sent += chunk.length;
      if (proc.stdin.write(chunk)) continue;
      if (await drained()) {
        exitedEarly = true; // the script failed (no permission, a full disk): its exit says why
        break;
      }
    }
  } catch (err) {
    sourceError = err instanceof Error ? err : new Error('the upload stream failed', { cause: err });
  }
  // End-of-file, never a kill: the rename is a separate command, so an early end only leaves a temp file.
  proc.stdin.end();
  const [end] = await Promise.all([proc.exited, stdout.ended, stderr.ended]);
  const [temp, target, size] = Buffer.from(stdout.buffer.bytes()).toString('utf8').split('\0');
  const staged = temp === undefined || temp === '' || target === undefined ? undefined : { path, target, temp, size: sent };
  if (sourceError === undefined && !exitedEarly && end.exitCode === 0 && staged !== undefined) {
    const received = size?.trim() ?? '';
    if (received === String(sent)) return staged;
    await discardFiles(shell, [staged], opts);
    throw shortWrite('write', path, `received ${received === '' ? 'an unknown number' : received} of ${sent} bytes`);
  }
  if (staged !== undefined) await discardFiles(shell, [staged], opts);
  if (sourceError !== undefined) throw sourceError;
  const result: ExecResult = { exitCode: end.exitCode === 0 ? 1 : end.exitCode, stdout: new Uint8Array(), stderr: stderr.buffer.bytes(), timedOut: false, truncated: false };
  throw failure(result, 'write', path, staged?.temp);
}

/** Renames staged files over their targets (one command for all). On failure every temporary file is removed. */
export async function commitFiles(shell: PodShell, files: readonly StagedFile[], opts: WriteOptions = {}): Promise<void> {
  if (files.length === 0) return;
  const args = files.flatMap((f) => [f.temp, f.target, modeArg(opts.mode), String(f.size)]);
  const result = await shell.exec({ command: ['sh', '-c', COMMIT, 'sh', ...args], ...userOf(opts) }).catch(async (err: unknown) => {
    await discardFiles(shell, files, opts);
    throw err;
  });
  if (result.exitCode === 0) return;
  await discardFiles(shell, files, opts);
  const first = files[0];
  throw failure(result, 'write', first?.path ?? '', first?.temp);
}

/**
 * A body that ends within this many bytes is written by one command instead of staged and
 * committed by two (~4 ms each locally, tens of ms over pods/exec): most SDK writes are small.
 * 32 uploads at once hold 8 MiB of these at most.
 */
export const WHOLE_BODY_BYTES = 256 * 1024;

/** The body in hand if it ends within `max` bytes; else the stream again, whole (what was read first, then the rest). */
async function whenSmall(source: AsyncIterable<Uint8Array>, max: number): Promise<Uint8Array | AsyncIterable<Uint8Array>> {
  const it = source[Symbol.asyncIterator]();
  const head: Uint8Array[] = [];
  let size = 0;
  while (size <= max) {
    const next = await it.next();
    if (next.done === true) return Buffer.concat(head, size);
    head.push(next.value);
    size += next.value.length;
  }
  return (async function* rest(): AsyncGenerator<Uint8Array> {
    try {
      yield* head.splice(0);
      for (let next = await it.next(); next.done !== true; next = await it.next()) yield next.value;
    } finally {
      await it.return?.();
    }
  })();
}

/**
 * Writes `data` to `path` in the sandbox, replacing the file only once all of it arrived. A body
 * in hand (a Uint8Array, or a stream that ends within WHOLE_BODY_BYTES) takes one command; a
 * longer stream is staged, then committed.
 */
export async function writeFileFrom(shell: PodShell, path: string, data: Uint8Array | AsyncIterable<Uint8Array>, opts: WriteOptions = {}): Promise<void> {
  const body = data instanceof Uint8Array ? data : await whenSmall(data, WHOLE_BODY_BYTES);
  if (body instanceof Uint8Array) {
    const result = await shell.exec({ command: ['sh', '-c', WRITE_WHOLE, 'sh', path, suffix(), modeArg(opts.mode), String(body.length)], stdin: body, ...userOf(opts) });
    if (result.exitCode === 0) return;
    // The temp file's name is the first thing printed; the script removed it unless the commit failed.
    const temp = Buffer.from(result.stdout).toString('utf8').split('\0')[0];
    if (temp !== undefined && temp !== '') await discardFiles(shell, [{ temp }], opts);
    throw failure(result, 'write', path, temp);
  }
  await commitFiles(shell, [await stageFile(shell, path, body, opts)], opts);
}
