// The egress proxy end to end: EgressNet (a sandbox namespace behind a gateway, public servers),
// the cluster Envoy from envoy/edge.yaml with its egress listener on the gateway, the egress
// decision service, and the DNAT that sends the sandbox's TCP to the listener.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { createServer } from 'node:net';
import { writeEgressLds } from '../../src/edge/envoy-config.ts';
import { EnvoyProcess } from '../../src/edge/envoy-process.ts';
import { createEgressMetrics, EgressAuthzServer } from '../../src/egress/authz-service.ts';
import { interceptedHosts, type CredentialRule } from '../../src/egress/credentials.ts';
import { DnsResolver, withHosts } from '../../src/egress/dns-resolver.ts';
import { ensureEgressCa, ensureHostCertificate, type EgressCa } from '../../src/egress/egress-ca.ts';
import type { EgressPolicySource } from '../../src/egress/egress-decision.ts';
import type { EgressPolicy } from '../../src/network/egress-policy.ts';
import { ResolvedAddresses } from '../../src/egress/resolved-addresses.ts';
import { systemClock } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/log.ts';
import { EgressNet, type Cleanup } from './egress-net.ts';

/** The public servers' certificate covers every name under this domain. */
export const PUBLIC_DOMAIN = 'egress.test';

export interface EgressProxyFixture {
  net: EgressNet;
  envoy: EnvoyProcess;
  registry: Registry;
  /** The CA that signed the public servers' certificate (what a sandbox's trust store holds for "the internet"). */
  publicCa: EgressCa;
  dir: string;
  /** The cluster's egress CA (credential hosts' certificates). */
  egressCa: EgressCa;
  /** What the sandbox trusts: the public CA and the egress CA, one PEM bundle. */
  trustBundle: string;
  /** Secret values by name (write-only from the sandbox's side: it never reads them). */
  secrets: Map<string, string>;
  /** Sets (or with undefined, removes) the sandbox's policy; takes effect on the next connection. */
  setPolicy(policy: EgressPolicy | undefined): void;
  /** With `lds`: replaces the credential rules and rewrites the egress listener's LDS file, as the worker does (Envoy keeps running). */
  setRules(rules: readonly CredentialRule[]): Promise<void>;
  sandboxId: string;
  /** asb_egress_decisions_total for one label set. */
  decisions(labels: { rule: string; verdict: 'allowed' | 'denied'; protocol?: string }): Promise<number>;
  /** asb_egress_dns_queries_total for one label set. */
  dnsQueries(labels: { rule: string; verdict: string }): Promise<number>;
}

/**
 * `hosts`: what the resolver answers (every other name is NXDOMAIN: the tests never ask the real
 * internet). Names are looked up as the sandbox's resolv.conf says: at the gateway, port 53.
 */
