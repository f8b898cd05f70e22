// The unmodified E2B SDK with no apiUrl and no sandboxUrl: Recipe B of research e2b.md. It finds
// the API at https://api.<E2B_DOMAIN> and each sandbox at https://49983-<id>.<domain>, as against
// E2B's cloud. Run as its own process, because the test CA must be in NODE_EXTRA_CA_CERTS when
// Node starts. `*.asb.localhost` is resolved to 127.0.0.1 here (glibc does not), by patching
// dns.lookup, which net.connect reads at call time (undici brings its own Agent, so nothing else
// can be patched). Prints one JSON line of what it saw.
import dns from 'node:dns';
import { Sandbox } from 'e2b';

const SUFFIX = '.asb.localhost';
const lookup = dns.lookup.bind(dns);
const patched = ((host: string, options: unknown, callback: unknown): void => {
  const cb = (typeof options === 'function' ? options : callback) as (err: Error | null, address: string | dns.LookupAddress[], family?: number) => void;
  const all = typeof options === 'object' && options !== null && (options as { all?: boolean }).all === true;
  if (host.endsWith(SUFFIX) || host === SUFFIX.slice(1)) {
    if (all) cb(null, [{ address: '127.0.0.1', family: 4 }]);
    else cb(null, '127.0.0.1', 4);
    return;
  }
  (lookup as (h: string, o: unknown, c: unknown) => void)(host, options, callback);
}) as typeof dns.lookup;
dns.lookup = patched;

const sbx = await Sandbox.create('base', { envs: { VIA: 'https' } });
const run = await sbx.commands.run('echo "$VIA $(hostname)"');
await sbx.files.write('/tmp/over-tls.txt', 'h2 host routing');
const read = await sbx.files.read('/tmp/over-tls.txt');
const host = sbx.getHost(49983);
const listed = (await Sandbox.list().nextItems()).map((s) => s.sandboxId);
const killed = await sbx.kill();
console.log(JSON.stringify({ id: sbx.sandboxId, stdout: run.stdout, read, host, listed, killed }));
