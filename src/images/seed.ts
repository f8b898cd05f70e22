// Seeds a registry with the images scripts/build-images.sh made: each tag of the built OCI layout
// is pushed (skopeo copy, plain HTTP on loopback) under every Docker reference seed.json gives it,
// at the same repository path it has on Docker Hub. With the registry configured as the docker.io
// mirror (registries.ts), `busybox`, `debian:12`, `python:3.11` and `agent-sandbox/base` then
// pull as they would from Docker Hub; `localhost:<port>/agent-sandbox/base` names the same image
// directly. A blob the registry already has is not sent again (skopeo asks first).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { AsbError } from '../errors.ts';
import { parseImageReference } from './reference.ts';
import { runTool, SKOPEO, toolMessage } from './tool.ts';

export interface SeedImages {
  /** The OCI layout scripts/build-images.sh wrote. */
  readonly layout: string;
  /** Layout tag → Docker references it is pushed as. */
  readonly tags: Readonly<Record<string, readonly string[]>>;
}

/** Where `make images` writes them: .tools/images, or ASB_IMAGES_DIR (a worktree sharing another checkout's build). */
export function defaultSeedDir(): string {
  return process.env.ASB_IMAGES_DIR ?? resolve(import.meta.dirname, '../../.tools/images');
}

/** The build output: `<dir>/oci` and `<dir>/seed.json` (default dir `.tools/images`). */
export function readSeedImages(dir: string): SeedImages {
  const layout = join(dir, 'oci');
  const seedPath = join(dir, 'seed.json');
  if (!existsSync(join(layout, 'index.json')) || !existsSync(seedPath)) {
    throw new AsbError('Unavailable', `no seed images in ${dir}: run scripts/build-images.sh (make test and make up do)`);
  }
  return { layout, tags: JSON.parse(readFileSync(seedPath, 'utf8')) as Record<string, string[]> };
}

/**
 * Pushes every seed image (or those of `only`, full references) to the registry at `address`
 * (`127.0.0.1:<port>`); returns the repository:tag pairs pushed.
 */
export async function seedRegistry(address: string, seed: SeedImages, opts: { tmpDir: string; timeoutMs?: number; only?: readonly string[]; credentials?: { username: string; password: string } }): Promise<string[]> {
  mkdirSync(opts.tmpDir, { recursive: true });
  const policy = join(opts.tmpDir, 'policy.json');
  writeFileSync(policy, JSON.stringify({ default: [{ type: 'insecureAcceptAnything' }] }));
  const pushed: string[] = [];
  // Credentials through an auth file, never on the command line (ps shows it).
  const creds: string[] = ['--dest-no-creds'];
  if (opts.credentials !== undefined) {
    const authFile = join(opts.tmpDir, 'auth.json');
    const auth = Buffer.from(`${opts.credentials.username}:${opts.credentials.password}`).toString('base64');
    writeFileSync(authFile, JSON.stringify({ auths: { [address]: { auth } } }), { mode: 0o600 });
    creds.splice(0, 1, '--dest-authfile', authFile);
  }
  for (const [tag, references] of Object.entries(seed.tags)) {
    for (const reference of references) {
      if (opts.only !== undefined && !opts.only.includes(reference)) continue;
      const ref = parseImageReference(reference);
      const target = `${ref.repository}:${ref.tag ?? 'latest'}`;
      const result = await runTool(SKOPEO, [
        '--policy', policy, '--tmpdir', opts.tmpDir, 'copy', '--retry-times', '0', '--dest-tls-verify=false', ...creds,
        `oci:${seed.layout}:${tag}`, `docker://${address}/${target}`,
      ], { timeoutMs: opts.timeoutMs ?? 120_000, env: { HOME: opts.tmpDir, XDG_RUNTIME_DIR: opts.tmpDir, XDG_CONFIG_HOME: opts.tmpDir } });
      if (result.code !== 0) throw new AsbError('Unavailable', `seeding ${address}/${target} failed: ${result.timedOut ? 'timed out' : toolMessage(result.stderr)}`);
      pushed.push(target);
    }
  }
  return pushed;
}
