// One local pod as an OCI container: its directories, its config.json (src/runtime/oci/spec.ts,
// hardened by default) and the oci-shim argv that mounts its rootfs and runs it under runc. Every
// sandbox runs in a user namespace of its own host id range (id-ranges.ts: container ids 0.. are
// host ids <range>..), so root in a sandbox, E2B's `user: "root"` included, is root of that
// namespace only, and to the kernel each sandbox is another host user. The image's cached tree is
// owned from ROOT_ID_MAP.hostId and shared by every pod: the shim idmaps it into the pod's range
// (oci-shim.c -U). A pod made before ranges keeps ROOT_ID_MAP itself, and no idmap.
//
// On disk (paths from rootfs.ts): the pod's disk (disk.ts: a sparse ext4 image of its
// ephemeral-storage limit) is mounted first, at <pod>/disk; its upper/ and work/ are the overlay's
// writable layer over the image's cached tree, its empty/ and volumes/ the volumes (all kept by
// hibernation). <pod>/etc holds the runtime's /etc/hosts and /etc/hostname (bind-mounted
// read-only: a sandbox that swaps them for symlinks changes nothing on the host,
// research/runtime.md §1a escape 3), <pod>/config.json is the bundle's config. A pod dir made
// before disks keeps its plain directories (rootfs.ts' legacyLayout) and no cap.
// The overlay is mounted at <mountRoot>/<id>/rootfs: runc's init, inside the user namespace, must
// be able to walk to its rootfs, and the state dir is private (0700), so mount points live under
// /run/asb instead (gone after a reboot, made again at the next start), <id>/ walkable by host
// root and the pod's own root group only.
// A pod with runtimeClassName gvisor (runtime-class.ts) runs under runsc with the same config,
// adjusted by runscSpec (src/runtime/oci/runsc.ts): its network namespace is the file <pod>/netns
// the shim makes before the sandbox (oci-shim.c -N), and its /tmp is tmp/ on the pod's disk.
import { chmod, chown, mkdir, readFile, writeFile } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { AsbError } from '../../errors.ts';
import type { CachedImage } from '../../images/image-store.ts';
import type { PodRequest } from '../runtime.ts';
import { containerSpec, ROOT_ID_MAP, sandboxIdentity, type BindMount, type IdRange, type OciSpec } from '../oci/spec.ts';
import { POD_NOFILE } from '../oci/inherited-rlimits.ts';
import { runscContainerId, runscSpec } from '../oci/runsc.ts';
import { readImageFile } from './image-file.ts';
import { AGENT_PORT } from '../../router/contract.ts';
import { homeOf, initProcess, newAgentToken, readInitProcess } from './agent-init.ts';
import { seedTmpFromImage } from './image-tmp.ts';
import { legacyLayout, type PodPaths } from './rootfs.ts';
import { madeBeforeDisks, podDisk, type DiskTool } from './disk.ts';
import { mainContainer, resolveMounts } from './pod-process.ts';
import type { RuntimeKind } from './runtime-class.ts';

/** Where the container's init (asb-init.c) is bind-mounted: /dev is the container's own tmpfs, so nothing lands in its rootfs. */
export const INIT_PATH = '/dev/.asb-init';

export interface OciHost {
  runc: string;
  /** runc's --root: its state of every container of this runtime. */
  runcRoot: string;
  /** The containers' init on the host (asb-init.c, static, init-binary.ts), bind-mounted read-only as the container's pid 1. */
  init: string;
  /** Overlay mount points, one per pod: a 0711 directory the user namespace can walk. */
  mountRoot: string;
  /** cgroupfs parent of every pod's cgroup: `/asb-<hash>`. */
  cgroupParent: string;
  /** Global flags before every runc subcommand. */
  runtimeFlags?: readonly string[];
  /** Makes and mounts each pod's disk (pod-disk.c, run through the launcher). */
  disk: DiskTool;
  /** The image's /etc/passwd and /etc/group (names in runAsUser and the image's USER), read once per image tree. */
  imageUsers: ImageUsers;
  /** gVisor's runsc, for pods with runtimeClassName gvisor; absent when this worker cannot run it. */
  runsc?: { binary: string; root: string; flags: readonly string[] };
  /** Pods ask the resolver on their gateway (LocalRuntimeOptions.podDns): their /etc/resolv.conf names it. */
  dnsOnGateway?: boolean;
  /** CAs every pod trusts besides its image's (LocalRuntimeOptions.extraCaPath), PEM. */
  extraCaPem?: string;
}

/** Debian's (and Ubuntu's, Alpine's) bundle: what curl, Python's ssl, OpenSSL and Go read. */
const CA_BUNDLE = 'etc/ssl/certs/ca-certificates.crt';

