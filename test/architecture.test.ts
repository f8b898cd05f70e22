// Imports flow one way (STYLE.md): no module of src/ reaches itself again through its imports,
// type-only ones included. Two such circles stood here (e2b/shape.ts ↔ envd/envd.ts and
// hub-link.ts ↔ sync-agent.ts); this keeps new ones from coming back unnoticed.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative, resolve } from 'node:path';
import { test } from 'node:test';

const SRC = resolve(import.meta.dirname, '../src');
const IMPORT = /^(?:import|export)\b[^'"\n]*?\bfrom\s+['"](\.{1,2}\/[^'"]+)['"]/gm;

function modules(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? modules(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : []));
}

/** Every circle of imports among `graph`'s modules, each once, as the path around it. */
function circles(graph: ReadonlyMap<string, readonly string[]>): string[][] {
  const found: string[][] = [];
  const done = new Set<string>();
  const onPath: string[] = [];
  const visit = (m: string): void => {
    const at = onPath.indexOf(m);
    if (at !== -1) {
      found.push([...onPath.slice(at), m]);
      return;
    }
    if (done.has(m)) return;
    onPath.push(m);
    for (const dep of graph.get(m) ?? []) visit(dep);
    onPath.pop();
    done.add(m);
  };
  for (const m of graph.keys()) visit(m);
  return found;
}

test('no module of src/ imports itself back, directly or through others', () => {
  const files = modules(SRC);
  const graph = new Map(files.map((f) => [f, [...readFileSync(f, 'utf8').matchAll(IMPORT)].map((m) => normalize(join(dirname(f), m[1] ?? '')))]));
  assert.ok(files.length > 100, `read the source tree (${files.length} modules)`);
  const found = circles(graph).map((c) => c.map((f) => relative(SRC, f)).join(' → '));
  assert.deepEqual(found, []);
});

test('the circle finder finds a circle', () => {
  const graph = new Map([['a', ['b']], ['b', ['c']], ['c', ['a']], ['d', ['a']]]);
  assert.deepEqual(circles(graph), [['a', 'b', 'c', 'a']]);
});
