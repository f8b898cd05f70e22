// Errors leave the worker as RFC 9457 problem details (application/problem+json). The `code` is
// the stable ErrorCode clients switch on; `detail` is a sentence a user can act on.
import { STATUS_CODES, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { AsbError, ERRORS, type ErrorCode, type FieldProblem } from '../errors.ts';

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: ErrorCode;
  fields?: FieldProblem[];
}

export function problemOf(err: AsbError): Problem {
  const problem: Problem = {
    type: `urn:asb:problem:${err.code}`,
    title: ERRORS[err.code].title,
    status: err.status,
    detail: err.message,
    code: err.code,
  };
  if (err.fields.length > 0) problem.fields = [...err.fields];
  return problem;
}

/** Any thrown value as an AsbError; anything not already one is an internal error. */
export function toAsbError(err: unknown): AsbError {
  if (err instanceof AsbError) return err;
  return new AsbError('Internal', 'internal error; the worker log has the details', { cause: err });
}

export function writeProblem(res: ServerResponse, err: AsbError, headers: Record<string, string> = {}): void {
  const body = JSON.stringify(problemOf(err));
  res.writeHead(err.status, {
    ...headers,
    ...(err.retryAfterS === undefined ? {} : { 'retry-after': String(err.retryAfterS) }),
    'content-type': PROBLEM_CONTENT_TYPE,
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/**
 * Answers a WebSocket upgrade request with the problem instead of upgrading, and closes the
 * socket: an 'upgrade' listener has no ServerResponse, so the status line and headers are written
 * by hand. An Unauthorized answer names the Bearer scheme and `realm`.
 */
export function refuseUpgrade(socket: Duplex, err: AsbError, realm = 'asb'): void {
  const body = JSON.stringify(problemOf(err));
  const extra = err.code === 'Unauthorized' ? `WWW-Authenticate: Bearer realm="${realm}"\r\n` : '';
  socket.end(
    `HTTP/1.1 ${err.status} ${STATUS_CODES[err.status] ?? ''}\r\nContent-Type: ${PROBLEM_CONTENT_TYPE}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}Connection: close\r\n\r\n${body}`,
  );
}
