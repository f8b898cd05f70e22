// Terminals into a running runc container (src/runtime/oci/pty.ts): the seed busybox image, which
// has no python3 (so today's pty-bridge.py cannot run in it), started detached under the generated
// spec (test/support/oci-container.ts), and `runc exec -d --console-socket` through pty-helper.c.
// Each subtest is what a user of a terminal would notice: output, resize, exit codes, hangup, and
// what the process in the terminal may do.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { isAsbError } from '../src/errors.ts';
import { DEFAULT_PTY_COMMAND, execArgv, execProcess, openRuncPty, runcMessage, type RuncPtyTarget } from '../src/runtime/oci/pty.ts';
import type { PtySession } from '../src/runtime/runtime.ts';
import { busyboxImages, onCleanup, prepareBundle, run, tempDir, type Bundle } from './support/oci-container.ts';
import { waitFor, within } from './support/wait.ts';

/** busybox ash's prompt, then its request for the cursor position, ESC [6n (a real terminal answers it; it works without). */
const PROMPT = /\$ (.\[6n)?$/;

/** What a terminal printed so far, read as it comes (the reader never stops unless `paused`). */
class Screen {
  text = '';
  bytes = 0;
  readonly ended: Promise<void>;

  constructor(pty: PtySession) {
    const decoder = new TextDecoder();
    this.ended = (async () => {
      for await (const chunk of pty.output) {
        this.bytes += chunk.length;
        this.text += decoder.decode(chunk, { stream: true });
      }
    })();
  }

  /** Waits (bounded) until the output matches `pattern`; returns the match. */
  async expect(pattern: RegExp, timeoutMs = 20_000): Promise<RegExpExecArray> {
    return waitFor(`terminal output matching ${String(pattern)} (so far: ${JSON.stringify(this.text.slice(-300))})`, () => Promise.resolve(pattern.exec(this.text) ?? undefined), timeoutMs, 10);
  }
}

/** Starts `sleep 86400` detached in a busybox container; returns its bundle. */
async function startContainer(t: test.TestContext, runc: string, image: Parameters<typeof prepareBundle>[2], env: { name: string; value: string }[] = []): Promise<Bundle> {
  const bundle = await prepareBundle(t, runc, image, { command: ['sleep', '86400'], workingDir: '/home/user', env }, {});
  // Detached, the container keeps runc's stdio: /dev/null, so nothing waits for it to close.
  const child = spawn(runc, ['--root', bundle.state, 'run', '-d', '--bundle', bundle.bundle, bundle.id], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 60_000 });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  const code = await new Promise<number | null>((done) => child.on('exit', done));
  assert.equal(code, 0, `runc run -d: ${stderr}`);
  return bundle;
}

function targetOf(b: Bundle, runc: string, stateDir: string): RuncPtyTarget {
  return { runc, root: b.state, id: b.id, user: b.spec.process.user, env: b.spec.process.env, cwd: b.spec.process.cwd, stateDir };
}

/** Pids in the container's pids cgroup, with their command lines. */
function containerProcesses(b: Bundle): { pid: number; cmdline: string }[] {
  const procs = readFileSync(join('/sys/fs/cgroup/pids', `/asb-oci-test-${b.id}`, 'cgroup.procs'), 'utf8').split('\n').filter((l) => l !== '');
  return procs.flatMap((p) => {
    try {
      return [{ pid: Number(p), cmdline: readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').join(' ').trim() }];
    } catch {
      return []; // gone meanwhile
    }
  });
}

/** This process's children running the pty helper, with their RSS and private (unshared) memory in KiB. */
function helperMemory(): { pid: number; rssKiB: number; privateKiB: number }[] {
  return readdirSync('/proc').filter((d) => /^\d+$/.test(d)).flatMap((d) => {
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid !== process.pid || !stat.includes('(pty-helper-')) return [];
      const rollup = readFileSync(`/proc/${d}/smaps_rollup`, 'utf8');
      const kib = (field: string): number => Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(rollup)?.[1] ?? NaN);
      return [{ pid: Number(d), rssKiB: kib('Rss'), privateKiB: kib('Private_Clean') + kib('Private_Dirty') }];
    } catch {
      return [];
    }
  });
}

