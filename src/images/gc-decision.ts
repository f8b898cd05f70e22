// What image GC removes, decided from what the cache holds and who uses it: a pure function (no
// disk, no clock), so every rule below is tested without pulling anything (test/image-gc-decision.test.ts).
// image-store.ts gathers the inputs and carries the plan out.
//
// Rules, in order:
// - A pin (a pod's record of the images it uses, pins.ts) is live while its pod's directory exists:
//   a running pod and a hibernated one both have it; delete() removes it. A pin whose pod dir is
//   gone (the pod was deleted and its worker died before it unpinned, or the whole state dir was
//   removed) is stale and is removed, unless it is younger than the grace (written in the instant
//   before the pod dir).
// - A record (one pulled reference) is kept when a live pin or the caller names its reference, or
//   when it was pulled or last used within the grace: an image pulled for a sandbox that has not
//   started yet, or one a pool will start again soon, is not collected under it.
// - A tree (an unpacked chain, plain or id-mapped) is kept when a kept record has its chain, when
//   a live pin names it (a hibernated pod wakes on the bytes it ran even after its tag moved and
//   its record now names other ones), or when it was unpacked or last used within the grace.
// Blobs are not decided here: `umoci gc` removes those no remaining record's manifest reaches.

export interface GcRecord {
  /** images/<tag>.json. */
  readonly tag: string;
  readonly reference: string;
  /** rootfs/ directory name of its chain, without an id map suffix. */
  readonly chainDir: string;
  /** Pulled, pinned or unpinned last (the record file's mtime), ms since the epoch. */
  readonly usedAt: number;
}

export interface GcTree {
  /** rootfs/ directory name: `<chain>` or `<chain>_u<host id>-<size>`. */
  readonly dir: string;
  /** Unpacked, pinned or unpinned last (the directory's mtime). */
  readonly usedAt: number;
}

export interface GcPin {
  /** pins/ file name. */
  readonly file: string;
  readonly podDirExists: boolean;
  readonly pinnedAt: number;
  readonly references: readonly string[];
  /** rootfs/ directory names. */
  readonly trees: readonly string[];
}

export interface GcInput {
  readonly now: number;
  /** Nothing used or pulled more recently than this is removed. */
  readonly graceMs: number;
  /** References kept whatever the pins say (normalised, as records name them). */
  readonly keep: ReadonlySet<string>;
  readonly records: readonly GcRecord[];
  readonly trees: readonly GcTree[];
  readonly pins: readonly GcPin[];
}

export interface GcPlan {
  /** Tags of the records to remove. */
  readonly records: readonly string[];
  /** rootfs/ directory names to remove. */
  readonly trees: readonly string[];
  /** pins/ file names to remove. */
  readonly stalePins: readonly string[];
}

export function decideGc(input: GcInput): GcPlan {
  const recent = (at: number): boolean => input.now - at < input.graceMs;
  const references = new Set(input.keep);
  const pinnedTrees = new Set<string>();
  const stalePins: string[] = [];
  for (const pin of input.pins) {
    if (!pin.podDirExists && !recent(pin.pinnedAt)) {
      stalePins.push(pin.file);
      continue;
    }
    for (const reference of pin.references) references.add(reference);
    for (const tree of pin.trees) pinnedTrees.add(tree);
  }
  const records: string[] = [];
  const chains = new Set<string>();
  for (const record of input.records) {
    if (references.has(record.reference) || recent(record.usedAt)) chains.add(record.chainDir);
    else records.push(record.tag);
  }
  const trees = input.trees
    .filter((tree) => !(chains.has(chainOfTree(tree.dir)) || pinnedTrees.has(tree.dir) || recent(tree.usedAt)))
    .map((tree) => tree.dir);
  return { records, trees, stalePins };
}

/** The chain an unpacked tree's directory belongs to: an id-mapped tree goes with its chain. */
export function chainOfTree(dir: string): string {
  return dir.split('_')[0] ?? dir;
}

/** The rootfs/ directory name of a chain ID (`sha256:ab…` → `sha256-ab…`). */
export function chainDirOf(chainId: string): string {
  return chainId.replace(':', '-');
}
