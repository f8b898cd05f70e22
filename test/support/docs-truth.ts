// What the docs name must exist: the checker behind test/docs-truth.test.ts. A page (README.md or
// docs/*.md) is read as Markdown: relative links must resolve (a file, and a `#anchor` to one of
// its headings), and what its code names must be real: repository paths, `--flags` of our
// programs, `ASB_…` variables, `make` targets and `METHOD /path` endpoints. The facts are read from
// the repository itself, never listed here: flags from their definitions in src/, bench/ and the
// Makefile, variables from the code, targets from the Makefile, routes from the route tables in
// src/ and the paths of docs/openapi.yaml (the contract every response is checked against).
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';

export interface Route {
  readonly method: string;
  /** Path segments; `null` is a parameter (`{id}`), matching any one segment. */
  readonly segments: readonly (string | null)[];
}

export interface RepoFacts {
  readonly root: string;
  readonly flags: ReadonlySet<string>;
  readonly variables: ReadonlySet<string>;
  readonly makeTargets: ReadonlySet<string>;
  readonly routes: readonly Route[];
}

const METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD'] as const;
/** The folders whose paths a page may name in code: anything under them must exist. */
const PATH_ROOTS = ['src', 'test', 'bench', 'scripts', 'clusters', 'docs', '.ci', 'tools', 'envoy', 'proto', 'examples', 'bin'];

function filesUnder(dir: string, keep: (name: string) => boolean, out: string[] = []): string[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return out;
  }
  for (const name of names) {
    if (name === 'node_modules' || name.startsWith('.')) continue;
    const path = join(dir, name);
    let isDir: boolean;
    try {
      isDir = statSync(path).isDirectory();
    } catch {
      continue; // a dangling link
    }
    if (isDir) filesUnder(path, keep, out);
    else if (keep(name)) out.push(path);
  }
  return out;
}

const CODE = (name: string): boolean => /\.(ts|c|sh|go|py|ya?ml|json|toml)$/.test(name) || name === 'Makefile' || name === 'Dockerfile';

function collect(texts: readonly string[], pattern: RegExp, group = 1): Set<string> {
  const out = new Set<string>();
  for (const text of texts) for (const m of text.matchAll(pattern)) {
    const v = m[group];
    if (v !== undefined) out.add(v);
  }
  return out;
}

