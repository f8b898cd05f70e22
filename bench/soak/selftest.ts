// `make soak-selftest`: the soak's checks can fail. Two short soaks (SOAK_SELFTEST_MINUTES, default
// 3), each with one fault injected (bench/soak/run.ts SOAK_INJECT): `lost-write` removes one
// acknowledged file behind the soak's back, `leak` leaves a mount under a worker's runtime root per
// create. Each soak must exit 1 naming the check the fault breaks; exits 1 itself otherwise.
import { spawn } from 'node:child_process';
import { resolve } from 'node:path';

const REPO = resolve(import.meta.dirname, '../..');
const minutes = process.env.SOAK_SELFTEST_MINUTES ?? '3';
const CASES = [
  { inject: 'lost-write', check: 'ledger (acknowledged creates, writes, deletes; convergence)', line: /acknowledged write lost: /u },
  { inject: 'leak', check: 'residue after the drain', line: /residue after the drain: mounts 0 before, [1-9]\d* after/u },
] as const;

function soak(inject: string): Promise<{ code: number | null; output: string }> {
  return new Promise((res) => {
    const child = spawn(process.execPath, ['bench/soak/run.ts'], { cwd: REPO, env: { ...process.env, SOAK_MINUTES: minutes, SOAK_INJECT: inject }, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    const take = (d: Buffer): void => {
      output += d.toString();
      process.stdout.write(d);
    };
    child.stdout.on('data', take);
    child.stderr.on('data', take);
    child.on('exit', (code) => res({ code, output }));
  });
}

let bad = 0;
const verdicts: string[] = [];
for (const c of CASES) {
  const r = await soak(c.inject);
  const named = r.output.includes(`SOAK FAILED: `) && r.output.split('\n').some((l) => l.startsWith('SOAK FAILED: ') && l.includes(c.check));
  const ok = r.code === 1 && named && c.line.test(r.output);
  if (!ok) bad++;
  verdicts.push(`${ok ? 'ok  ' : 'BAD '} injected ${c.inject}: soak exited ${String(r.code)}, ${named ? `named "${c.check}"` : `did not name "${c.check}"`}${c.line.test(r.output) ? '' : `, no line matching ${String(c.line)}`}`);
}
console.log(`\nsoak self-test:\n  ${verdicts.join('\n  ')}`);
process.exit(bad === 0 ? 0 : 1);
