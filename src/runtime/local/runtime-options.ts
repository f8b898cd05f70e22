// What createLocalRuntime (local-runtime.ts) is given, in a module of its own: the runtime's parts
// read it through their context (runtime-context.ts) without importing the runtime.
import type { Logger } from '../../base/log.ts';
import type { Clock } from '../../base/clock.ts';
import type { ImageStore } from '../../images/image-store.ts';
import type { ConnectionLimits } from '../../network/connection-limits.ts';
import type { EgressFloor } from '../../network/egress-floor.ts';

export interface LocalRuntimeOptions {
  /** State dir, e.g. .asb/data/runtime: pods/, volumes/, runc/ and the compiled shim live here. */
  root: string;
  log: Logger;
  /** The image cache pods' images are pulled into (may be shared by several runtimes). */
  images: ImageStore;
  /** The runc binary; default: the one `make runc` builds (findRuncBinary). */
  runc?: string;
  /** gVisor's runsc for pods with runtimeClassName gvisor; default: the one `make runsc` builds (findRunscBinary). Without it such pods fail. */
  runsc?: string;
  /** CRIU, for runc pods that keep their memory; default: the one `make criu` builds (findCriuBinary). Without it they refuse with NotImplemented. */
  criu?: string;
  /** The image of a container that names none (`image:` empty, as kubernetes-sigs' getting-started example). */
  defaultImage?: string;
  clock?: Clock;
  /** Pod subnet; the bridge takes its first address. Default: derived from root (src/runtime/local/derived-network.ts). */
  subnet?: string;
  /** Host bridge name (≤ 15 bytes); distinct per worker or test run. Default: derived from root. */
  bridge?: string;
  /** Host-wide directory of bridge and subnet claims (network-claim.ts). Default /run/asb/networks */
  claimsDir?: string;
  /**
   * Host-wide pool of user-namespace id ranges, one per sandbox (id-ranges.ts); every runtime on
   * the host must share it. Default /var/lib/asb/id-ranges (kept across reboots, like the pods).
   */
  idRangesDir?: string;
  /** Readiness probe period when a probe sets no periodSeconds. Default 1000 ms. */
  probeIntervalMs?: number;
  /** How often to check the init of an adopted pod (one we did not spawn). Default 500 ms. */
  pollIntervalMs?: number;
  /** stop(): SIGTERM, then SIGKILL after this long. Default 2000 ms. */
  stopGraceMs?: number;
  /** Mount points' parent (must be walkable by the user namespace). Default /run/asb/rootfs/<hash of root>. */
  mountRoot?: string;
  /**
   * The egress proxy listening on the bridge's gateway address: pods' outbound TCP that the
   * address rules do not decide is DNAT'ed to it (src/network/nft-ruleset.ts). Absent: direct.
   */
  egressProxy?: { port: number };
  /** Pods may query a DNS resolver on the gateway (UDP and TCP 53). Default false: no host port is open to pods. */
  podDns?: boolean;
  /** Addresses no pod reaches whatever its policy (src/network/egress-floor.ts). Default DEFAULT_FLOOR: cloud metadata. */
  egressFloor?: EgressFloor;
  /**
   * Each pod's bounds on the proxy, the resolver and forwarded flows: connections open at once
   * and new ones a second (src/network/connection-limits.ts). Default DEFAULT_CONNECTION_LIMITS.
   */
  connectionLimits?: ConnectionLimits;
  /**
   * PEM file of a CA every pod trusts besides its image's (the cluster's egress CA, whose
   * certificates the egress proxy serves for credential-injection hosts): appended to each pod's
   * /etc/ssl/certs/ca-certificates.crt at start. Read once, here.
   */
  extraCaPath?: string;
}
