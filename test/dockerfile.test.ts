// The Dockerfile front end of `asb template build`: each instruction becomes the build steps a
// user of Docker expects, each refused one fails naming its line, and the build context is packed
// into deterministic tars (the hash is the cache key) that honour .dockerignore and never leave
// the context.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, utimesSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { test } from 'node:test';
import { contextEntries, FIXED_MTIME_S, openContext, packSource } from '../src/builds/build-context.ts';
import { parseDockerfile, type ParsedDockerfile } from '../src/builds/dockerfile.ts';
import { TeamFileStore } from '../src/builds/files.ts';
import { putVerified } from '../src/builds/verified-upload.ts';
import { checkBuildSpec } from '../src/builds/spec-check.ts';
import { nextConfig, validateSteps, type BuildConfig } from '../src/builds/steps.ts';
import { isAsbError } from '../src/errors.ts';

function parse(text: string, buildArgs: Record<string, string> = {}): ParsedDockerfile {
  return parseDockerfile(text, { buildArgs });
}

function steps(text: string, buildArgs: Record<string, string> = {}): { type: string; args: string[] }[] {
  return parse(text, buildArgs).steps.map((s) => ({ type: s.step.type, args: s.step.args }));
}

/** The 400 a Dockerfile gets, asserting it names the line and matches `message`. */
function refused(text: string, line: number, message: RegExp): void {
  assert.throws(() => parse(text), (err: unknown) => {
    assert.ok(isAsbError(err, 'BadRequest'), String(err));
    assert.match(err.message, new RegExp(`^Dockerfile line ${line}: `));
    assert.match(err.message, message);
    assert.deepEqual(err.fields.map((f) => f.field), [`Dockerfile line ${line}`]);
    return true;
  });
}

test('FROM names the base image; ARGs before it substitute into it, and --build-arg overrides their default', () => {
  assert.deepEqual(parse('FROM debian:12\n').from, { image: 'debian:12' });
  assert.deepEqual(parse('ARG TAG=12\nFROM debian:${TAG} AS base\n').from, { image: 'debian:12' });
  assert.deepEqual(parse('ARG TAG=12\nFROM debian:$TAG\n', { TAG: '13' }).from, { image: 'debian:13' });
  assert.deepEqual(parse('from localhost:5000/base@sha256:' + 'a'.repeat(64) + '\n').from, { image: 'localhost:5000/base@sha256:' + 'a'.repeat(64) }, 'keywords are case-insensitive');
  assert.equal(parse('FROM --platform=linux/amd64 debian:12\n').warnings[0]?.line, 1, '--platform is ignored with a warning');
});

