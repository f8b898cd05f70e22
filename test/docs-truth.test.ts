// The README and docs/ name files, links, flags, variables, make targets and endpoints; each must
// be real, so a rename in the code that leaves a page behind fails here, naming the page and the
// name. The checker is test/support/docs-truth.ts; the facts come from the repository itself.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { headlineLines, readBlock, rewriteBlock } from '../bench/measured-blocks.ts';
import { checkPage, docPages, readRepoFacts } from './support/docs-truth.ts';

const ROOT = resolve(import.meta.dirname, '..');
const facts = readRepoFacts(ROOT);

test('README.md and every docs/*.md name only links, paths, flags, variables, make targets and endpoints that exist', () => {
  const pages = docPages(ROOT);
  assert.ok(pages.includes('docs/benchmarks.md') && pages.includes('README.md'), pages.join(', '));
  const problems = pages.flatMap((page) => checkPage(page, readFileSync(join(ROOT, page), 'utf8'), facts));
  assert.deepEqual(problems, []);
});

test('the README stays a page a newcomer reads in a screen or two: at most 250 lines', () => {
  const lines = readFileSync(join(ROOT, 'README.md'), 'utf8').trimEnd().split('\n').length;
  assert.ok(lines <= 250, `README.md has ${String(lines)} lines`);
});

test('the checker refuses a made-up flag, variable, file, link, anchor, make target and endpoint', () => {
  // Built from pieces so that this file, which the variable scan reads, never names the variable whole.
  const variable = ['ASB', 'NO_SUCH_SETTING'].join('_');
  const page = [
    '# A page',
    '',
    'Run `asb create --no-such-flag` or set `--made-up-option`, and export ' + variable + '.',
    'Its code is in `src/no/such/module.ts`; see [the guide](no-such-page.md) and [above](#no-such-heading),',
    'and [a real page with a made-up heading](benchmarks.md#no-such-row).',
    '`make no-such-target` builds it; `GET /v1/no-such-route` and `DELETE /v1/sandboxes/{id}/no-such-part` serve it.',
    '',
    '| method | path |',
    '|---|---|',
    '| PATCH | /v1/healthz-of-nothing |',
  ].join('\n');
  const problems = checkPage('docs/made-up.md', page, facts).join('\n');
  for (const name of ['--no-such-flag', '--made-up-option', variable, 'src/no/such/module.ts', 'no-such-page.md', '#no-such-heading', 'no heading #no-such-row', 'make no-such-target', 'GET /v1/no-such-route', 'DELETE /v1/sandboxes/{id}/no-such-part', 'PATCH /v1/healthz-of-nothing']) {
    assert.ok(problems.includes(name), `no problem names ${name}:\n${problems}`);
  }
  // And the real ones beside them pass.
  const real = 'Run `asb create --template base`, set ASB_DOMAIN, read `src/router/decide.ts` and [benchmarks](benchmarks.md#benchmarks); `make up`; `POST /v1/sandboxes/{id}/exec`.';
  assert.deepEqual(checkPage('docs/real.md', real, facts), []);
});

test('make bench and make soak rewrite their marker block in whichever page holds it, and the README headline takes the full table\'s figures', (t) => {
  const root = mkdtempSync(join(tmpdir(), 'asb-docs-'));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  mkdirSync(join(root, 'docs'));
  writeFileSync(join(root, 'README.md'), [
    '# R', '<!-- bench-headline:start -->', 'old', '', '| metric | measured | target |', '|---|---|---|', '| claims per second | 1 | ≥ 2 |', '| a row gone | 9 | — |', '<!-- bench-headline:end -->', 'after',
  ].join('\n'));
  writeFileSync(join(root, 'docs', 'benchmarks.md'), '# B\n<!-- bench:start -->\nold table\n<!-- bench:end -->\n');
  const file = rewriteBlock('bench', () => [
    'Measured 2026-11-24 on 2 × Intel, 24 GiB, Node 24 by `make bench`. The host took 0 %.',
    'Rows of `node bench/run.ts wake`: measured 2026-11-29 on 2 × AMD EPYC, 24 GiB, Node 24. The host took 0 %.',
    '', '| metric | measured | target |', '|---|---|---|', '| claims per second | 4296 ✅ | ≥ 2 |', '| other | 5 | — |',
  ], root);
  assert.equal(file, join(root, 'docs', 'benchmarks.md'));
  assert.match(readFileSync(file, 'utf8'), /<!-- bench:start -->\nMeasured 2026-11-24[\s\S]*\| other \| 5 \| — \|\n<!-- bench:end -->\n$/);
  const full = readBlock('bench', root);
  assert.ok(full !== undefined);
  assert.equal(rewriteBlock('bench-headline', (h) => headlineLines(h, full), root), join(root, 'README.md'));
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  assert.match(readme, /measured 2026-11-24 to 2026-11-29 on 2 × Intel, 24 GiB, Node 24 and 2 × AMD EPYC, 24 GiB, Node 24\./);
  assert.match(readme, /\| claims per second \| 4296 ✅ \| ≥ 2 \|\n<!-- bench-headline:end -->\nafter$/);
  assert.doesNotMatch(readme, /a row gone|\| other \|/);
  assert.equal(rewriteBlock('soak', () => ['x'], root), undefined, 'no page holds the soak markers: nothing is written');
});