/** The OCI runtime one pod runs under: its binary, its --root and the global flags before every subcommand. */
export interface OciRuntime {
  kind: RuntimeKind;
  binary: string;
  root: string;
  flags: readonly string[];
}

export function ociRuntime(host: OciHost, kind: RuntimeKind): OciRuntime {
  if (kind === 'runc') return { kind, binary: host.runc, root: host.runcRoot, flags: host.runtimeFlags ?? [] };
  if (host.runsc === undefined) throw new Error('gVisor (runsc) is not available on this worker');
  return { kind, binary: host.runsc.binary, root: host.runsc.root, flags: host.runsc.flags };
}

export interface PodNetwork {
  ip: string;
  prefix: number;
  gateway: string;
}

/** Who and where a process in the pod runs by default: the container's own process. */
export interface PodIdentity {
  uid: number;
  gid: number;
  /** Supplementary groups of the pod's user (an exec as that user gets them too). */
  groups?: number[];
  env: Record<string, string>;
  cwd: string;
  /** The port and token of the pod's init's agent; absent for a pod started with tini (before asb-init). */
  agent?: { port: number; token: string };
}

export interface PreparedPod {
  /** oci-shim's arguments (after the binary). */
  shimArgs: string[];
  identity: PodIdentity;
  runtime: OciRuntime;
}

/**
 * Mounts the pod's disk, then writes its directories, /etc files and config.json; the shim mounts
 * the rootfs, runs the container and unmounts both when it ends. A failure unmounts the disk again.
 */
export async function preparePod(host: OciHost, podDir: PodPaths, req: PodRequest, image: Pick<CachedImage, 'rootfs' | 'config'>, net: PodNetwork | undefined, kind: RuntimeKind = 'runc', idRange: IdRange = ROOT_ID_MAP): Promise<PreparedPod> {
  const size = podDisk(req.spec); // refused (Invalid) before anything is made
  const paths = (await madeBeforeDisks(podDir.dir)) ? legacyLayout(podDir) : podDir;
  if (paths.disk === undefined) return writeBundle(host, paths, req, image, net, kind, idRange);
  await host.disk.mount(paths.disk.image, paths.disk.mount, size.bytes);
  try {
    return await writeBundle(host, paths, req, image, net, kind, idRange);
  } catch (err) {
    // Left mounted, a failed pod would hold its loop device until it is removed or started again.
    await host.disk.unmount(paths.disk.mount).catch((unmountErr: unknown) => {
      throw new Error(`${err instanceof Error ? err.message : String(err)}; and its disk stays mounted: ${unmountErr instanceof Error ? unmountErr.message : String(unmountErr)}`, { cause: err });
    });
    throw err;
  }
}