export async function startEgressProxy(t: Cleanup, opts: { rules?: readonly CredentialRule[]; hosts?: (publicIps: readonly string[]) => Record<string, string[]>; directLink?: boolean; concurrency?: number; lds?: boolean } = {}): Promise<EgressProxyFixture> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-egress-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const net = await EgressNet.create(t, { directLink: opts.directLink ?? false });
  const publicCa = await ensureEgressCa(join(dir, 'public-ca'), 'egress test public CA');
  const serving = await ensureHostCertificate(publicCa, `*.${PUBLIC_DOMAIN}`);
  await net.startUpstream(serving);
  const egressCa = await ensureEgressCa(join(dir, 'egress-ca'), 'egress test cluster CA');
  const trustBundle = join(dir, 'trust.pem');
  writeFileSync(trustBundle, readFileSync(publicCa.caCertPath, 'utf8') + readFileSync(egressCa.caCertPath, 'utf8'));
  let rules = opts.rules ?? [];
  const intercept = await Promise.all(interceptedHosts(rules).map((h) => ensureHostCertificate(egressCa, h)));
  const secrets = new Map<string, string>();
  const credentials = { rulesFor: () => rules, secretValue: (name: string) => secrets.get(name) };

  const sandboxId = 'sbx-egress';
  let policy: EgressPolicy | undefined;
  const source: EgressPolicySource = {
    policyForPodIp: (ip) => (ip === net.clientIp ? policy : undefined),
    sandboxForPodIp: (ip) => (ip === net.clientIp ? sandboxId : undefined),
  };
  const registry = new Registry();
  const metrics = createEgressMetrics(registry);
  const resolvedAddresses = new ResolvedAddresses(systemClock);
  const resolved = (podIp: string, name: string, ip: string): boolean => resolvedAddresses.has(podIp, name, ip);
  const authz = await EgressAuthzServer.start({ host: '127.0.0.1', port: 0, source, metrics, resolved, credentials, log: silentLogger() });
  t.after(() => authz.close());

  // LDS from a file: the listener's port is fixed (a reload binds it again), so pick a free one now.
  const ldsPath = opts.lds === true ? join(dir, 'egress-lds.json') : undefined;
  const egressPort = ldsPath === undefined ? 0 : await freePortOn(net.gateway);
  const egressOptions = { listenAddress: net.gateway, listenPort: egressPort, authzAddress: `127.0.0.1:${authz.port}`, intercept, upstreamCaPath: publicCa.caCertPath, ...(ldsPath === undefined ? {} : { ldsPath }) };
  if (ldsPath !== undefined) writeEgressLds(ldsPath, egressOptions);
  const envoy = new EnvoyProcess({
    stateDir: join(dir, 'envoy'),
    logger: silentLogger(),
    concurrency: opts.concurrency ?? 1,
    config: {
      listenPort: 0,
      adminPort: 0,
      // No router in these tests: the edge listener is unused.
      routerAddress: '127.0.0.1:9',
      workers: [],
      // The proxy checks the credential hosts' real certificates against the public CA.
      egress: egressOptions,
    },
  });
  t.after(() => envoy.close());
  const endpoints = await envoy.start();
  if (endpoints.egressPort === undefined) throw new Error('Envoy reports no egress listener');
  const upstream = withHosts(new Map(Object.entries(opts.hosts?.(net.publicIps) ?? {})), { lookup: () => Promise.resolve({ addresses: 'nxdomain', ttlS: 0 }) });
  const dns = new DnsResolver({ source, upstream, registry, log: silentLogger(), onAnswer: (pod, name, ips, ttl) => resolvedAddresses.record(pod, name, ips, ttl) });
  t.after(() => dns.close());
  const dnsPort = await dns.listen(net.gateway, 0);
  await net.redirect({ tcpPort: endpoints.egressPort, dnsPort });

  return {
    net,
    envoy,
    registry,
    publicCa,
    egressCa,
    trustBundle,
    secrets,
    dir,
    sandboxId,
    setPolicy: (p) => {
      policy = p;
    },
    setRules: async (next) => {
      if (ldsPath === undefined) throw new Error('setRules needs startEgressProxy(t, { lds: true })');
      rules = next;
      const hosts = await Promise.all(interceptedHosts(next).map((h) => ensureHostCertificate(egressCa, h)));
      writeEgressLds(ldsPath, { ...egressOptions, intercept: hosts });
    },
    decisions: (labels) => counted(registry, 'asb_egress_decisions_total', { sandbox: sandboxId, ...labels }),
    dnsQueries: (labels) => counted(registry, 'asb_egress_dns_queries_total', { sandbox: sandboxId, ...labels }),
  };
}

async function counted(registry: Registry, name: string, want: Record<string, string | undefined>): Promise<number> {
  const metric = await registry.getSingleMetric(name)?.get();
  let sum = 0;
  for (const v of metric?.values ?? []) {
    const labels: Record<string, string | number | undefined> = v.labels;
    if (Object.entries(want).every(([k, x]) => x === undefined || labels[k] === x)) sum += v.value;
  }
  return sum;
}

/** A port free on `host` right now. */
export function freePortOn(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, host, () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}
