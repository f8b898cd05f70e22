// A step's layer read from inside a build pod (src/builds/pod-layers.ts), where the pod is hostile:
// its archive may hold entries its listing never named, devices, hardlinks to files outside the
// layer, or more bytes than the build's disk limit. A pod double answers the listing and archive
// commands with such bytes; the layer is then read back with GNU tar.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { test } from 'node:test';
import { openPodLayers } from '../src/builds/pod-layers.ts';
import { padding, tarEnd, tarHeader } from '../src/builds/tar-header.ts';
import type { PodProcess, SpawnRequest } from '../src/runtime/runtime.ts';
import { FakeRuntime } from './support/fake-runtime.ts';

/** Answers `find` with the next listing and `tar` with the archive; records what tar was asked for. */
class ScriptedPod extends FakeRuntime {
  readonly listings: string[][];
  archive: Buffer = Buffer.alloc(0);
  asked = '';
  constructor(listings: string[][]) {
    super();
    this.listings = listings;
  }
  override spawn(_id: string, req: SpawnRequest): Promise<PodProcess> {
    const script = req.command.join(' ');
    const stdin = new PassThrough();
    const chunks: Buffer[] = [];
    stdin.on('data', (b: Buffer) => chunks.push(b));
    const out = script.includes('find /') ? Buffer.from((this.listings.shift() ?? []).map((l) => `${l}\0`).join('')) : this.archive;
    const exited = new Promise<{ exitCode: number }>((resolve) => stdin.on('end', () => {
      this.asked = Buffer.concat(chunks).toString('utf8');
      resolve({ exitCode: 0 });
    }));
    return Promise.resolve({ stdin, stdout: Readable.from([out]), stderr: Readable.from([]), kill: () => undefined, exited });
  }
}

const line = (type: string, ino: number, ctime: number, path: string): string => `${type} 644 0 0 5 1.0 ${String(ctime)}.0 ${String(ino)} 1 ${path}`;

function entry(path: string, type: 'file' | 'hardlink' | 'symlink' | 'dir', content = '', linkname?: string): Buffer {
  const body = Buffer.from(content);
  return Buffer.concat([tarHeader({ path, type, mode: 0o644, uid: 0, gid: 0, size: body.length, mtime: 1, ...(linkname === undefined ? {} : { linkname }) }), body, padding(body.length)]);
}

/** A character device entry (type '3'), which tar-header.ts cannot write: a ustar header by hand. */
function device(path: string): Buffer {
  const h = tarHeader({ path, type: 'file', mode: 0o644, uid: 0, gid: 0, size: 0, mtime: 1 });
  h.write('3', 156, 1, 'latin1');
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += h[i] ?? 0;
  h.write(`${sum.toString(8).padStart(6, '0')}\u0000 `, 148, 8, 'latin1');
  return h;
}

test('a hostile build pod\'s layer holds only the paths its listing named as changed, as files, links or dirs, and whiteouts for what went', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-pod-layers-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const pod = new ScriptedPod([
    [line('d', 1, 1, 'etc'), line('f', 2, 1, 'etc/passwd'), line('f', 3, 1, 'gone'), line('d', 4, 1, 'olddir'), line('f', 5, 1, 'olddir/inner')],
    [line('d', 1, 1, 'etc'), line('f', 2, 1, 'etc/passwd'), line('f', 6, 2, 'built.txt'), line('f', 7, 2, 'dev-node'), line('f', 8, 2, 'link')],
  ]);
  pod.archive = Buffer.concat([
    entry('built.txt', 'file', 'hello'),
    entry('etc/shadow', 'file', 'root::0:0'), // never listed as changed
    device('dev-node'), // listed, but a device
    entry('link', 'hardlink', '', 'etc/passwd'), // a hardlink to a file outside the layer
    tarEnd(),
  ]);
  const layers = await openPodLayers(pod, 'p', AbortSignal.timeout(10_000));
  const blob = await layers.next(dir, 2 ** 30, AbortSignal.timeout(10_000)) ?? assert.fail('no layer');
  assert.deepEqual(pod.asked.split('\0').filter((p) => p !== ''), ['built.txt', 'dev-node', 'link'], 'tar is asked for the changed paths only');
  const listed = execFileSync('tar', ['-tzf', join(dir, blob.digest.replace('sha256:', ''))], { encoding: 'utf8' }).trim().split('\n');
  assert.deepEqual(listed, ['built.txt', '.wh.gone', '.wh.olddir']);
  const content = execFileSync('tar', ['-xzOf', join(dir, blob.digest.replace('sha256:', '')), 'built.txt'], { encoding: 'utf8' });
  assert.equal(content, 'hello');
});

test('a build pod\'s archive past the build\'s disk limit fails the step and leaves no layer', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-pod-layers-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const pod = new ScriptedPod([[], [line('f', 9, 2, 'big')]]);
  pod.archive = Buffer.concat([entry('big', 'file', 'x'.repeat(4096)), tarEnd()]);
  const layers = await openPodLayers(pod, 'p', AbortSignal.timeout(10_000));
  await assert.rejects(layers.next(dir, 1024, AbortSignal.timeout(10_000)), /disk limit/);
  assert.deepEqual(execFileSync('ls', ['-A', dir], { encoding: 'utf8' }), '');
});
