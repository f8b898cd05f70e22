// An Envoy child process: writes the generated configuration under a state directory, starts
// Envoy, waits until the admin API says /ready, and stops it (SIGTERM, then SIGKILL). It can be
// restarted on the same ports, and killed to simulate a crash and started again.
//
// Files under stateDir: envoy.yaml (the generated config), envoy.log (Envoy's own log, appended
// across restarts), access.log (one JSON line per request unless config.accessLogPath says
// otherwise), admin.address (written by Envoy once its admin listener is bound).
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { AsbError } from '../errors.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { openPrivateLog, privateDir, privateFile } from '../base/private-files.ts';
import { WatchedProcess } from '../base/watched-process.ts';
import { EDGE_TLS_LISTENER, edgeConfigYaml, EGRESS_LISTENER, INGRESS_LISTENER, type EdgeConfigOptions } from './envoy-config.ts';
import { findEnvoyBinary } from './envoy-binary.ts';

export interface EnvoyProcessOptions {
  /** Directory for the generated config, the admin address file and the logs. */
  stateDir: string;
  /** What to generate; ports may be 0 (chosen by the kernel, kept across restarts). */
  config: EdgeConfigOptions;
  logger: Logger;
  clock?: Clock;
  /** Envoy binary; default: the one in .venv/ (findEnvoyBinary). */
  binary?: string;
  /** Worker threads; default Envoy's (one per core). */
  concurrency?: number;
  /** Envoy's log level (trace…critical, off); default info: start-up and config problems only. */
  logLevel?: string;
  /** How long start() waits for /ready; default 20 s (Envoy is ready in ~0.3 s here; slow CI disks). */
  readyTimeoutMs?: number;
  /** How long close() waits after SIGTERM before SIGKILL; default 5 s. */
  stopTimeoutMs?: number;
  /** Called when Envoy exits without being asked to. */
  onUnexpectedExit?: (code: number | null, signal: NodeJS.Signals | null) => void;
  /** In a process group of its own, so a signal to ours does not reach it (make up stops it in order). */
  ownGroup?: boolean;
}

export interface EnvoyEndpoints {
  /** http://127.0.0.1:<port> of the edge listener. */
  edgeUrl: string;
  edgePort: number;
  adminUrl: string;
  adminPort: number;
  /** The static comparison listener, when config.static was given. */
  staticUrl?: string;
  staticPort?: number;
  /** https://127.0.0.1:<port> of the HTTPS edge listener, when config.edgeTls was given. */
  edgeTlsUrl?: string;
  edgeTlsPort?: number;
  /** `host:port` of the ingress listener (mutual TLS, so no URL), when config.ingress was given: what other clusters are told. */
  ingressAddress?: string;
  ingressPort?: number;
  /** The egress listener's port, when config.egress was given (the kernel redirects pods' TCP there). */
  egressPort?: number;
}

const POLL_MS = 20;

export class EnvoyProcess {
  readonly #opts: EnvoyProcessOptions;
  readonly #clock: Clock;
  readonly #log: Logger;
  #config: EdgeConfigOptions;
  #proc: WatchedProcess | undefined;
  #closed = false;
  #endpoints: EnvoyEndpoints | undefined;

  constructor(opts: EnvoyProcessOptions) {
    this.#opts = opts;
    this.#clock = opts.clock ?? systemClock;
    this.#log = opts.logger.child({ component: 'envoy' });
    this.#config = { ...opts.config, accessLogPath: opts.config.accessLogPath ?? join(opts.stateDir, 'access.log') };
  }