/** `/v1/sandboxes/{id}/exec` as segments; `${…}` pieces of template literals and `{…}` are parameters. */
function routeOf(method: string, pattern: string): Route {
  const segments = pattern.split('?')[0]?.split('/').slice(1).map((s) => (/^\{.*\}$|\$\{/.test(s) ? null : s)) ?? [];
  return { method, segments };
}

function openApiRoutes(text: string): Route[] {
  const routes: Route[] = [];
  let path: string | undefined;
  for (const line of text.split('\n')) {
    const p = /^ {2}(\/\S*):\s*$/.exec(line);
    if (p !== null) {
      path = p[1];
      continue;
    }
    if (/^\S/.test(line)) path = undefined;
    const m = /^ {4}(get|post|put|delete|patch|head):/.exec(line);
    if (path !== undefined && m?.[1] !== undefined) routes.push(routeOf(m[1].toUpperCase(), path));
  }
  return routes;
}

/** Reads the facts pages are checked against from the repository at `root`. */
export function readRepoFacts(root: string): RepoFacts {
  const src = filesUnder(join(root, 'src'), CODE).map((f) => readFileSync(f, 'utf8'));
  const bench = filesUnder(join(root, 'bench'), CODE).map((f) => readFileSync(f, 'utf8'));
  const makefile = readFileSync(join(root, 'Makefile'), 'utf8');
  const defining = [...src, ...bench, makefile];
  const flags = new Set([
    ...collect(defining, /(?<![\w-])--([a-z][a-z0-9-]*)/g), // named as --flag (usage lines, argv built for a program)
    ...collect(src, /\bflag:\s*'([a-z][a-z0-9-]*)'/g), // the worker's config table
    ...collect(src, /'([a-z][a-z0-9-]*)':\s*\{\s*type:\s*'(?:string|boolean)'/g), // parseArgs options
    ...collect(src, /(?<![\w'])([a-z][a-z0-9]*):\s*\{\s*type:\s*'(?:string|boolean)'/g),
    ...collect(src.flatMap((t) => [...t.matchAll(/\bFLAGS\s*=\s*\[([^\]]*)\]/g)].map((m) => m[1] ?? '')), /'([a-z][a-z0-9-]*)'/g),
  ]);
  // Variables: any code of ours that reads or sets one (docs and the README are not code).
  const code = [...src, ...bench, makefile, ...['scripts', 'test', 'tools', 'clusters', 'envoy', '.ci'].flatMap((d) => filesUnder(join(root, d), CODE).map((f) => readFileSync(f, 'utf8')))];
  const variables = collect(code, /\b(ASB_[A-Z0-9_]*[A-Z0-9])\b/g);
  const makeTargets = new Set([...collect([makefile], /^([a-zA-Z][\w.-]*)\s*:(?!=)/gm), ...[...collect([makefile], /^\.PHONY:(.*)$/gm)].flatMap((l) => l.trim().split(/\s+/))]);
  const routes: Route[] = [];
  const methodAlt = METHODS.join('|');
  for (const text of src) {
    for (const m of text.matchAll(new RegExp(`route\\(\\s*'(${methodAlt})',\\s*[\`']([^\`']+)[\`']`, 'g'))) routes.push(routeOf(m[1] ?? '', m[2] ?? ''));
    for (const m of text.matchAll(new RegExp(`method:\\s*'(${methodAlt})'(?: as const)?,[\\s\\S]{0,200}?pattern:\\s*[\`']([^\`']+)[\`']`, 'g'))) routes.push(routeOf(m[1] ?? '', m[2] ?? ''));
    for (const m of text.matchAll(new RegExp(`\\['(${methodAlt})',\\s*'(/[^']*)'`, 'g'))) routes.push(routeOf(m[1] ?? '', m[2] ?? ''));
    // A route table written with a prefix: `/v1${path}` over [method, path] rows.
    if (/pattern:\s*`\/v1\$\{path\}`/.test(text)) for (const m of text.matchAll(new RegExp(`\\['(${methodAlt})',\\s*'(/[^']*)'`, 'g'))) routes.push(routeOf(m[1] ?? '', `/v1${m[2] ?? ''}`));
    // A surface served by a handler of its own at one path (MCP, the hub's sync and console): its
    // exported path constant, any method.
    for (const m of text.matchAll(/export const [A-Z_]+_PATH = '(\/[^']*)'/g)) routes.push(routeOf('*', m[1] ?? ''));
    // The python-runtime protocol answers paths it compares itself: `path === '/x') return allow('M'`.
    for (const m of text.matchAll(new RegExp(`path === '(/[^']*)'\\) return allow\\('(${methodAlt})'`, 'g'))) routes.push(routeOf(m[2] ?? '', m[1] ?? ''));
    // …and the ops it serves under a path prefix: `PATH_OPS = ['download', …]`, each `GET /<op>/<path>`.
    if (/allow\('GET', \{ op, path/.test(text)) {
      for (const m of text.matchAll(/\bPATH_OPS = \[([^\]]*)\]/g)) for (const op of (m[1] ?? '').matchAll(/'([a-z]+)'/g)) routes.push(routeOf('GET', `/${op[1] ?? ''}/{path}`));
    }
  }
  const openapi = join(root, 'docs', 'openapi.yaml');
  if (existsSync(openapi)) routes.push(...openApiRoutes(readFileSync(openapi, 'utf8')));
  return { root, flags, variables, makeTargets, routes };
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens. */
export function slugOf(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-');
}

function withoutFences(text: string): { prose: string; fenced: string[] } {
  const fenced: string[] = [];
  const prose = text.replace(/^[ \t]*```[^\n]*\n([\s\S]*?)^[ \t]*```\s*$/gm, (_all, body: string) => {
    fenced.push(...body.split('\n'));
    return '';
  });
  return { prose, fenced };
}

export function headingsOf(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of withoutFences(text).prose.matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const base = slugOf(m[1] ?? '');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${String(n)}`);
  }
  return out;
}

/** Inline code spans (`…`, wrapped lines joined) of prose, then the lines of fenced blocks. */
function codeOf(text: string): { spans: string[]; fenced: string[] } {
  const { prose, fenced } = withoutFences(text);
  const spans = [...prose.replace(/``(.+?)``/g, '').matchAll(/`([^`]+)`/g)].map((m) => (m[1] ?? '').replace(/\s+/g, ' ').trim());
  return { spans, fenced: fenced.map((l) => l.replace(/^\s*\$\s+/, '').trim()) };
}

function pathProblems(token: string, facts: RepoFacts): string | undefined {
  let path = token.replace(/[.,:;]+$/, '').replace(/#.*$/, '');
  const wild = path.search(/[<{*…[$]/);
  if (wild >= 0) path = path.slice(0, path.lastIndexOf('/', wild) + 1);
  if (path === '' || existsSync(join(facts.root, path))) return undefined;
  return `names ${token}, which does not exist`;
}

function routeMatches(route: Route, method: string, path: string): boolean {
  if (route.method !== '*' && route.method !== method && !(method === 'HEAD' && route.method === 'GET')) return false;
  const suffix = path.startsWith('.../') || path.startsWith('…/');
  const segs = path.replace(/^(\.\.\.|…)/, '').replace(/(.)\/$/, '$1').split('/').slice(1);
  const want = segs.map((s) => (/^\{.*\}$|^<.*>$|^[A-Z][A-Z0-9_]*$|^…$|^ID$/.test(s) ? null : s));
  const have = suffix ? route.segments.slice(-want.length) : route.segments;
  if (have.length !== want.length) return false;
  return want.every((w, i) => w === null || have[i] === null || have[i] === w);
}

/** `/v1/egress/secrets[/{name}]` is two paths; a query or body after the path is dropped. */
function pathVariants(raw: string): string[] {
  const path = raw.replace(/[?#].*$/, '').replace(/[.,:;)]+$/, '');
  const opt = /\[([^\]]*)\]/.exec(path);
  if (opt === null) return [path];
  return [...pathVariants(path.replace(opt[0], '')), ...pathVariants(path.replace(opt[0], opt[1] ?? ''))];
}

function endpointProblem(methods: string, rawPath: string, facts: RepoFacts): string | undefined {
  if (!rawPath.startsWith('/') && !rawPath.startsWith('.../') && !rawPath.startsWith('…/')) return undefined;
  const missing: string[] = [];
  for (const method of methods.split('/')) for (const path of pathVariants(rawPath)) {
    if (!facts.routes.some((r) => routeMatches(r, method, path))) missing.push(`${method} ${path}`);
  }
  return missing.length === 0 ? undefined : `names the endpoint ${missing.join(', ')}, which no route serves`;
}

/** Everything wrong with one page (`file` relative to the repository root), each problem a sentence. */
export function checkPage(file: string, text: string, facts: RepoFacts): string[] {
  const problems: string[] = [];
  const at = (what: string): void => void problems.push(`${file}: ${what}`);
  const { prose } = withoutFences(text);
  const own = headingsOf(text);
  // Links: [text](target), images too; external and mail links are not ours to check.
  for (const m of prose.replace(/`[^`\n]*`/g, '').matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
    const target = m[1] ?? '';
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
    const [path = '', anchor] = target.split('#');
    if (path === '') {
      if (anchor !== undefined && !own.has(anchor)) at(`links to #${anchor}, a heading this page does not have`);
      continue;
    }
    const resolved = normalize(join(dirname(file), decodeURIComponent(path)));
    if (resolved.startsWith('..') || !existsSync(join(facts.root, resolved))) {
      at(`links to ${target}, and ${resolved} does not exist`);
      continue;
    }
    if (anchor !== undefined && resolved.endsWith('.md') && !headingsOf(readFileSync(join(facts.root, resolved), 'utf8')).has(anchor)) {
      at(`links to ${target}, and ${resolved} has no heading #${anchor}`);
    }
  }
  const { spans, fenced } = codeOf(text);
  const pathRe = new RegExp(`(?<![\\w./-])((?:${PATH_ROOTS.map((r) => r.replace('.', '\\.')).join('|')})/[^\\s\`'"()\\],;]*)`, 'g');
  for (const piece of [...spans, ...fenced]) {
    for (const m of piece.matchAll(pathRe)) {
      const problem = pathProblems(m[1] ?? '', facts);
      if (problem !== undefined) at(problem);
    }
    // make targets: `make up`, `make test TEST_FILES=…`.
    for (const m of piece.matchAll(/(?:^|[\s;&|(])make ([a-z][a-z0-9-]*)(?![\w=])/g)) {
      if (!facts.makeTargets.has(m[1] ?? '')) at(`names make ${m[1] ?? ''}, which the Makefile does not define`);
    }
    // Flags of our programs: a span that is a flag, or a command of ours (asb, node, make).
    if (/^(--|(?:npx )?asb |node (?:src|bench|scripts)\/|make )/.test(piece)) {
      for (const m of piece.matchAll(/(?:^|[\s[|])--([a-z][a-z0-9-]*)/g)) {
        if (!facts.flags.has(m[1] ?? '')) at(`names --${m[1] ?? ''}, which no src/ or bench/ file or the Makefile defines`);
      }
    }
  }
  // Endpoints: `GET /v1/…` in code, and the METHOD | path rows of a route table.
  for (const span of spans) {
    const m = new RegExp(`^((?:${METHODS.join('|')})(?:/(?:${METHODS.join('|')}))*) (\\S+)`).exec(span);
    if (m !== null) {
      const problem = endpointProblem(m[1] ?? '', m[2] ?? '', facts);
      if (problem !== undefined) at(problem);
    }
  }
  for (const m of prose.matchAll(new RegExp(`^\\| ((?:${METHODS.join('|')})(?:/(?:${METHODS.join('|')}))*) \\| (/[^ |]*) \\|`, 'gm'))) {
    const problem = endpointProblem(m[1] ?? '', m[2] ?? '', facts);
    if (problem !== undefined) at(problem);
  }
  // Variables, wherever the page names one.
  for (const m of new Set([...text.matchAll(/\b(ASB_[A-Z0-9_]*[A-Z0-9])\b/g)].map((x) => x[1] ?? ''))) {
    if (!facts.variables.has(m)) at(`names ${m}, which no code of ours reads or sets`);
  }
  return problems;
}

/** README.md and every docs/*.md, relative to `root`. */
export function docPages(root: string): string[] {
  return ['README.md', ...readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => relative(root, join(root, 'docs', f)))];
}
