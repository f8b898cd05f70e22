// The objects every installation starts with: the `base` template and a small warm pool of it,
// so the first claim is warm without any setup.
import { apiVersionOf } from './meta.ts';
import type { KubeObject } from './meta.ts';
import { SandboxTemplateType, SandboxWarmPoolType } from './types.ts';
import type { SandboxTemplate, SandboxWarmPool } from './types.ts';

export const BASE_TEMPLATE = 'base';
const HOME = '/home/user';
/** The envd port E2B SDKs connect to inside a sandbox. */
const ENVD_PORT = 49983;
/** Three warm members cover a burst of three claims while the pool refills (one pod each). */
const BASE_POOL_REPLICAS = 3;

export function baseTemplate(): SandboxTemplate {
  return {
    apiVersion: apiVersionOf(SandboxTemplateType),
    kind: SandboxTemplateType.kind,
    metadata: { name: BASE_TEMPLATE, namespace: 'default' },
    spec: {
      podTemplate: {
        spec: {
          containers: [{
            name: 'main',
            image: 'agent-sandbox/base',
            // The sandbox is a place to exec into, not a service: the main process only has to stay alive.
            command: ['sleep', 'infinity'],
            workingDir: HOME,
            env: [{ name: 'HOME', value: HOME }],
            ports: [{ containerPort: ENVD_PORT, name: 'envd', protocol: 'TCP' }],
            volumeMounts: [{ name: 'home', mountPath: HOME }],
          }],
        },
      },
      // The home directory is a persistent volume, so it survives hibernation and restarts.
      volumeClaimTemplates: [{
        metadata: { name: 'home' },
        spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } },
      }],
    },
  };
}

export function basePool(): SandboxWarmPool {
  return {
    apiVersion: apiVersionOf(SandboxWarmPoolType),
    kind: SandboxWarmPoolType.kind,
    metadata: { name: BASE_TEMPLATE, namespace: 'default' },
    spec: { replicas: BASE_POOL_REPLICAS, sandboxTemplateRef: { name: BASE_TEMPLATE } },
  };
}

/** Fresh copies each call: callers may default and store them. */
export function builtinObjects(): KubeObject[] {
  return [baseTemplate(), basePool()];
}
