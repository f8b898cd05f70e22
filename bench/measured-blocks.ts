// The measured tables live between marker comments (`<!-- <name>:start -->` and
// `<!-- <name>:end -->`) in README.md or a page under docs/ (the full bench table in
// docs/benchmarks.md, the soak's in docs/operations.md, the README's headline rows in README.md);
// make bench and make soak each rewrite their own block wherever it is.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const REPO = resolve(import.meta.dirname, '..');

function markers(name: string): { start: string; end: string } {
  return { start: `<!-- ${name}:start -->`, end: `<!-- ${name}:end -->` };
}

/** README.md, then every docs/*.md, in that order: the pages a marker block may live in. */
function pages(root: string): string[] {
  const docs = join(root, 'docs');
  let names: string[] = [];
  try {
    names = readdirSync(docs).filter((f) => f.endsWith('.md')).sort();
  } catch {
    // no docs/ (a test's scratch tree): README.md alone
  }
  return [join(root, 'README.md'), ...names.map((f) => join(docs, f))];
}

function locate(name: string, root: string): { file: string; text: string; a: number; b: number } | undefined {
  const { start, end } = markers(name);
  for (const file of pages(root)) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    const a = text.indexOf(start);
    const b = text.indexOf(end);
    if (a >= 0 && b > a) return { file, text, a: a + start.length, b };
  }
  return undefined;
}

/** The text between `name`'s markers in whichever page holds them; undefined when none does. */
export function readBlock(name: string, root: string = REPO): string | undefined {
  const at = locate(name, root);
  return at === undefined ? undefined : at.text.slice(at.a, at.b);
}

/**
 * Replaces the lines between `name`'s markers, in whichever of README.md and docs/*.md holds
 * them, with `render(the lines there now)`. Returns the file rewritten; nothing happens (and
 * undefined is returned) when no page holds the markers.
 */
export function rewriteBlock(name: string, render: (inner: string) => readonly string[], root: string = REPO): string | undefined {
  const at = locate(name, root);
  if (at === undefined) return undefined;
  writeFileSync(at.file, `${at.text.slice(0, at.a)}\n${render(at.text.slice(at.a, at.b)).join('\n')}\n${at.text.slice(at.b)}`);
  return at.file;
}

function metricOf(line: string): string {
  return line.slice(2, line.indexOf(' | ', 2));
}

function isRow(line: string): boolean {
  return line.startsWith('| ') && !line.startsWith('| metric |');
}

/**
 * The README's headline block, refreshed from the full table: the rows the headline names (by
 * their metric, so the README chooses which rows) get the full table's figures, under one line
 * saying where they come from and when and where they were measured. A headline row the full
 * table no longer has is dropped.
 */
export function headlineLines(headline: string, full: string): string[] {
  const fullLines = full.trim().split('\n');
  const byMetric = new Map(fullLines.filter(isRow).map((l) => [metricOf(l), l]));
  const rows = headline.trim().split('\n').filter(isRow).map((l) => byMetric.get(metricOf(l))).filter((l) => l !== undefined);
  const stamps = fullLines.filter((l) => l.startsWith('Measured ') || l.startsWith('Rows of `'));
  const dates = [...new Set(stamps.flatMap((l) => l.match(/\d{4}-\d{2}-\d{2}/g) ?? []))].sort();
  const machines = [...new Set(stamps.map((l) => /\bon (.+?)(?: by `[^`]*`)?\. /.exec(l)?.[1]).filter((m) => m !== undefined))];
  const when = dates.length === 0 ? '' : dates.length === 1 ? ` ${dates[0] ?? ''}` : ` ${dates[0] ?? ''} to ${dates[dates.length - 1] ?? ''}`;
  const where = machines.length === 0 ? '' : ` on ${machines.join(' and ')}`;
  return [`Rows from [docs/benchmarks.md](docs/benchmarks.md), measured${when}${where}.`, '', '| metric | measured | target |', '|---|---|---|', ...rows];
}
