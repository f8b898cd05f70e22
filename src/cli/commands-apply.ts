// `asb apply -f file.yaml`: kubectl-style apply of multi-document YAML (templates, warm pools,
// sandboxes, claims). The YAML is parsed and validated here first, so a typo is reported with
// its file and document before anything is sent; the server validates again and applies all
// objects or none.
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseManifests } from '../api/manifest.ts';
import type { KubeObject } from '../api/meta.ts';
import { ApiError } from '../client/api-client.ts';
import { AsbError, isAsbError, type FieldProblem } from '../errors.ts';
import { parseCommandArgs, stringList, UsageError } from './args.ts';
import { EXIT, readAll, type Command } from './command.ts';
import { writeJson } from './output.ts';

export const applyCommand: Command = {
  name: 'apply',
  summary: 'Create or update templates, warm pools, sandboxes and claims from YAML',
  usage: 'asb apply -f <file.yaml|-> [-f ...] [--json]',
  help: `Reads one or more multi-document YAML files (--- between documents), as kubectl does.
Every object is checked first; if any is invalid nothing is applied.

Options:
  -f, --filename FILE    YAML file; - reads stdin; repeatable
  --json                 print {results: [...]} as JSON

Example:
  asb apply -f examples/python-pool.yaml
  cat pool.yaml | asb apply -f -`,
  options: { filename: { type: 'string', short: 'f', multiple: true }, json: { type: 'boolean' } },
  async run(argv, ctx) {
    const { values, positionals, global } = parseCommandArgs(argv, this.options, this.usage);
    if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0] ?? ''}" (files go after -f)`, this.usage);
    const files = stringList(values, 'filename');
    if (files.length === 0) throw new UsageError('missing -f <file>', this.usage);
    if (files.filter((f) => f === '-').length > 1) throw new UsageError('stdin (-f -) can be read only once', this.usage);

    const objects: KubeObject[] = [];
    const origins: string[] = [];
    for (const file of files) {
      const source = file === '-' ? '<stdin>' : file;
      const text = file === '-' ? (await readAll(ctx.io.stdin)).toString('utf8') : readSource(resolve(ctx.io.cwd, file), file);
      const parsed = parseOrExplain(text, source);
      parsed.forEach((obj, i) => {
        objects.push(obj);
        origins.push(`${source} object ${i + 1} (${obj.kind}/${obj.metadata.name})`);
      });
    }
    if (objects.length === 0) throw new UsageError(`no objects in ${files.join(', ')}`, this.usage);

    let results;
    try {
      ({ results } = await ctx.client(global).apply(objects));
    } catch (err) {
      if (err instanceof ApiError) throw new ApiError(err.httpStatus, err.serverCode, err.detail, withOrigins(err.fields, origins));
      throw err;
    }
    if (values.json === true) writeJson(ctx.io.stdout, { results });
    else for (const r of results) ctx.io.stdout.write(`${r.kind.toLowerCase()}/${r.name} ${r.action}\n`);
    return EXIT.ok;
  },
};

/**
 * The manifest parser names each failing object in its message and again in its fields; the
 * fields (`file.yaml#2.spec.replicas: ...`) already say where, so the headline stays short.
 */
export function parseOrExplain(text: string, source: string): KubeObject[] {
  try {
    return parseManifests(text, source);
  } catch (err) {
    if (!isAsbError(err, 'Invalid') || err.fields.length === 0) throw err;
    throw new AsbError('Invalid', `${source} is invalid; nothing was applied`, { fields: [...err.fields] });
  }
}

export function readSource(path: string, shown: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new AsbError('BadRequest', `cannot read ${shown}: ${code === 'ENOENT' ? 'no such file' : String(code ?? err)}`, { cause: err });
  }
}

/** The server names fields `objects[i]...`; a user thinks in files and documents. */
function withOrigins(fields: readonly FieldProblem[], origins: readonly string[]): FieldProblem[] {
  return fields.map((f) => {
    const m = /^objects\[(\d+)\]\.?(.*)$/.exec(f.field);
    const origin = m === null ? undefined : origins[Number(m[1])];
    return origin === undefined || m === null ? f : { field: `${origin} ${m[2] ?? ''}`.trimEnd(), message: f.message };
  });
}
