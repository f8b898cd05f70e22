// A container registry on loopback: Debian's `docker-registry` (distribution 2.8) as a child
// process, with our own configuration (Debian's default listens on :5000 on every interface with
// htpasswd auth). These machines reach no public registry, so `make up` and the tests run this
// one and seed it with the images scripts/build-images.sh made (seed.ts); the worker pulls from
// it as a mirror of docker.io (registries.ts).
//
// Files under stateDir: registry.yml (generated), registry.log (its log, appended), data/ (the
// blobs and manifests; kept across restarts unless the caller removes it).
// Port 0 works: the registry logs "listening on 127.0.0.1:<port>" once bound, and start() reads
// the port from there, then waits until GET /v2/ answers 200.
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, fstatSync, openSync, readSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AsbError } from '../errors.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import type { Logger } from '../base/log.ts';
import { openPrivateLog, privateDir } from '../base/private-files.ts';
import { WatchedProcess } from '../base/watched-process.ts';

export const REGISTRY_BINARY = '/usr/bin/docker-registry';

export interface RegistryProcessOptions {
  stateDir: string;
  logger: Logger;
  /** Loopback port; 0 (default) lets the kernel choose, and a restart keeps the chosen one. */
  port?: number;
  clock?: Clock;
  binary?: string;
  /** How long start() waits for /v2/; default 10 s (ready in well under 1 s here). */
  readyTimeoutMs?: number;
  /** How long close() waits after SIGTERM before SIGKILL; default 5 s. */
  stopTimeoutMs?: number;
  onUnexpectedExit?: (code: number | null, signal: NodeJS.Signals | null) => void;
  /** In a process group of its own, so a Ctrl-C to ours does not reach it (make up stops it in order). */
  ownGroup?: boolean;
  /**
   * An htpasswd file (bcrypt entries) to require basic auth, as a private registry does; default
   * none. Over plain HTTP on loopback only: what tests of pull credentials need.
   */
  htpasswdPath?: string;
  /** Blobs and manifests here instead of <stateDir>/data (several registries may serve one store read-only). */
  dataDir?: string;
}

const POLL_MS = 20;

export class RegistryProcess {
  readonly #opts: RegistryProcessOptions;
  readonly #clock: Clock;
  readonly #log: Logger;
  #port: number;
  #proc: WatchedProcess | undefined;
  #closed = false;
  #address: string | undefined;

  constructor(opts: RegistryProcessOptions) {
    this.#opts = opts;
    this.#clock = opts.clock ?? systemClock;
    this.#log = opts.logger.child({ component: 'registry' });
    this.#port = opts.port ?? 0;
  }

