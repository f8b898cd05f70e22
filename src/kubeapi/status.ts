// Errors as the kube-apiserver writes them: a `Status` object (apiVersion v1, status Failure) with
// the apiserver's reason for each of our error codes, so kubectl and client libraries (which
// switch on `reason` and `code`) behave as against a cluster. Shapes copied from kube-apiserver
// 1.37 answers: NotFound/AlreadyExists/Conflict carry details {name, group, kind: <plural>};
// Invalid carries {name, group, kind: <Kind>, causes}; a watch that starts too far back ends
// with an ERROR event holding reason Expired and code 410.
import type { ResourceType } from '../api/meta.ts';
import { AsbError, type ErrorCode } from '../errors.ts';

export interface StatusCause {
  reason: string;
  message: string;
  field: string;
}

export interface StatusDetails {
  name?: string;
  group?: string;
  kind?: string;
  uid?: string;
  causes?: StatusCause[];
  retryAfterSeconds?: number;
}

export interface Status {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: Record<string, never>;
  status: 'Failure' | 'Success';
  message?: string;
  reason?: string;
  details?: StatusDetails;
  /** Absent on a Success, as the apiserver writes it. */
  code?: number;
}

/** The apiserver's StatusReason for each of our codes (metav1.StatusReason*). */
const REASONS: Record<ErrorCode, string> = {
  NotFound: 'NotFound',
  AlreadyExists: 'AlreadyExists',
  Conflict: 'Conflict',
  Invalid: 'Invalid',
  BadRequest: 'BadRequest',
  MalformedJson: 'BadRequest',
  UnsupportedMediaType: 'UnsupportedMediaType',
  PayloadTooLarge: 'RequestEntityTooLarge',
  TooManyRequests: 'TooManyRequests',
  Unauthorized: 'Unauthorized',
  Forbidden: 'Forbidden',
  MethodNotAllowed: 'MethodNotAllowed',
  Gone: 'Expired',
  PoolExhausted: 'ServiceUnavailable',
  Unavailable: 'ServiceUnavailable',
  Timeout: 'Timeout',
  SandboxNotRunning: 'Conflict',
  // The apiserver has no reason for 501: StatusReasonUnknown, which is empty.
  NotImplemented: '',
  CheckpointFailed: 'InternalError',
  BuildFailed: 'Invalid',
  Internal: 'InternalError',
};

/** What an error is about, for `details`: the resource and, when one is named, the object. */
export interface Subject {
  rt: ResourceType;
  name?: string;
}

/** The Status object for an error; `subject` fills details as the apiserver does per reason. */
export function statusOf(err: AsbError, subject?: Subject): Status {
  const reason = REASONS[err.code];
  const status: Status = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: err.message, reason, code: err.status };
  const details: StatusDetails = {};
  if (subject !== undefined) {
    if (subject.name !== undefined && subject.name !== '') details.name = subject.name;
    details.group = subject.rt.group;
    // Invalid names the Kind, every other reason the resource (the apiserver's own asymmetry).
    details.kind = err.code === 'Invalid' ? subject.rt.kind : subject.rt.plural;
  }
  if (err.fields.length > 0) {
    details.causes = err.fields.map((f) => ({ reason: err.code === 'Invalid' ? 'FieldValueInvalid' : 'FieldValueNotSupported', message: f.message, field: f.field }));
  }
  if (err.retryAfterS !== undefined) details.retryAfterSeconds = err.retryAfterS;
  if (Object.keys(details).length > 0) status.details = details;
  return status;
}

/** A delete that removed the object: Status Success naming it (what the apiserver answers for custom resources). */
export function deletedStatus(rt: ResourceType, name: string, uid: string | undefined): Status {
  return {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success',
    details: { name, group: rt.group, kind: rt.plural, ...(uid === undefined ? {} : { uid }) },
  };
}

export function notFoundError(rt: ResourceType, name: string): AsbError {
  return new AsbError('NotFound', `${rt.plural}.${rt.group} "${name}" not found`);
}
