// Attacks through a tenant's image: every file the runtime reads from or writes into a container's
// filesystem on the host (the CA bundle it extends with the cluster's CA, /etc/passwd and
// /etc/group for user names, /etc/hosts, /etc/hostname and /etc/resolv.conf it mounts) is, in
// the image, a link to a host file: absolute, relative with enough ../ to climb out, and through
// /proc/self/root. Before, the runtime read the image's CA bundle on the host and followed the
// link, so the sandbox started with any host file root can read as its CA bundle (the cluster's
// secret, the hub's admin key). The host canary must never be readable inside, nor changed.
import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import type { Attack } from './support/attack-lab.ts';
import { AttackLab } from './support/attack-lab.ts';
import { pushTenantImage, type LayerEntry } from './support/tenant-image.ts';

const canaryDir = await mkdtemp(join(tmpdir(), 'asb-image-canary-'));
after(() => rm(canaryDir, { recursive: true, force: true }));
const SECRET = `host-secret-${String(process.pid)}-${String(Date.now())}`;
const EXTRA_CA = '-----BEGIN CERTIFICATE-----\nasb-test-extra-ca\n-----END CERTIFICATE-----\n';
const extraCaPath = join(canaryDir, 'extra-ca.pem');
await writeFile(extraCaPath, EXTRA_CA);

const BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
/** The paths the runtime reads (bundle, passwd, group) or mounts over (hosts, hostname, resolv.conf). */
const HOST_TOUCHED = [BUNDLE, '/etc/passwd', '/etc/group', '/etc/hosts', '/etc/hostname', '/etc/resolv.conf'];
/** One host canary per path (as root's secrets are: the cluster secret, the admin key), each holding the secret. */
const canaryOf = (path: string): string => join(canaryDir, `secret${path.replaceAll('/', '_')}`);
for (const path of HOST_TOUCHED) await writeFile(canaryOf(path), `${SECRET}\n`, { mode: 0o600 });
const CANARIES = ['extra-ca.pem', ...HOST_TOUCHED.map((p) => canaryOf(p).slice(canaryDir.length + 1))].sort();

// Free on this host and in every other test (grep test/ for 10.2xx before taking another).
const lab = await AttackLab.create({ bridge: 'asbimg0', subnet: '10.221.0.0/16', runtime: { extraCaPath, podDns: true } });

/**
 * How each link kind ends, per runtime class. runc resolves its mount destinations inside the
 * root (openat2 RESOLVE_IN_ROOT): an absolute or ../ link lands inside the image, where runc makes
 * the file and mounts the runtime's over it; a magic link (/proc/self/root) it refuses by name.
 * runsc refuses a destination that is a link to a path the image lacks.
 */
const LINKS: Record<string, { target: (path: string) => string; runs: { runc: boolean; gvisor: boolean }; refusal: RegExp }> = {
  absolute: { target: (path) => canaryOf(path), runs: { runc: true, gvisor: false }, refusal: /Failure to resolve mounts: no such file or directory/ },
  'relative ../': { target: (path) => `${'../'.repeat(path.split('/').length + 8)}${canaryOf(path).slice(1)}`, runs: { runc: true, gvisor: false }, refusal: /Failure to resolve mounts: no such file or directory/ },
  '/proc/self/root': { target: (path) => `/proc/self/root${canaryOf(path)}`, runs: { runc: false, gvisor: false }, refusal: /(\/etc\/host(s|name): too many levels of symbolic links|"\/proc\/self\/root\/[^"]*secret_etc_host(s|name)\\+" during mountpoint creation: invalid argument)/ },
};

const images = new Map<string, Promise<string>>();
/** Each image is pushed once for the file, whichever runtime class asks first. */
function image(name: string, entries: () => LayerEntry[]): Promise<string> {
  let pushed = images.get(name);
  if (pushed === undefined) {
    pushed = pushTenantImage(name, entries());
    images.set(name, pushed);
  }
  return pushed;
}

async function canariesUnchanged(before: ReadonlyMap<string, number>): Promise<void> {
  for (const path of HOST_TOUCHED) {
    assert.equal(await readFile(canaryOf(path), 'utf8'), `${SECRET}\n`, `the host canary for ${path} was changed`);
    assert.equal((await stat(canaryOf(path))).mtimeMs, before.get(path), `the host canary for ${path} was written`);
  }
  assert.deepEqual((await readdir(canaryDir)).sort(), CANARIES, 'something was made in the host directory');
}

async function mtimes(): Promise<Map<string, number>> {
  return new Map(await Promise.all(HOST_TOUCHED.map(async (path) => [path, (await stat(canaryOf(path))).mtimeMs] as const)));
}

const linkAttacks: Attack[] = Object.entries(LINKS).map(([kind, link]) => ({
  name: `an image whose ${HOST_TOUCHED.join(', ')} are ${kind} links to host files neither shows nor changes them`,
  run: async (a) => {
    const before = await mtimes();
    const name = await image(`asb-tenant-${kind.replace(/[^a-z]/g, '')}`, () => HOST_TOUCHED.map((path) => ({ path, link: link.target(path) })));
    const pod = await a.pod(`img-${kind.replace(/[^a-z]/g, '').slice(0, 8)}`, { image: name }, { running: false });
    if (!link.runs[a.cls]) {
      const state = pod.state();
      assert.equal(state.phase, 'Failed', `${a.cls} refuses the image: ${JSON.stringify(state)}`);
      assert.match(state.message ?? '', link.refusal);
      await canariesUnchanged(before);
      return;
    }
    assert.equal(pod.state().phase, 'Running', JSON.stringify(pod.state()));
    for (const path of HOST_TOUCHED) {
      const r = await pod.sh(`cat ${path} 2>&1; true`);
      assert.doesNotMatch(r.out, new RegExp(SECRET), `${a.cls}: ${path} inside the sandbox shows the host file`);
    }
    // The runtime's own files are what the sandbox sees: the bundle has the cluster's CA, hosts the pod's name.
    assert.match((await pod.sh(`cat ${BUNDLE}`)).out, /asb-test-extra-ca/);
    assert.match((await pod.sh('cat /etc/hosts')).out, new RegExp(`\\t${pod.id}\\n`));
    await canariesUnchanged(before);
    // A wake reads and mounts them all again.
    await pod.hibernate();
    assert.equal((await pod.wake()).phase, 'Running');
    assert.doesNotMatch((await pod.sh(`cat ${HOST_TOUCHED.join(' ')} 2>&1; true`)).out, new RegExp(SECRET));
    await canariesUnchanged(before);
  },
}));

const specialFileAttacks: Attack[] = [
  {
    name: 'an image whose /etc/passwd is a FIFO fails to start with a reason naming it, and the worker does not hang on it',
    run: async (a) => {
      const name = await image('asb-tenant-fifo', () => [{ path: '/etc/passwd', fifo: true }]);
      const pod = await a.pod('img-fifo', { image: name }, { running: false });
      const state = pod.state();
      assert.equal(state.phase, 'Failed', JSON.stringify(state));
      assert.equal(state.reason, 'CreateContainerConfigError');
      assert.match(state.message ?? '', /\/etc\/passwd is a FIFO, not a regular file/);
    },
  },
];

lab.register([...linkAttacks, ...specialFileAttacks]);
