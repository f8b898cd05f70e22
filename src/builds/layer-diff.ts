// What one build step changed in a pod's writable layer. The upper dir (overlayfs) holds every
// change since the pod started, so each step's layer is the difference between two walks of it:
// the one after the step before (or the pod's start) and the one after this step. A path new or
// changed since (its inode, ctime, type or opacity) goes into the layer; a path gone since becomes
// a whiteout; an overlay whiteout (char device 0:0) the step made becomes `.wh.<name>`, and a
// directory the step made opaque (xattr trusted.overlay.opaque, e.g. `rm -rf d; mkdir d` of a
// base-image directory) gets `.wh..wh..opq`.
// The pod's disk is frozen while it is walked (readWritableLayer), so the sandbox cannot swap a
// directory for a symlink between a check and a use: every entry is lstat'ed, only real
// directories are descended into, and nothing here follows a link.
import { spawn } from 'node:child_process';
import { lstat, readdir } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { AsbError } from '../errors.ts';

export type NodeType = 'file' | 'dir' | 'symlink' | 'fifo' | 'whiteout';

export interface UpperNode {
  type: NodeType;
  ino: number;
  nlink: number;
  /** Host ids, as on disk. */
  uid: number;
  gid: number;
  mode: number;
  size: number;
  mtime: number;
  /** Changes whenever the inode does (ctime in ns can only move forward, by the kernel). */
  sig: string;
  opaque: boolean;
}

/** Relative path (no leading `/`) → node, parents before children. */
export type UpperState = Map<string, UpperNode>;

export type Change =
  | { kind: 'entry'; path: string; node: UpperNode }
  | { kind: 'whiteout'; path: string }
  | { kind: 'opaque'; dir: string };

/** Names the overlay (or our layers) give a meaning: a sandbox may not create them. */
const RESERVED = '.wh.';
/** One walk's bound: a step that made more entries than this fails rather than exhaust memory. */
const MAX_ENTRIES = 2_000_000;

/**
 * Where a pod's writable filesystem is on the host: the overlay upper dir, and directories bound
 * over the image's at `path` (WritableLayer.mounts: gVisor's /tmp), whose content is the layer's
 * at that path instead of the upper dir's.
 */
export interface LayerFiles {
  dir: string;
  mounts?: readonly { path: string; dir: string }[];
}

/** The host path of a layer path (relative, no leading `/`). */
export function hostPath(files: string | LayerFiles, path: string): string {
  const { dir, mounts = [] } = typeof files === 'string' ? { dir: files } : files;
  for (const m of mounts) {
    if (path === m.path) return m.dir;
    if (path.startsWith(`${m.path}/`)) return join(m.dir, path.slice(m.path.length + 1));
  }
  return join(dir, path);
}

/**
 * Walks the upper dir and its mounts (frozen by the caller); `opaque` answers which of the upper
 * dir's dirs are opaque (a mount is a plain directory: none of its are). A mount's directory
 * itself is the entry at its path, whatever the upper dir has there.
 */
