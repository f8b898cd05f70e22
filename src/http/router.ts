// Routes are data: a method, a path pattern with {params}, and a handler that returns a Reply.
// The pattern (not the raw path) labels metrics, so a million sandbox ids stay one series.
import type { IncomingMessage } from 'node:http';
import type { Principal } from '../auth/keyring.ts';
import { AsbError, type ErrorCode } from '../errors.ts';
import type { Logger } from '../base/log.ts';

export type Method = 'GET' | 'PUT' | 'POST' | 'DELETE' | 'PATCH';

export interface RequestContext {
  req: IncomingMessage;
  params: Readonly<Record<string, string>>;
  query: URLSearchParams;
  /** Undefined only on routes with `auth: false`. */
  principal: Principal | undefined;
  log: Logger;
}

export type Reply =
  /** errorCode: the failure this JSON answers, for routes that answer errors in their own shape (E2B's), counted as the pipeline counts its own. */
  | { status: number; json: unknown; headers?: Record<string, string>; errorCode?: ErrorCode }
  | { status: number; bytes: Uint8Array; contentType: string; headers?: Record<string, string> }
  | { status: 204 };

export interface Route {
  method: Method;
  /** e.g. /v1/sandboxes/{id}/exec */
  pattern: string;
  /** false: reachable without an API key (only /healthz). */
  auth?: boolean;
  handler: (ctx: RequestContext) => Promise<Reply>;
}

export interface Match {
  route: Route;
  params: Record<string, string>;
}

export type Resolution = { kind: 'match'; match: Match } | { kind: 'method'; pattern: string; allow: Method[] } | { kind: 'none' };

interface Compiled {
  route: Route;
  segments: string[];
}

export interface Router {
  resolve(method: string, path: string): Resolution;
  readonly routes: readonly Route[];
}

function matchSegments(segments: readonly string[], parts: readonly string[]): Record<string, string> | undefined {
  if (segments.length !== parts.length) return undefined;
  const params: Record<string, string> = {};
  for (const [i, seg] of segments.entries()) {
    const part = parts[i] ?? '';
    if (seg.startsWith('{') && seg.endsWith('}')) {
      if (part === '') return undefined;
      let decoded: string;
      try {
        decoded = decodeURIComponent(part);
      } catch {
        throw new AsbError('BadRequest', `path segment "${part}" is not valid percent-encoding`);
      }
      params[seg.slice(1, -1)] = decoded;
    } else if (seg !== part) {
      return undefined;
    }
  }
  return params;
}

export function createRouter(routes: readonly Route[]): Router {
  const compiled: Compiled[] = routes.map((route) => ({ route, segments: route.pattern.split('/').slice(1) }));
  const seen = new Set<string>();
  for (const r of routes) {
    const key = `${r.method} ${r.pattern}`;
    if (seen.has(key)) throw new Error(`route registered twice: ${key}`);
    seen.add(key);
  }
  return {
    routes,
    resolve(method, path) {
      const parts = path.split('/').slice(1);
      const allow: Method[] = [];
      let pattern = '';
      for (const c of compiled) {
        const params = matchSegments(c.segments, parts);
        if (params === undefined) continue;
        if (c.route.method === method) return { kind: 'match', match: { route: c.route, params } };
        allow.push(c.route.method);
        pattern = c.route.pattern;
      }
      return allow.length > 0 ? { kind: 'method', pattern, allow } : { kind: 'none' };
    },
  };
}
