// `asb template build NAME [-f Dockerfile] [--build-arg K=V]... [--no-cache] [--egress P] [CONTEXT]`: the
// Dockerfile becomes build steps here (src/builds/dockerfile.ts), so a refused instruction fails
// before anything is uploaded or run; each COPY's files are packed from the context and uploaded
// only when the worker lacks them; then the build is started and its log followed the way
// `docker build --progress=plain` shows one: `#n [n/N] INSTRUCTION`, the step's output under it,
// and the image and template at the end. Exit 1 with the failing step's error when it fails.
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { ApiClient, BuildLogEntry, BuildLogPage, BuildSpec, BuiltTemplateView } from '../client/api-client.ts';
import { AsbError } from '../errors.ts';
import { openContext, packSource } from '../builds/build-context.ts';
import { parseEgressText } from '../builds/build-egress.ts';
import { parseDockerfile, type ParsedDockerfile, type PlannedStep } from '../builds/dockerfile.ts';
import { isStepsFile, parseStepsFile } from '../builds/steps-file.ts';
import { parseDuration, stringList, stringOpt, UsageError, ValueError, type Parsed } from './args.ts';
import { EXIT, readAll, type CommandContext } from './command.ts';
import { ClientConfigError } from './env-file.ts';
import { formatAge, formatDuration, formatTable, writeJson } from './output.ts';

/** Polls of the log: quick while lines come, slower (to 1 s) while a step is quiet. */
const POLL_MIN_MS = 200;
const POLL_MAX_MS = 1000;
/** A build the CLI follows longer than this is left running and the command fails (--timeout). */
const DEFAULT_FOLLOW_MS = 60 * 60 * 1000;

// `--no-cache` arrives as `cache: false`: parseArgs reads --no-X as the negation of X.
export const BUILD_FLAGS = ['filename', 'build-arg', 'cache', 'timeout', 'egress'] as const;

export const BUILD_HELP = `  build NAME[:TAG] [CONTEXT]  build template NAME from a Dockerfile (default CONTEXT/Dockerfile;
                         CONTEXT default .), following its log; exit 1 if a step fails. TAG
                         names this build once it is ready: create --template NAME:TAG starts
                         it after later builds too (NAME alone starts the newest)
    -f FILE              the Dockerfile (- reads stdin), or a steps file (.yaml/.json: from,
                         steps of RUN/COPY/ENV/WORKDIR/USER, startCmd, readyCmd)
    --build-arg K=V      an ARG value; K alone takes $K from your environment; repeatable
    --no-cache           run every step, using no cached layer
    --egress POLICY      what RUN steps may reach: none, internet, or a comma-separated
                         allow-list (pypi.org,*.debian.org,203.0.113.0/24); within the
                         worker's --build-egress, which it may narrow but never widen
    --timeout DUR        stop following after DUR (default 1h); the build goes on
    --json               print the final status as JSON
  Supported: FROM (one stage), RUN (shell, exec, heredoc), COPY/ADD of the context (--chown,
  --chmod; .dockerignore applies), ENV, ARG, WORKDIR, USER, CMD/ENTRYPOINT (the start command),
  HEALTHCHECK CMD (the ready command). EXPOSE, LABEL, MAINTAINER are ignored with a warning.
  Refused, naming the line: multi-stage builds, COPY --from, RUN --mount/--network/--security,
  ADD of a URL, git repository or local archive, VOLUME, SHELL, ONBUILD, STOPSIGNAL.`;

function buildArgs(items: readonly string[], env: CommandContext['io']['env']): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of items) {
    const eq = item.indexOf('=');
    const name = eq === -1 ? item : item.slice(0, eq);
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new ValueError(`--build-arg: expected NAME=value or NAME, got "${item}"`);
    const value = eq === -1 ? env[name] : item.slice(eq + 1);
    if (value !== undefined) out[name] = value;
  }
  return out;
}

