// Who a USER value is (an image config's User, a build's USER step): `name`, `uid`, `name:group`,
// `uid:gid` against the image's /etc/passwd and /etc/group, by the rules Docker applies through
// runc's user.GetExecUser, pure:
// - the user: a number is a uid whether or not passwd names it; a name must be in passwd (root is
//   uid 0 even without one). The passwd entry (by name, or by uid for a number) gives the primary
//   group and the home directory.
// - an explicit group: a number is a gid whether or not /etc/group names it; a name must be in
//   /etc/group. It replaces the primary group, and no supplementary groups are added.
// - no group: the passwd entry's group (else the uid as gid), and every /etc/group entry that
//   lists the user's name among its members as a supplementary group.

export interface ExecUser {
  uid: number;
  gid: number;
  /** Supplementary groups, in /etc/group's order, without duplicates and without gid itself. */
  groups: number[];
  /** From passwd; undefined when no entry matched. */
  home?: string;
}

export type ExecUserResult = ExecUser | { error: string };

const NUMBER = /^\d+$/;
/** The ids a user namespace of a sandbox maps: 0..65535. */
const MAX_ID = 65_535;

export interface PasswdEntry { name: string; uid: number; gid: number; home: string }
interface GroupEntry { name: string; gid: number; members: string[] }

/** The well-formed entries of /etc/passwd text (a name, numeric uid and gid; comments skipped). */
export function passwdEntries(text: string): PasswdEntry[] {
  const out: PasswdEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 4 || (f[0] ?? '') === '' || (f[0] ?? '').startsWith('#') || !NUMBER.test(f[2] ?? '') || !NUMBER.test(f[3] ?? '')) continue;
    out.push({ name: f[0] ?? '', uid: Number(f[2]), gid: Number(f[3]), home: f[5] ?? '' });
  }
  return out;
}

function groupEntries(text: string): GroupEntry[] {
  const out: GroupEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 3 || (f[0] ?? '') === '' || (f[0] ?? '').startsWith('#') || !NUMBER.test(f[2] ?? '')) continue;
    out.push({ name: f[0] ?? '', gid: Number(f[2]), members: (f[3] ?? '').split(',').map((m) => m.trim()).filter((m) => m !== '') });
  }
  return out;
}

/** `spec` (`user[:group]`) resolved against the image's passwd and group files' text. */
export function resolveExecUser(spec: string, passwd: string, group: string): ExecUserResult {
  const colon = spec.indexOf(':');
  const userArg = colon === -1 ? spec : spec.slice(0, colon);
  const groupArg = colon === -1 ? undefined : spec.slice(colon + 1);
  if (groupArg === '') return { error: `USER "${spec}" names an empty group` };
  const users = passwdEntries(passwd);
  const numericUser = userArg === '' ? 0 : NUMBER.test(userArg) ? Number(userArg) : undefined;
  const entry = numericUser === undefined ? users.find((u) => u.name === userArg) : users.find((u) => u.uid === numericUser);
  let uid: number;
  if (entry !== undefined) uid = entry.uid;
  else if (numericUser !== undefined) uid = numericUser;
  else if (userArg === 'root') uid = 0;
  else return { error: `no user "${userArg}" in the image's /etc/passwd` };
  if (uid > MAX_ID) return { error: `uid ${String(uid)} is past ${String(MAX_ID)}, the last id a sandbox maps` };
  const home = entry !== undefined && entry.home !== '' ? { home: entry.home } : userArg === 'root' || uid === 0 ? { home: '/root' } : {};
  const groups = groupEntries(group);
  if (groupArg !== undefined) {
    let gid: number;
    if (NUMBER.test(groupArg)) gid = Number(groupArg);
    else {
      const named = groups.find((g) => g.name === groupArg);
      if (named === undefined) return { error: `no group "${groupArg}" in the image's /etc/group` };
      gid = named.gid;
    }
    if (gid > MAX_ID) return { error: `gid ${String(gid)} is past ${String(MAX_ID)}, the last id a sandbox maps` };
    return { uid, gid, groups: [], ...home };
  }
  const gid = entry?.gid ?? uid;
  const supplementary: number[] = [];
  if (entry !== undefined) {
    for (const g of groups) {
      if (g.members.includes(entry.name) && g.gid !== gid && g.gid <= MAX_ID && !supplementary.includes(g.gid)) supplementary.push(g.gid);
    }
  }
  return { uid, gid, groups: supplementary, ...home };
}