test('a terminal into a runc container of busybox (no python3): output, resize, exit codes, hangup, and no privileges', async (t) => {
  const { runc, busybox } = await busyboxImages();
  const stateDir = tempDir(t, 'asb-pty-state-');
  const box = await startContainer(t, runc, busybox);
  const target = targetOf(box, runc, stateDir);
  /** A terminal closed (and awaited) after the subtest `st`. */
  const open = async (st: test.TestContext, opts: Partial<Parameters<typeof openRuncPty>[1]> = {}): Promise<{ pty: PtySession; screen: Screen }> => {
    const pty = await openRuncPty(target, { cols: 80, rows: 24, ...opts });
    onCleanup(st, async () => {
      pty.close();
      await pty.exited;
    });
    return { pty, screen: new Screen(pty) };
  };

  await t.test('typing a command gives its output; the default shell is busybox sh, as the image has no bash or python3', async (st) => {
    const { pty: warm } = await open(st, { command: ['true'] }); // builds the helper: not part of the timing
    assert.equal(await within('the warm-up exit', warm.exited, 20_000), 0);
    const started = performance.now();
    const { pty, screen } = await open(st);
    const opened = performance.now();
    await screen.expect(PROMPT);
    const prompt = performance.now();
    await pty.write('echo sum=$((6*7)); command -v python3 || echo python3=none; command -v bash || echo bash=none; readlink /proc/$$/exe\n');
    await screen.expect(/sum=42\r\npython3=none\r\nbash=none\r\n\/bin\/busybox\r\n/);
    const memory = helperMemory();
    assert.ok(memory.length >= 1, 'the pty helper runs as a child of this process');
    t.diagnostic(`openRuncPty resolved in ${(opened - started).toFixed(1)} ms; first prompt ${(prompt - started).toFixed(1)} ms after the call; helper RSS ${memory.map((m) => `${String(m.rssKiB)} KiB (private ${String(m.privateKiB)} KiB)`).join(', ')}`);
    await pty.write('exit\n');
    assert.equal(await within('exit', pty.exited, 20_000), 0);
    await screen.ended;
  });

  await t.test('the size given at open and every resize show in `stty size`', async (st) => {
    const { pty, screen } = await open(st, { cols: 100, rows: 30 });
    await pty.write('stty size\n');
    await screen.expect(/^30 100\r$/m);
    pty.resize(132, 40);
    await pty.write('stty size\n');
    await screen.expect(/^40 132\r$/m);
  });

  await t.test('the exit code comes back, after every byte written before the exit; a signal gives 128+n', async (st) => {
    // 20000 lines (~109 KB) then exit 3: more than the pty's and the pipe's buffers together.
    const { pty, screen } = await open(st, { command: ['/bin/sh', '-c', 'seq 1 20000; exit 3'] });
    assert.equal(await within('exit 3', pty.exited, 20_000), 3);
    await screen.ended;
    assert.match(screen.text, /^1\r\n2\r\n[\s\S]*\r\n19999\r\n20000\r\n$/);
    const killed = await open(st, { command: ['/bin/sh', '-c', 'kill -TERM $$'] });
    assert.equal(await within('SIGTERM exit', killed.pty.exited, 20_000), 128 + 15);
  });

  await t.test('close() hangs up a running shell: the shell and its foreground job end with SIGHUP', async (st) => {
    const { pty, screen } = await open(st);
    await screen.expect(PROMPT);
    await pty.write('echo started; sleep 1001\n');
    await screen.expect(/^started\r$/m);
    await waitFor('sleep 1001 in the container', () => Promise.resolve(containerProcesses(box).some((p) => p.cmdline === 'sleep 1001') ? true : undefined), 20_000, 10);
    pty.close();
    pty.close(); // idempotent
    assert.equal(await within('the hung-up shell exits', pty.exited, 20_000), 128 + 1, JSON.stringify(screen.text));
    await waitFor('sleep 1001 gone', () => Promise.resolve(containerProcesses(box).some((p) => p.cmdline === 'sleep 1001') ? undefined : true), 20_000, 10);
    assert.deepEqual(containerProcesses(box).map((p) => p.cmdline), ['sleep 86400'], JSON.stringify(screen.text));
  });

  await t.test('a shell that ignores SIGHUP is killed once the grace period is over', async (st) => {
    const { pty, screen } = await open(st, { command: ['/bin/sh', '-c', 'trap "" HUP; echo ignoring; exec sleep 1002'] });
    await screen.expect(/^ignoring\r$/m);
    pty.close();
    assert.equal(await within('SIGKILL after the grace', pty.exited, 20_000), 128 + 9);
    assert.deepEqual(containerProcesses(box).map((p) => p.cmdline), ['sleep 86400']);
  });

  await t.test('the process in the terminal: no_new_privs, no capabilities, seccomp filter, the given uid', async (st) => {
    const status = "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|CapBnd|CapAmb):' /proc/self/status | tr -d '\\t'; echo ids=$(id -u):$(id -g):$(id -G)";
    for (const [user, ids] of [[undefined, '1000:1000:1000'], [1234, '1234:1234:1234']] as const) {
      const { pty, screen } = await open(st, { command: ['/bin/sh', '-c', status], ...(user === undefined ? {} : { user }) });
      assert.equal(await within('status', pty.exited, 20_000), 0);
      await screen.ended;
      const f = new Map(screen.text.split('\r\n').map((l) => l.split(/[:=]/, 2) as [string, string]));
      assert.equal(f.get('NoNewPrivs'), '1', JSON.stringify(screen.text));
      assert.equal(f.get('Seccomp'), '2', screen.text);
      for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb']) assert.equal(f.get(set), '0000000000000000', `${set}: ${screen.text}`);
      assert.match(screen.text, new RegExp(`^ids=${ids}\\r$`, 'm'));
    }
  });

  /** A program writing 4 KiB blocks of 'x' (no newlines, so the tty adds nothing), counting them in `file`; `limit` blocks, or forever. */
  const writer = (file: string, limit?: number): string[] => ['/bin/sh', '-c', `i=0; while ${limit === undefined ? ':' : `[ $i -lt ${String(limit)} ]`}; do head -c 4096 /dev/zero | tr "\\0" x; i=$((i+1)); echo $i > /tmp/${file}; done`];
  /** The writer's count once it stops rising (polled every 50 ms until 10 readings agree), or `limit` if it got there. */
  const untilStalled = async (file: string, limit = Infinity): Promise<number> => {
    const counter = join(box.upper, 'tmp', file);
    let last = -1;
    let same = 0;
    return waitFor(`the writer of /tmp/${file} to stall`, () => {
      const n = existsSync(counter) ? Number(readFileSync(counter, 'utf8')) : 0;
      same = n === last ? same + 1 : 0;
      last = n;
      return Promise.resolve(same >= 10 || n >= limit ? n : undefined);
    }, 30_000, 50);
  };

  await t.test('a reader that stops reading stalls the program in the terminal; reading again lets it finish', async (st) => {
    const pty = await openRuncPty(target, { cols: 80, rows: 24, command: writer('n', 2000) });
    onCleanup(st, () => pty.close());
    const stalled = await untilStalled('n', 2000);
    assert.ok(stalled < 2000 && stalled * 4096 < 2 * 2 ** 20, `the writer got ${String(stalled)} blocks ahead of a reader that read nothing`);
    let bytes = 0;
    for await (const chunk of pty.output) bytes += chunk.length;
    assert.equal(bytes, 2000 * 4096);
    assert.equal(await pty.exited, 0);
  });

  await t.test('close() while nobody reads a stalled writer still hangs it up at once (SIGHUP, not the SIGKILL after the grace)', async (st) => {
    const pty = await openRuncPty(target, { cols: 80, rows: 24, command: writer('m') });
    onCleanup(st, () => pty.close());
    await untilStalled('m');
    pty.close();
    assert.equal(await within('the stalled writer exits', pty.exited, 20_000), 128 + 1);
  });

  await t.test('errors: a command the image lacks and a container that is not running are refused at open; uid 0 without a user namespace is refused', async () => {
    await assert.rejects(openRuncPty(target, { cols: 80, rows: 24, command: ['bash'] }), (err: unknown) => isAsbError(err, 'BadRequest') && /"bash": executable file not found/.test(err.message) && !err.message.includes('time='));
    await assert.rejects(openRuncPty(target, { cols: 80, rows: 24, cwd: '/no/such/dir' }), (err: unknown) => isAsbError(err, 'BadRequest') && err.message.includes('/no/such/dir'));
    await assert.rejects(openRuncPty({ ...target, id: 'no-such-container' }, { cols: 80, rows: 24 }), (err: unknown) => isAsbError(err, 'Unavailable') && /no-such-container/.test(err.message));
    assert.throws(() => execProcess(target, { cols: 80, rows: 24, user: 0 }), (err: unknown) => isAsbError(err, 'Forbidden'));
    assert.equal(execProcess({ ...target, userNamespace: true }, { cols: 80, rows: 24, user: 0 }).user.uid, 0);
    // Nothing is left behind by a failed open: no helper, no console socket dir.
    assert.deepEqual(readdirSync(join(stateDir, 'pty')), []);
  });
});

