// How results look: kubectl-style tables with upper-case headers and two-space gutters, ages
// like 5s/3m/2h/4d, and JSON (two-space indented, one document per command) for scripts.
import type { FieldProblem } from '../errors.ts';

export interface Writer {
  write(chunk: string | Uint8Array): unknown;
}

/** Lays out rows under headers, each column as wide as its widest cell; no trailing spaces. */
export function formatTable(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(headers), ...rows.map(line)].join('\n') + '\n';
}

/** Elapsed time in kubectl's style: the largest unit only, below 2 of it the next one down. */
export function formatAge(fromIso: string | undefined, nowMs: number): string {
  if (fromIso === undefined) return '<unknown>';
  const from = Date.parse(fromIso);
  if (Number.isNaN(from)) return '<unknown>';
  const s = Math.max(0, Math.floor((nowMs - from) / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 120) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h`;
  return `${Math.floor(h / 24)}d`;
}

/** A duration for humans: 1.2s, 45s, 10m, 1h30m. */
export function formatDuration(ms: number): string {
  if (ms < 10_000) return `${(ms / 1000).toFixed(1)}s`;
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 120) return s % 60 === 0 ? `${m}m` : `${m}m${s % 60}s`;
  const h = Math.floor(m / 60);
  return m % 60 === 0 ? `${h}h` : `${h}h${m % 60}m`;
}

export function writeJson(out: Writer, value: unknown): void {
  out.write(JSON.stringify(value, null, 2) + '\n');
}

/** `error: <detail>` then one indented line per field, the way validation errors are read. */
export function formatError(detail: string, fields: readonly FieldProblem[] = []): string {
  const lines = [`error: ${detail}`];
  for (const f of fields) {
    const line = `${f.field}: ${f.message}`;
    // A single-problem error often repeats its one field in the detail; say it once.
    if (!detail.includes(line)) lines.push(`  ${line}`);
  }
  return lines.join('\n') + '\n';
}

/** Aligned `key: value` lines, for `asb get` and friends; undefined values are left out. */
export function formatFields(entries: readonly (readonly [string, string | undefined])[]): string {
  const shown = entries.filter((e): e is readonly [string, string] => e[1] !== undefined);
  const width = Math.max(0, ...shown.map(([k]) => k.length + 1));
  return shown.map(([k, v]) => `${`${k}:`.padEnd(width)}  ${v}`).join('\n') + '\n';
}
