// The Dockerfile's text as Docker reads it, before any instruction means anything: parser
// directives (`# escape=`), comments, line continuations, heredocs, words, and `$VAR`
// substitution. dockerfile.ts turns the instructions into build steps.
//
// Rules followed (Docker's reference, "Dockerfile reference" and its shell-lexer):
// - Directives only at the very top, before any comment, blank line or instruction. `escape` is
//   `\` or `` ` ``; `syntax` and `check` are accepted and have no effect here; any other
//   `# name=value` line is a comment.
// - A line ending in the escape character (trailing blanks allowed) continues on the next; the
//   two are joined without the newline. Comment and blank lines inside a continuation are skipped.
// - Heredocs (`<<EOF`, `<<-EOF`, `<<"EOF"`) are read for RUN only: their lines up to the
//   terminator belong to the instruction. COPY/ADD heredocs are refused by dockerfile.ts.
import { AsbError } from '../errors.ts';

/** A Dockerfile problem: 400 naming the file's line, and the instruction when there is one. */
export function dockerfileError(line: number, message: string): AsbError {
  return new AsbError('BadRequest', `Dockerfile line ${line}: ${message}`, { fields: [{ field: `Dockerfile line ${line}`, message }] });
}

export interface Heredoc {
  name: string;
  /** The lines between the marker's line and the terminator, each ending in "\n", as written. */
  body: string;
  /** `<<-`: leading tabs of the body and terminator are stripped (by the shell that runs it). */
  stripTabs: boolean;
  /** The terminator line as written (with its leading tabs for `<<-`). */
  terminator: string;
}

export interface RawInstruction {
  /** 1-based line of the keyword. */
  line: number;
  /** Upper-cased keyword, e.g. RUN. */
  keyword: string;
  /** Everything after the keyword on its logical line, continuations joined, leading blanks removed. */
  rest: string;
  heredocs: Heredoc[];
}

export interface Lexed {
  escape: '\\' | '`';
  instructions: RawInstruction[];
  warnings: { line: number; message: string }[];
}

const DIRECTIVE = /^#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=\s*(.*?)\s*$/;
const HEREDOC_KEYWORDS: ReadonlySet<string> = new Set(['RUN', 'COPY', 'ADD']);

