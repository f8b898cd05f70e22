// Command-line flags of our processes: `--name value` or `--name=value`, each possibly repeated;
// a switch (named in `switches`) also stands alone, `--name` meaning `--name=true`.
// Problems (a bare argument, a flag with no value) are collected, not thrown, so configuration
// parsing can report every problem at once.

/** Every value given for each flag name, in order. */
export function parseFlags(argv: readonly string[], problems: string[], switches: ReadonlySet<string> = new Set()): Map<string, string[]> {
  const flags = new Map<string, string[]>();
  const add = (name: string, value: string): void => {
    flags.set(name, [...(flags.get(name) ?? []), value]);
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? '';
    if (!arg.startsWith('--')) {
      problems.push(`unexpected argument "${arg}"`);
      continue;
    }
    const eq = arg.indexOf('=');
    if (eq > 0) {
      add(arg.slice(2, eq), arg.slice(eq + 1));
      continue;
    }
    if (switches.has(arg.slice(2))) {
      add(arg.slice(2), 'true');
      continue;
    }
    const value = argv[i + 1];
    if (value === undefined || value.startsWith('--')) {
      problems.push(`flag ${arg} needs a value`);
      continue;
    }
    add(arg.slice(2), value);
    i++;
  }
  return flags;
}

/** A process's configuration is wrong: every problem found, one per line. */
export class ConfigError extends Error {
  readonly problems: readonly string[];
  constructor(problems: string[]) {
    super(`invalid configuration:\n  ${problems.join('\n  ')}`);
    this.name = 'ConfigError';
    this.problems = problems;
  }
}
