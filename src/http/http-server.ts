// Small pieces every HTTP-serving process of ours (worker, hub) shares.
import { readFileSync } from 'node:fs';
import type { Server } from 'node:http';

/** Listens on host:port; rejects with the bind error (EADDRINUSE, EACCES) instead of throwing later. */
export function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/** The version in package.json, reported by /v1/status. */
export function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: unknown };
  return typeof pkg.version === 'string' ? pkg.version : 'unknown';
}