test('the pod environment never reaches the host side: an LD_PRELOAD in the container env loads nothing on the host', async (t) => {
  const { runc, busybox } = await busyboxImages();
  const stateDir = tempDir(t, 'asb-pty-state-');
  // A library that, if loaded by a host process (the helper, runc), writes a marker: host root code execution.
  const lib = tempDir(t, 'asb-preload-');
  const marker = join(lib, 'loaded');
  const source = join(lib, 'evil.c');
  writeFileSync(source, `#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen(${JSON.stringify(marker)}, "a"); if (f) { fputs("ran\\n", f); fclose(f); } }\n`);
  await run('cc', ['-shared', '-fPIC', '-o', join(lib, 'evil.so'), source], { timeout: 60_000 });
  const box = await startContainer(t, runc, busybox, [{ name: 'LD_PRELOAD', value: join(lib, 'evil.so') }, { name: 'PATH', value: `${lib}:/usr/bin:/bin` }]);
  const pty = await openRuncPty(targetOf(box, runc, stateDir), { cols: 80, rows: 24, command: ['/bin/sh', '-c', 'echo LD_PRELOAD=$LD_PRELOAD'] });
  const screen = new Screen(pty);
  assert.equal(await within('exit', pty.exited, 20_000), 0);
  await screen.ended;
  // The container's process gets its env (the path means nothing inside it); the host side never did.
  assert.match(screen.text, new RegExp(`LD_PRELOAD=${join(lib, 'evil.so')}`));
  assert.equal(existsSync(marker), false, 'the preload library ran on the host');
});

