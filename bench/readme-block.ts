// The README's measured tables live between marker comments (`<!-- <name>:start -->` and
// `<!-- <name>:end -->`); make bench and make soak each rewrite their own block.
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const README = join(resolve(import.meta.dirname, '..'), 'README.md');

/** Replaces the lines between `name`'s markers with `render(the lines there now)`; nothing when the markers are missing. */
export function rewriteReadmeBlock(name: string, render: (inner: string) => readonly string[]): void {
  const text = readFileSync(README, 'utf8');
  const start = `<!-- ${name}:start -->`;
  const end = `<!-- ${name}:end -->`;
  const a = text.indexOf(start);
  const b = text.indexOf(end);
  if (a < 0 || b < a) return;
  writeFileSync(README, `${text.slice(0, a + start.length)}\n${render(text.slice(a + start.length, b)).join('\n')}\n${text.slice(b)}`);
}