  get configPath(): string {
    return join(this.#opts.stateDir, 'envoy.yaml');
  }

  get logPath(): string {
    return join(this.#opts.stateDir, 'envoy.log');
  }

  get accessLogPath(): string {
    return this.#config.accessLogPath ?? join(this.#opts.stateDir, 'access.log');
  }

  /** Envoy's pid while it runs. */
  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  get running(): boolean {
    return this.pid !== undefined;
  }

  /** Addresses of the last successful start. */
  get endpoints(): EnvoyEndpoints {
    if (this.#endpoints === undefined) throw new AsbError('Unavailable', 'Envoy has not been started');
    return this.#endpoints;
  }

  /** Starts Envoy and resolves once /ready answers 200; rejects (with the log's tail) if it exits first or is not ready in time. */
  async start(): Promise<EnvoyEndpoints> {
    if (this.#closed) throw new AsbError('Unavailable', 'Envoy process is closed');
    if (this.running) throw new AsbError('Conflict', 'Envoy is already running');
    const binary = this.#opts.binary ?? findEnvoyBinary();
    // 0700 / 0600 (src/base/private-files.ts): the access log names every sandbox host and
    // client address. Envoy opens an existing file without changing its mode, so it is made
    // here first; a device (/dev/stdout in production) is left alone.
    privateDir(this.#opts.stateDir);
    const accessLog = this.accessLogPath;
    if (!accessLog.startsWith('/dev/')) privateFile(accessLog);
    const adminAddressPath = join(this.#opts.stateDir, 'admin.address');
    rmSync(adminAddressPath, { force: true });
    const yaml = edgeConfigYaml(this.#config);
    writeFileSync(`${this.configPath}.tmp`, yaml, { mode: 0o600 });
    renameSync(`${this.configPath}.tmp`, this.configPath);

    const args = [
      '-c', this.configPath,
      // Hot restart needs a shared-memory region per base id: two Envoys on one machine (tests,
      // `make up` beside a test run) would collide on base id 0. We restart by stop + start.
      '--disable-hot-restart',
      '--admin-address-path', adminAddressPath,
      '--log-level', this.#opts.logLevel ?? 'info',
      // Envoy flushes file logs every 10 s by default; someone tailing the access log locally
      // (or a test reading it) should see a request within a second.
      '--file-flush-interval-msec', '1000',
      ...(this.#opts.concurrency === undefined ? [] : ['--concurrency', String(this.#opts.concurrency)]),
    ];
    // Dies with us even if we are SIGKILLed (watched-process.ts), so no test run or crashed
    // `make up` leaves an Envoy holding port 10000.
    const proc = new WatchedProcess({
      name: 'envoy',
      binary,
      args,
      logFd: openPrivateLog(this.logPath),
      logPath: this.logPath,
      log: this.#log,
      ownGroup: this.#opts.ownGroup === true,
      onUnexpectedExit: this.#opts.onUnexpectedExit,
    });
    this.#proc = proc;
    const child = proc.child;

    try {
      const adminUrl = await this.#waitReady(child, adminAddressPath, () => proc.spawnError);
      this.#endpoints = await this.#readEndpoints(adminUrl);
    } catch (err) {
      await this.#stop(proc);
      throw err;
    }
    // Keep the chosen ports: a restart comes back where clients (and tests) expect it.
    this.#config = {
      ...this.#config,
      listenPort: this.#endpoints.edgePort,
      adminPort: this.#endpoints.adminPort,
      ...(this.#config.static === undefined || this.#endpoints.staticPort === undefined
        ? {}
        : { static: { ...this.#config.static, listenPort: this.#endpoints.staticPort } }),
      ...(this.#config.ingress === undefined || this.#endpoints.ingressPort === undefined
        ? {}
        : { ingress: { ...this.#config.ingress, listenPort: this.#endpoints.ingressPort } }),
      ...(this.#config.edgeTls === undefined || this.#endpoints.edgeTlsPort === undefined
        ? {}
        : { edgeTls: { ...this.#config.edgeTls, listenPort: this.#endpoints.edgeTlsPort } }),
    };
    this.#log.info({ pid: child.pid, ...this.#endpoints }, 'envoy ready');
    return this.#endpoints;
  }

  /** Stops Envoy gracefully and starts it again on the same ports. */
  async restart(): Promise<EnvoyEndpoints> {
    if (this.#proc !== undefined) await this.#stop(this.#proc);
    return this.start();
  }

  /** Sends a signal to Envoy without stopping supervision (simulate a crash; start() again afterwards). */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    await this.#proc?.kill(signal);
  }

  /** SIGTERM, SIGKILL after stopTimeoutMs; resolves when Envoy has exited. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#proc !== undefined) await this.#stop(this.#proc);
  }

  /** Kills Envoy at once. Idempotent. */
  destroy(): void {
    this.#closed = true;
    void this.#proc?.kill('SIGKILL');
  }

  /** Envoy's counters and gauges (`/stats`), e.g. `http.edge.ext_proc.streams_failed`. */
  async stats(filter?: string): Promise<Map<string, number>> {
    const query = filter === undefined ? '' : `?filter=${encodeURIComponent(filter)}`;
    const text = await adminGet(`${this.endpoints.adminUrl}/stats${query}`);
    const out = new Map<string, number>();
    for (const line of text.split('\n')) {
      const m = /^([^:\s]+): (\d+)$/.exec(line);
      if (m?.[1] !== undefined) out.set(m[1], Number(m[2]));
    }
    return out;
  }

  #stop(proc: WatchedProcess): Promise<void> {
    return proc.stop(this.#clock, this.#opts.stopTimeoutMs ?? 5000, this.#log);
  }

  async #waitReady(child: ChildProcess, adminAddressPath: string, spawnError: () => Error | undefined): Promise<string> {
    const timeoutMs = this.#opts.readyTimeoutMs ?? 20_000;
    const deadline = this.#clock.now() + timeoutMs;
    let lastProblem = 'admin address not written yet';
    for (;;) {
      const failed = spawnError();
      if (failed !== undefined) throw new AsbError('Unavailable', `Envoy could not be started: ${failed.message}`, { cause: failed });
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new AsbError('Unavailable', `Envoy exited (${child.signalCode ?? `code ${child.exitCode ?? '?'}`}) before it was ready; ${this.logPath} ends with:\n${logTail(this.logPath)}`);
      }
      if (existsSync(adminAddressPath)) {
        const adminUrl = `http://${readFileSync(adminAddressPath, 'utf8').trim()}`;
        try {
          const res = await fetch(`${adminUrl}/ready`, { signal: AbortSignal.timeout(1000) });
          await res.body?.cancel();
          if (res.ok) return adminUrl;
          lastProblem = `/ready answered ${res.status}`;
        } catch (err) {
          lastProblem = `/ready: ${(err as Error).message}`;
        }
      }
      if (this.#clock.now() >= deadline) {
        throw new AsbError('Timeout', `Envoy was not ready within ${timeoutMs} ms (${lastProblem}); see ${this.logPath}`);
      }
      await new Promise<void>((resolveDelay) => this.#clock.after(POLL_MS, resolveDelay));
    }
  }

  async #readEndpoints(adminUrl: string): Promise<EnvoyEndpoints> {
    const body = JSON.parse(await adminGet(`${adminUrl}/listeners?format=json`)) as {
      listener_statuses?: { name?: string; local_address?: { socket_address?: { address?: string; port_value?: number } } }[];
    };
    const ports = new Map<string, { address: string; port: number }>();
    for (const status of body.listener_statuses ?? []) {
      const sa = status.local_address?.socket_address;
      if (status.name !== undefined && sa?.port_value !== undefined) ports.set(status.name, { address: sa.address ?? '127.0.0.1', port: sa.port_value });
    }
    const edge = ports.get('edge');
    if (edge === undefined) throw new AsbError('Internal', 'Envoy reports no "edge" listener');
    const adminPort = Number(new URL(adminUrl).port);
    const endpoints: EnvoyEndpoints = { edgeUrl: `http://${hostForUrl(edge.address)}:${edge.port}`, edgePort: edge.port, adminUrl, adminPort };
    const staticListener = ports.get('static');
    if (staticListener !== undefined) {
      endpoints.staticUrl = `http://${hostForUrl(staticListener.address)}:${staticListener.port}`;
      endpoints.staticPort = staticListener.port;
    }
    const edgeTls = ports.get(EDGE_TLS_LISTENER);
    if (edgeTls !== undefined) {
      endpoints.edgeTlsUrl = `https://${hostForUrl(edgeTls.address)}:${edgeTls.port}`;
      endpoints.edgeTlsPort = edgeTls.port;
    }
    const ingress = ports.get(INGRESS_LISTENER);
    if (ingress !== undefined) {
      endpoints.ingressAddress = `${hostForUrl(ingress.address)}:${ingress.port}`;
      endpoints.ingressPort = ingress.port;
    }
    const egress = ports.get(EGRESS_LISTENER);
    if (egress !== undefined) endpoints.egressPort = egress.port;
    return endpoints;
  }
}

/** A wildcard listen address is reached through loopback. */
function hostForUrl(address: string): string {
  if (address === '0.0.0.0') return '127.0.0.1';
  if (address === '::') return '[::1]';
  return address.includes(':') ? `[${address}]` : address;
}

async function adminGet(url: string): Promise<string> {
  let res: Response;
  try {
    res = await fetch(url, { signal: AbortSignal.timeout(5000) });
  } catch (err) {
    throw new AsbError('Unavailable', `Envoy admin ${url}: ${(err as Error).message}`, { cause: err });
  }
  const text = await res.text();
  if (!res.ok) throw new AsbError('Unavailable', `Envoy admin ${url} answered ${res.status}: ${text.slice(0, 200)}`);
  return text;
}

function logTail(path: string): string {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-15).join('\n');
  } catch {
    return '(no log)';
  }
}
