// Each pod's egress policy: replaced at run time (the kernel's rules, the open connections it now
// forbids cut, the egress proxy told), answered per connection to the proxy and the resolver by the
// pod's address, and the kernel's per-pod counts of what the rules decided.
import { AsbError } from '../../errors.ts';
import { DEFAULT_EGRESS_POLICY, type EgressPolicy } from '../../network/egress-policy.ts';
import type { EgressCount } from '../../network/egress-metrics.ts';
import { persist, type RuntimeContext } from './runtime-context.ts';

/** Replaces a pod's egress policy: applied at once when it runs, and kept (persisted) for its next wake. */
export async function setEgressPolicy(ctx: RuntimeContext, id: string, policy: EgressPolicy): Promise<void> {
  const pod = ctx.pods.get(id);
  if (pod?.persisted === undefined) throw new AsbError('NotFound', `pod ${id} not found`);
  await pod.starting?.catch(() => undefined);
  const persisted = pod.persisted;
  persisted.request = { ...persisted.request, egress: policy };
  await persist(pod);
  if (pod.state.phase !== 'Running' && pod.state.phase !== 'Pending') return;
  const net = ctx.net.podNet(id, persisted.ip, policy);
  await ctx.net.firewall.apply(net);
  // The rules above decide new connections only: open ones the policy now forbids are cut here,
  // before the change is acknowledged (runc's and gVisor's flows alike leave through the bridge).
  const cut = await ctx.net.firewall.cutForbidden(net).catch((err: unknown) => {
    ctx.log.error({ err, id }, 'cannot cut the open connections the new egress policy forbids: they keep running until they end');
    return [];
  });
  if (cut.length > 0) ctx.log.info({ id, destinations: cut }, 'cut open connections the new egress policy forbids');
  // The proxied ones are not the kernel's: the egress proxy's own (onPolicyChange), also before the acknowledgement.
  await ctx.net.policyChanged(id, persisted.ip);
}

/**
 * The policy of the pod holding `ip` (the egress proxy and DNS resolver ask, per connection or
 * question): the pod's persisted request, the same the kernel rules were made from. A scan of
 * the pods: ~1 µs per pod, well under a connection's cost at the few thousand a worker holds.
 */
export function policyForPodIp(ctx: RuntimeContext, ip: string): EgressPolicy | undefined {
  for (const pod of ctx.pods.values()) {
    if (pod.persisted?.ip === ip) return pod.persisted.request.egress ?? DEFAULT_EGRESS_POLICY;
  }
  return undefined;
}

/** The pod (= sandbox id) holding `ip`, for the egress proxy's per-sandbox counts; the same scan as policyForPodIp. */
export function sandboxForPodIp(ctx: RuntimeContext, ip: string): string | undefined {
  for (const pod of ctx.pods.values()) if (pod.persisted?.ip === ip) return pod.id;
  return undefined;
}

/** The kernel's per-pod, per-rule counts of connection attempts. */
export async function egressCounts(ctx: RuntimeContext): Promise<EgressCount[]> {
  if (!(await ctx.net.hasPodNetwork().catch(() => false))) return [];
  const byIp = new Map<string, string>();
  for (const pod of ctx.pods.values()) if (pod.persisted !== undefined) byIp.set(pod.persisted.ip, pod.id);
  const out: EgressCount[] = [];
  for (const c of await ctx.net.firewall.counters()) {
    const pod = byIp.get(c.ip);
    if (pod !== undefined) out.push({ pod, rule: c.rule, verdict: c.verdict, count: c.packets });
  }
  return out;
}