export async function walkUpper(files: string | LayerFiles, opaque: (dirs: string[]) => Promise<boolean[]>): Promise<UpperState> {
  const { dir: upper, mounts = [] } = typeof files === 'string' ? { dir: files } : files;
  const state: UpperState = new Map();
  const dirs: string[] = [];
  const under = (path: string, m: { path: string }): boolean => path === m.path || path.startsWith(`${m.path}/`);
  const statNode = async (hostFile: string, path: string): Promise<UpperNode | undefined> => {
    const st = await lstat(hostFile, { bigint: true });
    let type: NodeType;
    if (st.isFile()) type = 'file';
    else if (st.isDirectory()) type = 'dir';
    else if (st.isSymbolicLink()) type = 'symlink';
    else if (st.isFIFO()) type = 'fifo';
    else if (st.isCharacterDevice() && st.rdev === 0n && !mounts.some((m) => under(path, m))) type = 'whiteout';
    else return undefined; // sockets (as Docker), and devices, which a sandbox cannot make
    return {
      type, ino: Number(st.ino), nlink: Number(st.nlink), uid: Number(st.uid), gid: Number(st.gid), mode: Number(st.mode) & 0o7777,
      size: type === 'file' ? Number(st.size) : 0, mtime: Number(st.mtimeMs / 1000n),
      sig: `${type}:${String(st.ino)}:${String(st.ctimeNs)}`, opaque: false,
    };
  };
  const visit = async (base: string, rel: string, prefix: string): Promise<void> => {
    const names = (await readdir(rel === '' ? base : join(base, rel))).sort();
    for (const name of names) {
      const own = rel === '' ? name : `${rel}/${name}`;
      const path = prefix === '' ? own : `${prefix}/${own}`;
      if (prefix === '' && mounts.some((m) => under(path, m))) continue; // the mount's content is the layer's there
      if (name.startsWith(RESERVED)) throw new AsbError('BuildFailed', `the step made /${path}: names beginning with ${RESERVED} are reserved in image layers`);
      const node = await statNode(join(base, own), path);
      if (node === undefined) continue;
      state.set(path, node);
      if (state.size > MAX_ENTRIES) throw new AsbError('BuildFailed', `the step left more than ${String(MAX_ENTRIES)} changed files`);
      if (node.type === 'dir') {
        if (prefix === '') dirs.push(path);
        await visit(base, own, prefix);
      }
    }
  };
  await visit(upper, '', '');
  for (const m of mounts) {
    const node = await statNode(m.dir, m.path);
    if (node?.type !== 'dir') continue;
    state.set(m.path, node);
    await visit(m.dir, '', m.path);
  }
  const flags = dirs.length === 0 ? [] : await opaque(dirs);
  for (const [i, dir] of dirs.entries()) {
    const node = state.get(dir);
    if (node !== undefined && flags[i] === true) node.opaque = true;
  }
  return state;
}

/** What changed from `before` to `after`, parents before children; unchanged parents of a change are included. */
export function diffUpper(before: UpperState, after: UpperState): Change[] {
  const wanted = new Set<string>();
  const opaqueDirs = new Set<string>();
  for (const [path, node] of after) {
    const old = before.get(path);
    const changed = old === undefined || old.sig !== node.sig || old.opaque !== node.opaque;
    if (!changed) continue;
    wanted.add(path);
    // An opacity the layers below already have is not said again: it would hide their entries.
    if (node.type === 'dir' && node.opaque && (old === undefined || old.type !== 'dir' || old.ino !== node.ino || !old.opaque)) opaqueDirs.add(path);
  }
  const whiteouts: string[] = [];
  for (const path of before.keys()) {
    if (after.has(path)) continue;
    // Gone with its parent: the parent's whiteout (or its absence from every layer) covers it.
    const parent = posix.dirname(path);
    if (parent !== '.' && after.get(parent)?.type !== 'dir') continue;
    whiteouts.push(path);
  }
  const withParents = (path: string): void => {
    for (let p = posix.dirname(path); p !== '.'; p = posix.dirname(p)) wanted.add(p);
  };
  for (const path of [...wanted]) withParents(path);
  for (const path of whiteouts) withParents(path);
  const changes: Change[] = [];
  for (const [path, node] of after) {
    if (!wanted.has(path)) continue;
    if (node.type === 'whiteout') {
      changes.push({ kind: 'whiteout', path });
      continue;
    }
    changes.push({ kind: 'entry', path, node });
    if (opaqueDirs.has(path)) changes.push({ kind: 'opaque', dir: path });
  }
  for (const path of whiteouts) changes.push({ kind: 'whiteout', path });
  return changes;
}

/** The overlay-opaque helper (overlay-opaque.c) asked about `dirs` of `upper`, one run per walk. */
export function opaqueReader(helper: string, upper: string): (dirs: string[]) => Promise<boolean[]> {
  return (dirs) => new Promise((resolve, reject) => {
    const child = spawn(helper, [upper], { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => err.push(b));
    child.on('error', reject);
    child.on('close', (code) => {
      const lines = Buffer.concat(out).toString('utf8').split('\n').slice(0, dirs.length);
      if (code !== 0 || lines.length !== dirs.length) {
        reject(new AsbError('Internal', `overlay-opaque failed (exit ${String(code)}): ${Buffer.concat(err).toString('utf8').trim()}`));
        return;
      }
      const failed = lines.findIndex((l) => l.startsWith('E'));
      if (failed !== -1) {
        reject(new AsbError('BuildFailed', `cannot read the directory /${dirs[failed] ?? ''} the step made (${lines[failed] ?? ''})`));
        return;
      }
      resolve(lines.map((l) => l === '1'));
    });
    child.stdin.end(Buffer.from(dirs.map((d) => `${d}\0`).join('')));
  });
}