export function lexDockerfile(text: string): Lexed {
  const lines = text.replace(/^\uFEFF/, '').split(/\r?\n/);
  const warnings: Lexed['warnings'] = [];
  let escape: '\\' | '`' = '\\';
  let i = 0;
  const seen = new Set<string>();
  for (; i < lines.length; i++) {
    const m = DIRECTIVE.exec(lines[i] ?? '');
    if (m === null) break;
    const name = (m[1] ?? '').toLowerCase();
    const value = m[2] ?? '';
    if (name !== 'escape' && name !== 'syntax' && name !== 'check') break;
    if (seen.has(name)) throw dockerfileError(i + 1, `the parser directive ${name} is given twice`);
    seen.add(name);
    if (name === 'escape') {
      if (value !== '\\' && value !== '`') throw dockerfileError(i + 1, `invalid escape directive "${value}": the escape character must be \\ or \``);
      escape = value;
    }
  }
  const continuation = new RegExp(`${escape === '\\' ? '\\\\' : '`'}[ \\t]*$`);
  const instructions: RawInstruction[] = [];
  while (i < lines.length) {
    const first = lines[i] ?? '';
    if (first.trim() === '' || first.trimStart().startsWith('#')) {
      i++;
      continue;
    }
    const start = i + 1;
    let logical = '';
    let current = first;
    for (;;) {
      i++;
      if (!continuation.test(current)) {
        logical += current;
        break;
      }
      logical += current.replace(continuation, '');
      // Skip the comment and blank lines a continuation may hold; the file may end mid-way.
      while (i < lines.length && ((lines[i] ?? '').trim() === '' || (lines[i] ?? '').trimStart().startsWith('#'))) i++;
      if (i >= lines.length) break;
      current = lines[i] ?? '';
    }
    const trimmed = logical.trimStart();
    const space = trimmed.search(/\s/);
    const keyword = (space === -1 ? trimmed : trimmed.slice(0, space)).toUpperCase();
    const rest = space === -1 ? '' : trimmed.slice(space).trimStart();
    const heredocs: Heredoc[] = [];
    if (HEREDOC_KEYWORDS.has(keyword)) {
      for (const marker of heredocMarkers(rest)) {
        const bodyLines: string[] = [];
        let terminator: string | undefined;
        while (i < lines.length) {
          const l = lines[i] ?? '';
          i++;
          if ((marker.stripTabs ? l.replace(/^\t+/, '') : l) === marker.name) {
            terminator = l;
            break;
          }
          bodyLines.push(`${l}\n`);
        }
        if (terminator === undefined) throw dockerfileError(start, `${keyword}: the heredoc <<${marker.name} has no terminating line "${marker.name}"`);
        heredocs.push({ name: marker.name, body: bodyLines.join(''), stripTabs: marker.stripTabs, terminator });
      }
    }
    instructions.push({ line: start, keyword, rest, heredocs });
  }
  return { escape, instructions, warnings };
}

/** The heredoc markers of a line, outside quotes: `<<EOF`, `<<-EOF`, `<<'EOF'`, `<<"EOF"` (not `<<<`). */
export function heredocMarkers(line: string): { name: string; stripTabs: boolean }[] {
  const out: { name: string; stripTabs: boolean }[] = [];
  let quote: string | undefined;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i];
    if (quote !== undefined) {
      if (ch === quote) quote = undefined;
      continue;
    }
    if (ch === "'" || ch === '"') {
      quote = ch;
      continue;
    }
    if (ch !== '<' || line[i + 1] !== '<' || line[i + 2] === '<' || (i > 0 && line[i - 1] === '<')) continue;
    const m = /^<<(-?)(["']?)([A-Za-z_][A-Za-z0-9_.-]*)\2/.exec(line.slice(i));
    if (m === null) continue;
    out.push({ name: m[3] ?? '', stripTabs: m[1] === '-' });
    i += m[0].length - 1;
  }
  return out;
}

/**
 * Splits on blanks outside quotes, keeping quotes and escapes in each word for substitute() to
 * process (Docker's parseWords, used by ENV, ARG, LABEL and the flags of every instruction).
 */
export function splitWords(text: string, escape: string): string[] {
  const words: string[] = [];
  let word = '';
  let inWord = false;
  let quote: string | undefined;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charAt(i);
    if (quote === undefined && /\s/.test(ch)) {
      if (inWord) words.push(word);
      word = '';
      inWord = false;
      continue;
    }
    inWord = true;
    word += ch;
    if (ch === escape && quote !== "'" && i + 1 < text.length) {
      word += text.charAt(++i);
      continue;
    }
    if (quote === undefined && (ch === '"' || ch === "'")) quote = ch;
    else if (ch === quote) quote = undefined;
  }
  if (inWord) words.push(word);
  return words;
}

/** What a variable reference resolves to: its value, or undefined when it is not set. */
export type Lookup = (name: string) => string | undefined;

export interface SubstituteOptions {
  /**
   * Unset variables named here are kept as references (`${NAME}`, `${NAME:-word}`) instead of
   * becoming empty: the base image's environment (PATH, HOME) is known only where the build runs,
   * which expands them there. Use with `forEngine`, so the rest of the output is literal there.
   */
  keepUnset?: (name: string) => boolean;
  /**
   * The output is a build step's value (ENV, WORKDIR, USER), which the engine expands once more
   * (steps.ts, expandStepValue): every literal `\` and `$` is escaped, so only the references
   * kept by keepUnset expand there.
   */
  forEngine?: boolean;
  /**
   * With forEngine: a variable's value as a step value already (escaped, references the engine
   * expands kept), put in as it is; `lookup` is not asked then.
   */
  engineLookup?: Lookup;
  /**
   * The word is a build step's value as the engine reads it (E2B's rule: the value of a shell
   * word in double quotes): `\` escapes only `$`, `"`, `` ` `` and itself, quotes are literal
   * characters, and `$NAME`, `${NAME}` and the modifiers expand.
   */
  stepValue?: boolean;
}

/**
 * One word with quotes removed, escapes applied and `$NAME`, `${NAME}`, `${NAME:-word}`,
 * `${NAME-word}`, `${NAME:+word}`, `${NAME+word}`, `${NAME:?message}` and `${NAME?message}`
 * replaced, as Docker's shell-lexer does for ENV, ARG, WORKDIR, USER, COPY/ADD and FROM.
 * Throws a message (the caller names the line) for a malformed reference.
 */