function kib(bytes: number): string {
  return bytes < 1024 ? `${bytes} B` : bytes < 1024 * 1024 ? `${(bytes / 1024).toFixed(1)} KiB` : `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

/** Packs and uploads each COPY's files (once per distinct tar), setting its filesHash. */
async function uploadContext(client: ApiClient, ctx: CommandContext, name: string, contextDir: string, steps: readonly PlannedStep[]): Promise<void> {
  const copies = steps.filter((s) => s.source !== undefined);
  if (copies.length === 0) return;
  const context = openContext(contextDir);
  const done = new Set<string>();
  for (const s of copies) {
    const packed = packSource(context, s.source ?? '.');
    try {
      s.step.filesHash = packed.sha256;
      if (done.has(packed.sha256)) continue;
      done.add(packed.sha256);
      const what = `${s.source ?? '.'}: ${packed.entries} entr${packed.entries === 1 ? 'y' : 'ies'}, ${kib(packed.bytes)}, sha256 ${packed.sha256.slice(0, 12)}`;
      if (await client.hasBuildFiles(name, packed.sha256)) {
        ctx.io.stderr.write(`=> context ${what} (already uploaded)\n`);
      } else {
        await client.uploadBuildFiles(name, packed.sha256, packed.path);
        ctx.io.stderr.write(`=> context ${what} uploaded\n`);
      }
    } finally {
      packed.remove();
    }
  }
}

/** Writes log entries under their step's `#n [n/N] INSTRUCTION` header, as docker's plain progress does. */
class LogPrinter {
  readonly #out: CommandContext['io']['stderr'];
  readonly #steps: readonly PlannedStep[];
  #current: number | undefined;

  constructor(out: CommandContext['io']['stderr'], steps: readonly PlannedStep[]) {
    this.#out = out;
    this.#steps = steps;
  }

  print(e: BuildLogEntry): void {
    const n = e.step;
    if (n === undefined) {
      this.#current = undefined;
      this.#out.write(`${e.level === 'error' ? 'ERROR: ' : ''}${e.message}\n`);
      return;
    }
    if (n !== this.#current) {
      this.#current = n;
      this.#out.write(`#${n} [${n}/${this.#steps.length}] ${this.#steps[n - 1]?.text ?? ''}\n`);
    }
    for (const line of e.message.replace(/\n$/, '').split('\n')) this.#out.write(`#${n} ${e.level === 'error' ? 'ERROR: ' : ''}${line}\n`);
  }
}

/** Runs `asb template build`; returns the exit code. */
export async function runTemplateBuild(parsed: Parsed, args: readonly string[], ctx: CommandContext, usage: string): Promise<number> {
  const [name, contextArg, surplus] = args;
  if (name === undefined) throw new UsageError('missing template name', usage);
  if (surplus !== undefined) throw new UsageError(`unexpected argument "${surplus}"`, usage);
  const { values } = parsed;
  const files = stringList(values, 'filename');
  if (files.length > 1) throw new UsageError('build takes one -f Dockerfile', usage);
  const contextDir = resolve(ctx.io.cwd, contextArg ?? '.');
  const file = files[0] ?? join(contextDir, 'Dockerfile');
  let text: string;
  try {
    text = file === '-' ? (await readAll(ctx.io.stdin)).toString('utf8') : readFileSync(resolve(ctx.io.cwd, file), 'utf8');
  } catch (err) {
    throw new AsbError('BadRequest', `cannot read the Dockerfile ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  const egressText = stringOpt(values, 'egress');
  let egress: BuildSpec['egress'];
  try {
    egress = egressText === undefined ? undefined : parseEgressText(egressText, '--egress');
  } catch (err) {
    throw new ValueError(`--egress: expected none, internet or a comma-separated list of CIDRs, IPs and domains: ${err instanceof AsbError ? err.fields.map((f) => f.message).join('; ') : String(err)}`);
  }
  const timeout = stringOpt(values, 'timeout');
  const followMs = timeout === undefined ? DEFAULT_FOLLOW_MS : parseDuration(timeout, '--timeout');

  // 1. Everything that can be refused is refused before anything leaves this machine.
  const argValues = buildArgs(stringList(values, 'build-arg'), ctx.io.env);
  let parsedFile: ParsedDockerfile;
  let extra: Pick<BuildSpec, 'cpuCount' | 'memoryMB' | 'noCache'> = {};
  if (isStepsFile(file)) {
    if (Object.keys(argValues).length > 0) throw new UsageError('--build-arg applies to a Dockerfile, not to a steps file', usage);
    ({ extra, ...parsedFile } = parseStepsFile(text, file));
  } else {
    parsedFile = parseDockerfile(text, { buildArgs: argValues });
  }
  for (const w of parsedFile.warnings) ctx.io.stderr.write(`warning: ${w.line > 0 ? `Dockerfile line ${w.line}: ` : ''}${w.message}\n`);
  const steps = parsedFile.steps;
  const client = ctx.client(parsed.global);
  const started = ctx.clock.now();
  ctx.io.stderr.write(`[+] Building template ${name} from ${'image' in parsedFile.from ? parsedFile.from.image : parsedFile.from.template} (${steps.length} step${steps.length === 1 ? '' : 's'})\n`);

  // 2. The context's files, then the build.
  await uploadContext(client, ctx, name, contextDir, steps);
  const spec: BuildSpec = {
    from: parsedFile.from,
    steps: steps.map((s) => s.step),
    ...(parsedFile.startCmd === undefined ? {} : { startCmd: parsedFile.startCmd }),
    ...(parsedFile.readyCmd === undefined ? {} : { readyCmd: parsedFile.readyCmd }),
    ...extra,
    ...(values.cache === false ? { noCache: true } : {}),
    ...(egress === undefined ? {} : { egress }),
  };
  const { buildId } = await client.startBuild(name, spec);
  ctx.io.stderr.write(`=> build ${buildId}\n`);

  // 3. Follow the log until the build ends (bounded by --timeout).
  const printer = new LogPrinter(ctx.io.stderr, steps);
  let offset = 0;
  let wait = POLL_MIN_MS;
  let page: BuildLogPage;
  for (;;) {
    page = await client.buildLogs(name, buildId, offset);
    for (const e of page.entries) printer.print(e);
    offset = page.offset;
    if (page.phase === 'ready' || page.phase === 'error') break;
    if (ctx.clock.now() - started > followMs) {
      ctx.io.stderr.write(`error: stopped following build ${buildId} after ${formatDuration(followMs)}; it goes on: asb template build shows it no more, GET /v1/templates/${name}/builds/${buildId} does\n`);
      return EXIT.failed;
    }
    wait = page.entries.length > 0 ? POLL_MIN_MS : Math.min(POLL_MAX_MS, wait * 2);
    await ctx.delay(wait);
  }
  const elapsed = formatDuration(ctx.clock.now() - started);
  if (values.json === true) writeJson(ctx.io.stdout, { templateId: name, buildId, phase: page.phase, ...(page.image === undefined ? {} : { image: page.image }), ...(page.reason === undefined ? {} : { reason: page.reason }) });
  if (page.phase === 'error') {
    const n = page.reason?.step;
    const failed = n === undefined ? undefined : steps[n - 1];
    const source = failed === undefined ? '' : failed.line > 0 ? ` (Dockerfile line ${failed.line}: ${failed.text})` : ` (${failed.text})`;
    const where = n === undefined ? '' : ` at step ${n}/${steps.length}${source}`;
    ctx.io.stderr.write(`ERROR: build of template ${name} failed${where} after ${elapsed}: ${page.reason?.message ?? 'no reason given'}\n`);
    return EXIT.failed;
  }
  ctx.io.stderr.write(`=> image ${page.image ?? '(not reported)'}\n=> template ${name} built in ${elapsed}; start one with: asb create --template ${name}\n`);
  if (values.json !== true) ctx.io.stdout.write(`${name}\n`);
  return EXIT.ok;
}

/** The caller's team's built templates from the worker API; undefined when no worker is configured. */
export async function listBuiltTemplates(parsed: Parsed, ctx: CommandContext): Promise<BuiltTemplateView[] | undefined> {
  let client: ApiClient;
  try {
    client = ctx.client(parsed.global);
  } catch (err) {
    if (err instanceof ClientConfigError) return undefined;
    throw err;
  }
  return (await client.listBuiltTemplates()).items;
}

/** The tags grouped by the build they name: `default,v2=1a2b3c4d v1=0f9e8d7c`, the default's build first. */
function tagsText(t: BuiltTemplateView): string {
  const byBuild = new Map<string, string[]>();
  for (const [tag, buildId] of Object.entries(t.tags)) byBuild.set(buildId, [...(byBuild.get(buildId) ?? []), tag]);
  const first = t.tags.default;
  const order = [...byBuild.keys()].sort((a, b) => (a === first ? -1 : b === first ? 1 : a.localeCompare(b)));
  return order.map((id) => `${(byBuild.get(id) ?? []).sort((a, b) => (a === 'default' ? -1 : b === 'default' ? 1 : a.localeCompare(b))).join(',')}=${id.slice(0, 8)}`).join(' ') || '-';
}

/** The built templates as `asb template ls` prints them. */
export function builtTemplatesTable(items: readonly BuiltTemplateView[], nowMs: number): string {
  return formatTable(['NAME', 'ID', 'TAGS', 'LATEST BUILD', 'STATUS', 'UPDATED'], items.map((t) => [t.name, t.templateId, tagsText(t), t.latestBuild?.buildId.slice(0, 8) ?? '-', t.status, formatAge(t.updatedAt, nowMs)]));
}
