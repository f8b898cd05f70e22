// Discovery and /version: what kubectl reads before any request, in both forms it takes.
// - kubectl 1.37 asks /api and /apis for the aggregated form first
//   (Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, then v2beta1,
//   then plain JSON) and reads every group's resources from that one answer; older clients read
//   the legacy APIVersions/APIGroupList and then /apis/<group>/<version> per group.
// - The core group ("" /api/v1) serves one resource here, Events (read-only: events.ts), which
//   `kubectl get events` and `kubectl describe` read.
// Shapes copied from kube-apiserver 1.37's answers for the same CRDs (src/api/crd.ts).
import { EVENTS_DISCOVERY, EVENTS_RESOURCE } from './events.ts';
import { groupVersions, resourcesOf, scaleSubresource, SERVED_GROUPS, type ServedResource } from './resources.ts';

export const AGGREGATED_V2 = 'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList';
export const AGGREGATED_V2BETA1 = 'application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList';

/** The aggregated discovery version the Accept header asks for first, or undefined for the legacy form. */
export function aggregatedVersion(accept: string | undefined): 'v2' | 'v2beta1' | undefined {
  for (const part of (accept ?? '').split(',')) {
    const params = new Map(part.split(';').slice(1).map((p) => {
      const [k = '', v = ''] = p.trim().split('=');
      return [k.trim(), v.trim()] as const;
    }));
    if (params.get('as') === 'APIGroupDiscoveryList' && params.get('g') === 'apidiscovery.k8s.io') {
      const v = params.get('v');
      if (v === 'v2' || v === 'v2beta1') return v;
    }
  }
  return undefined;
}

const VERBS = ['delete', 'deletecollection', 'get', 'list', 'patch', 'create', 'update', 'watch'];
const SUBRESOURCE_VERBS = ['get', 'patch', 'update'];
/** What a scale subresource answers in, whatever the resource: autoscaling/v1 Scale (scale.ts). */
const SCALE_KIND = { group: 'autoscaling', version: 'v1', kind: 'Scale' };

export function apiVersions(serverAddress: string): unknown {
  return { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress }] };
}

export function coreResourceList(): unknown {
  return { kind: 'APIResourceList', groupVersion: 'v1', resources: [EVENTS_RESOURCE] };
}

function groupEntry(group: string): { name: string; versions: { groupVersion: string; version: string }[]; preferredVersion: { groupVersion: string; version: string } } {
  const versions = groupVersions(group).map((v) => ({ groupVersion: `${group}/${v}`, version: v }));
  const preferred = versions[0] ?? { groupVersion: `${group}/v1beta1`, version: 'v1beta1' };
  return { name: group, versions, preferredVersion: preferred };
}

export function apiGroupList(): unknown {
  return { kind: 'APIGroupList', apiVersion: 'v1', groups: SERVED_GROUPS.map(groupEntry) };
}

export function apiGroup(group: string): unknown {
  return { kind: 'APIGroup', apiVersion: 'v1', ...groupEntry(group) };
}

export function resourceList(group: string, version: string): unknown {
  const resources = resourcesOf(group, version).flatMap((s) => {
    const names = s.crd.spec.names;
    return [
      {
        name: s.rt.plural, singularName: names.singular, namespaced: s.rt.namespaced, kind: s.rt.kind, verbs: VERBS,
        ...(names.shortNames === undefined ? {} : { shortNames: names.shortNames }), categories: names.categories,
      },
      { name: `${s.rt.plural}/status`, singularName: '', namespaced: s.rt.namespaced, kind: s.rt.kind, verbs: SUBRESOURCE_VERBS },
      ...(scaleSubresource(s, version) === undefined ? [] : [{ name: `${s.rt.plural}/scale`, singularName: '', namespaced: s.rt.namespaced, ...SCALE_KIND, verbs: SUBRESOURCE_VERBS }]),
    ];
  });
  return { kind: 'APIResourceList', apiVersion: 'v1', groupVersion: `${group}/${version}`, resources };
}

function discoveryResource(s: ServedResource, version: string): unknown {
  const names = s.crd.spec.names;
  const responseKind = { group: s.rt.group, version, kind: s.rt.kind };
  return {
    resource: s.rt.plural, responseKind, scope: s.rt.namespaced ? 'Namespaced' : 'Cluster', singularResource: names.singular, verbs: VERBS,
    ...(names.shortNames === undefined ? {} : { shortNames: names.shortNames }), categories: names.categories,
    subresources: [
      { subresource: 'status', responseKind, verbs: SUBRESOURCE_VERBS },
      ...(scaleSubresource(s, version) === undefined ? [] : [{ subresource: 'scale', responseKind: SCALE_KIND, verbs: SUBRESOURCE_VERBS }]),
    ],
  };
}

/** The aggregated document for /apis (our groups) or /api (the empty core group). */
export function aggregatedDiscovery(path: '/api' | '/apis', version: 'v2' | 'v2beta1'): unknown {
  const items = path === '/api'
    ? [{ metadata: {}, versions: [{ version: 'v1', resources: [EVENTS_DISCOVERY], freshness: 'Current' }] }]
    : SERVED_GROUPS.map((group) => ({
      metadata: { name: group },
      versions: groupVersions(group).map((v) => ({ version: v, resources: resourcesOf(group, v).map((s) => discoveryResource(s, v)), freshness: 'Current' })),
    }));
  return { kind: 'APIGroupDiscoveryList', apiVersion: `apidiscovery.k8s.io/${version}`, metadata: {}, items };
}

// The Kubernetes API level served: kubectl warns when its minor version is more than one away
// from the server's, and 1.37 is the kubectl `make test` builds (scripts/kube-tools.sh).
const KUBE_MAJOR = '1';
const KUBE_MINOR = '37';

/** /version: the API level in the apiserver's shape; `gitVersion` also says it is us (kubectl prints it). */
export function versionInfo(version: string): unknown {
  return {
    major: KUBE_MAJOR, minor: KUBE_MINOR, gitVersion: `v${KUBE_MAJOR}.${KUBE_MINOR}.0+asb.${version}`, gitCommit: '', gitTreeState: 'clean', buildDate: '1970-01-01T00:00:00Z',
    goVersion: `node${process.versions.node}`, compiler: 'asb', platform: `${process.platform}/${process.arch}`,
  };
}

