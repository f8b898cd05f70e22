// Imports flow one way (STYLE.md). Two checks: no module of src/ reaches itself again through its
// imports, type-only ones included; and every import between folders runs down the floors that
// src/README.md draws, except the upward ones a folder's own README.md names and explains.
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
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

/** src/README.md's drawing: each folder (or root module) → its floor, 0 at the bottom. */
function floorsOf(readme: string): Map<string, number> {
  const section = readme.split(/^## /m).find((s) => s.startsWith('Floors\n')) ?? '';
  const drawing = /```\n([\s\S]*?)```/.exec(section)?.[1] ?? '';
  const lines = drawing.split('\n').filter((l) => l.trim() !== '').reverse();
  return new Map(lines.flatMap((line, floor) => line.trim().split(/\s+/).map((name) => [name, floor] as const)));
}

/** The upward imports a folder's README.md names under "Imports that run upward", as `from → to` pairs of src-relative paths. */
function declaredUpward(readme: string): Set<string> {
  const section = readme.split(/^## /m).find((s) => s.startsWith('Imports that run upward\n')) ?? '';
  return new Set([...section.matchAll(/`([^`\s]+\.ts)` → `([^`\s]+\.ts)`/g)].map((m) => `${m[1]} → ${m[2]}`));
}

/** The part of src/ a module belongs to: its top folder, or its own name for a module at the root. */
function partOf(rel: string): string {
  return rel.includes('/') ? (rel.split('/')[0] ?? rel) : rel;
}

/** Each import between parts that does not run down the floors and is not declared, and each part not on the drawing. */
function misdirected(imports: readonly (readonly [string, string])[], floors: ReadonlyMap<string, number>, declared: ReadonlySet<string>): string[] {
  const found = new Set<string>();
  for (const [from, to] of imports) {
    const a = partOf(from);
    const b = partOf(to);
    if (a === b) continue;
    const fa = floors.get(a);
    const fb = floors.get(b);
    if (fa === undefined || fb === undefined) found.add(`${fa === undefined ? a : b} is on no floor of src/README.md`);
    else if (fb >= fa && !declared.has(`${from} → ${to}`)) found.add(`${from} → ${to} runs ${fb === fa ? 'sideways' : 'upward'} (${a} is below or beside ${b})`);
  }
  return [...found];
}

test('every import between folders runs down the floors of src/README.md, or is declared where it starts', () => {
  const files = modules(SRC);
  const imports = files.flatMap((f) => [...readFileSync(f, 'utf8').matchAll(IMPORT)].map((m) => [relative(SRC, f), relative(SRC, normalize(join(dirname(f), m[1] ?? '')))] as const));
  const floors = floorsOf(readFileSync(join(SRC, 'README.md'), 'utf8'));
  assert.ok(floors.size > 10, `read the drawing (${floors.size} parts)`);
  const readmes = [...new Set(files.map((f) => partOf(relative(SRC, f))))].map((part) => join(SRC, part, 'README.md')).filter((p) => existsSync(p));
  const declared = new Set(readmes.flatMap((p) => [...declaredUpward(readFileSync(p, 'utf8'))]));
  assert.deepEqual(misdirected(imports, floors, declared), []);
  const seen = new Set(imports.map(([from, to]) => `${from} → ${to}`));
  assert.deepEqual([...declared].filter((d) => !seen.has(d)), [], 'a declared upward import that no longer exists (remove it from the README)');
});

test('the floor check finds an import that runs upward or sideways, and accepts a declared one', () => {
  const floors = floorsOf('## Floors\n\n```\ntop\nmid side\nbottom.ts\n```\n');
  assert.deepEqual([...floors], [['bottom.ts', 0], ['mid', 1], ['side', 1], ['top', 2]]);
  const imports = [['top/a.ts', 'mid/b.ts'], ['mid/b.ts', 'bottom.ts'], ['mid/b.ts', 'top/a.ts'], ['mid/b.ts', 'side/c.ts'], ['side/c.ts', 'top/d.ts'], ['other/x.ts', 'mid/b.ts']] as const;
  const declared = declaredUpward('## Imports that run upward\n\n- `side/c.ts` → `top/d.ts`: because.\n');
  assert.deepEqual(misdirected(imports, floors, declared), ['mid/b.ts → top/a.ts runs upward (mid is below or beside top)', 'mid/b.ts → side/c.ts runs sideways (mid is below or beside side)', 'other is on no floor of src/README.md']);
});

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
