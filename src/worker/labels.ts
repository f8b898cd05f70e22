// Label keys, values and selectors as users send them: checked here so a bad one is a 4xx
// naming it, and so users cannot set the labels tenancy and pools depend on.
import { isReservedKey, RESERVED_PREFIXES } from '../api/names.ts';
import { AsbError, type FieldProblem } from '../errors.ts';

const NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const PREFIX = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

export function isLabelKey(key: string): boolean {
  const slash = key.indexOf('/');
  if (slash === -1) return NAME.test(key);
  return PREFIX.test(key.slice(0, slash)) && NAME.test(key.slice(slash + 1));
}

export function isLabelValue(value: string): boolean {
  return VALUE.test(value);
}

/** Problems with labels a user asked for, each naming `<field>.<key>`; `allowed` names reserved keys the caller lets through. */
export function userLabelProblems(labels: Record<string, string>, field: string, allowed: ReadonlySet<string> = new Set()): FieldProblem[] {
  const problems: FieldProblem[] = [];
  for (const [key, value] of Object.entries(labels)) {
    if (!isLabelKey(key)) problems.push({ field: `${field}.${key}`, message: 'is not a valid label key (name of 1-63 [A-Za-z0-9._-], optional DNS prefix and /)' });
    // Prefixes we own: asb.dev/owner decides tenancy, agents.x-k8s.io/* decides pool membership.
    else if (isReservedKey(key) && !allowed.has(key)) problems.push({ field: `${field}.${key}`, message: `uses a reserved prefix (${RESERVED_PREFIXES.join(', ')})` });
    if (!isLabelValue(value)) problems.push({ field: `${field}.${key}`, message: `value "${value}" is not a valid label value (0-63 [A-Za-z0-9._-])` });
  }
  return problems;
}

/** Throws 400 unless `selector` is an equality-based selector: a=b, a==b, a!=b, a, !a. */
export function checkSelector(selector: string, param: string): void {
  for (const term of selector.split(',')) {
    const t = term.trim();
    const m = /^(!?)([^=!]+)(?:(==|=|!=)(.*))?$/.exec(t);
    const key = m?.[2]?.trim() ?? '';
    const ok = m !== null && isLabelKey(key) && (m[3] === undefined ? true : m[1] === '' && isLabelValue((m[4] ?? '').trim()));
    if (!ok) {
      throw new AsbError('BadRequest', `${param} term "${t}" is not valid: use key=value, key!=value, key or !key, separated by commas`, {
        fields: [{ field: param, message: `invalid term "${t}"` }],
      });
    }
  }
}
