// The apiserver's failures (a metav1.Status body and an HTTP status) converted once into our
// error catalogue, worded like the embedded store's so callers and users see one vocabulary.
import type { ResourceType } from '../api/meta.ts';
import { AsbError, invalid, type ErrorCode, type FieldProblem } from '../errors.ts';
import { describeObject } from './mutation.ts';

/** The parts of a metav1.Status we read. */
export interface KubeStatus {
  kind?: string;
  code?: number;
  reason?: string;
  message?: string;
  details?: { name?: string; uid?: string; causes?: { reason?: string; message?: string; field?: string }[] };
}

export function asStatus(body: unknown): KubeStatus {
  if (typeof body === 'object' && body !== null) return body;
  return typeof body === 'string' && body !== '' ? { message: body.trim() } : {};
}

/** What the failed call was about, for the message. */
export interface Subject {
  rt: ResourceType;
  namespace: string;
  /** The object's name ('' for a collection, the generateName prefix on create). */
  name: string;
  /** The resourceVersion the caller sent, for a Conflict message. */
  resourceVersion?: string | undefined;
}

const BY_STATUS: Partial<Record<number, ErrorCode>> = {
  400: 'BadRequest',
  403: 'Forbidden',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  410: 'Gone',
  413: 'PayloadTooLarge',
  415: 'UnsupportedMediaType',
  504: 'Timeout',
};

function fieldsOf(status: KubeStatus): FieldProblem[] {
  // Go prints a cause about the whole object as field "<nil>".
  return (status.details?.causes ?? []).map((c) => ({ field: c.field === undefined || c.field === '<nil>' ? '' : c.field, message: c.message ?? c.reason ?? 'invalid' }));
}

/** The AsbError for a non-2xx answer from the apiserver. */
export function kubeError(subject: Subject, httpStatus: number, body: unknown): AsbError {
  const status = asStatus(body);
  const serverMessage = status.message ?? `HTTP ${httpStatus}`;
  const what = subject.name === '' ? subject.rt.kind : describeObject(subject.rt, subject.namespace, subject.name);
  switch (httpStatus) {
    case 404:
      // A missing namespace on create is the apiserver's 404 too: its message names it.
      return new AsbError('NotFound', subject.name !== '' && status.details?.name === subject.name ? `${what} not found` : serverMessage);
    case 409:
      if (status.reason === 'AlreadyExists') return new AsbError('AlreadyExists', `${describeObject(subject.rt, subject.namespace, status.details?.name ?? subject.name)} already exists`);
      if (serverMessage.includes('Precondition failed')) return new AsbError('Conflict', `${what}: precondition failed: ${serverMessage}`);
      return new AsbError(
        'Conflict',
        subject.resourceVersion === undefined
          ? `${what} has been modified: ${serverMessage}`
          : `${what} has been modified: resourceVersion ${subject.resourceVersion} is stale; read it again and retry`,
      );
    case 422: {
      const fields = fieldsOf(status);
      if (fields.length > 0) return invalid(subject.rt.kind, subject.name, fields);
      return new AsbError('Invalid', `${what} is invalid: ${serverMessage}`);
    }
    case 401:
      // Our credentials, not the caller's API key: to the caller the store is unavailable.
      return new AsbError('Unavailable', `the API server refused the store's credentials (401): ${serverMessage}`);
    case 429:
      return new AsbError('Unavailable', `the API server is throttling requests (429): ${serverMessage}`);
    default: {
      const code = BY_STATUS[httpStatus] ?? (httpStatus >= 500 ? 'Unavailable' : 'Internal');
      return new AsbError(code, `${what}: ${serverMessage}`);
    }
  }
}