test('the process.json of a terminal: explicit user, no capabilities, no_new_privs, the env in order, bad input refused by field', () => {
  const target: RuncPtyTarget = {
    runc: '/opt/runc', root: '/state/runc', id: 'c1', user: { uid: 1000, gid: 1001, additionalGids: [2000] },
    env: ['PATH=/usr/bin:/bin', 'TERM=dumb', 'LANG=C.UTF-8'], cwd: '/home/user', stateDir: '/state',
  };
  const p = execProcess(target, { cols: 132, rows: 40, env: { LANG: 'en_US.UTF-8', EXTRA: 'a=b' } });
  assert.deepEqual(p, {
    terminal: true,
    consoleSize: { height: 40, width: 132 },
    user: { uid: 1000, gid: 1001, additionalGids: [2000] },
    args: [...DEFAULT_PTY_COMMAND],
    // The container's env, then TERM, then the caller's, by name.
    env: ['PATH=/usr/bin:/bin', 'TERM=xterm-256color', 'LANG=en_US.UTF-8', 'EXTRA=a=b'],
    cwd: '/home/user',
    capabilities: { bounding: [], effective: [], permitted: [], inheritable: [], ambient: [] },
    noNewPrivileges: true,
  });
  // Another uid: its own group, no supplementary groups; sizes are clamped to what TIOCSWINSZ holds.
  const other = execProcess(target, { cols: 0, rows: 1e9, user: 1234, cwd: '/tmp', command: ['top', '-b'] });
  assert.deepEqual([other.user, other.consoleSize, other.cwd, other.args], [{ uid: 1234, gid: 1234, additionalGids: [] }, { height: 65535, width: 1 }, '/tmp', ['top', '-b']]);
  const field = (f: string) => (err: unknown): boolean => isAsbError(err, 'BadRequest') && err.fields[0]?.field === f;
  assert.throws(() => execProcess(target, { cols: 80, rows: 24, cwd: 'relative' }), field('cwd'));
  assert.throws(() => execProcess(target, { cols: 80, rows: 24, command: [''] }), field('command'));
  assert.throws(() => execProcess(target, { cols: 80, rows: 24, env: { 'A=B': 'x' } }), field('env.A=B'));
  assert.throws(() => execProcess(target, { cols: 80, rows: 24, user: -1 }), field('user'));
  assert.throws(() => execProcess(target, { cols: 80, rows: 24, user: 0 }), (err: unknown) => isAsbError(err, 'Forbidden'));
  // With the pod's rlimits (inherited-rlimits.ts): runc's own prlimit into the sandbox's namespace needs CAP_SYS_RESOURCE.
  assert.deepEqual(execArgv(target), ['/usr/bin/prlimit', '--nofile=16384:16384', '--core=0:0', '--', '/opt/runc', '--root', '/state/runc', 'exec', '-d', '--console-socket', 'console.sock', '--pid-file', 'pid', '--process', 'process.json', 'c1']);
  assert.equal(runcMessage('time="2026-11-24T12:38:36Z" level=error msg="exec failed: exec: \\"zsh\\": not found"\npty-helper: runc exec exited with 255\n'), 'exec failed: exec: "zsh": not found');
  assert.equal(runcMessage('pty-helper: runc sent no terminal: Success\n'), 'pty-helper: runc sent no terminal: Success');
  // gVisor: runsc's global flags first, no -d (runsc has -detach), its errors also in ./runsc.log.
  assert.deepEqual(execArgv({ ...target, runc: '/opt/runsc', runtime: 'runsc', runtimeFlags: ['--platform=systrap'] }),
    ['/opt/runsc', '--platform=systrap', '--debug-log=runsc.log', '--root', '/state/runc', 'exec', '-detach', '-console-socket', 'console.sock', '-pid-file', 'pid', '-process', 'process.json', 'c1']);
});
