// The Dockerfile front end of `asb template build`: a Dockerfile (one stage) becomes a BuildSpec,
// the same five step types the E2B SDK sends, so one engine builds both. Pure: no file is read
// here; build-context.ts packs what each COPY names. What is supported and how it maps:
//
//   FROM image [AS name]      spec.from.image (ARGs declared before FROM substituted); a second
//                             FROM (multi-stage) and FROM scratch (no shell to run steps) refused
//   RUN cmd | RUN ["a","b"]   RUN step, `sh -c` (exec form joined with shell quoting); the ARGs in
//                             scope are exported in front of the command, as Docker puts them in
//                             the step's environment without keeping them in the image; heredocs
//                             (`RUN <<EOF`) supported; flags (--mount, --network, --security) refused
//   COPY/ADD src... dest      one COPY step per source, its files packed from the build context;
//                             --chown and --chmod kept, root without --chown (Docker copies as
//                             root whatever USER says); --from, heredocs, ADD of a URL, a git
//                             repository or a local archive (which Docker would unpack) refused
//   ENV k=v ... | ENV k v     ENV step; values substituted; a variable this file does not set
//                             (PATH, HOME: the base image's) is left as ${NAME} for the build
//   ARG name[=default]        --build-arg values, then defaults; not kept in the image
//   WORKDIR, USER             WORKDIR (relative ones joined onto the previous) and USER steps
//   CMD, ENTRYPOINT           spec.startCmd, combined as Docker does: an exec-form ENTRYPOINT gets
//                             CMD's words appended (a shell-form CMD as `/bin/sh -c cmd`); a
//                             shell-form ENTRYPOINT ignores CMD; CMD alone is the command
//   HEALTHCHECK CMD c         spec.readyCmd (ready when it exits 0); its timing flags are ignored
//   EXPOSE, LABEL, MAINTAINER accepted and ignored, with a warning (a template has no such metadata)
//   VOLUME, ONBUILD, SHELL, STOPSIGNAL, anything else: refused, naming the line and instruction.
import { posix } from 'node:path';
import type { BuildSpec, BuildStep } from './contract.ts';
import { dockerfileError, execForm, lexDockerfile, shellQuote, splitWords, substitute, type RawInstruction } from './dockerfile-lex.ts';

export { dockerfileError };

/** One step and where it came from, so progress can show the Dockerfile's own line. */
export interface PlannedStep {
  step: BuildStep;
  /** 1-based line of the instruction. */
  line: number;
  /** The instruction as the user wrote it, on one line (continuations joined), for progress output. */
  text: string;
  /** COPY only: the source path or pattern inside the build context (step.args[0]); its files are packed into the tar whose sha256 becomes filesHash. */
  source?: string;
}

export interface ParsedDockerfile {
  /** The spec with every COPY's filesHash still unset (build-context.ts sets them). */
  from: BuildSpec['from'];
  steps: PlannedStep[];
  startCmd?: string;
  readyCmd?: string;
  warnings: { line: number; message: string }[];
}

export interface ParseOptions {
  /** --build-arg values; a name without a value (`--build-arg NAME`) takes the caller's environment value, which the CLI resolves. */
  buildArgs?: Readonly<Record<string, string>>;
}

/** Build args Docker lets a build use without an ARG line (proxy settings). */
const PREDEFINED_ARGS: ReadonlySet<string> = new Set(['HTTP_PROXY', 'http_proxy', 'HTTPS_PROXY', 'https_proxy', 'FTP_PROXY', 'ftp_proxy', 'NO_PROXY', 'no_proxy', 'ALL_PROXY', 'all_proxy']);
const IGNORED: ReadonlySet<string> = new Set(['EXPOSE', 'LABEL', 'MAINTAINER']);
const REFUSED: Readonly<Record<string, string>> = {
  VOLUME: 'a template has no volumes; a sandbox\'s files persist with it already',
  ONBUILD: 'triggers for later builds are not supported',
  SHELL: 'steps always run with /bin/sh -c; put the shell in the command (RUN bash -c "...")',
  STOPSIGNAL: 'sandboxes are stopped by the system, not by a signal the image chooses',
};
const ARCHIVE_NAME = /\.(tar|tgz|tbz2?|txz|tar\.(gz|bz2|xz|zst))$/i;
const REMOTE = /^([a-z][a-z0-9+.-]*:\/\/|git@)/i;
const CHMOD = /^[0-7]{3,4}$/;

