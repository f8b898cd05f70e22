// How the E2B routes authenticate and fail. The E2B SDK reads failures from a JSON body
// `{code, message}` with the HTTP status as a number in `code` (it detects "not found" from
// `body.code === 404` and "already paused" from `body.code === 409`, not from the status line),
// so these routes cannot use the pipeline's problem+json. Each E2B route is registered with
// `auth: false` and authenticates here instead, so a missing or unknown key is a
// `{code: 401}` body as well.
import type { Principal } from '../../auth/keyring.ts';
import { AsbError } from '../../errors.ts';
import type { Authenticator } from '../../auth/keyring.ts';
import { toAsbError } from '../../http/problem.ts';
import { AUTH_HINT, presentedKey } from '../../http/presented-key.ts';
import type { Method, Reply, RequestContext, Route } from '../../http/router.ts';

/** The error body every E2B API failure carries. */
export interface E2bError {
  code: number;
  message: string;
}

/**
 * The HTTP status E2B uses for one of our errors: E2B answers every invalid request with 400,
 * where our API distinguishes 422 (a field is wrong) from 400 (the request is malformed).
 */
function e2bStatus(err: AsbError): number {
  return err.code === 'Invalid' ? 400 : err.status;
}

export function e2bErrorReply(err: AsbError): Reply {
  const status = e2bStatus(err);
  const body: E2bError = { code: status, message: err.message };
  return { status, json: body, errorCode: err.code, ...(status === 401 ? { headers: { 'www-authenticate': 'Bearer realm="e2b"' } } : {}) };
}

/** A request context whose principal is set: what E2B handlers get. */
export type AuthedContext = RequestContext & { principal: Principal };

/**
 * An E2B route: authenticated with our API keys (`X-API-KEY`, as the SDK sends it, or
 * `Authorization: Bearer`), every failure answered as `{code, message}`. `server` names whose
 * keys they are in messages: the worker's, or the hub's for the creates and lists it serves.
 */
export function e2bRoute(auth: Authenticator, method: Method, pattern: string, handler: (ctx: AuthedContext) => Promise<Reply>, server: 'worker' | 'hub' = 'worker'): Route {
  return {
    method,
    pattern,
    auth: false,
    handler: async (ctx) => {
      try {
        const key = presentedKey(ctx.req);
        if (key === undefined) throw new AsbError('Unauthorized', `no API key: set apiKey (E2B_API_KEY) to an API key of this ${server}, or ${AUTH_HINT}`);
        const principal = auth.verify(key);
        if (principal === undefined) throw new AsbError('Unauthorized', `the API key is unknown to the ${server} or revoked (or not of the form asb_<8 chars>_<32 chars>); E2B keys do not work here: use an API key of this installation`);
        return await handler({
          req: ctx.req,
          params: ctx.params,
          query: ctx.query,
          principal,
          get log() {
            return ctx.log;
          },
        });
      } catch (err) {
        const asb = toAsbError(err);
        if (asb.code === 'Internal') ctx.log.error({ err, method: ctx.req.method, url: ctx.req.url }, 'E2B request failed');
        return e2bErrorReply(asb);
      }
    },
  };
}
