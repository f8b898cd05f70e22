// The web console's files, served by the hub at /console/ without a key (the page logs in with
// one and sends it on every API call). No build step: the files under src/console/ are plain ES
// modules and CSS, and xterm.js comes from the @xterm/xterm npm package, served from
// node_modules at /console/vendor/ (no CDN: the console works on a hub with no internet access).
//
// Only the files listed here are served, read once and kept in memory (~400 KB, mostly xterm.js),
// so no request path ever reaches the file system.
import { readFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

export const CONSOLE_PATH = '/console';

const consoleDir = join(import.meta.dirname, '..', 'console');
const xtermDir = dirname(createRequire(import.meta.url).resolve('@xterm/xterm/package.json'));

/** URL path under /console/ → file on disk and content type. */
const FILES: Readonly<Record<string, { path: string; type: string }>> = {
  '/': { path: join(consoleDir, 'index.html'), type: 'text/html; charset=utf-8' },
  '/app.js': { path: join(consoleDir, 'app.js'), type: 'text/javascript; charset=utf-8' },
  '/api.js': { path: join(consoleDir, 'api.js'), type: 'text/javascript; charset=utf-8' },
  '/terminal.js': { path: join(consoleDir, 'terminal.js'), type: 'text/javascript; charset=utf-8' },
  '/style.css': { path: join(consoleDir, 'style.css'), type: 'text/css; charset=utf-8' },
  '/vendor/xterm.mjs': { path: join(xtermDir, 'lib', 'xterm.mjs'), type: 'text/javascript; charset=utf-8' },
  '/vendor/xterm.css': { path: join(xtermDir, 'css', 'xterm.css'), type: 'text/css; charset=utf-8' },
};

/**
 * Scripts and styles from the hub only; xterm.js sets inline styles on its elements. WebSockets
 * and fetches go to the hub itself ('self' covers ws: to the same host in current browsers).
 */
const CSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

export function isConsolePath(path: string): boolean {
  return path === CONSOLE_PATH || path.startsWith(`${CONSOLE_PATH}/`);
}

export interface ConsoleFiles {
  handle(req: IncomingMessage, res: ServerResponse): void;
}

/** Reads every console file now, so a missing one fails the hub's start, not a user's page. */
export function loadConsoleFiles(): ConsoleFiles {
  const loaded = new Map(Object.entries(FILES).map(([path, f]) => [path, { type: f.type, body: readFileSync(f.path) }]));
  return {
    handle(req, res) {
      const path = new URL(req.url ?? '/', 'http://hub.invalid').pathname;
      if (path === CONSOLE_PATH) {
        res.writeHead(308, { location: `${CONSOLE_PATH}/`, 'content-length': 0 });
        res.end();
        return;
      }
      const file = loaded.get(path.slice(CONSOLE_PATH.length));
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' });
        res.end('the console is read with GET\n');
        return;
      }
      if (file === undefined) {
        res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' });
        res.end(`no such console file: ${path}; the console is at ${CONSOLE_PATH}/\n`);
        return;
      }
      res.writeHead(200, { 'content-type': file.type, 'content-length': file.body.byteLength, 'cache-control': 'no-cache', 'content-security-policy': CSP, 'x-content-type-options': 'nosniff' });
      res.end(req.method === 'HEAD' ? undefined : file.body);
    },
  };
}
