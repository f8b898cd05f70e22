// The route feed's HTTP endpoint (the feed itself is feed.ts): the HTTP server's 'upgrade'
// listener that admits routers' WebSockets, and the answer to a plain GET of the feed's path.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type WebSocket } from 'ws';
import { AsbError } from '../../errors.ts';
import type { Logger } from '../../base/log.ts';
import type { Authenticator } from '../../auth/keyring.ts';
import { requireAdmin } from '../access.ts';
import { AUTH_HINT, presentedKey } from '../../http/presented-key.ts';
import { refuseUpgrade } from '../../http/problem.ts';
import type { Route } from '../../http/router.ts';
import { CLOSE, type RouteFeed } from './feed.ts';

export const ROUTE_FEED_PATH = '/v1/routes/feed';
// Routers send nothing but pongs; a larger frame is a misbehaving client.
const MAX_INBOUND_FRAME_BYTES = 4096;

export interface FeedUpgradeOptions {
  feed: RouteFeed;
  auth: Authenticator;
  log: Logger;
}

/**
 * The HTTP server's 'upgrade' listener: accepts WebSockets on /v1/routes/feed from admin keys and
 * answers anything else with a problem+json response before upgrading (401 no or bad key, 403 not
 * admin, 404 other paths). A feed whose key is revoked (or loses admin) is closed with 1008, and
 * its router's reconnect is refused. Returns a close function that stops accepting upgrades.
 */
export function createFeedUpgrade(opts: FeedUpgradeOptions): { handle: (req: IncomingMessage, socket: Duplex, head: Buffer) => void; close: () => void } {
  const wss = new WebSocketServer({ noServer: true, maxPayload: MAX_INBOUND_FRAME_BYTES });
  let closed = false;
  /** Open feeds → the prefix of the key that opened each. */
  const opened = new Map<WebSocket, string>();
  const unwatchKeys = opts.auth.onRevoked((prefix) => {
    for (const [ws, by] of opened) if (by === prefix) ws.close(CLOSE.policy, 'the API key that opened this feed was revoked');
  });
  const handle = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    socket.on('error', (err) => opts.log.debug({ err }, 'upgrade socket error'));
    let prefix: string;
    try {
      if (closed) throw new AsbError('Unavailable', 'the worker is shutting down; reconnect to another worker or retry shortly');
      const path = new URL(req.url ?? '/', 'http://worker.invalid').pathname;
      if (path !== ROUTE_FEED_PATH) throw new AsbError('NotFound', `no WebSocket endpoint at ${path}; the route feed is at ${ROUTE_FEED_PATH}`);
      if (req.method !== 'GET') throw new AsbError('MethodNotAllowed', `${req.method ?? ''} is not allowed on ${path}; use GET with Upgrade: websocket`);
      const key = presentedKey(req);
      if (key === undefined) throw new AsbError('Unauthorized', `no API key: ${AUTH_HINT}`);
      const principal = opts.auth.verify(key);
      if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown or revoked; ${AUTH_HINT}`);
      if (!principal.admin) throw new AsbError('Forbidden', `the route feed needs an admin API key; key ${principal.prefix} of team "${principal.team}" is not one`);
      prefix = principal.prefix;
    } catch (err) {
      refuseUpgrade(socket, err instanceof AsbError ? err : new AsbError('Internal', 'internal error; the worker log has the details', { cause: err }));
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      opened.set(ws, prefix);
      ws.once('close', () => opened.delete(ws));
      opts.feed.attach(ws);
      // Revoked while the handshake ran: the listener above did not see this socket yet.
      if (!opts.auth.live(prefix)) ws.close(CLOSE.policy, 'the API key that opened this feed was revoked');
    });
  };
  return {
    handle,
    close: () => {
      if (closed) return;
      closed = true;
      unwatchKeys();
      wss.close();
    },
  };
}

/** A plain GET (no Upgrade header) of the feed: an admin gets 400 naming what to do, others 401/403 as usual. */
export function feedRoutes(): Route[] {
  return [
    {
      method: 'GET',
      pattern: ROUTE_FEED_PATH,
      handler: (ctx) => {
        requireAdmin(ctx, 'the route feed');
        return Promise.reject(new AsbError('BadRequest', `${ROUTE_FEED_PATH} is a WebSocket endpoint: connect with "Upgrade: websocket" (messages are described in src/router/contract.ts)`));
      },
    },
  ];
}
