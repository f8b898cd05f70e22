// Stop with memory on gVisor, measured (not part of `make bench` yet): `node bench/checkpoint.ts [MiB...]`
// (default 64 256), as root with `make runsc` built. For each size, a python3 pod holding that many
// MiB of touched memory and an in-memory counter served on port 8000 is:
//   - stopped with memory (stop(id, { memory: true }): pause, checkpoint -leave-running, seal, kill)
//     and started again until its counter answers (restore through the shim);
//   - beside the floor of the same runs: the raw `runsc checkpoint` and `runsc restore` commands the
//     runtime ran (timed by a wrapper in front of runsc), and a plain `runsc checkpoint` (no pause,
//     no -leave-running) of a second, identical pod.
// Prints seconds, image size and the pod's memory working set before the save.
import { execFile } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { findRunscBinary } from '../src/runtime/oci/runsc-binary.ts';
import { runscFlags } from '../src/runtime/oci/runsc.ts';
import type { PodRequest } from '../src/runtime/runtime.ts';
import { startTestRuntime, stopTestRuntime } from '../test/support/test-runtime.ts';

const run = promisify(execFile);
const sizes = process.argv.slice(2).map(Number).filter((n) => n > 0);
const real = findRunscBinary();
const scratch = await mkdtemp(join(tmpdir(), 'asb-ckpt-bench-'));
const times = join(scratch, 'runsc-times');
const wrapper = join(scratch, 'runsc');
await writeFile(wrapper, `#!/bin/sh
case " $* " in
  *" checkpoint "*|*" restore "*)
    s=$(date +%s%N); "${real}" "$@"; rc=$?; e=$(date +%s%N)
    for a in "$@"; do case "$a" in checkpoint|restore) op=$a;; esac; done
    echo "$op $(( (e - s) / 1000 ))" >> "${times}"; exit $rc;;
esac
exec "${real}" "$@"
`);
await chmod(wrapper, 0o755);

const COUNTER = 'import http.server, sys\nhold = b"\\x01" * (int(sys.argv[1]) << 20)\nn = 0\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        global n\n        n += 1\n        b = str(n).encode()\n        self.send_response(200)\n        self.send_header("Content-Length", str(len(b)))\n        self.end_headers()\n        self.wfile.write(b)\n    def log_message(self, *a):\n        pass\nhttp.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()';

const pod = (id: string, mib: number): PodRequest => ({
  id, uid: `uid-${id}`, namespace: 'default', hostname: id,
  spec: { runtimeClassName: 'gvisor', containers: [{ name: 'main', image: 'agent-sandbox/base', command: ['python3', '-c', COUNTER, String(mib)], resources: { limits: { memory: `${String(mib + 256)}Mi` } }, readinessProbe: { tcpSocket: { port: 8000 }, periodSeconds: 1 } }] },
});

function httpGet(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = get(url, { agent: false, timeout: 5000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve(body));
    });
    req.on('error', reject);
  });
}

async function answers(ip: string): Promise<string> {
  for (;;) {
    try {
      return await httpGet(`http://${ip}:8000/`);
    } catch {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
}

const lastTime = async (op: string): Promise<number> => {
  const lines = (await readFile(times, 'utf8')).trim().split('\n').filter((l) => l.startsWith(`${op} `));
  return Number(lines.at(-1)?.split(' ')[1]) / 1000;
};

const fixture = await startTestRuntime('asb-ckpt-bench-', 'asbckpb0', '10.238.0.0/16', { runsc: wrapper, probeIntervalMs: 50 });
const { rt, root } = fixture;
const s = (ms: number): string => (ms / 1000).toFixed(3);
try {
  for (const mib of sizes.length > 0 ? sizes : [64, 256]) {
    const id = `b${String(mib)}`;
    const started = await rt.start(pod(id, mib));
    await answers(started.ip ?? '');
    const memory = (await rt.usage(id))?.memory?.workingSetBytes ?? 0;
    let t = performance.now();
    await rt.stop(id, { memory: true });
    const stopMs = performance.now() - t;
    const bytes = rt.state(id).checkpoint?.bytes ?? 0;
    const rawCheckpointLeaveRunning = await lastTime('checkpoint');
    t = performance.now();
    const woken = await rt.start(pod(id, mib));
    const count = await answers(woken.ip ?? '');
    const startMs = performance.now() - t;
    const rawRestore = await lastTime('restore');
    if (woken.restoreFailure !== undefined || count !== '2') throw new Error(`${id} was not restored: ${woken.restoreFailure ?? `count ${count}`}`);

    // The floor of the save: a plain checkpoint of a second, identical pod (it ends the sandbox).
    const floorId = `f${String(mib)}`;
    const floorPod = await rt.start(pod(floorId, mib));
    await answers(floorPod.ip ?? '');
    const image = join(scratch, floorId);
    t = performance.now();
    await run(real, [...runscFlags({}), '--root', join(root, 'runsc'), 'checkpoint', '-image-path', image, floorId]);
    const plainMs = performance.now() - t;
    await rm(image, { recursive: true, force: true });

    console.log(`${String(mib)} MiB held: working set ${(memory / 2 ** 20).toFixed(0)} MiB, image ${(bytes / 2 ** 20).toFixed(0)} MiB (${(bytes / memory).toFixed(2)}x)`);
    console.log(`  stop with memory ${s(stopMs)} s  [runsc checkpoint -leave-running inside it ${s(rawCheckpointLeaveRunning)} s; plain runsc checkpoint of a twin pod ${s(plainMs)} s]`);
    console.log(`  start until the counter answers ${s(startMs)} s  [runsc restore inside it ${s(rawRestore)} s]`);
    await rt.remove(id);
    await rt.remove(floorId);
  }
} finally {
  await stopTestRuntime(fixture);
  await rm(scratch, { recursive: true, force: true });
}
