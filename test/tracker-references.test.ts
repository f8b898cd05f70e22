// Code, tests, scripts and docs name the behaviour a line pins, never our tracker's issue number
// (STYLE.md): a reader of the repository cannot see the tracker, so its numbers tell them nothing.
// Another project's issue or pull request stays, since anyone can look it up, as long as
// it names the project: `google/gvisor#14688`, "kubernetes-sigs issue #251".
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { test } from 'node:test';

const ROOT = resolve(import.meta.dirname, '..');
const SCANNED = ['src', 'test', 'bench', 'scripts', 'docs', 'clusters', '.ci', 'README.md', 'Makefile'];

// "issue", "issues", "PR" or "pull request", then a number ("16", "15.5", "17's") or "#" and a
// number. Without '#' it is always ours; with '#' the word before it must name a project.
// (The second test below shows each form.)
const REFERENCE = /(\S*)\s*\b(issues?|PRs?|pull requests?)\s+(#?)\d+(?:\.\d+)*/gi;
/** Words that may stand before "issue #N" without naming whose issue it is. */
const NOT_A_PROJECT = new Set(['', 'a', 'an', 'and', 'by', 'fixed', 'for', 'from', 'in', 'its', 'of', 'on', 'our', 'proposed', 'see', 'that', 'the', 'this', 'to', 'upstream', 'with', '//', '#', '*']);

/** Each reference in `text` to an issue or pull request that names no project, as `page:line: excerpt`. */
function trackerReferences(page: string, text: string): string[] {
  const found: string[] = [];
  text.split('\n').forEach((line, i) => {
    for (const m of line.matchAll(REFERENCE)) {
      const before = (m[1] ?? '').replace(/^[("'`[]+/, '').toLowerCase();
      if (m[3] === '#' && !NOT_A_PROJECT.has(before)) continue;
      found.push(`${page}:${String(i + 1)}: ${m[0].trim()}`);
    }
  });
  return found;
}

/** Every file at or under `path`, past node_modules and Python's caches. */
function files(path: string): string[] {
  if (!statSync(path).isDirectory()) return [path];
  return readdirSync(path).filter((name) => name !== 'node_modules' && name !== '__pycache__').flatMap((name) => files(join(path, name)));
}

test('no file of src, test, bench, scripts, docs, clusters, .ci, the README or the Makefile names one of our tracker\'s issues', () => {
  const found = SCANNED.flatMap((p) => files(join(ROOT, p))).flatMap((file) => {
    const text = readFileSync(file, 'utf8');
    return text.includes('\0') ? [] : trackerReferences(relative(ROOT, file), text);
  });
  assert.deepEqual(found, [], `say what each one pins instead of its number:\n${found.join('\n')}`);
});

test('the check flags our tracker\'s numbers and a bare "#N", and lets another project\'s issue by its name pass', () => {
  // Built from pieces so that this file, which the first test reads, never holds a reference whole.
  const issue = 'issue';
  const Issue = 'Issue';
  const pr = 'PR';
  const ours = [
    `// The disk cap (${issue} 16 point 4): ephemeral-storage covers the writable layer`,
    `test('${issue} 18: a SandboxClaim for a missing warm pool…'`,
    `// ${Issue} 15.5: our own worker is down`,
    `// Test subnets of ${issue} 17's netpol work`,
    `a claimName of ../x (${issue} 14)`,
    `see the ${issue} #12 for why`,
    `fix proposed in ${pr} #14721`,
  ];
  for (const line of ours) assert.equal(trackerReferences('x.ts', line).length, 1, line);
  const theirs = [
    'ignores errnoRet (google/gvisor#14688, open)',
    `k8s-sigs sets no maximum, and kubernetes-sigs ${issue} #251 shows it`,
    'the class of checkpoint-restore/criu#2651 (open)',
    `CRIU learnt that in CRIU ${pr} #2539`,
    `the e2b-dev/infra#2813 fix`,
    'an issued token; issue(sandboxId, team) returns 16 bytes',
  ];
  for (const line of theirs) assert.deepEqual(trackerReferences('x.ts', line), [], line);
});
