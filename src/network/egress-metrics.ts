// The kernel's egress counters as a Prometheus metric, read at each scrape (one `nft -j list` run,
// ~5 ms): asb_egress_connections_total{sandbox, rule, verdict}. `rule` is the policy entry or
// default that decided (nft-ruleset.ts comments: an allow/deny CIDR, default-internet,
// default-no-internet, default-private, host, sandboxes). The counts are of first packets, so
// about one per connection attempt; a sandbox removed drops out at the next scrape.
import { Counter, type Registry } from 'prom-client';

/** One counter of the kernel's egress rules: connection attempts of one pod decided by one rule. */
export interface EgressCount {
  pod: string;
  rule: string;
  verdict: 'allowed' | 'denied';
  count: number;
}

export function registerEgressMetrics(registry: Registry, counts: () => Promise<EgressCount[]>, onError: (err: unknown) => void): void {
  new Counter({
    name: 'asb_egress_connections_total',
    help: 'Outbound connection attempts from sandboxes decided by the kernel rules, by sandbox, deciding rule and verdict (allowed, denied).',
    labelNames: ['sandbox', 'rule', 'verdict'],
    registers: [registry],
    async collect() {
      this.reset();
      try {
        for (const c of await counts()) this.inc({ sandbox: c.pod, rule: c.rule, verdict: c.verdict }, c.count);
      } catch (err) {
        // A scrape still answers (the other metrics); the failure is logged, not thrown.
        onError(err);
      }
    },
  });
}
