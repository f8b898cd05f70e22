// `make test`'s test run, in two lanes started together: the Kubernetes tier (test/k8s/) in one
// `node --test`, everything else in the other, each one file at a time (--test-concurrency=1).
// The Kubernetes tier (~11 of ~33 min serially) mostly waits on a real kube-apiserver and
// kubelet, so beside the local tests it costs little more than its own CPU; the two share nothing
// that either changes (test/support/kubelet-subids.ts and node-host.ts say what the node keeps
// apart or takes back).
//
// Output: each lane's spec reporter, live, every line prefixed with the lane's name, and whole in
// test-artifacts/lanes/<lane>.log; at the end, one summary line per lane and the failing tests of
// each lane that failed. Exit status 1 when a lane fails (the summary names it).
//
// Usage: node scripts/test-lanes.ts [--logs <dir>] <file or glob>...  (make test passes
// TEST_FILES: globs are expanded here, so TEST_FILES=test/store.test.ts runs that file alone, in
// its lane; --logs puts the lane logs elsewhere, as test/test-lanes.test.ts does).
import { spawn } from 'node:child_process';
import { createWriteStream, globSync, mkdirSync, readFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { createInterface } from 'node:readline';

const repoRoot = resolve(import.meta.dirname, '..');
const DEFAULT_LOG_DIR = join(repoRoot, 'test-artifacts', 'lanes');
/** The test runner's own flags, the same in every lane: one file at a time, 5 min per test, the spec reporter on stdout. */
const TEST_FLAGS = ['--test', '--test-concurrency=1', '--test-timeout=300000', '--test-reporter=spec', '--test-reporter-destination=stdout'];
const FILES_REPORTER = join(repoRoot, 'scripts', 'lane-files-reporter.ts');

interface Lane {
  name: string;
  files: string[];
}

interface LaneResult {
  lane: Lane;
  code: number;
  wallMs: number;
  logPath: string;
}

/** The files a pattern names: a glob expanded (sorted, as the test runner does), a plain path as given. */
function expand(pattern: string): string[] {
  if (!/[*?[{]/.test(pattern)) return [pattern];
  const found = globSync(pattern, { exclude: (p) => p.includes('node_modules') }).sort();
  // None found: the test runner names the pattern it could not match.
  return found.length === 0 ? [pattern] : found;
}

/** k8s: every file under test/k8s/; local: the rest. A lane with no files is left out. */
export function splitLanes(patterns: readonly string[]): Lane[] {
  const files = [...new Set(patterns.flatMap(expand))];
  const k8s = files.filter((f) => relative(repoRoot, resolve(f)).startsWith('test/k8s/'));
  const local = files.filter((f) => !k8s.includes(f));
  return [{ name: 'k8s', files: k8s }, { name: 'local', files: local }].filter((l) => l.files.length > 0);
}

const minutes = (ms: number): string => `${String(Math.floor(ms / 60_000))} min ${String(Math.round((ms % 60_000) / 1000))} s`;

function runLane(lane: Lane, width: number, logDir: string): Promise<LaneResult> {
  const logPath = join(logDir, `${lane.name}.log`);
  const log = createWriteStream(logPath);
  const prefix = `${lane.name.padEnd(width)} │ `;
  const started = Date.now();
  const timings = [`--test-reporter=${FILES_REPORTER}`, `--test-reporter-destination=${join(logDir, `${lane.name}.files.tsv`)}`];
  const child = spawn(process.execPath, [...TEST_FLAGS, ...timings, ...lane.files], { stdio: ['ignore', 'pipe', 'pipe'] });
  const closed: Promise<void>[] = [];
  for (const stream of [child.stdout, child.stderr]) {
    const lines = createInterface({ input: stream, crlfDelay: Infinity });
    lines.on('line', (line) => {
      log.write(`${line}\n`);
      process.stdout.write(`${prefix}${line}\n`);
    });
    closed.push(new Promise((r) => lines.once('close', r)));
  }
  return new Promise((res) => {
    child.once('close', (code, signal) => {
      void Promise.all(closed).then(() => log.end(() => res({ lane, code: code ?? (signal === null ? 1 : 128), wallMs: Date.now() - started, logPath })));
    });
  });
}

/** The spec reporter's closing counts (ℹ tests N, ℹ fail N, ...) and its "failing tests" section, from a lane's log. */
function summaryOf(logPath: string): { counts: string; failing: string } {
  const text = readFileSync(logPath, 'utf8');
  const count = (what: string): string => new RegExp(`^ℹ ${what} (\\d+)$`, 'm').exec(text)?.[1] ?? '?';
  const at = text.lastIndexOf('✖ failing tests:');
  return {
    counts: `${count('tests')} tests, ${count('pass')} passed, ${count('fail')} failed, ${count('skipped')} skipped, ${count('cancelled')} cancelled`,
    failing: at < 0 ? '' : text.slice(at).trimEnd(),
  };
}

async function main(): Promise<number> {
  const args = process.argv.slice(2);
  const logsAt = args.indexOf('--logs');
  const logDir = logsAt < 0 ? DEFAULT_LOG_DIR : resolve(args[logsAt + 1] ?? '');
  const patterns = logsAt < 0 ? args : args.filter((_, i) => i !== logsAt && i !== logsAt + 1);
  if (patterns.length === 0 || (logsAt >= 0 && args[logsAt + 1] === undefined)) {
    process.stderr.write('usage: node scripts/test-lanes.ts [--logs <dir>] <test file or glob>...\n');
    return 2;
  }
  const lanes = splitLanes(patterns);
  mkdirSync(logDir, { recursive: true });
  const width = Math.max(...lanes.map((l) => l.name.length));
  process.stdout.write(lanes.map((l) => `lane ${l.name}: ${String(l.files.length)} test files, log ${relative(repoRoot, join(logDir, `${l.name}.log`))}\n`).join(''));
  const results = await Promise.all(lanes.map((l) => runLane(l, width, logDir)));
  process.stdout.write('\n');
  for (const r of results) {
    const s = summaryOf(r.logPath);
    process.stdout.write(`lane ${r.lane.name}: ${r.code === 0 ? 'passed' : `FAILED (exit ${String(r.code)})`}: ${s.counts}, ${minutes(r.wallMs)} wall\n`);
  }
  const failed = results.filter((r) => r.code !== 0);
  for (const r of failed) {
    const { failing } = summaryOf(r.logPath);
    process.stdout.write(`\n── lane ${r.lane.name} failed (${relative(repoRoot, r.logPath)}) ──\n${failing === '' ? '(no failing-tests section: see the log)' : failing}\n`);
  }
  if (failed.length > 0) process.stdout.write(`\nmake test: lane ${failed.map((r) => r.lane.name).join(' and lane ')} failed\n`);
  return failed.length === 0 ? 0 : 1;
}

if (import.meta.main) process.exitCode = await main();
