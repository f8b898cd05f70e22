// Placement: which worker clusters a new sandbox should be tried on, best first. Pure and
// allocation-light, because the hub runs it on every create (a benchmark measures decisions per
// second over 20 candidates); the registry and the live sync view are gathered by the caller
// (src/hub/candidates.ts), and the proxying and failover happen in src/hub/create-placement.ts.
//
// Rules, in order:
//   1. A named cluster (`cluster`) is the only one tried: every other is skipped as
//      `not the named cluster`, and the named one is skipped too when a rule below drops it.
//   2. Dropped: drained clusters (`drained`), clusters not connected or not healthy (`down`), and
//      clusters that do not hold the template (`no template <ns>/<name>`), in that order of
//      precedence, so each skipped cluster gets the first reason that applies.
//   3. What is left is ordered by, from the most significant key:
//        a. the preferred region (`region`) first; clusters elsewhere follow as the failover;
//        b. clusters with a ready warm sandbox of the template before those without (a claim
//           there takes milliseconds, a cold start about a second);
//        c. more ready warm sandboxes first (spreads a burst over the pools that can take it);
//        d. the cluster name, so equal candidates are always tried in the same order.
// A built template's `name:tag` is held where `name` is (the cluster that built it reports the
// name; its worker resolves the tag to the build the tag names).
import type { PlacementCandidate, PlacementRequest, PlacementResult } from '../api/hub-contract.ts';

interface Ranked {
  name: string;
  inRegion: boolean;
  warm: number;
}

function compare(a: Ranked, b: Ranked): number {
  if (a.inRegion !== b.inRegion) return a.inRegion ? -1 : 1;
  if (a.warm > 0 !== b.warm > 0) return a.warm > 0 ? -1 : 1;
  if (a.warm !== b.warm) return b.warm - a.warm;
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
}

export function place(req: PlacementRequest, candidates: readonly PlacementCandidate[]): PlacementResult {
  const colon = req.template.indexOf(':');
  const key = `${req.namespace}/${colon === -1 ? req.template : req.template.slice(0, colon)}`;
  const ranked: Ranked[] = [];
  const skipped: PlacementResult['skipped'] = [];
  for (const c of candidates) {
    let reason: string | undefined;
    if (req.cluster !== undefined && c.name !== req.cluster) reason = 'not the named cluster';
    else if (c.drain) reason = 'drained';
    else if (!c.healthy) reason = 'down';
    else if (req.fromSnapshot !== true && !Object.hasOwn(c.templates, key)) reason = `no template ${key}`;
    if (reason !== undefined) {
      skipped.push({ cluster: c.name, reason });
      continue;
    }
    const warm = c.templates[key] ?? 0;
    ranked.push({ name: c.name, inRegion: req.region !== undefined && c.region === req.region, warm: warm > 0 ? warm : 0 });
  }
  ranked.sort(compare);
  return { order: ranked.map((r) => r.name), skipped };
}
