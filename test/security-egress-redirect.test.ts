// The local runtime with an egress proxy (option egressProxy, the contract with the egress proxy
// in src/edge): a sandbox's outbound TCP that its policy does not already decide by address goes
// to the proxy's port on the bridge gateway; what the address rules deny is still refused by the
// kernel, and nothing else on the host opens. The "proxy" here is a plain HTTP server of this
// test on the gateway address that says who reached it; no packet leaves the host.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after } from 'node:test';
import { parseEgressPolicy, type EgressPolicy } from '../src/network/egress-policy.ts';
import type { Attack, LabPod } from './support/attack-lab.ts';
import { AttackLab, fields } from './support/attack-lab.ts';

const GATEWAY = '10.239.128.1';
const hits: string[] = [];
const proxy = createServer((req, res) => {
  hits.push(req.headers.host ?? '');
  res.end(`proxy ${req.headers.host ?? ''}`);
});
// The port must be known before the runtime starts; the gateway address exists once the bridge does.
const port = await new Promise<number>((resolve) => {
  const probe = createServer().listen(0, '127.0.0.1', () => {
    const p = (probe.address() as AddressInfo).port;
    probe.close(() => resolve(p));
  });
});
const lab = await AttackLab.create({ bridge: 'asbnpred0', subnet: '10.239.128.0/17', runtime: { egressProxy: { port } } });
await new Promise<void>((resolve) => proxy.listen(port, GATEWAY, resolve));
after(() => proxy.close());

const policy = (p: Partial<EgressPolicy>): EgressPolicy => parseEgressPolicy(p, 'egress');

async function curl(p: LabPod, url: string): Promise<{ exit: string; body: string }> {
  const r = await p.sh(`curl -sS --max-time 5 -o /tmp/b ${url} 2>/dev/null; echo exit=$?; echo body=$(cat /tmp/b 2>/dev/null)`);
  const f = fields(r.out);
  return { exit: f.get('exit') ?? '', body: f.get('body') ?? '' };
}

const redirect: Attack = {
  name: 'with an egress proxy, outbound TCP the address rules leave open reaches the proxy; denied addresses are still refused by the kernel',
  async run(a) {
    const open = await a.pod('rd-open');
    assert.deepEqual(await curl(open, 'http://203.0.113.10/'), { exit: '0', body: 'proxy 203.0.113.10' }, 'the internet goes through the proxy');
    assert.deepEqual(await curl(open, `http://${GATEWAY}:${String(port)}/`), { exit: '0', body: `proxy ${GATEWAY}:${String(port)}` }, 'the proxy port itself is open');
    assert.equal((await curl(open, `http://${GATEWAY}:${String(port + 1)}/`)).exit, '7', 'no other host port');
    assert.equal((await curl(open, 'http://10.239.0.10/')).exit, '7', 'a private address is refused, not proxied');
    assert.equal((await curl(open, 'http://169.254.169.254/')).exit, '7');
    const domains = await a.pod('rd-domains', {}, { egress: policy({ deny: ['0.0.0.0/0'], allow: ['api.example.com'] }) });
    assert.deepEqual(await curl(domains, 'http://198.51.100.10/'), { exit: '0', body: 'proxy 198.51.100.10' }, 'only the proxy can tell api.example.com: it decides');
    const closed = await a.pod('rd-closed', {}, { egress: policy({ internet: false }) });
    assert.equal((await curl(closed, 'http://203.0.113.10/')).exit, '7', 'no domain could allow it: the kernel refuses at once');
    const denied = await a.pod('rd-denied', {}, { egress: policy({ deny: ['203.0.113.0/24'] }) });
    assert.equal((await curl(denied, 'http://203.0.113.10/')).exit, '7');
    assert.deepEqual(hits.splice(0), ['203.0.113.10', `${GATEWAY}:${String(port)}`, '198.51.100.10'], 'the proxy saw only what it should');
  },
};

lab.register([redirect]);