export function substitute(word: string, escape: string, lookup: Lookup, opts: SubstituteOptions = {}): string {
  let pos = 0;
  const fail = (message: string): never => {
    throw new Error(message);
  };

  const name = (): string => {
    const m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(word.slice(pos));
    if (m === null) return '';
    pos += m[0].length;
    return m[0];
  };

  const keep = (n: string): boolean => opts.keepUnset?.(n) === true;
  /** A variable's value as it goes into the output, or undefined when it is not set. */
  const resolve = (n: string): string | undefined => {
    if (opts.forEngine === true && opts.engineLookup !== undefined) return opts.engineLookup(n);
    const value = lookup(n);
    return value === undefined ? undefined : lit(value);
  };
  /** Text that is literal where the value ends up: escaped for the engine's expansion when the output goes there. */
  const lit = (text: string): string => (opts.forEngine === true ? text.replace(/[\\$]/g, (c) => `\\${c}`) : text);

  const variable = (): string => {
    // pos is just past '$'
    if (word[pos] !== '{') {
      const n = name();
      if (n === '') return lit('$');
      const value = resolve(n);
      return value !== undefined ? value : keep(n) ? `\${${n}}` : '';
    }
    pos++;
    const n = name();
    if (n === '') fail(`bad substitution in "${word}": expected a variable name after \${`);
    const value = resolve(n);
    if (word[pos] === '}') {
      pos++;
      return value !== undefined ? value : keep(n) ? `\${${n}}` : '';
    }
    if (pos >= word.length) fail(`missing "}" in "${word}"`);
    let colon = false;
    if (word[pos] === ':') {
      colon = true;
      pos++;
    }
    const op = word[pos];
    if (op !== '-' && op !== '+' && op !== '?') fail(`unsupported modifier "${colon ? ':' : ''}${op ?? ''}" in "${word}": Docker takes :- :+ :? - + ?`);
    pos++;
    const operand = opts.stepValue === true ? quotedUntil('}') : scan('}');
    // Unknown here, known where the build runs: the reference goes there whole, its operand escaped as the rest.
    if (value === undefined && keep(n)) return `\${${n}${colon ? ':' : ''}${op}${operand}}`;
    const isSet = value !== undefined && (!colon || value !== '');
    if (op === '-') return isSet ? value : operand;
    if (op === '+') return isSet ? operand : '';
    if (!isSet) fail(`${n}: ${operand === '' ? 'is not set' : operand}`);
    return value ?? '';
  };

  const scan = (stop: string | undefined): string => {
    let out = '';
    while (pos < word.length) {
      const ch = word.charAt(pos);
      if (stop !== undefined && ch === stop) {
        pos++;
        return out;
      }
      pos++;
      if (ch === escape) {
        if (pos < word.length) out += lit(word.charAt(pos++));
      } else if (ch === "'") {
        const end = word.indexOf("'", pos);
        if (end === -1) fail(`unterminated single quote in "${word}"`);
        out += lit(word.slice(pos, end));
        pos = end + 1;
      } else if (ch === '"') {
        out += quotedUntil('"');
      } else if (ch === '$') {
        out += variable();
      } else {
        out += lit(ch);
      }
    }
    if (stop !== undefined) fail(`missing "${stop}" in "${word}"`);
    return out;
  };

  /** Inside double quotes up to `stop` (a closing quote; `}` of a step value's modifier; the end of a step value). */
  const quotedUntil = (stop: '"' | '}' | undefined): string => {
    // Inside double quotes the escape keeps its meaning only before " $ and itself (POSIX); a
    // step value's also before ` (what a shell's double quotes do, as E2B's build reads them).
    const special = opts.stepValue === true ? ['"', '$', escape, '`'] : ['"', '$', escape];
    let out = '';
    while (pos < word.length) {
      const ch = word.charAt(pos++);
      if (ch === stop) return out;
      if (ch === escape && pos < word.length) {
        const next = word.charAt(pos);
        if (special.includes(next)) {
          out += lit(next);
          pos++;
        } else {
          out += lit(ch);
        }
      } else if (ch === '$') {
        out += variable();
      } else {
        out += lit(ch);
      }
    }
    if (stop === undefined) return out;
    return fail(stop === '"' ? `unterminated double quote in "${word}"` : `missing "}" in "${word}"`);
  };

  return opts.stepValue === true ? quotedUntil(undefined) : scan(undefined);
}

/** A word for `sh -c`: bare when it holds only safe characters, else in single quotes. */
export function shellQuote(word: string): string {
  if (word !== '' && /^[A-Za-z0-9_@%+=:,./-]+$/.test(word)) return word;
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/** An exec-form argument list (`["a", "b"]`), or undefined when the text is not one (then it is shell form). */
export function execForm(text: string): string[] | undefined {
  const t = text.trim();
  if (!t.startsWith('[')) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(t);
  } catch {
    return undefined;
  }
  if (!Array.isArray(parsed) || !parsed.every((x): x is string => typeof x === 'string')) return undefined;
  return parsed;
}
