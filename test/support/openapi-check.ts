// Checks real responses against docs/openapi.yaml: each response body must match the schema the
// document gives for its route, status and content type, and the routes exercised are recorded
// so a test can assert the document and the server list the same routes.
import { readFileSync } from 'node:fs';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { parse } from 'yaml';
import type { ApiResponse } from './worker-fixture.ts';

interface Doc {
  paths: Record<string, Record<string, { responses?: Record<string, unknown> }>>;
  components: Record<string, unknown>;
}

interface ResponseDoc {
  $ref?: string;
  content?: Record<string, { schema?: unknown }>;
}

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options'];

export class OpenApiChecker {
  readonly doc: Doc;
  readonly exercised = new Set<string>();
  readonly #ajv: Ajv2020;
  readonly #compiled = new Map<string, ReturnType<Ajv2020['compile']>>();

  constructor(file: string) {
    this.doc = parse(readFileSync(file, 'utf8')) as Doc;
    // strict off: OpenAPI adds keywords (e.g. contentMediaType annotations, `example`) Ajv's strict mode rejects.
    this.#ajv = new Ajv2020({ strict: false, allErrors: true, validateSchema: false });
  }

  /** Every documented operation as "METHOD /pattern". */
  operations(): string[] {
    const out: string[] = [];
    for (const [path, item] of Object.entries(this.doc.paths)) {
      for (const m of Object.keys(item)) if (METHODS.includes(m)) out.push(`${m.toUpperCase()} ${path}`);
    }
    return out.sort();
  }

  /** The documented path template that matches a concrete path, or undefined. */
  templateFor(path: string): string | undefined {
    const parts = path.split('?')[0]?.split('/') ?? [];
    // A literal segment wins over a parameter (/templates/tags before /templates/{id}), as in OpenAPI.
    const params = (t: string): number => t.split('/').filter((s) => s.startsWith('{')).length;
    let best: string | undefined;
    for (const template of Object.keys(this.doc.paths)) {
      const segs = template.split('/');
      if (segs.length === parts.length && segs.every((s, i) => (s.startsWith('{') && (parts[i] ?? '') !== '') || s === parts[i]) && (best === undefined || params(template) < params(best))) best = template;
    }
    return best;
  }

  /** Throws with the Ajv errors if the response does not match the document. */
  check(method: string, path: string, res: ApiResponse): void {
    const template = this.templateFor(path);
    if (template === undefined) throw new Error(`${method} ${path} is not documented`);
    const op = this.doc.paths[template]?.[method.toLowerCase()];
    if (op === undefined) {
      if (res.status === 405 || res.status === 401) return;
      throw new Error(`${method} ${template} is not documented`);
    }
    this.exercised.add(`${method.toUpperCase()} ${template}`);
    const responses = op.responses ?? {};
    const status = String(res.status);
    const key = status in responses ? status : 'default' in responses ? 'default' : undefined;
    // A Problem for an undocumented 4xx is still checked against the Problem schema.
    let response = (key === undefined ? (res.status >= 400 ? { $ref: '#/components/responses/Problem' } : undefined) : responses[key]) as ResponseDoc | undefined;
    if (response === undefined) throw new Error(`${method} ${template} has no documented ${status} response`);
    if (response.$ref !== undefined) response = this.#resolve(response.$ref) as ResponseDoc;
    const content = response.content;
    if (content === undefined) {
      if (res.bytes.byteLength !== 0) throw new Error(`${method} ${template} ${status} documents no body but got ${res.bytes.byteLength} bytes`);
      return;
    }
    const type = (res.headers.get('content-type') ?? '').split(';')[0]?.trim() ?? '';
    const media = content[type];
    if (media === undefined) throw new Error(`${method} ${template} ${status}: content type ${type} is not documented (documented: ${Object.keys(content).join(', ')})`);
    if (!type.includes('json')) return;
    const cacheKey = `${method} ${template} ${key ?? 'problem'} ${type}`;
    let validate = this.#compiled.get(cacheKey);
    // The media schema compiled with the document's components beside it, so its
    // '#/components/...' refs resolve.
    if (validate === undefined) this.#compiled.set(cacheKey, (validate = this.#ajv.compile({ ...(media.schema as object), components: this.doc.components })));
    if (!validate(res.json)) {
      throw new Error(`${method} ${template} ${status} does not match docs/openapi.yaml: ${this.#ajv.errorsText(validate.errors)}\nbody: ${res.text.slice(0, 500)}`);
    }
  }

  #resolve(ref: string): unknown {
    let node: unknown = this.doc;
    for (const part of ref.replace(/^#\//, '').split('/')) node = (node as Record<string, unknown>)[part.replaceAll('~1', '/').replaceAll('~0', '~')];
    return node;
  }
}
