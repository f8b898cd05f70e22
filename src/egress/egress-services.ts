// The worker's half of the egress proxy, composed: the decision service (ext_authz, for the
// cluster Envoy's `egress` listener), the sandboxes' DNS resolver on the bridge gateway, the
// memory of what it answered, the memory of the connections it allowed (closed when a policy
// change forbids them: proxy-cut.ts), and the egress CA with a certificate per credential host.
// Closed in the reverse order: resolver, then decision service (Envoy fails closed meanwhile).
import type { Registry } from 'prom-client';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { createEgressMetrics, EgressAuthzServer } from './authz-service.ts';
import type { CredentialStore } from './credential-store.ts';
import { interceptedHosts } from './credentials.ts';
import { DnsResolver, systemUpstream, type DnsUpstream } from './dns-resolver.ts';
import { ensureEgressCa, ensureHostCertificate, type HostCertificate } from './egress-ca.ts';
import { writeEgressLds } from '../edge/envoy-config.ts';
import { privateDir } from '../base/private-files.ts';
import { dirname } from 'node:path';
import type { EgressPolicySource } from './egress-decision.ts';
import { ResolvedAddresses } from './resolved-addresses.ts';
import { ProxyCut } from './proxy-cut.ts';
import type { CheckAttributes } from './authz-codec.ts';
import type { EgressFloor } from '../network/egress-floor.ts';

export interface EgressServicesOptions {
  /** The pods' gateway: the resolver listens on it (port 53). */
  gateway: string;
  source: EgressPolicySource;
  credentials: CredentialStore;
  /** Where the egress CA and host certificates live (0700). */
  caDir: string;
  registry: Registry;
  log: Logger;
  clock: Clock;
  /** Default 53. */
  dnsPort?: number;
  /** The decision service's port on 127.0.0.1; 0 (default) picks one. Fixed, a restarted worker is where Envoy expects it. */
  authzPort?: number;
  /** Default: the node's resolvers. */
  upstream?: DnsUpstream;
  /** Addresses no policy opens (src/network/egress-floor.ts); default DEFAULT_FLOOR. */
  floor?: EgressFloor;
  /**
   * Serve Envoy's egress listener from this LDS file (EdgeConfigOptions.egress.ldsPath), on
   * listenPort of the gateway: written at start and rewritten whenever a credential rule
   * changes, so a rule for a new host intercepts the next connection with no Envoy restart.
   */
  lds?: { path: string; listenPort: number };
  /**
   * The egress listener's port on the gateway (default lds.listenPort): when known, a policy
   * change the source reports (onPolicyChange) closes the pod's proxied connections the new
   * policy denies (proxy-cut.ts).
   */
  proxyPort?: number;
}

export interface EgressServices {
  /** `host:port` of the decision service (Envoy's asb-egress-authz cluster). */
  authzAddress: string;
  /** The hosts whose TLS the proxy terminates now, with their certificates (EdgeConfigOptions.egress.intercept). */
  intercept: HostCertificate[];
  /** The egress CA certificate sandboxes must trust. */
  caCertPath: string;
  /** The LDS file, when asked for (EdgeConfigOptions.egress.ldsPath). */
  ldsPath: string | undefined;
  close(): Promise<void>;
}

export async function startEgressServices(o: EgressServicesOptions): Promise<EgressServices> {
  const resolved = new ResolvedAddresses(o.clock);
  const ca = await ensureEgressCa(o.caDir);
  const intercept = await Promise.all(interceptedHosts(o.credentials.listRules()).map((h) => ensureHostCertificate(ca, h)));
  const inputs = {
    source: o.source,
    credentials: o.credentials,
    resolved: (pod: string, name: string, ip: string) => resolved.has(pod, name, ip),
    ...(o.floor === undefined ? {} : { floor: o.floor }),
  };
  const proxyPort = o.proxyPort ?? o.lds?.listenPort;
  const log = o.log.child({ component: 'egress-authz' });
  const proxyCut = proxyPort === undefined ? undefined : new ProxyCut({ gateway: o.gateway, proxyPort, inputs, log });
  const authz = await EgressAuthzServer.start({
    host: '127.0.0.1',
    port: o.authzPort ?? 0,
    ...inputs,
    metrics: createEgressMetrics(o.registry),
    log,
    ...(proxyCut === undefined ? {} : { onAllowed: (check: CheckAttributes) => proxyCut.allowed(check) }),
  });
  const stopCutting =
    proxyCut === undefined || o.source.onPolicyChange === undefined
      ? () => undefined
      : o.source.onPolicyChange(async (podIp) => {
          const ports = await proxyCut.cut(podIp);
          if (ports.length > 0) log.info({ podIp, sourcePorts: ports }, 'closed proxied connections the new egress policy forbids');
        });
  const dns = new DnsResolver({
    source: o.source,
    upstream: o.upstream ?? systemUpstream(),
    registry: o.registry,
    log: o.log.child({ component: 'egress-dns' }),
    onAnswer: (pod, name, ips, ttl) => resolved.record(pod, name, ips, ttl),
    ...(o.floor === undefined ? {} : { floor: o.floor }),
  });
  try {
    await dns.listen(o.gateway, o.dnsPort ?? 53);
  } catch (err) {
    await authz.close();
    throw err;
  }
  const authzAddress = `127.0.0.1:${authz.port}`;
  let unsubscribe = (): void => undefined;
  let writing = Promise.resolve();
  const lds = o.lds;
  if (lds !== undefined) {
    privateDir(dirname(lds.path));
    const write = (hosts: HostCertificate[]): void => writeEgressLds(lds.path, { listenAddress: o.gateway, listenPort: lds.listenPort, authzAddress, intercept: hosts, ldsPath: lds.path });
    write(intercept);
    // One rewrite at a time, in the order of the changes; a failure is logged and the next change tries again.
    const rewrite = async (): Promise<void> => write(await Promise.all(interceptedHosts(o.credentials.listRules()).map((h) => ensureHostCertificate(ca, h))));
    unsubscribe = o.credentials.onChange(() => {
      writing = writing.then(rewrite).catch((err: unknown) => o.log.error({ err }, 'cannot rewrite the egress listener: a new credential host is not intercepted yet'));
    });
  }
  return {
    authzAddress,
    intercept,
    caCertPath: ca.caCertPath,
    ldsPath: lds?.path,
    async close() {
      stopCutting();
      unsubscribe();
      await writing;
      await dns.close();
      await authz.close();
    },
  };
}