test('RUN: shell form as written, continuations joined, exec form shell-quoted, heredocs as scripts', () => {
  assert.deepEqual(steps('FROM d\nRUN apt-get update && \\\n    apt-get install -y curl\n'), [{ type: 'RUN', args: ['apt-get update &&     apt-get install -y curl'] }]);
  assert.deepEqual(steps('FROM d\nRUN echo a \\\n# a comment inside\n\n  && echo b\n'), [{ type: 'RUN', args: ['echo a   && echo b'] }], 'comments and blank lines inside a continuation are skipped');
  assert.deepEqual(steps('FROM d\nRUN ["echo", "it\'s $HOME", "a b"]\n'), [{ type: 'RUN', args: [`echo 'it'\\''s $HOME' 'a b'`] }], 'exec form runs no shell expansion: each word quoted');
  assert.deepEqual(steps('FROM d\nRUN [not json\n'), [{ type: 'RUN', args: ['[not json'] }], 'a bracket that is not a JSON array is shell form');
  assert.deepEqual(steps('FROM d\nRUN <<EOF\necho one\necho two\nEOF\nRUN true\n'), [{ type: 'RUN', args: ['echo one\necho two\n'] }, { type: 'RUN', args: ['true'] }]);
  assert.deepEqual(steps('FROM d\nRUN cat <<EOF > /etc/motd\nhello\nEOF\n'), [{ type: 'RUN', args: ['cat <<EOF > /etc/motd\nhello\nEOF'] }], 'a heredoc feeding a command stays for the shell');
  const shebang = steps('FROM d\nRUN <<EOF\n#!/usr/bin/env python3\nprint(1)\nEOF\n')[0]?.args[0] ?? '';
  assert.match(shebang, /#!\/usr\/bin\/env python3\nprint\(1\)\n/);
  assert.match(shebang, /chmod \+x "\$f" && "\$f"/, 'a #! heredoc runs as its own program');
  refused('FROM d\nRUN <<EOF\necho never ends\n', 2, /heredoc <<EOF has no terminating line/);
  refused('FROM d\nRUN\n', 2, /RUN has no command/);
});

test('RUN: flags are refused (--mount, --network, --security), naming the line', () => {
  refused('FROM d\nRUN --mount=type=cache,target=/root/.cache pip install x\n', 2, /RUN --mount is not supported/);
  refused('FROM d\n\nRUN --network=host curl x\n', 3, /RUN --network is not supported/);
  refused('FROM d\nRUN --security=insecure id\n', 2, /RUN --security is not supported/);
});

test('ARG: build-arg, then default; in scope after FROM only when declared there; exported to RUN, never kept as ENV', () => {
  const s = steps('ARG GLOBAL=g\nFROM d\nARG V=1\nARG EMPTY\nARG GLOBAL\nRUN echo $V\n', { V: 'it\'s' });
  assert.deepEqual(s, [{ type: 'RUN', args: [`export V='it'\\''s' GLOBAL=g\necho $V`] }], 'an ARG without value is not set; a global one re-declared takes its default');
  assert.deepEqual(steps('ARG A=1\nFROM d\nRUN echo $A\n'), [{ type: 'RUN', args: ['echo $A'] }], 'an ARG before FROM is not in scope after it');
  assert.deepEqual(steps('FROM d\nARG V=1\nENV V=2\nRUN echo $V\n').map((x) => x.args), [['V', '2'], ['echo $V']], 'ENV wins over an ARG of the same name');
  assert.deepEqual(steps('FROM d\nRUN echo $HTTP_PROXY\n', { HTTP_PROXY: 'http://proxy:3128' })[0]?.args, [`export HTTP_PROXY=http://proxy:3128\necho $HTTP_PROXY`], 'proxy args need no ARG line');
  const p = parse('FROM d\nARG USED\n', { USED: 'x', UNUSED: 'y' });
  assert.match(p.warnings.map((w) => w.message).join('\n'), /build-arg UNUSED was not consumed/);
  refused('FROM d\nARG 1BAD=x\n', 2, /not a valid variable name/);
});

/** The image config a Dockerfile's steps leave on a base image with `baseEnv`, as the engine computes it (steps.ts). */
function configOf(text: string, baseEnv: string[] = ['PATH=/usr/bin:/bin', 'HOME=/root'], buildArgs: Record<string, string> = {}): BuildConfig {
  let config: BuildConfig = { env: baseEnv };
  for (const s of parse(text, buildArgs).steps) config = nextConfig(config, s.step);
  return config;
}

function envOf(text: string, baseEnv?: string[]): Record<string, string> {
  return Object.fromEntries(configOf(text, baseEnv).env.map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
}

test('ENV: both forms, quotes and substitution; variables the file does not set come from the base image', () => {
  assert.deepEqual(envOf('FROM d\nENV A=1 B="two words"\n'), { PATH: '/usr/bin:/bin', HOME: '/root', A: '1', B: 'two words' });
  assert.equal(envOf('FROM d\nENV GREETING hello   big world\n').GREETING, 'hello   big world', 'legacy form: the rest of the line is the value');
  const e = envOf('FROM d\nARG V=1.2\nENV APP_V=${V} PATH=/opt/app/bin:$PATH D=${UNSET:-fallback} E=${V:+set} F=${HOME:+home-set} G=${NOPE:-$HOME/x}\n');
  assert.deepEqual([e.APP_V, e.PATH, e.D, e.E, e.F, e.G], ['1.2', '/opt/app/bin:/usr/bin:/bin', 'fallback', 'set', 'home-set', '/root/x'], 'the base image\'s PATH and HOME expand where the build runs');
  assert.equal(envOf('FROM d\nENV A=x\nENV B=$A-y\n').B, 'x-y', 'an earlier ENV substitutes into a later one');
  assert.equal(envOf('FROM d\nENV A=old\nENV A=new B=$A\n').B, 'old', 'one ENV\'s values read the variables as they were before it (Docker)');
  refused('FROM d\nENV A=1 B\n', 2, /ENV "B" has no "="/);
  refused('FROM d\nENV A=${B\n', 2, /ENV: missing "}"/);
  refused('FROM d\nARG B=\nENV A="${B:?must be set}"\n', 3, /B: must be set/);
  assert.throws(() => configOf('FROM d\nENV A="${B:?must be set}"\n'), (err: unknown) => isAsbError(err, 'BuildFailed') && /ENV A: B: must be set/.test(err.message), 'a variable neither the file nor the base image sets fails the build');
});

test('a $ the Dockerfile quotes or escapes stays literal in the image: single quotes, \\$, and values holding $ or \\', () => {
  const e = envOf(`FROM d\nENV A='$HOME' B=\\$HOME C="\\$HOME" D='\${PATH}' E='a\\b' F="it's $HOME"\nENV G=$A H=\${B}x\nARG P='$6$salt'\nENV I=$P\n`);
  assert.deepEqual([e.A, e.B, e.C, e.D, e.E, e.F], ['$HOME', '$HOME', '$HOME', '${PATH}', 'a\\b', "it's /root"]);
  assert.deepEqual([e.G, e.H, e.I], ['$HOME', '$HOMEx', '$6$salt'], 'a variable whose value holds a $ substitutes that value, which is not expanded again');
  const escaped = envOf('# escape=`\nFROM d\nENV P=C:\\dir Q=`$HOME\n');
  assert.deepEqual([escaped.P, escaped.Q], ['C:\\dir', '$HOME'], 'with escape=` a backslash is an ordinary character');
  assert.equal(configOf(`FROM d\nWORKDIR '/srv/$app'\n`).workingDir, '/srv/$app');
  const w = configOf('FROM d\nWORKDIR $HOME/work\nUSER $ME\n', ['HOME=/home/me', 'ME=me']);
  assert.deepEqual([w.workingDir, w.user], ['/home/me/work', 'me'], 'WORKDIR and USER read the base image\'s env');
});

test('E2B steps: ENV, WORKDIR and USER values expand as E2B\'s build does ($VAR, ${VAR:-x}, \\$ literal, quotes literal); malformed references are refused before anything runs', () => {
  const base: BuildConfig = { env: ['HOME=/home/user', 'PATH=/usr/bin'] };
  const after = [
    { type: 'ENV' as const, args: ['A', '$HOME/a', 'B', '\\$HOME', 'C', "'$HOME'", 'D', '${MISSING:-dflt}', 'E', 'say "hi"', 'F', '$(id)', 'G', 'p\\x'] },
    { type: 'WORKDIR' as const, args: ['${HOME}/app'] },
    { type: 'USER' as const, args: ['${NAME:-user}'] },
  ].reduce(nextConfig, base);
  const env = Object.fromEntries(after.env.map((kv): [string, string] => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
  assert.deepEqual([env.A, env.B, env.C, env.D, env.E, env.F, env.G], ['/home/user/a', '$HOME', "'/home/user'", 'dflt', 'say "hi"', '$(id)', 'p\\x']);
  assert.deepEqual([after.workingDir, after.user], ['/home/user/app', 'user']);
  const files = { has: () => false, path: () => undefined };
  assert.throws(() => validateSteps('t', [{ type: 'ENV', args: ['A', '${B'] }, { type: 'WORKDIR', args: ['/x/${'] }], files), (err: unknown) => isAsbError(err, 'BadRequest') && /step 1: ENV A: missing "}"/.test(err.message) && /step 2: WORKDIR: bad substitution/.test(err.message));
});

test('WORKDIR and USER: substituted, relative WORKDIRs joined onto the previous one', () => {
  assert.deepEqual(steps('FROM d\nARG APP=srv\nWORKDIR /$APP\nWORKDIR sub\nUSER ${APP}:staff\n'), [
    { type: 'WORKDIR', args: ['/srv'] },
    { type: 'WORKDIR', args: ['/srv/sub'] },
    { type: 'USER', args: ['srv:staff'] },
  ]);
  refused('FROM d\nWORKDIR /a /b\n', 2, /WORKDIR takes exactly one argument/);
  refused('FROM d\nUSER ""\n', 2, /USER is empty/);
  assert.throws(() => configOf('FROM d\nUSER $NOBODY\n'), (err: unknown) => isAsbError(err, 'BuildFailed') && /USER "\$\{NOBODY\}" is ""/.test(err.message), 'a USER that expands to nothing fails its step');
});

test('COPY/ADD: one step per source, dest relative to WORKDIR, --chown and --chmod kept, root without --chown', () => {
  const p = parse('FROM d\nWORKDIR /app\nCOPY --chown=user:user --chmod=755 bin/run.sh ./\nCOPY a.txt b.txt conf/\nADD ["with space.txt", "/opt/x"]\nCOPY --link . .\n');
  assert.deepEqual(p.steps.map((s) => [s.step.type, s.step.args, s.source]), [
    ['WORKDIR', ['/app'], undefined],
    ['COPY', ['bin/run.sh', '/app/', 'user:user', '0755'], 'bin/run.sh'],
    ['COPY', ['a.txt', '/app/conf/', 'root', ''], 'a.txt'],
    ['COPY', ['b.txt', '/app/conf/', 'root', ''], 'b.txt'],
    ['COPY', ['with space.txt', '/opt/x', 'root', ''], 'with space.txt'],
    ['COPY', ['.', '/app/', 'root', ''], '.'],
  ]);
  assert.deepEqual([p.steps[2]?.line, p.steps[2]?.text], [4, 'COPY a.txt b.txt conf/'], 'progress shows the line as written');
  refused('FROM d\nCOPY a b c\n', 2, /more than one source needs a destination directory ending in \//);
  refused('FROM d\nCOPY ../secret /x\n', 2, /COPY source "..\/secret" leaves the build context/);
  refused('FROM d\nCOPY --chmod=u+x a /x\n', 2, /not an octal mode/);
  refused('FROM d\nCOPY only\n', 2, /needs at least one source and a destination/);
});

test('COPY/ADD refusals: --from (multi-stage), heredocs, URLs, git repositories and local archives', () => {
  refused('FROM d\nCOPY --from=builder /out /out\n', 2, /COPY --from is not supported/);
  refused('FROM d\nCOPY <<EOF /etc/x\nhi\nEOF\n', 2, /COPY with a heredoc is not supported/);
  refused('FROM d\nADD https://example.com/x.tgz /x\n', 2, /ADD of a URL or git repository/);
  refused('FROM d\nADD git@github.com:o/r.git /src\n', 2, /ADD of a URL or git repository/);
  refused('FROM d\nADD rootfs.tar.gz /\n', 2, /ADD of a local archive \(rootfs\.tar\.gz\) is not supported/);
  refused('FROM d\nCOPY --exclude=*.md . /x\n', 2, /COPY --exclude is not supported/);
});

test('CMD and ENTRYPOINT combine into the start command as Docker combines them', () => {
  assert.equal(parse('FROM d\nCMD python3 -m http.server 8000\n').startCmd, 'python3 -m http.server 8000');
  assert.equal(parse('FROM d\nCMD ["python3", "-c", "print(\'hi\')"]\n').startCmd, `python3 -c 'print('\\''hi'\\'')'`);
  assert.equal(parse('FROM d\nENTRYPOINT ["node", "server.js"]\nCMD ["--port", "80"]\n').startCmd, 'node server.js --port 80', 'exec ENTRYPOINT gets exec CMD appended');
  assert.equal(parse('FROM d\nCMD echo hi\nENTRYPOINT ["/entry.sh"]\n').startCmd, `/entry.sh /bin/sh -c 'echo hi'`, 'a shell-form CMD is appended as /bin/sh -c');
  assert.equal(parse('FROM d\nENTRYPOINT exec nginx\nCMD ["ignored"]\n').startCmd, 'exec nginx', 'a shell-form ENTRYPOINT ignores CMD');
  assert.equal(parse('FROM d\nCMD first\nCMD second\n').startCmd, 'second', 'the last CMD wins');
  assert.equal(parse('FROM d\nRUN true\n').startCmd, undefined, 'no CMD: the template keeps its default');
});

test('HEALTHCHECK CMD becomes the ready command; NONE clears it', () => {
  const p = parse('FROM d\nHEALTHCHECK --interval=5s --retries=3 CMD curl -fs localhost:8000/\n');
  assert.equal(p.readyCmd, 'curl -fs localhost:8000/');
  assert.match(p.warnings[0]?.message ?? '', /--interval --retries ignored/);
  assert.equal(parse('FROM d\nHEALTHCHECK CMD ["test", "-f", "/ready"]\n').readyCmd, 'test -f /ready');
  assert.equal(parse('FROM d\nHEALTHCHECK CMD true\nHEALTHCHECK NONE\n').readyCmd, undefined);
  refused('FROM d\nHEALTHCHECK curl x\n', 2, /HEALTHCHECK takes CMD command or NONE/);
});

test('EXPOSE, LABEL and MAINTAINER are accepted and ignored with a warning naming the line', () => {
  const p = parse('FROM d\nEXPOSE 8000\nLABEL a=b\nMAINTAINER me\nRUN true\n');
  assert.deepEqual(p.steps.map((s) => s.step.type), ['RUN']);
  assert.deepEqual(p.warnings.map((w) => w.line), [2, 3, 4]);
});

test('refused instructions name their line: multi-stage, scratch, VOLUME, ONBUILD, SHELL, STOPSIGNAL, unknown, before FROM', () => {
  refused('FROM a AS build\nRUN make\nFROM b\n', 3, /a second FROM: multi-stage Dockerfiles are not supported/);
  refused('FROM scratch\n', 1, /FROM scratch is not supported/);
  refused('FROM d\nVOLUME /data\n', 2, /VOLUME is not supported/);
  refused('FROM d\nONBUILD RUN x\n', 2, /ONBUILD is not supported/);
  refused('FROM d\nSHELL ["/bin/bash", "-c"]\n', 2, /SHELL is not supported/);
  refused('FROM d\nSTOPSIGNAL SIGTERM\n', 2, /STOPSIGNAL is not supported/);
  refused('FROM d\nFROBNICATE x\n', 2, /unknown instruction FROBNICATE/);
  refused('RUN true\nFROM d\n', 1, /RUN before FROM/);
  refused('# just a comment\n', 1, /no FROM instruction/);
});

test('parser directives: escape=` changes the escape and continuation character; comments and blank lines are skipped', () => {
  assert.deepEqual(steps('# escape=`\nFROM d\nRUN echo a `\n  b\nENV P=C:\\dir\n'), [{ type: 'RUN', args: ['echo a   b'] }, { type: 'ENV', args: ['P', 'C:\\\\dir'] }], 'a literal backslash is escaped for the engine');
  assert.deepEqual(steps('# syntax=docker/dockerfile:1\n\n# comment\nFROM d\n  # indented comment\nRUN true\n'), [{ type: 'RUN', args: ['true'] }]);
  assert.deepEqual(steps('# comment\n# escape=`\nFROM d\nRUN echo `\n'), [{ type: 'RUN', args: ['echo `'] }], 'a directive after a comment is a comment');
  refused('# escape=x\nFROM d\n', 1, /invalid escape directive/);
});

// --- the build context ---

function context(t: { after: (fn: () => void) => void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'asb-ctx-test-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(join(dir, 'app/sub'), { recursive: true });
  mkdirSync(join(dir, 'secrets'));
  writeFileSync(join(dir, 'app/main.py'), 'print("hi")\n');
  writeFileSync(join(dir, 'app/sub/data.txt'), 'data\n');
  writeFileSync(join(dir, 'app/debug.log'), 'noise\n');
  writeFileSync(join(dir, 'app/run.sh'), '#!/bin/sh\n');
  chmodSync(join(dir, 'app/run.sh'), 0o755);
  writeFileSync(join(dir, 'secrets/key'), 'k\n');
  writeFileSync(join(dir, 'secrets/public.pem'), 'p\n');
  symlinkSync('/etc/passwd', join(dir, 'app/passwd-link'));
  writeFileSync(join(dir, '.dockerignore'), '# comment\nsecrets\n!secrets/public.pem\n**/*.log\n');
  return dir;
}

function tarList(path: string): string[] {
  return execFileSync('tar', ['-tvf', path, '--numeric-owner', '--full-time'], { encoding: 'utf8' }).trim().split('\n');
}

test('a COPY source is packed with .dockerignore applied, symlinks kept as links, owner 0:0 and a fixed mtime', (t) => {
  const dir = context(t);
  const ctx = openContext(dir);
  assert.deepEqual(contextEntries(ctx, 'app').map((e) => e.path), ['app', 'app/main.py', 'app/passwd-link', 'app/run.sh', 'app/sub', 'app/sub/data.txt']);
  assert.deepEqual(contextEntries(ctx, '.').map((e) => e.path), ['.dockerignore', 'app', 'app/main.py', 'app/passwd-link', 'app/run.sh', 'app/sub', 'app/sub/data.txt', 'secrets/public.pem'], 'an ignored directory stays out but a ! line re-includes a file in it');
  assert.deepEqual(contextEntries(ctx, 'app/*.py').map((e) => e.path), ['app/main.py'], 'a glob names each path it matches');
  const packed = packSource(ctx, 'app');
  t.after(() => packed.remove());
  const listing = tarList(packed.path);
  assert.equal(listing.length, 6);
  assert.ok(listing.every((l) => l.includes(' 0/0 ') && l.includes('2000-01-01 00:00:00')), listing.join('\n'));
  assert.match(listing.find((l) => l.includes('passwd-link')) ?? '', /^lrwxrwxrwx .* app\/passwd-link -> \/etc\/passwd$/, 'the link itself, never the host file it points to');
  assert.match(listing.find((l) => l.includes('run.sh')) ?? '', /^-rwxr-xr-x /, 'permission bits kept');
  assert.equal(packed.sha256, createHash('sha256').update(readFileSync(packed.path)).digest('hex'), 'filesHash is the sha256 of the tar');
  const out = mkdtempSync(join(tmpdir(), 'asb-ctx-out-'));
  t.after(() => rmSync(out, { recursive: true, force: true }));
  execFileSync('tar', ['-xf', packed.path, '-C', out]);
  assert.equal(readFileSync(join(out, 'app/sub/data.txt'), 'utf8'), 'data\n', 'GNU tar reads it back');
});

test('the tar is deterministic: the same files give the same hash whatever their mtimes; a changed byte changes it', (t) => {
  const dir = context(t);
  const first = packSource(openContext(dir), 'app');
  first.remove();
  utimesSync(join(dir, 'app/main.py'), new Date('2030-01-01'), new Date('2030-01-01'));
  const touched = packSource(openContext(dir), 'app');
  touched.remove();
  assert.equal(touched.sha256, first.sha256, `a checkout (new mtimes) keeps the cache key; every entry has mtime ${FIXED_MTIME_S}`);
  writeFileSync(join(dir, 'app/main.py'), 'print("HI")\n');
  const changed = packSource(openContext(dir), 'app');
  changed.remove();
  assert.notEqual(changed.sha256, first.sha256);
});

test('long paths (over 100 bytes) survive through a PAX header', (t) => {
  const dir = context(t);
  const deep = join(dir, 'app', 'd'.repeat(90), 'e'.repeat(40));
  mkdirSync(deep, { recursive: true });
  writeFileSync(join(deep, 'file.txt'), 'deep\n');
  const packed = packSource(openContext(dir), 'app');
  t.after(() => packed.remove());
  const out = mkdtempSync(join(tmpdir(), 'asb-ctx-out-'));
  t.after(() => rmSync(out, { recursive: true, force: true }));
  execFileSync('tar', ['-xf', packed.path, '-C', out]);
  assert.equal(readFileSync(join(out, 'app', 'd'.repeat(90), 'e'.repeat(40), 'file.txt'), 'utf8'), 'deep\n');
});

test('a source that leaves the context, through .. or a symlinked directory, or that matches nothing, is refused', (t) => {
  const dir = context(t);
  const outside = mkdtempSync(join(tmpdir(), 'asb-outside-'));
  t.after(() => rmSync(outside, { recursive: true, force: true }));
  writeFileSync(join(outside, 'host-secret'), 'x');
  symlinkSync(outside, join(dir, 'escape'));
  const ctx = openContext(dir);
  assert.throws(() => contextEntries(ctx, '../x'), /leaves the build context/);
  assert.throws(() => contextEntries(ctx, 'escape/host-secret'), /leaves the build context through the symlink escape/);
  assert.deepEqual(contextEntries(ctx, 'escape').map((e) => [e.path, e.kind]), [['escape', 'symlink']], 'the link itself is copied, not followed');
  assert.throws(() => contextEntries(ctx, 'missing.txt'), /no such file or directory in the build context/);
  assert.throws(() => contextEntries(ctx, 'secrets/key'), /matches no file .*\.dockerignore excludes all of it/);
  assert.throws(() => contextEntries(ctx, '*.none'), /matches no file/);
});

// --- the build body and the file store ---

test('a build body is checked whole before anything runs: each problem names its field and step', () => {
  const hash = 'a'.repeat(64);
  const has = (h: string): boolean => h === hash;
  assert.deepEqual(checkBuildSpec({ from: { image: 'debian:12' }, steps: [{ type: 'COPY', args: ['app', '/app/'], filesHash: hash }], startCmd: 'python3 app.py' }, has), {
    from: { image: 'debian:12' },
    steps: [{ type: 'COPY', args: ['app', '/app/'], filesHash: hash }],
    startCmd: 'python3 app.py',
  });
  assert.throws(() => checkBuildSpec({
    from: { image: 'x', template: 'y' },
    steps: [
      { type: 'RUN', args: ['true'] },
      { type: 'APT', args: ['vim'] },
      { type: 'COPY', args: ['a', '/a'], filesHash: 'b'.repeat(64) },
      { type: 'ENV', args: ['A'] },
      { type: 'WORKDIR', args: ['/a', '/b'] },
      { type: 'USER', args: ['u'], filesHash: hash },
    ],
    extra: 1,
  }, has), (err: unknown) => {
    assert.ok(isAsbError(err, 'Invalid'));
    assert.deepEqual(err.fields.map((f) => f.field), ['extra', 'from', 'steps[1].type', 'steps[2].filesHash', 'steps[3].args', 'steps[4].args', 'steps[5].filesHash']);
    assert.match(err.message, /steps\[2\]\.filesHash: no files with sha256 b{64} were uploaded by this team/);
    assert.match(err.message, /unknown step type "APT"/);
    return true;
  });
});

test('an upload is kept only under its own sha256, and a team sees only its own files', async (t) => {
  const dir = context(t);
  const packed = packSource(openContext(dir), 'app');
  t.after(() => packed.remove());
  const root = mkdtempSync(join(tmpdir(), 'asb-files-'));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const store = new TeamFileStore({ dir: join(root, 'files'), now: () => Date.now() });
  const body = readFileSync(packed.path);
  const other = 'c'.repeat(64);
  await assert.rejects(putVerified(store, 'team-a', other, Readable.from([body])), /have sha256 [0-9a-f]{64}, not c{64} as the path names; nothing was stored/);
  assert.equal(store.has('team-a', other), false);
  assert.equal(await putVerified(store, 'team-a', packed.sha256, Readable.from([body.subarray(0, 700), body.subarray(700)])), body.length);
  assert.equal(store.has('team-a', packed.sha256), true);
  assert.equal(store.has('team-b', packed.sha256), false, 'another team has not uploaded it');
  assert.deepEqual(readFileSync(store.path('team-a', packed.sha256) ?? ''), body);
});