interface Flag {
  name: string;
  value: string | undefined;
}

/** Leading `--name[=value]` words, and the text after them. */
function takeFlags(rest: string): { flags: Flag[]; text: string } {
  const flags: Flag[] = [];
  let text = rest;
  for (;;) {
    const m = /^--([A-Za-z][A-Za-z0-9-]*)(?:=(\S*))?(?:\s+|$)/.exec(text);
    if (m === null) break;
    flags.push({ name: m[1] ?? '', value: m[2] });
    text = text.slice(m[0].length);
  }
  return { flags, text };
}

function quoteJoin(words: readonly string[]): string {
  return words.map(shellQuote).join(' ');
}

class Converter {
  readonly #escape: string;
  readonly #buildArgs: Readonly<Record<string, string>>;
  readonly #usedArgs = new Set<string>();
  /** ARGs declared before FROM: their defaults, for FROM and for re-declarations after it. */
  readonly #globalArgs = new Map<string, string | undefined>();
  /** ARGs in scope after FROM, with their values (undefined: declared without a value). */
  readonly #args = new Map<string, string | undefined>();
  /** ENV set by this file: the value as later instructions of this file read it, and as its step carries it (stepValue). */
  readonly #env = new Map<string, { value: string; step: string }>();
  readonly steps: PlannedStep[] = [];
  readonly warnings: ParsedDockerfile['warnings'] = [];
  from: string | undefined;
  /** The current WORKDIR when this file set an absolute one: as meant, and as its step carries it. */
  #workdir: { value: string; step: string } | undefined;
  #cmd: { exec: boolean; words: string[] } | undefined;
  #entrypoint: { exec: boolean; words: string[] } | undefined;
  readyCmd: string | undefined;

  constructor(escape: string, buildArgs: Readonly<Record<string, string>>) {
    this.#escape = escape;
    this.#buildArgs = buildArgs;
  }

