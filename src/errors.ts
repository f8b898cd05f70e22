// One error catalogue: every error the system reports has a stable code and an HTTP status.
// Code switches on `code`, never on the message. docs/errors.md lists the same catalogue and a
// test keeps the two in step.

export const ERRORS = {
  NotFound: { status: 404, title: 'Not found' },
  AlreadyExists: { status: 409, title: 'Already exists' },
  Conflict: { status: 409, title: 'Conflict: the object changed since it was read' },
  Invalid: { status: 422, title: 'Invalid object' },
  BadRequest: { status: 400, title: 'Bad request' },
  MalformedJson: { status: 400, title: 'Malformed JSON' },
  UnsupportedMediaType: { status: 415, title: 'Unsupported media type' },
  PayloadTooLarge: { status: 413, title: 'Request body too large' },
  TooManyRequests: { status: 429, title: 'Too many requests' },
  Unauthorized: { status: 401, title: 'Missing or invalid API key' },
  Forbidden: { status: 403, title: 'Forbidden' },
  MethodNotAllowed: { status: 405, title: 'Method not allowed' },
  Gone: { status: 410, title: 'Resource version too old' },
  PoolExhausted: { status: 503, title: 'No warm sandbox and cold start refused' },
  Unavailable: { status: 503, title: 'Unavailable' },
  Timeout: { status: 504, title: 'Timed out' },
  SandboxNotRunning: { status: 409, title: 'Sandbox is not running' },
  NotImplemented: { status: 501, title: 'Not implemented' },
  CheckpointFailed: { status: 500, title: 'The sandbox\'s memory could not be saved; it keeps running' },
  BuildFailed: { status: 422, title: 'A template build step failed' },
  Internal: { status: 500, title: 'Internal error' },
} as const satisfies Record<string, { status: number; title: string }>;

export type ErrorCode = keyof typeof ERRORS;

/** A problem detail for one field, as in a validation error. */
export interface FieldProblem {
  /** JSON-path-like location, e.g. spec.podTemplate.spec.containers[0].image */
  field: string;
  message: string;
}

export class AsbError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly fields: readonly FieldProblem[];
  /** Seconds a client should wait before retrying (the Retry-After header), when the error says so. */
  readonly retryAfterS: number | undefined;

  constructor(code: ErrorCode, message: string, options?: { fields?: FieldProblem[]; cause?: unknown; retryAfterS?: number }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'AsbError';
    this.code = code;
    this.status = ERRORS[code].status;
    this.fields = options?.fields ?? [];
    this.retryAfterS = options?.retryAfterS;
  }
}

export function isAsbError(err: unknown, code?: ErrorCode): err is AsbError {
  return err instanceof AsbError && (code === undefined || err.code === code);
}

export function invalid(kind: string, name: string, fields: FieldProblem[]): AsbError {
  const detail = fields.map((f) => `${f.field}: ${f.message}`).join('; ');
  return new AsbError('Invalid', `${kind} "${name}" is invalid: ${detail}`, { fields });
}
