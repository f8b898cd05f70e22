// The reclaim sweep's decisions (src/runtime/local/reclaim.ts), without a host: what a worker
// starting on a killed one's state dir removes, and what it never touches (a live pod's things,
// another runtime's mounts, containers, cgroups and bridge ports).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { reclaimPlan, shimsOf, straySaves, type HostFacts, type ReclaimScope } from '../src/runtime/local/reclaim.ts';

const scope: ReclaimScope = {
  root: '/s/rt', runcRoot: '/s/rt/runc', runscRoot: '/s/rt/runsc', mountRoot: '/run/asb/rootfs/aaaa', cgroupParent: '/asb-aaaa', bridge: 'asbx0',
};

const facts: HostFacts = {
  mountPoints: [
    '/s/rt/pods/live/disk', '/run/asb/rootfs/aaaa/live/rootfs',
    '/s/rt/pods/dead/disk', '/run/asb/rootfs/aaaa/dead/rootfs', '/s/rt/pods/dead/netns', '/run/asb/rootfs/aaaa/dead/disk',
    '/s/rt/runsc/null-netns', '/s/rt/runsc/null-netns', '/s/rt/runsc/null-netns',
    // another runtime's: another root and another hash
    '/s/other/pods/dead/disk', '/run/asb/rootfs/bbbb/dead/rootfs',
  ],
  runcContainers: ['live', 'dead'],
  runscContainers: ['gone.pod', 'live.pod'],
  cgroups: ['/sys/fs/cgroup/pids/asb-aaaa/live', '/sys/fs/cgroup/pids/asb-aaaa/dead', '/sys/fs/cgroup/memory/asb-aaaa/dead'],
  bridgePorts: ['vxlive', 'vxdead'],
  mountDirs: ['live', 'dead', 'gone'],
  loops: [
    { device: '/dev/loop3', backingFile: '/s/rt/pods/live/disk.img' },
    // attached, never mounted: the worker died between the two
    { device: '/dev/loop4', backingFile: '/s/rt/pods/half/disk.img' },
    { device: '/dev/loop5', backingFile: '/s/other/pods/half/disk.img' },
  ],
};

test('reclaim removes what belongs to no live pod, deepest mounts first, detaches a dead pod\'s disk attached but never mounted, and keeps one null-netns layer for a live gVisor pod', () => {
  const plan = reclaimPlan(scope, facts, { ids: new Set(['live']), veths: new Set(['vxlive']), gvisor: true });
  assert.deepEqual(plan, [
    { kind: 'delete-container', runtime: 'runc', id: 'dead' },
    { kind: 'delete-container', runtime: 'runsc', id: 'gone.pod' },
    { kind: 'unmount', path: '/run/asb/rootfs/aaaa/dead/rootfs' },
    { kind: 'unmount', path: '/run/asb/rootfs/aaaa/dead/disk' },
    { kind: 'unmount', path: '/s/rt/pods/dead/disk' },
    { kind: 'unmount', path: '/s/rt/pods/dead/netns' },
    { kind: 'unmount', path: '/s/rt/runsc/null-netns' },
    { kind: 'unmount', path: '/s/rt/runsc/null-netns' },
    { kind: 'detach-loop', device: '/dev/loop4' },
    { kind: 'delete-veth', name: 'vxdead' },
    { kind: 'remove-cgroup', path: '/sys/fs/cgroup/pids/asb-aaaa/dead' },
    { kind: 'remove-cgroup', path: '/sys/fs/cgroup/memory/asb-aaaa/dead' },
    { kind: 'remove-mount-dir', id: 'dead' },
    { kind: 'remove-mount-dir', id: 'gone' },
  ]);
  // No gVisor pod left: no null-netns layer either.
  const none = reclaimPlan(scope, facts, { ids: new Set(['live']), veths: new Set(['vxlive']), gvisor: false });
  assert.equal(none.filter((a) => a.kind === 'unmount' && a.path.endsWith('null-netns')).length, 3);
});

test('only a save\'s runc/runsc commands on this runtime\'s roots are stray, never a sandbox\'s own runsc processes; shims are this root\'s', () => {
  const procs = [
    { pid: 1, argv: ['/t/runsc', '--platform=systrap', '--root', '/s/rt/runsc', 'checkpoint', '-image-path', '/s/rt/pods/a/checkpoint.partial', 'a.pod'] },
    { pid: 2, argv: ['/t/runc', '--root', '/s/rt/runc', 'pause', 'b'] },
    { pid: 3, argv: ['runsc-sandbox', '--root=/s/rt/runsc', 'boot', 'a.pod'] },
    { pid: 4, argv: ['/t/runsc', '--root', '/s/other/runsc', 'checkpoint', 'x.pod'] },
    { pid: 5, argv: ['/t/runc', '--root', '/s/rt/runc', 'exec', 'b', 'true'] },
    { pid: 6, argv: ['/s/rt/bin/oci-shim-123', '-d', '/s/rt/pods/a', '-r', '/t/runsc'] },
    { pid: 7, argv: ['/s/other/bin/oci-shim-123', '-d', '/s/other/pods/a'] },
  ];
  assert.deepEqual(straySaves(procs, ['/s/rt/runc', '/s/rt/runsc']), [1, 2]);
  assert.deepEqual(shimsOf(procs, '/s/rt'), [{ pid: 6, id: 'a' }]);
});
