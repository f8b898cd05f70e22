// `.dockerignore` and COPY source patterns, matched as Docker matches them: paths relative to the
// build context with `/` separators; `*` and `?` within one path segment, `[...]` classes
// (`[^...]` negated), `\` escaping, `**` across any number of segments; a pattern that matches a
// directory excludes everything under it; `!pattern` re-includes, and the last matching line wins.

export interface IgnorePattern {
  exclude: boolean;
  regex: RegExp;
  source: string;
}

/** A glob as a regex over a whole relative path. Throws on an unterminated class. */
export function globRegex(pattern: string): RegExp {
  let re = '';
  for (let i = 0; i < pattern.length; i++) {
    const ch = pattern.charAt(i);
    if (ch === '*') {
      if (pattern[i + 1] === '*') {
        i++;
        // `**/` matches zero or more whole segments; a trailing `**` anything below.
        if (pattern[i + 1] === '/') {
          i++;
          re += '(?:.*/)?';
        } else re += '.*';
      } else re += '[^/]*';
    } else if (ch === '?') {
      re += '[^/]';
    } else if (ch === '[') {
      const end = pattern.indexOf(']', i + 2);
      if (end === -1) throw new Error(`pattern "${pattern}": "[" without a closing "]"`);
      let body = pattern.slice(i + 1, end);
      const negate = body.startsWith('^') || body.startsWith('!');
      if (negate) body = body.slice(1);
      re += `[${negate ? '^' : ''}${body.replace(/[\\\]]/g, '\\$&')}]`;
      i = end;
    } else if (ch === '\\' && i + 1 < pattern.length) {
      re += escapeRegex(pattern.charAt(++i));
    } else {
      re += escapeRegex(ch);
    }
  }
  return new RegExp(`^${re}$`);
}

function escapeRegex(ch: string): string {
  return /[.*+?^${}()|[\]\\/]/.test(ch) ? `\\${ch}` : ch;
}

/** Whether a word holds glob characters (then a COPY source names every path it matches). */
export function isGlob(word: string): boolean {
  return /[*?[]/.test(word);
}

/** Cleans a path as Go's filepath.Clean does for relative paths: no `.` segments, `..` resolved, no trailing `/`. */
export function cleanPath(path: string): string {
  const out: string[] = [];
  for (const seg of path.split('/')) {
    if (seg === '' || seg === '.') continue;
    if (seg === '..' && out.length > 0 && out[out.length - 1] !== '..') out.pop();
    else out.push(seg);
  }
  return out.join('/') || '.';
}

/** The lines of a .dockerignore as patterns; comments (`#` first) and blank lines skipped. Throws naming the line of a bad pattern. */
export function parseDockerignore(text: string): IgnorePattern[] {
  const out: IgnorePattern[] = [];
  for (const [i, raw] of text.replace(/^\uFEFF/, '').split(/\r?\n/).entries()) {
    if (raw.startsWith('#')) continue;
    let line = raw.trim();
    if (line === '') continue;
    const exclude = !line.startsWith('!');
    if (!exclude) line = line.slice(1).trim();
    const cleaned = cleanPath(line.replace(/^\/+/, ''));
    try {
      out.push({ exclude, regex: globRegex(cleaned), source: raw });
    } catch (err) {
      throw new Error(`.dockerignore line ${i + 1}: ${(err as Error).message}`);
    }
  }
  return out;
}

export class IgnoreMatcher {
  readonly #patterns: readonly IgnorePattern[];
  /** Some line re-includes: an ignored directory may still hold kept paths, so it is walked. */
  readonly hasExceptions: boolean;

  constructor(patterns: readonly IgnorePattern[]) {
    this.#patterns = patterns;
    this.hasExceptions = patterns.some((p) => !p.exclude);
  }

  /** Whether the context-relative path is left out (it or one of its parent directories matches, last line wins). */
  ignores(path: string): boolean {
    if (path === '.' || path === '') return false;
    const parts = path.split('/');
    let ignored = false;
    for (const p of this.#patterns) {
      let matched = false;
      for (let n = parts.length; n >= 1 && !matched; n--) matched = p.regex.test(parts.slice(0, n).join('/'));
      if (matched) ignored = p.exclude;
    }
    return ignored;
  }
}
