// asb-init's own process in a pod's config.json: asb-init as the container's root with the few
// capabilities it needs for itself, the pod's user and capabilities as its flags, and the agent's
// port and token in its environment (asb-init.c reads and removes them); read back from the config
// after a restart (readInitProcess). Also the HOME the pod's user gets from the image's /etc/passwd.
import { randomBytes } from 'node:crypto';
import type { OciSpec } from '../oci/spec.ts';
import { passwdEntries } from '../oci/user-spec.ts';

/** asb-init reads `<port>:<token>` from this variable and removes it before anything else runs. */
export const AGENT_ENV = 'ASB_AGENT';

/**
 * The capabilities asb-init needs for itself: to set a child's user (SETUID, SETGID) and bounding
 * set (SETPCAP), to signal processes of another user of the pod (KILL: a stop's SIGTERM to a
 * command running as uid 1000, an exec's timeout), and to give a started process its own stdio
 * pipes or terminal (CHOWN: a program that opens /dev/stdout must find it its user's).
 */
const INIT_CAPS = ['CAP_CHOWN', 'CAP_KILL', 'CAP_SETGID', 'CAP_SETUID', 'CAP_SETPCAP'];

/** Linux's capability numbers (linux/capability.h), for asb-init's masks. */
const CAP_NUMBERS: Readonly<Record<string, number>> = {
  CAP_CHOWN: 0, CAP_DAC_OVERRIDE: 1, CAP_DAC_READ_SEARCH: 2, CAP_FOWNER: 3, CAP_FSETID: 4, CAP_KILL: 5, CAP_SETGID: 6,
  CAP_SETUID: 7, CAP_SETPCAP: 8, CAP_LINUX_IMMUTABLE: 9, CAP_NET_BIND_SERVICE: 10, CAP_NET_BROADCAST: 11, CAP_NET_ADMIN: 12,
  CAP_NET_RAW: 13, CAP_IPC_LOCK: 14, CAP_IPC_OWNER: 15, CAP_SYS_MODULE: 16, CAP_SYS_RAWIO: 17, CAP_SYS_CHROOT: 18,
  CAP_SYS_PTRACE: 19, CAP_SYS_PACCT: 20, CAP_SYS_ADMIN: 21, CAP_SYS_BOOT: 22, CAP_SYS_NICE: 23, CAP_SYS_RESOURCE: 24,
  CAP_SYS_TIME: 25, CAP_SYS_TTY_CONFIG: 26, CAP_MKNOD: 27, CAP_LEASE: 28, CAP_AUDIT_WRITE: 29, CAP_AUDIT_CONTROL: 30,
  CAP_SETFCAP: 31, CAP_MAC_OVERRIDE: 32, CAP_MAC_ADMIN: 33, CAP_SYSLOG: 34, CAP_WAKE_ALARM: 35, CAP_BLOCK_SUSPEND: 36,
  CAP_AUDIT_READ: 37, CAP_PERFMON: 38, CAP_BPF: 39, CAP_CHECKPOINT_RESTORE: 40,
};

function mask(names: readonly string[]): string {
  let bits = 0n;
  for (const name of names) {
    const n = CAP_NUMBERS[name];
    if (n === undefined) throw new Error(`unknown capability ${name}`);
    bits |= 1n << BigInt(n);
  }
  return bits.toString(16);
}

export function newAgentToken(): string {
  return randomBytes(24).toString('hex');
}

/**
 * The pod's process as asb-init runs it: asb-init as container root with INIT_CAPS besides the
 * pod's own, the pod's user and capabilities as its flags (the command and every started process
 * get those), and the agent's address in its environment. `init` is where asb-init is mounted.
 */
export function initProcess(spec: OciSpec, init: string, agent: { port: number; token: string }): OciSpec['process'] {
  const p = spec.process;
  const c = p.capabilities;
  const groups = p.user.additionalGids ?? [];
  const user = `${String(p.user.uid)}:${String(p.user.gid)}${groups.length > 0 ? `:${groups.join(',')}` : ''}`;
  const caps = [c.bounding, c.effective, c.permitted, c.inheritable, c.ambient].map(mask).join(':');
  const own = (set: readonly string[]): string[] => [...new Set([...set, ...INIT_CAPS])];
  return {
    ...p,
    // No additionalGids at all, not an empty list: runsc's restore compares the user with the saved spec, which drops an empty one (runsc.ts).
    user: { uid: 0, gid: 0 },
    capabilities: { bounding: own(c.bounding), effective: own(c.effective), permitted: own(c.permitted), inheritable: [...c.inheritable], ambient: [] },
    args: [init, '--user', user, '--caps', caps, '--', ...p.args],
    env: [...p.env, `${AGENT_ENV}=${String(agent.port)}:${agent.token}`],
  };
}

/**
 * The home directory /etc/passwd gives `uid`, else "/": what runc sets HOME to when the process's
 * environment has none. asb-init runs as root, so runc would give the init (and through it the
 * command and every exec) root's home: the pod's spec gets the user's HOME itself instead.
 */
export function homeOf(passwd: string, uid: number): string {
  return passwdEntries(passwd).find((e) => e.uid === uid && e.home !== '')?.home ?? '/';
}

/** What asb-init's command line and environment say (a pod's config.json read back after a restart). */
export function readInitProcess(process: OciSpec['process'], init: string): { uid: number; gid: number; groups: number[]; env: string[]; agent?: { port: number; token: string } } | undefined {
  const [binary, flag, user] = process.args;
  if (binary !== init || flag !== '--user' || user === undefined) return undefined;
  const [uidText, gidText, groupsText = ''] = user.split(':');
  const uid = Number(uidText);
  const gid = Number(gidText);
  if (!Number.isInteger(uid) || !Number.isInteger(gid)) return undefined;
  const groups = groupsText === '' ? [] : groupsText.split(',').map(Number).filter((g) => Number.isInteger(g));
  const env = process.env.filter((e) => !e.startsWith(`${AGENT_ENV}=`));
  const value = process.env.find((e) => e.startsWith(`${AGENT_ENV}=`))?.slice(AGENT_ENV.length + 1);
  const colon = value?.indexOf(':') ?? -1;
  const agent = value === undefined || colon < 0 ? undefined : { port: Number(value.slice(0, colon)), token: value.slice(colon + 1) };
  return { uid, gid, groups, env, ...(agent === undefined ? {} : { agent }) };
}
