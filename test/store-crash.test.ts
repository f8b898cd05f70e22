// kill -9 never loses an acknowledged write: a child process writes continuously and reports
// each write only after its promise resolved; we SIGKILL it at varied points, reopen the file
// and check every acknowledged write is there, with its version in the watch history.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import type { KubeObject } from '../src/api/meta.ts';
import { SandboxType } from '../src/api/types.ts';
import { openSqliteStore } from '../src/store/sqlite.ts';

const WRITER = join(import.meta.dirname, 'support', 'store-writer.ts');
// Kill after this many acknowledgements in each round: from "during the first commits" to
// "mid-stream after hundreds of batches".
const KILL_AFTER_ACKS = [1, 7, 30, 64, 150, 333, 600, 1000];
const ROUND_DEADLINE_MS = 30_000;

interface Round {
  /** name -> highest resourceVersion acknowledged. */
  acked: Map<string, number>;
  /** Every acknowledged (name, version) pair. */
  pairs: { name: string; rv: number }[];
}

/** Runs the writer until `killAfter` acks, SIGKILLs it, and collects every ack it printed. */
async function runAndKill(path: string, prefix: string, killAfter: number): Promise<Round> {
  const child = spawn(process.execPath, [WRITER, path, prefix], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, signal) => resolve(signal)));
  const round: Round = { acked: new Map(), pairs: [] };
  const timer = setTimeout(() => child.kill('SIGKILL'), ROUND_DEADLINE_MS);
  try {
    // Lines still in the pipe after the kill were printed after their promise resolved: they count.
    for await (const line of createInterface({ input: child.stdout })) {
      const [word, name, rv] = line.split(' ');
      if (word !== 'ack' || name === undefined || rv === undefined) continue;
      round.pairs.push({ name, rv: Number(rv) });
      round.acked.set(name, Math.max(round.acked.get(name) ?? 0, Number(rv)));
      if (round.pairs.length === killAfter) child.kill('SIGKILL');
    }
  } finally {
    clearTimeout(timer);
  }
  assert.equal(await exited, 'SIGKILL', `writer did not run until killed: ${stderr}`);
  assert.ok(round.pairs.length >= killAfter, `writer acknowledged ${round.pairs.length} of ${killAfter} writes before the deadline: ${stderr}`);
  return round;
}

test('kill -9 at varied points loses no acknowledged write', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'asb-store-crash-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'store.db');
  let lastRv = 0;

  for (const [i, killAfter] of KILL_AFTER_ACKS.entries()) {
    const round = await runAndKill(path, `r${i}`, killAfter);

    const store = await openSqliteStore({ path });
    try {
      const { items, resourceVersion } = await store.list(SandboxType, { namespace: 'crash' });
      const byName = new Map(items.map((o) => [o.metadata.name, o]));
      for (const [name, rv] of round.acked) {
        const stored = byName.get(name);
        assert.ok(stored !== undefined, `round ${i}: acknowledged ${name} is missing`);
        assert.ok(Number(stored.metadata.resourceVersion) >= rv, `round ${i}: ${name} at ${stored.metadata.resourceVersion ?? ''}, acknowledged ${rv}`);
      }
      const maxAcked = Math.max(...round.pairs.map((p) => p.rv));
      assert.ok(Number(resourceVersion) >= maxAcked);

      // The history replays every acknowledged version since the previous round.
      const seen = new Set<string>();
      let wanted = 0;
      const w = store.watch<KubeObject>(SandboxType, { resourceVersion: String(lastRv), namespace: 'crash' }, {
        onEvent: (e) => {
          seen.add(`${e.object.metadata.name} ${e.object.metadata.resourceVersion ?? ''}`);
          if (Number(e.object.metadata.resourceVersion) >= Number(resourceVersion)) wanted++;
        },
        onError: (err) => assert.fail(err),
      });
      const deadline = Date.now() + 5000;
      while (wanted === 0 && Date.now() < deadline) await new Promise((resolve) => setImmediate(resolve));
      w.close();
      for (const p of round.pairs) assert.ok(seen.has(`${p.name} ${p.rv}`), `round ${i}: watch history lacks ${p.name} at ${p.rv}`);

      // Versions keep increasing across the crash.
      const after = await store.create<KubeObject>(SandboxType, { apiVersion: '', kind: '', metadata: { name: `after-${i}`, namespace: 'crash' } });
      assert.ok(Number(after.metadata.resourceVersion) > Number(resourceVersion));
      lastRv = Number(after.metadata.resourceVersion);
    } finally {
      await store.close();
    }
  }
});
