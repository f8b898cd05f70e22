// Worker memory under concurrent uploads (security probe row M3): a real worker process with a
// real sandbox; 8 uploads of 60 MiB at once to envd's POST /files with the sandbox's token (the
// probe's reproduction, as the router forwards it), each body one random MiB sent 60 times so the
// client holds 1 MiB. Reported: the worker's RSS before, its peak during (VmHWM, reset just before
// the uploads through /proc/<pid>/clear_refs) and after, the time for all 8, and their total rate.
// A worker that buffered uploads went from 150 MB to 1.32 GB and kept it.
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { performance } from 'node:perf_hooks';
import { api, removeDataDir, startWorkerProcess } from '../test/support/worker-process.ts';
import { round } from './claims.ts';

const MiB = 1024 * 1024;
const UPLOADS = 8;
const UPLOAD_MIB = 60;

export interface UploadBench {
  uploads: number;
  uploadMiB: number;
  rssBeforeMiB: number;
  rssPeakMiB: number;
  rssAfterMiB: number;
  seconds: number;
  mibPerSec: number;
}

function memoryMiB(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) / 1024;
  return { rss: field('VmRSS'), peak: field('VmHWM') };
}

function upload(url: string, headers: Record<string, string>, block: Buffer, size: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { ...headers, 'content-length': String(size) }, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    let sent = 0;
    const more = (): void => {
      while (sent < size) {
        const chunk = block.subarray(0, Math.min(block.length, size - sent));
        sent += chunk.length;
        if (!req.write(chunk)) {
          req.once('drain', more);
          return;
        }
      }
      req.end();
    };
    more();
  });
}

export async function benchUploads(): Promise<UploadBench> {
  const w = await startWorkerProcess({ clusterTag: 'upbn', subnetOctet: 196, basePool: 1 });
  try {
    const pid = w.proc.pid;
    if (pid === undefined) throw new Error('the worker has no pid');
    const created = await api<{ id: string; accessToken: string }>(w, 'POST', '/v1/sandboxes', { template: 'base', wait: true });
    if (created.status !== 201) throw new Error(`create failed: ${JSON.stringify(created.body)}`);
    const { id, accessToken } = created.body;
    const headers = { 'x-asb-sandbox-id': id, 'x-access-token': accessToken, 'content-type': 'application/octet-stream' };
    const block = randomBytes(MiB);
    // One small upload first: module loading and the first exec are not what is measured.
    await upload(`${w.apiUrl}/files?path=/tmp/warm`, headers, block, MiB);
    writeFileSync(`/proc/${pid}/clear_refs`, '5');
    const before = memoryMiB(pid);
    const start = performance.now();
    const statuses = await Promise.all(Array.from({ length: UPLOADS }, (_, n) => upload(`${w.apiUrl}/files?path=/tmp/up${n}`, headers, block, UPLOAD_MIB * MiB)));
    const seconds = (performance.now() - start) / 1000;
    const during = memoryMiB(pid);
    if (statuses.some((s) => s !== 200)) throw new Error(`uploads answered ${statuses.join(', ')}`);
    return {
      uploads: UPLOADS,
      uploadMiB: UPLOAD_MIB,
      rssBeforeMiB: round(before.rss, 0),
      rssPeakMiB: round(during.peak, 0),
      rssAfterMiB: round(during.rss, 0),
      seconds: round(seconds, 2),
      mibPerSec: round((UPLOADS * UPLOAD_MIB) / seconds, 0),
    };
  } finally {
    await w.stop();
    removeDataDir(w.dataDir);
  }
}