async function writeBundle(host: OciHost, paths: PodPaths, req: PodRequest, image: Pick<CachedImage, 'rootfs' | 'config'>, net: PodNetwork | undefined, kind: RuntimeKind, idRange: IdRange): Promise<PreparedPod> {
  const runtime = ociRuntime(host, kind);
  const gvisor = kind === 'runsc';
  // A runc pod that may keep its memory: runc makes its user namespace (CRIU cannot checkpoint the
  // shim's, docs/criu.md) and its stdio is pipes (CRIU cannot dump the host's log file).
  const checkpointable = !gvisor && req.checkpointable === true;
  const container = mainContainer(req.spec);
  const root = idRange.hostId;
  // The pod's range differs from the one the cached tree is owned by: the shim idmaps the tree.
  const ownRange = idRange.hostId !== ROOT_ID_MAP.hostId;
  // <mountRoot>/<id>/ is walkable by the pod's own root only (and host root): runc's init, inside
  // the user namespace, walks to rootfs/ there; another host user or sandbox must not.
  const mountDir = join(host.mountRoot, req.id);
  const mountPoint = join(mountDir, 'rootfs');
  // A pod started before this layout had its rootfs at <id> itself: one left mounted by a shim
  // that was killed must go first, or rootfs/ and the mode below would land in its writable layer.
  await host.disk.unmount(mountDir);
  // A checkpointable runc pod's /etc files lie under its mount dir, which its own root can walk:
  // CRIU opens every bind mount's source from inside the pod's user namespace at restore
  // ("mnt-v2: Failed to open_tree <pod>/etc/hostname: Permission denied" under the private pod dir).
  const etcDir = checkpointable ? join(mountDir, 'etc') : paths.etc;
  await Promise.all([mkdir(paths.work, { recursive: true, mode: 0o700 }), mkdir(etcDir, { recursive: true, mode: checkpointable ? 0o755 : 0o700 }), mkdir(paths.exec, { recursive: true, mode: 0o700 }), mkdir(mountPoint, { recursive: true, mode: 0o755 })]);
  await chown(mountDir, 0, root);
  await chmod(mountDir, 0o710);
  // The merged root takes the upper dir's owner and mode: the sandbox's root owns its `/`.
  if ((await mkdir(paths.upper, { recursive: true, mode: 0o755 })) !== undefined) await chown(paths.upper, root, root);
  const ip = net?.ip ?? '127.0.0.1';
  await Promise.all([
    writeFile(join(etcDir, 'hostname'), `${req.hostname}\n`, { mode: 0o644 }),
    writeFile(join(etcDir, 'hosts'), `127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n${ip}\t${req.hostname}\n`, { mode: 0o644 }),
  ]);
  const { passwd, group } = await host.imageUsers(image.rootfs);
  // Volumes are owned by the sandbox's user as the host sees it (through the id map).
  const user = sandboxIdentity(container, image.config, { userNamespace: 'always', idMap: idRange, passwd, group }, req.spec);
  const owner = { uid: root + user.uid, gid: root + user.gid };
  const resolved = await resolveMounts(req, container, paths, owner);
  // A checkpointable runc pod's volumes are bound from its disk bound again under its mount dir
  // (oci-shim.c -V), for the same reason as etcDir.
  const diskBind = checkpointable && paths.disk !== undefined ? { from: paths.disk.mount, to: join(mountDir, 'disk') } : undefined;
  const volumes = diskBind === undefined ? resolved : resolved.map((m) => (m.src.startsWith(`${diskBind.from}/`) ? { ...m, src: join(diskBind.to, m.src.slice(diskBind.from.length + 1)) } : m));
  // Like /etc/hosts, files the runtime owns, bind-mounted read-only over the image's: the
  // resolver on the gateway, and the image's CA bundle plus the cluster's extra CA (written at
  // every start, so a CA or image change reaches a woken pod).
  const etcMounts: BindMount[] = [];
  if (host.dnsOnGateway === true && net !== undefined) {
    await writeFile(join(etcDir, 'resolv.conf'), `nameserver ${net.gateway}\n`, { mode: 0o644 });
    etcMounts.push({ destination: '/etc/resolv.conf', source: join(etcDir, 'resolv.conf'), readOnly: true });
  }
  if (host.extraCaPem !== undefined) {
    // Read as the container sees it (image-file.ts): the image's links never reach a host file.
    const bundle = (await readImageFile(image.rootfs, `/${CA_BUNDLE}`)) ?? '';
    await writeFile(join(etcDir, 'ca-certificates.crt'), `${bundle}${bundle === '' || bundle.endsWith('\n') ? '' : '\n'}${host.extraCaPem}`, { mode: 0o644 });
    etcMounts.push({ destination: `/${CA_BUNDLE}`, source: join(etcDir, 'ca-certificates.crt'), readOnly: true });
  }
  const mounts: BindMount[] = [
    { destination: INIT_PATH, source: host.init, readOnly: true },
    { destination: '/etc/hostname', source: join(etcDir, 'hostname'), readOnly: true },
    { destination: '/etc/hosts', source: join(etcDir, 'hosts'), readOnly: true },
    ...etcMounts,
    ...volumes.map((m) => ({ destination: m.dst, source: m.src, readOnly: m.readOnly })),
  ];
  if (gvisor && (await mkdir(paths.tmp, { recursive: true, mode: 0o1777 })) !== undefined) {
    // Owned by the sandbox's root, sticky and world-writable like any /tmp (mkdir's mode passes the umask).
    await chown(paths.tmp, root, root);
    await chmod(paths.tmp, 0o1777);
    // Then what the image has there, with its mode and owner: the bind hides the image's /tmp (image-tmp.ts).
    await seedTmpFromImage(image.rootfs, paths.tmp, ROOT_ID_MAP, idRange);
  }
  const generic: OciSpec = containerSpec(container, image.config, {
    rootfs: mountPoint,
    hostname: req.hostname,
    cgroupsPath: posix.join(host.cgroupParent, req.id),
    mounts,
    userNamespace: 'always',
    idMap: idRange,
    // runsc makes its own namespace (gVisor's sentry keeps the per-user counts itself).
    ...(ownRange && !gvisor && !checkpointable ? { userNamespacePath: paths.userns } : {}),
    passwd,
    group,
    ...(gvisor ? { netnsPath: paths.netns } : {}),
  }, req.spec);
  // runc's processes get their rlimits by inheritance (the shim's -l, withPodRlimits for exec);
  // runsc sets them in its sentry from the spec.
  const spec = gvisor ? runscSpec(generic, { tmpDir: paths.tmp }) : { ...generic, process: { ...generic.process, rlimits: [] } };
  // asb-init as pid 1: it passes SIGTERM on to the command's process group (a shell as pid 1 would
  // ignore it: the kernel drops signals a namespace's init has no handler for), reaps orphans, and
  // starts exec'd processes and terminals as its own children (agent.ts). Its token stays the
  // pod's across starts: a pod restored with its memory has the one it was started with.
  const token = (await readIdentity(paths))?.agent?.token ?? newAgentToken();
  if (!spec.process.env.some((e) => e.startsWith('HOME='))) spec.process.env.push(`HOME=${homeOf(passwd, spec.process.user.uid)}`);
  spec.process = initProcess(spec, INIT_PATH, { port: AGENT_PORT, token });
  if (checkpointable) {
    // Connections from outside are dropped by a pause with memory (as E2B documents): CRIU closes
    // them instead of refusing to dump (tcp-close), and ignores connections not yet accepted.
    const conf = join(paths.dir, 'criu.conf');
    await writeFile(conf, 'tcp-close\nskip-in-flight\n', { mode: 0o600 });
    spec.annotations = { 'org.criu.config': conf };
  }
  await writeFile(join(paths.dir, 'config.json'), JSON.stringify(spec), { mode: 0o600 });
  const shimArgs = ['-d', paths.dir, '-r', runtime.binary, '-R', runtime.root, '-i', gvisor ? runscContainerId(req.id) : req.id, '-b', paths.dir, '-c', spec.linux.cgroupsPath, '-o', image.rootfs, paths.upper, paths.work, mountPoint];
  if (net !== undefined) shimArgs.push('-n', net.ip, String(net.prefix), net.gateway);
  if (paths.disk !== undefined) shimArgs.push('-D', paths.disk.mount);
  if (!gvisor) shimArgs.push('-l', String(POD_NOFILE));
  if (gvisor) shimArgs.push('-N', paths.netns);
  if (ownRange) shimArgs.push('-U', String(idRange.hostId), String(idRange.size), String(ROOT_ID_MAP.hostId));
  if (ownRange && !gvisor && !checkpointable) shimArgs.push('-u', paths.userns);
  if (checkpointable) shimArgs.push('-P');
  if (diskBind !== undefined) shimArgs.push('-V', diskBind.to);
  if (runtime.flags.length > 0) shimArgs.push('--', ...runtime.flags);
  return { shimArgs, identity: identityOf(spec), runtime };
}

