// Child process for test/store-crash.test.ts: writes to the embedded store as fast as it can
// from many concurrent callers and prints one line per acknowledged write, `ack <name> <rv>`,
// only after the write's promise resolved. The parent kills it with SIGKILL mid-stream.
// Usage: node test/support/store-writer.ts <db path> <name prefix>
import type { KubeObject } from '../../src/api/meta.ts';
import { SandboxType } from '../../src/api/types.ts';
import { openSqliteStore } from '../../src/store/sqlite.ts';

// 32 callers keep batches of many writes in flight, so the kill often lands inside a commit.
const CALLERS = 32;
const UPDATES_PER_OBJECT = 3;

const [path, prefix] = process.argv.slice(2);
if (path === undefined || prefix === undefined) throw new Error('usage: store-writer.ts <db path> <name prefix>');
const store = await openSqliteStore({ path });

function ack(obj: KubeObject): void {
  // Synchronous for pipes on Linux: the line is in the pipe before the next write starts.
  process.stdout.write(`ack ${obj.metadata.name} ${obj.metadata.resourceVersion ?? ''}\n`);
}

async function caller(id: number): Promise<void> {
  for (let n = 0; ; n++) {
    let obj: KubeObject = await store.create(SandboxType, {
      apiVersion: '',
      kind: '',
      metadata: { name: `${prefix}-c${id}-${n}`, namespace: 'crash' },
      spec: { n: 0 },
    });
    ack(obj);
    for (let u = 1; u <= UPDATES_PER_OBJECT; u++) {
      obj = await store.update(SandboxType, { ...obj, spec: { n: u } });
      ack(obj);
    }
  }
}

await Promise.all(Array.from({ length: CALLERS }, (_, id) => caller(id)));