  #lookup(name: string): string | undefined {
    // ENV wins over ARG of the same name (Docker's rule).
    return this.#env.get(name)?.value ?? this.#args.get(name);
  }

  /** A word as this file means it: quotes and escapes applied, the file's ARG and ENV substituted. */
  #word(ins: RawInstruction, word: string, keepUnset = false): string {
    try {
      return substitute(word, this.#escape, (n) => (this.from === undefined ? this.#globalArgs.get(n) : this.#lookup(n)), keepUnset ? { keepUnset: () => true } : {});
    } catch (err) {
      throw dockerfileError(ins.line, `${ins.keyword}: ${(err as Error).message}`);
    }
  }

  /**
   * A word as an ENV, WORKDIR or USER step carries it: what this file means literally is escaped
   * (`\$`, `\\`), and a variable this file does not set (the base image's PATH, HOME) stays a
   * reference, which the engine expands from the image's environment (steps.ts, stepValue).
   */
  #stepWord(ins: RawInstruction, word: string): string {
    const escapeLiteral = (v: string): string => v.replace(/[\\$]/g, (c) => `\\${c}`);
    try {
      return substitute(word, this.#escape, (n) => this.#lookup(n), {
        keepUnset: () => true,
        forEngine: true,
        engineLookup: (n) => {
          const env = this.#env.get(n);
          if (env !== undefined) return env.step;
          const arg = this.#args.get(n);
          return arg === undefined ? undefined : escapeLiteral(arg);
        },
      });
    } catch (err) {
      throw dockerfileError(ins.line, `${ins.keyword}: ${(err as Error).message}`);
    }
  }

  #text(ins: RawInstruction): string {
    const oneLine = `${ins.keyword} ${ins.rest}`.trim();
    return ins.heredocs.length === 0 ? oneLine : `${oneLine} (heredoc ${ins.heredocs.map((h) => h.name).join(', ')})`;
  }

  #push(ins: RawInstruction, step: BuildStep, source?: string): void {
    this.steps.push({ step, line: ins.line, text: this.#text(ins), ...(source === undefined ? {} : { source }) });
  }

  #noFlags(ins: RawInstruction, flags: Flag[], allowed: readonly string[] = []): void {
    for (const f of flags) {
      if (!allowed.includes(f.name)) throw dockerfileError(ins.line, `${ins.keyword} --${f.name} is not supported${f.name === 'mount' ? ' (build steps get no cache, secret or bind mounts)' : ''}`);
    }
  }

  handle(ins: RawInstruction): void {
    const k = ins.keyword;
    if (this.from === undefined && k !== 'FROM' && k !== 'ARG') throw dockerfileError(ins.line, `${k} before FROM: only ARG may come before FROM`);
    const refused = REFUSED[k];
    if (refused !== undefined) throw dockerfileError(ins.line, `${k} is not supported: ${refused}`);
    if (IGNORED.has(k)) {
      this.warnings.push({ line: ins.line, message: `${k} is ignored: a template has no such metadata` });
      return;
    }
    if (ins.heredocs.length > 0 && k !== 'RUN') throw dockerfileError(ins.line, `${k} with a heredoc is not supported; put the file in the build context and COPY it`);
    switch (k) {
      case 'FROM': return this.#from(ins);
      case 'ARG': return this.#arg(ins);
      case 'RUN': return this.#run(ins);
      case 'COPY':
      case 'ADD': return this.#copy(ins);
      case 'ENV': return this.#envInstruction(ins);
      case 'WORKDIR': return this.#workdirInstruction(ins);
      case 'USER': return this.#user(ins);
      case 'CMD':
      case 'ENTRYPOINT': return this.#startCommand(ins);
      case 'HEALTHCHECK': return this.#healthcheck(ins);
      default:
        throw dockerfileError(ins.line, `unknown instruction ${k}`);
    }
  }

  #from(ins: RawInstruction): void {
    if (this.from !== undefined) throw dockerfileError(ins.line, 'a second FROM: multi-stage Dockerfiles are not supported (one FROM per file)');
    const { flags, text } = takeFlags(ins.rest);
    for (const f of flags) {
      if (f.name !== 'platform') throw dockerfileError(ins.line, `FROM --${f.name} is not supported`);
      this.warnings.push({ line: ins.line, message: 'FROM --platform is ignored: images are pulled for this machine\'s platform' });
    }
    const words = splitWords(text, this.#escape);
    if (!(words.length === 1 || (words.length === 3 && words[1]?.toLowerCase() === 'as'))) throw dockerfileError(ins.line, 'FROM takes an image and optionally AS name');
    const image = this.#word(ins, words[0] ?? '');
    if (image === '') throw dockerfileError(ins.line, `FROM names no image ("${words[0] ?? ''}" is empty after substitution)`);
    if (image === 'scratch') throw dockerfileError(ins.line, 'FROM scratch is not supported: build steps need a base image with /bin/sh');
    // From here on, ARGs need declaring again (Docker's scope rule); record the file's global ones.
    this.from = image;
  }

  #arg(ins: RawInstruction): void {
    const { flags, text } = takeFlags(ins.rest);
    this.#noFlags(ins, flags);
    const words = splitWords(text, this.#escape);
    if (words.length === 0) throw dockerfileError(ins.line, 'ARG needs a name');
    for (const w of words) {
      const eq = w.indexOf('=');
      const name = eq === -1 ? w : w.slice(0, eq);
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw dockerfileError(ins.line, `ARG name "${name}" is not a valid variable name`);
      const fallback = eq === -1 ? (this.from === undefined ? undefined : this.#globalArgs.get(name)) : this.#word(ins, w.slice(eq + 1));
      const given = Object.hasOwn(this.#buildArgs, name) ? this.#buildArgs[name] : undefined;
      if (given !== undefined) this.#usedArgs.add(name);
      const value = given ?? fallback;
      if (this.from === undefined) this.#globalArgs.set(name, value);
      else this.#args.set(name, value);
    }
  }

  /** `export A='1' B='2'` for the ARGs (and predefined proxy args given) in scope, or ''. */
  #argExports(): string {
    const pairs: string[] = [];
    for (const [name, value] of this.#args) {
      if (value !== undefined && !this.#env.has(name)) pairs.push(`${name}=${shellQuote(value)}`);
    }
    for (const name of PREDEFINED_ARGS) {
      const value = this.#buildArgs[name];
      if (value !== undefined && !this.#args.has(name)) {
        this.#usedArgs.add(name);
        pairs.push(`${name}=${shellQuote(value)}`);
      }
    }
    return pairs.length === 0 ? '' : `export ${pairs.join(' ')}\n`;
  }

  #run(ins: RawInstruction): void {
    const { flags, text } = takeFlags(ins.rest);
    this.#noFlags(ins, flags);
    const argv = execForm(text);
    let command: string;
    if (argv !== undefined) {
      if (argv.length === 0) throw dockerfileError(ins.line, 'RUN [] has no command');
      command = quoteJoin(argv);
    } else if (ins.heredocs.length > 0) {
      command = heredocCommand(text, ins);
    } else {
      command = text;
    }
    if (command.trim() === '') throw dockerfileError(ins.line, 'RUN has no command');
    this.#push(ins, { type: 'RUN', args: [this.#argExports() + command] });
  }

  #copy(ins: RawInstruction): void {
    const k = ins.keyword;
    const { flags, text } = takeFlags(ins.rest);
    // Docker's COPY writes as root whatever USER says (files root:root unless --chown); the engine
    // copies as the step's user, the current USER when none is named, so name root.
    let user = 'root';
    let mode = '';
    for (const f of flags) {
      if (f.name === 'from') throw dockerfileError(ins.line, `${k} --from is not supported: multi-stage builds and copies from other images are not (one FROM per file)`);
      if (f.name === 'link') continue; // the layer is the same either way
      if (f.name !== 'chown' && f.name !== 'chmod') throw dockerfileError(ins.line, `${k} --${f.name} is not supported`);
      if (f.value === undefined || f.value === '') throw dockerfileError(ins.line, `${k} --${f.name} needs a value`);
      const value = this.#word(ins, f.value);
      if (f.name === 'chown') user = value;
      else {
        if (!CHMOD.test(value)) throw dockerfileError(ins.line, `${k} --chmod="${value}" is not an octal mode such as 0755`);
        mode = value.padStart(4, '0');
      }
    }
    const json = execForm(text);
    const words = (json ?? splitWords(text, this.#escape)).map((w) => (json === undefined ? this.#word(ins, w) : w));
    if (words.length < 2) throw dockerfileError(ins.line, `${k} needs at least one source and a destination`);
    const rawDest = words[words.length - 1] ?? '';
    const sources = words.slice(0, -1);
    if (sources.length > 1 && !rawDest.endsWith('/')) throw dockerfileError(ins.line, `${k} with more than one source needs a destination directory ending in / (got "${rawDest}")`);
    // `.`, `./` and anything ending in `/` or `/.` name a directory (Docker copies into it).
    const isDir = rawDest.endsWith('/') || rawDest === '.' || rawDest.endsWith('/.');
    const joined = this.#workdir === undefined || rawDest.startsWith('/') ? rawDest : posix.join(this.#workdir.value, rawDest);
    const dest = isDir && !joined.endsWith('/') ? `${joined.replace(/\/\.$|^\.$/, '') || '.'}/` : joined;
    for (const src of sources) {
      if (k === 'ADD' && REMOTE.test(src)) throw dockerfileError(ins.line, `ADD of a URL or git repository (${src}) is not supported: download it in a RUN step`);
      if (k === 'ADD' && ARCHIVE_NAME.test(src)) throw dockerfileError(ins.line, `ADD of a local archive (${src}) is not supported: Docker would unpack it; COPY it and unpack it with RUN tar -x`);
      const source = contextPath(src);
      if (source === undefined) throw dockerfileError(ins.line, `${k} source "${src}" leaves the build context`);
      this.#push(ins, { type: 'COPY', args: [source, dest, user, mode] }, source);
    }
  }

  #envInstruction(ins: RawInstruction): void {
    const { flags, text } = takeFlags(ins.rest);
    this.#noFlags(ins, flags);
    const words = splitWords(text, this.#escape);
    if (words.length === 0) throw dockerfileError(ins.line, 'ENV needs a name and a value');
    const pairs: [string, string][] = [];
    if (!(words[0] ?? '').includes('=')) {
      // Legacy form: ENV NAME the rest of the line is the value.
      const name = words[0] ?? '';
      pairs.push([name, text.trimStart().slice(name.length).trim()]);
    } else {
      for (const w of words) {
        const eq = w.indexOf('=');
        if (eq === -1) throw dockerfileError(ins.line, `ENV "${w}" has no "=": write NAME=value for each variable`);
        pairs.push([w.slice(0, eq), w.slice(eq + 1)]);
      }
    }
    // Every value reads the variables as they were before this instruction (Docker's rule: ENV A=1 B=$A sees the old A).
    const values = pairs.map(([rawName, raw]) => ({ name: this.#word(ins, rawName), value: this.#word(ins, raw, true), step: this.#stepWord(ins, raw) }));
    const args: string[] = [];
    for (const { name, value, step } of values) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw dockerfileError(ins.line, `ENV name "${name}" is not a valid variable name`);
      this.#env.set(name, { value, step });
      args.push(name, step);
    }
    this.#push(ins, { type: 'ENV', args });
  }

  /** The one argument of WORKDIR or USER: as this file means it, and as its step carries it. */
  #single(ins: RawInstruction): { value: string; step: string } {
    const { flags, text } = takeFlags(ins.rest);
    this.#noFlags(ins, flags);
    const words = splitWords(text, this.#escape);
    if (words.length !== 1) throw dockerfileError(ins.line, `${ins.keyword} takes exactly one argument, got ${words.length}`);
    const value = this.#word(ins, words[0] ?? '', true);
    if (value === '') throw dockerfileError(ins.line, `${ins.keyword} is empty ("${words[0] ?? ''}" after substitution)`);
    return { value, step: this.#stepWord(ins, words[0] ?? '') };
  }

  #workdirInstruction(ins: RawInstruction): void {
    const { value, step } = this.#single(ins);
    // A relative WORKDIR is joined onto the previous one here, where this file's own directory is known.
    const joined = value.startsWith('/') || this.#workdir === undefined ? step : posix.join(this.#workdir.step, step);
    if (value.startsWith('/') || this.#workdir !== undefined) this.#workdir = { value: posix.normalize(value.startsWith('/') ? value : posix.join(this.#workdir?.value ?? '/', value)), step: posix.normalize(joined) };
    this.#push(ins, { type: 'WORKDIR', args: [joined] });
  }

  #user(ins: RawInstruction): void {
    this.#push(ins, { type: 'USER', args: [this.#single(ins).step] });
  }

  #startCommand(ins: RawInstruction): void {
    const { flags, text } = takeFlags(ins.rest);
    this.#noFlags(ins, flags);
    const argv = execForm(text);
    const command = argv === undefined ? { exec: false, words: text.trim() === '' ? [] : [text.trim()] } : { exec: true, words: argv };
    if (ins.keyword === 'CMD') this.#cmd = command;
    else this.#entrypoint = command;
  }

  #healthcheck(ins: RawInstruction): void {
    const { flags, text } = takeFlags(ins.rest);
    for (const f of flags) {
      if (!['interval', 'timeout', 'start-period', 'start-interval', 'retries'].includes(f.name)) throw dockerfileError(ins.line, `HEALTHCHECK --${f.name} is not supported`);
    }
    if (flags.length > 0) this.warnings.push({ line: ins.line, message: `HEALTHCHECK ${flags.map((f) => `--${f.name}`).join(' ')} ignored: the check becomes the template's ready command, polled until it succeeds` });
    const words = text.trim();
    if (/^NONE$/i.test(words)) {
      this.readyCmd = undefined;
      return;
    }
    const m = /^CMD(?:\s+([\s\S]*))?$/i.exec(words);
    if (m === null) throw dockerfileError(ins.line, 'HEALTHCHECK takes CMD command or NONE');
    const body = (m[1] ?? '').trim();
    const argv = execForm(body);
    const command = argv === undefined ? body : quoteJoin(argv);
    if (command === '') throw dockerfileError(ins.line, 'HEALTHCHECK CMD has no command');
    this.readyCmd = command;
  }

  startCmd(): string | undefined {
    const cmd = this.#cmd;
    const ep = this.#entrypoint;
    if (ep !== undefined && ep.words.length > 0) {
      if (!ep.exec) return ep.words[0];
      const tail = cmd === undefined ? [] : cmd.exec ? cmd.words : cmd.words.length === 0 ? [] : ['/bin/sh', '-c', cmd.words[0] ?? ''];
      return quoteJoin([...ep.words, ...tail]);
    }
    if (cmd === undefined || cmd.words.length === 0) return undefined;
    return cmd.exec ? quoteJoin(cmd.words) : cmd.words[0];
  }

  unusedArgs(): string[] {
    return Object.keys(this.#buildArgs).filter((n) => !this.#usedArgs.has(n) && !PREDEFINED_ARGS.has(n)).sort();
  }
}

/** A `RUN` with heredocs as one shell script: a lone `<<EOF` runs its body (a `#!` body as that program); otherwise the heredocs follow the line, as a shell reads them. */
function heredocCommand(text: string, ins: RawInstruction): string {
  const only = ins.heredocs[0];
  if (ins.heredocs.length === 1 && only !== undefined && /^<<-?(["']?)[A-Za-z_][A-Za-z0-9_.-]*\1$/.test(text.trim())) {
    const body = only.stripTabs ? only.body.replace(/^\t+/gm, '') : only.body;
    if (!body.startsWith('#!')) return body;
    // Docker runs a shebang heredoc as a script file; so do we, in a private temporary file.
    let end = 'ASB_HEREDOC_END';
    while (body.includes(end)) end += '_';
    return `f=$(mktemp) && cat >"$f" <<'${end}'\n${body}${end}\nchmod +x "$f" && "$f"; s=$?; rm -f "$f"; exit $s`;
  }
  return `${text}\n${ins.heredocs.map((h) => `${h.body}${h.terminator}`).join('\n')}`;
}

/** A source inside the build context as a clean relative path ('.' for all of it), or undefined when it leaves the context. */
export function contextPath(src: string): string | undefined {
  const clean = posix.normalize(src.replace(/^\/+/, ''));
  if (clean === '..' || clean.startsWith('../')) return undefined;
  return clean === '' ? '.' : clean.replace(/\/$/, '') || '.';
}

/** Parses a Dockerfile into the steps of a build; throws a 400 AsbError naming the line and instruction of the first problem. */
export function parseDockerfile(text: string, opts: ParseOptions = {}): ParsedDockerfile {
  const lexed = lexDockerfile(text);
  const c = new Converter(lexed.escape, opts.buildArgs ?? {});
  for (const ins of lexed.instructions) c.handle(ins);
  if (c.from === undefined) throw dockerfileError(1, 'no FROM instruction: a Dockerfile starts FROM an image');
  const unused = c.unusedArgs();
  const warnings = [...lexed.warnings, ...c.warnings];
  if (unused.length > 0) warnings.push({ line: 0, message: `build-arg${unused.length === 1 ? '' : 's'} ${unused.join(', ')} ${unused.length === 1 ? 'was' : 'were'} not consumed: no ARG declares ${unused.length === 1 ? 'it' : 'them'}` });
  const startCmd = c.startCmd();
  return {
    from: { image: c.from },
    steps: c.steps,
    ...(startCmd === undefined ? {} : { startCmd }),
    ...(c.readyCmd === undefined ? {} : { readyCmd: c.readyCmd }),
    warnings,
  };
}