export type ImageUsers = (rootfs: string) => Promise<{ passwd: string; group: string }>;

/**
 * An image tree's /etc/passwd and /etc/group, read from the cached tree (never the pod's own
 * layer) once and kept for the last `max` trees: a tree is unpacked once per manifest digest and
 * never changes after, and a refill of 300 pods read the same two files 600 times. Read as the
 * container sees them (image-file.ts: links resolved inside the tree). A missing file is an empty
 * one (an image without users, e.g. a static binary); a file that is no regular file fails the
 * start (Invalid, naming it) and is not kept; any other failure (EMFILE under a burst of starts) is
 * not kept either, so the next start reads again.
 */
export function imageUsersCache(max = 32, readFileOfImage: typeof readImageFile = readImageFile): ImageUsers {
  const kept = new Map<string, Promise<{ passwd: string; group: string }>>();
  return (rootfs) => {
    const found = kept.get(rootfs);
    if (found !== undefined) return found;
    let transient = false;
    const read = (file: string): Promise<string> => readFileOfImage(rootfs, `/etc/${file}`).then((text) => text ?? '', (err: unknown) => {
      if (err instanceof AsbError) throw err;
      transient = true;
      return '';
    });
    const users = Promise.all([read('passwd'), read('group')]).then(([passwd, group]) => {
      if (transient) kept.delete(rootfs);
      return { passwd, group };
    }, (err: unknown) => {
      kept.delete(rootfs);
      throw err;
    });
    kept.set(rootfs, users);
    if (kept.size > max) kept.delete(kept.keys().next().value ?? rootfs);
    return users;
  };
}

/** The container's own user and environment: asb-init's flags when it is the init, else the process's. */
export function identityOf(spec: OciSpec): PodIdentity {
  const init = readInitProcess(spec.process, INIT_PATH);
  const env: Record<string, string> = {};
  for (const entry of init?.env ?? spec.process.env) {
    const eq = entry.indexOf('=');
    if (eq > 0) env[entry.slice(0, eq)] = entry.slice(eq + 1);
  }
  const groups = init?.groups ?? spec.process.user.additionalGids ?? [];
  const user = init ?? spec.process.user;
  return { uid: user.uid, gid: user.gid, ...(groups.length === 0 ? {} : { groups: [...groups] }), env, cwd: spec.process.cwd, ...(init?.agent === undefined ? {} : { agent: init.agent }) };
}

/** The identity recorded in a pod's config.json (an adopted pod, after a worker restart). */
export async function readIdentity(paths: PodPaths): Promise<PodIdentity | undefined> {
  try {
    return identityOf(JSON.parse(await readFile(join(paths.dir, 'config.json'), 'utf8')) as OciSpec);
  } catch {
    return undefined;
  }
}
