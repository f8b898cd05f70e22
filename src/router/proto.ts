// Loads our minimal ext_proc v3 and gRPC health protos (proto/) with @grpc/proto-loader and
// describes, by hand, the plain objects the router reads and writes. keepCase keeps Envoy's
// snake_case field names, so these shapes read like the Envoy docs.
import { loadPackageDefinition, type GrpcObject, type ServiceDefinition } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { join } from 'node:path';

export const PROTO_DIR = join(import.meta.dirname, '..', '..', 'proto');
export const EXT_PROC_SERVICE = 'envoy.service.ext_proc.v3.ExternalProcessor';
export const HEALTH_SERVICE = 'grpc.health.v1.Health';

export interface HeaderValue {
  key: string;
  value?: string;
  raw_value?: Buffer;
}

export interface HeaderValueOption {
  header: HeaderValue;
  append?: { value: boolean };
}

export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}

export interface HttpHeaders {
  headers?: { headers?: HeaderValue[] };
  end_of_stream?: boolean;
}

export interface CommonResponse {
  status?: number;
  header_mutation?: HeaderMutation;
  clear_route_cache?: boolean;
}

export interface ImmediateResponse {
  status: { code: number };
  headers?: HeaderMutation;
  body?: Buffer;
  details?: string;
}

/** ProcessingMode.HeaderSendMode values. */
export const HEADER_SEND = { default: 0, send: 1, skip: 2 } as const;

export interface ProcessingMode {
  request_header_mode?: number;
  response_header_mode?: number;
}

export interface ProcessingRequest {
  /** With oneofs: true proto-loader names the set oneof case here. */
  request?: 'request_headers' | 'response_headers' | 'request_body' | 'response_body' | 'request_trailers' | 'response_trailers';
  request_headers?: HttpHeaders;
  response_headers?: HttpHeaders;
  observability_mode?: boolean;
}

export interface ProcessingResponse {
  request_headers?: { response?: CommonResponse };
  response_headers?: { response?: CommonResponse };
  request_body?: { response?: CommonResponse };
  response_body?: { response?: CommonResponse };
  request_trailers?: { header_mutation?: HeaderMutation };
  response_trailers?: { header_mutation?: HeaderMutation };
  immediate_response?: ImmediateResponse;
  mode_override?: ProcessingMode;
  override_message_timeout?: { seconds: number; nanos: number };
}

/** grpc.health.v1.HealthCheckResponse.ServingStatus */
export const SERVING_STATUS = { unknown: 0, serving: 1, notServing: 2, serviceUnknown: 3 } as const;

export interface RouterProtos {
  extProc: ServiceDefinition;
  health: ServiceDefinition;
  /** The package objects, for building clients (the test harness plays Envoy with one). */
  grpc: GrpcObject;
}

let cached: RouterProtos | undefined;

/** Parsed once per process: ~20 ms of protobufjs work that every server and client shares. */
export function loadRouterProtos(): RouterProtos {
  if (cached !== undefined) return cached;
  const definition = loadSync(['envoy/service/ext_proc/v3/external_processor.proto', 'grpc/health/v1/health.proto'], {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    oneofs: true,
    longs: Number,
    enums: Number,
    defaults: false,
  });
  const service = (name: string): ServiceDefinition => {
    const entry = definition[name];
    if (entry === undefined || !('Process' in entry || 'Check' in entry)) throw new Error(`proto: service ${name} missing`);
    return entry;
  };
  cached = { extProc: service(EXT_PROC_SERVICE), health: service(HEALTH_SERVICE), grpc: loadPackageDefinition(definition) };
  return cached;
}
