// The egress proxy end to end: EgressNet (a sandbox namespace behind a gateway, public servers),
// the cluster Envoy from envoy/edge.yaml with its egress listener on the gateway, the egress
// decision service, and the DNAT that sends the sandbox's TCP to the listener.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { Registry } from 'prom-client';
import { EnvoyProcess } from '../../src/edge/envoy-process.ts';
import { createEgressMetrics, EgressAuthzServer } from '../../src/egress/authz-service.ts';
import type { CredentialSource } from '../../src/egress/credentials.ts';
import { ensureEgressCa, ensureHostCertificate, type EgressCa } from '../../src/egress/egress-ca.ts';
import type { EgressPolicySource } from '../../src/egress/egress-decision.ts';
import type { EgressPolicy } from '../../src/network/egress-policy.ts';
import { silentLogger } from '../../src/system/log.ts';
import { EgressNet } from './egress-net.ts';

/** The public servers' certificate covers every name under this domain. */
export const PUBLIC_DOMAIN = 'egress.test';

export interface EgressProxyFixture {
  net: EgressNet;
  envoy: EnvoyProcess;
  registry: Registry;
  /** The CA that signed the public servers' certificate (what a sandbox's trust store holds for "the internet"). */
  publicCa: EgressCa;
  dir: string;
  /** Sets (or with undefined, removes) the sandbox's policy; takes effect on the next connection. */
  setPolicy(policy: EgressPolicy | undefined): void;
  sandboxId: string;
  /** asb_egress_decisions_total for one label set. */
  decisions(labels: { rule: string; verdict: 'allowed' | 'denied'; protocol?: string }): Promise<number>;
}

export async function startEgressProxy(t: TestContext, opts: { credentials?: CredentialSource } = {}): Promise<EgressProxyFixture> {
  const dir = mkdtempSync(join(tmpdir(), 'asb-egress-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const net = await EgressNet.create(t);
  const publicCa = await ensureEgressCa(join(dir, 'public-ca'), 'egress test public CA');
  const serving = await ensureHostCertificate(publicCa, `*.${PUBLIC_DOMAIN}`);
  await net.startUpstream(serving);

  const sandboxId = 'sbx-egress';
  let policy: EgressPolicy | undefined;
  const source: EgressPolicySource = {
    policyForPodIp: (ip) => (ip === net.clientIp ? policy : undefined),
    sandboxForPodIp: (ip) => (ip === net.clientIp ? sandboxId : undefined),
  };
  const registry = new Registry();
  const metrics = createEgressMetrics(registry);
  const authz = await EgressAuthzServer.start({ host: '127.0.0.1', port: 0, source, metrics, log: silentLogger(), ...(opts.credentials === undefined ? {} : { credentials: opts.credentials }) });
  t.after(() => authz.close());

  const envoy = new EnvoyProcess({
    stateDir: join(dir, 'envoy'),
    logger: silentLogger(),
    concurrency: 1,
    config: {
      listenPort: 0,
      adminPort: 0,
      // No router in these tests: the edge listener is unused.
      routerAddress: '127.0.0.1:9',
      workers: [],
      egress: { listenAddress: net.gateway, listenPort: 0, authzAddress: `127.0.0.1:${authz.port}` },
    },
  });
  t.after(() => envoy.close());
  const endpoints = await envoy.start();
  if (endpoints.egressPort === undefined) throw new Error('Envoy reports no egress listener');
  await net.redirect({ tcpPort: endpoints.egressPort });

  return {
    net,
    envoy,
    registry,
    publicCa,
    dir,
    sandboxId,
    setPolicy: (p) => {
      policy = p;
    },
    decisions: async (labels) => {
      const metric = await registry.getSingleMetric('asb_egress_decisions_total')?.get();
      let sum = 0;
      for (const v of metric?.values ?? []) {
        const l = v.labels;
        if (l.sandbox === sandboxId && l.rule === labels.rule && l.verdict === labels.verdict && (labels.protocol === undefined || l.protocol === labels.protocol)) sum += v.value;
      }
      return sum;
    },
  };
}
