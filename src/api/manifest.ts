// Manifests: multi-document YAML (or JSON, which YAML contains) as kubectl reads it. Every
// document is validated; problems from all documents come back in one error, each field path
// prefixed with `<source>#<n>` where n counts documents from 1 as an editor would.
import { parseAllDocuments } from 'yaml';
import { AsbError, isAsbError } from '../errors.ts';
import type { FieldProblem } from '../errors.ts';
import type { KubeObject } from './meta.ts';
import { isFields } from './shape.ts';
import { validateObject } from './validate.ts';

export function parseManifests(text: string, source = 'manifest'): KubeObject[] {
  const objects: KubeObject[] = [];
  const failures: AsbError[] = [];
  let n = 0;
  for (const doc of parseAllDocuments(text)) {
    n += 1;
    const where = `${source}#${n}`;
    const syntax = doc.errors[0];
    // A syntax error can shift every later document, so stop at the first one.
    if (syntax !== undefined) throw syntaxError(where, syntax.message, syntax.linePos?.[0]);
    const value: unknown = doc.toJS();
    // A document holding only comments or `---` separators is skipped, as kubectl does.
    if (value === null || value === undefined) continue;
    for (const [item, path] of listItems(value, where)) {
      try {
        objects.push(validateObject(item, path));
      } catch (err) {
        if (!isAsbError(err, 'Invalid')) throw err;
        failures.push(err);
      }
    }
  }
  if (failures.length > 0) {
    const fields: FieldProblem[] = failures.flatMap((f) => [...f.fields]);
    throw new AsbError('Invalid', failures.map((f) => f.message).join('\n'), { fields });
  }
  return objects;
}

/** `kubectl get -o yaml` wraps several objects in a `v1 List`; apply its items one by one. */
function listItems(value: unknown, where: string): [unknown, string][] {
  if (isFields(value) && value.apiVersion === 'v1' && value.kind === 'List' && Array.isArray(value.items)) {
    return value.items.map((item, i): [unknown, string] => [item, `${where}.items[${i}]`]);
  }
  return [[value, where]];
}

function syntaxError(where: string, message: string, pos: { line: number; col: number } | undefined): AsbError {
  // The yaml package appends " at line L, column C:" and a source excerpt; keep the first clause.
  const reason = (message.split('\n')[0] ?? message).replace(/ at line \d+, column \d+:?$/, '');
  const at = pos === undefined ? '' : ` at line ${pos.line}, column ${pos.col}`;
  const detail = `YAML syntax error${at}: ${reason}`;
  return new AsbError('BadRequest', `${where}: ${detail}`, { fields: [{ field: where, message: detail }] });
}