  get configPath(): string {
    return join(this.#opts.stateDir, 'registry.yml');
  }

  get logPath(): string {
    return join(this.#opts.stateDir, 'registry.log');
  }

  get dataDir(): string {
    return this.#opts.dataDir ?? join(this.#opts.stateDir, 'data');
  }

  /** `127.0.0.1:<port>` once started: what a reference or a mirror names. */
  get address(): string {
    if (this.#address === undefined) throw new AsbError('Unavailable', 'the registry has not been started');
    return this.#address;
  }

  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  get running(): boolean {
    return this.pid !== undefined;
  }

  /** Starts the registry; resolves with its address once /v2/ answers 200. */
  async start(): Promise<string> {
    if (this.#closed) throw new AsbError('Unavailable', 'the registry process is closed');
    if (this.running) throw new AsbError('Conflict', 'the registry is already running');
    const binary = this.#opts.binary ?? REGISTRY_BINARY;
    if (!existsSync(binary)) {
      throw new AsbError('Unavailable', `${binary} is missing: install Debian's docker-registry package (make test and make up do, through scripts/bootstrap.sh)`);
    }
    privateDir(this.#opts.stateDir);
    privateDir(this.dataDir);
    writeFileSync(`${this.configPath}.tmp`, registryConfigYaml(this.dataDir, this.#port, this.#opts.htpasswdPath), { mode: 0o600 });
    renameSync(`${this.configPath}.tmp`, this.configPath);

    const logFd = openPrivateLog(this.logPath);
    const logStart = fstatSync(logFd).size;
    // It dies with us even if we are SIGKILLed (watched-process.ts). A clean env: the registry
    // reads REGISTRY_* variables as configuration overrides.
    const proc = new WatchedProcess({
      name: 'registry',
      binary,
      args: ['serve', this.configPath],
      logFd,
      logPath: this.logPath,
      log: this.#log,
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
      ownGroup: this.#opts.ownGroup === true,
      onUnexpectedExit: this.#opts.onUnexpectedExit,
    });
    this.#proc = proc;
    const child = proc.child;
    try {
      this.#address = await this.#waitReady(child, logStart, () => proc.spawnError);
    } catch (err) {
      await this.#stop(proc);
      throw err;
    }
    this.#port = Number(this.#address.slice(this.#address.lastIndexOf(':') + 1));
    this.#log.info({ pid: child.pid, address: this.#address }, 'registry ready');
    return this.#address;
  }

  /** SIGTERM, SIGKILL after stopTimeoutMs; resolves when it has exited. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#proc !== undefined) await this.#stop(this.#proc);
  }

  /** Stops it and starts it again on the same port (its data stays). */
  async restart(): Promise<string> {
    if (this.#proc !== undefined) await this.#stop(this.#proc);
    return this.start();
  }

  /** Stops it from keeping this process's event loop alive (it still dies with this process). */
  unref(): void {
    this.#proc?.child.unref();
  }

  /** Kills it at once. Idempotent. */
  destroy(): void {
    this.#closed = true;
    void this.#proc?.kill('SIGKILL');
  }

  #stop(proc: WatchedProcess): Promise<void> {
    return proc.stop(this.#clock, this.#opts.stopTimeoutMs ?? 5000, this.#log);
  }

  async #waitReady(child: ChildProcess, logStart: number, spawnError: () => Error | undefined): Promise<string> {
    const timeoutMs = this.#opts.readyTimeoutMs ?? 10_000;
    const deadline = this.#clock.now() + timeoutMs;
    let address: string | undefined;
    let lastProblem = 'no "listening on" line in its log yet';
    for (;;) {
      const failed = spawnError();
      if (failed !== undefined) throw new AsbError('Unavailable', `the registry could not be started: ${failed.message}`, { cause: failed });
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new AsbError('Unavailable', `the registry exited (${child.signalCode ?? `code ${child.exitCode ?? '?'}`}) before it was ready; ${this.logPath} ends with:\n${readFrom(this.logPath, logStart).split('\n').slice(-10).join('\n')}`);
      }
      address ??= /msg="listening on (127\.0\.0\.1:\d+)"/.exec(readFrom(this.logPath, logStart))?.[1];
      if (address !== undefined) {
        try {
          const res = await fetch(`http://${address}/v2/`, { signal: AbortSignal.timeout(1000) });
          await res.body?.cancel();
          // With htpasswd, 401 and the API version header is the registry answering.
          if (res.status === 200 || (res.status === 401 && res.headers.get('docker-distribution-api-version') === 'registry/2.0')) return address;
          lastProblem = `GET /v2/ answered ${res.status}`;
        } catch (err) {
          lastProblem = `GET /v2/: ${(err as Error).message}`;
        }
      }
      if (this.#clock.now() >= deadline) throw new AsbError('Timeout', `the registry was not ready within ${timeoutMs} ms (${lastProblem}); see ${this.logPath}`);
      await new Promise<void>((resolveDelay) => this.#clock.after(POLL_MS, resolveDelay));
    }
  }
}

/** The registry's configuration: loopback only, no auth unless htpasswd, deletes allowed (so tests and GC can remove tags). */
export function registryConfigYaml(dataDir: string, port: number, htpasswdPath?: string): string {
  // JSON is YAML; quoting every value keeps a path with spaces or colons intact.
  const config = {
    version: 0.1,
    log: { level: 'info', formatter: 'text', accesslog: { disabled: true } },
    storage: { filesystem: { rootdirectory: dataDir }, delete: { enabled: true }, cache: { blobdescriptor: 'inmemory' } },
    // A fresh random secret per start: it signs upload state, and only this process serves uploads.
    http: { addr: `127.0.0.1:${port}`, secret: randomBytes(16).toString('hex') },
    ...(htpasswdPath === undefined ? {} : { auth: { htpasswd: { realm: 'agent-sandbox', path: htpasswdPath } } }),
  };
  return `${JSON.stringify(config, null, 2)}\n`;
}

function readFrom(path: string, from: number): string {
  try {
    const fd = openSync(path, 'r');
    try {
      const size = fstatSync(fd).size;
      const start = Math.max(from, size - 65_536);
      const buf = Buffer.alloc(Math.max(0, size - start));
      readSync(fd, buf, 0, buf.length, start);
      return buf.toString('utf8');
    } finally {
      closeSync(fd);
    }
  } catch {
    return '';
  }
}
