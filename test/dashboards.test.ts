// The Grafana dashboards and Prometheus alerting rules under clusters/components/dashboards/,
// checked against the real Prometheus (Debian's) scraping a running federation of one cluster:
// the hub, and a worker with its router and Envoy, each scraped with the admin key it takes. After
// real load (warm claims, a cold create, exec, a wake through Envoy, refused and failing requests)
// every panel's query returns series with the labels its legend names, every alert expression
// evaluates, and the alert for a sandbox that cannot start fires.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { promisify } from 'node:util';
import { parse as parseYaml } from 'yaml';
import { startTestFederation } from './support/federation.ts';
import { renderDashboards } from '../scripts/gen-dashboards.ts';
import { startPrometheus, type QueryResult } from './support/prometheus.ts';
import { waitFor } from './support/wait.ts';
import { edgeGet, WEB_TEMPLATE, webPool } from './support/web-sandbox.ts';
import { api } from './support/worker-process.ts';

const DIR = resolve(import.meta.dirname, '../clusters/components/dashboards');
const ALERTS = join(DIR, 'alerts.yaml');
const CLUSTER = 'east';

interface View { id: string; phase: string; ready: boolean; accessToken: string; launchType?: string }

const BROKEN_TEMPLATE = {
  apiVersion: 'extensions.agents.x-k8s.io/v1alpha1',
  kind: 'SandboxTemplate',
  metadata: { name: 'broken', namespace: 'default' },
  // An image no registry has: the sandbox cannot start, which an operator must hear about.
  spec: { podTemplate: { spec: { containers: [{ name: 'main', image: 'agent-sandbox/no-such-image:1', command: ['sleep', 'infinity'] }] } } },
};

test('every dashboard panel and every alert expression answers from a real Prometheus scraping a running system, and a sandbox that cannot start fires its alert', async (t) => {
  const fed = await startTestFederation([[CLUSTER, 'dash', 146]]);
  t.after(() => fed.cleanup());
  const cluster = fed.clusters[0];
  assert.ok(cluster !== undefined);
  const metricsAddress = cluster.router.ready.metrics;
  assert.ok(metricsAddress !== undefined, 'the router serves its metrics');
  const prom = await startPrometheus([
    { job: 'asb-worker', address: new URL(cluster.apiUrl).host, bearer: cluster.adminKey, labels: { cluster: CLUSTER } },
    { job: 'asb-router', address: metricsAddress, bearer: cluster.adminKey, labels: { cluster: CLUSTER } },
    { job: 'asb-envoy', address: new URL(cluster.envoy.endpoints.adminUrl).host, metricsPath: '/stats/prometheus', labels: { cluster: CLUSTER } },
    { job: 'asb-hub', address: new URL(fed.hubUrl).host, bearer: fed.adminKey },
  ], [ALERTS]);
  t.after(() => prom.stop());
  await waitFor('every target scraped', async () => {
    const up = await prom.query('up == 1');
    const fresh = await prom.query('asb_sandbox_failures_total');
    return up.result.length === 4 && fresh.result.length > 0 ? true : undefined;
  }, 30_000, 200);

  // Load: a warm pool and warm claims, a cold create, exec, a wake through Envoy.
  const loadStarted = Date.now();
  assert.equal((await api(cluster, 'POST', '/v1/apply', { objects: [WEB_TEMPLATE, webPool(2), BROKEN_TEMPLATE] })).status, 200);
  await waitFor('the warm pool filled', async () => ((await api<{ pools: { name: string; readyReplicas: number }[] }>(cluster, 'GET', '/v1/status')).body.pools.find((p) => p.name === 'web')?.readyReplicas === 2 ? true : undefined), 60_000, 200);
  const web = (await api<View>(cluster, 'POST', '/v1/sandboxes', { template: 'web' })).body;
  assert.equal((await api<View>(cluster, 'POST', '/v1/sandboxes', { template: 'web' })).status, 201);
  const cold = await api<View>(cluster, 'POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(cold.status, 201, JSON.stringify(cold.body));
  const exec = await api<{ stdout: string }>(cluster, 'POST', `/v1/sandboxes/${cold.body.id}/exec`, { command: ['echo', 'hi'] });
  assert.equal(exec.body.stdout, 'hi\n');
  const host = `8080-${web.id}.asb.localhost`;
  assert.equal((await edgeGet(cluster.edgeUrl, host, { headers: { 'x-access-token': web.accessToken } })).status, 200);
  assert.equal((await api(cluster, 'POST', `/v1/sandboxes/${web.id}/pause`)).status, 200);
  await waitFor('hibernation', async () => ((await api<View>(cluster, 'GET', `/v1/sandboxes/${web.id}`)).body.phase === 'Hibernated' ? true : undefined), 30_000, 100);
  const woken = await edgeGet(cluster.edgeUrl, host, { headers: { 'x-access-token': web.accessToken }, timeoutMs: 28_000 });
  assert.equal(woken.status, 200, 'the request woke the sandbox and got its answer');
  // Errors: no token at the edge, an unknown sandbox, a claim refused with no warm sandbox, a
  // sandbox whose image cannot be pulled.
  assert.equal((await edgeGet(cluster.edgeUrl, host)).status, 401);
  assert.equal((await edgeGet(cluster.edgeUrl, '8080-dashnosuchsandbox0000.asb.localhost')).status, 404);
  const refused = await api<{ code: string }>(cluster, 'POST', '/v1/sandboxes', { template: 'base', coldStart: false });
  assert.equal(refused.body.code, 'PoolExhausted');
  assert.equal((await api(cluster, 'POST', '/v1/sandboxes', { template: 'broken', wait: false })).status, 201);

  // Auth failures at the worker as well as at the edge.
  assert.equal((await api(cluster, 'GET', '/v1/sandboxes', undefined, 'asb_nosuchke_00000000000000000000000000000000')).status, 401);

  // The alerts for what was provoked fire: a sandbox that cannot start, a claim refused.
  const firing = async (name: string): Promise<Alert> => waitFor(`${name} to fire`, async () => {
    const { alerts } = (await prom.api('alerts')) as { alerts: Alert[] };
    return alerts.find((a) => a.labels.alertname === name && a.state === 'firing');
  }, 30_000, 250);
  const startFailure = await firing('AsbSandboxStartFailures');
  assert.equal(startFailure.labels.cluster, CLUSTER);
  assert.equal(startFailure.labels.severity, 'page');
  assert.match(startFailure.labels.reason ?? '', /^(PodStartFailed|ErrImagePull|ImagePullBackOff)$/, 'the reason the image could not be had');
  assert.match(startFailure.annotations.summary ?? '', new RegExp(`Sandboxes cannot start in ${CLUSTER}`));
  assert.equal((await firing('AsbColdStartsRefused')).labels.cluster, CLUSTER);
  // What was driven is in Prometheus, a couple of scrapes on (rates need two samples).
  await waitFor('the wake through Envoy scraped', async () => ((await prom.query('asb_router_wakes_total{result="ok"} > 0')).result.length === 1 ? true : undefined), 15_000, 250);
  // Envoy publishes its histograms at its stats flush (every 5 s), not as requests end: wait until
  // the four edge requests above (two 200s, a 401, a 404) are in a scraped latency histogram.
  const edgeTimed = `sum(envoy_http_downstream_rq_time_count{cluster="${CLUSTER}", envoy_http_conn_manager_prefix="edge"}) >= 4`;
  await waitFor('the edge requests in Envoy\'s latency histogram', async () => ((await prom.query(edgeTimed)).result.length === 1 ? true : undefined), 20_000, 250);
  await new Promise((resolve) => setTimeout(resolve, 3_000));

  // promtool accepts the rules, and Prometheus evaluates every one of them without error.
  const checked = await run('promtool', ['check', 'rules', ALERTS]);
  assert.match(checked, /SUCCESS: \d+ rules found/);
  const file = parseYaml(readFileSync(ALERTS, 'utf8')) as { groups: { rules: { alert: string; expr: string }[] }[] };
  const ruleExprs = file.groups.flatMap((g) => g.rules);
  const loaded = ((await prom.api('rules')) as { groups: { rules: { name: string; health: string; lastError?: string }[] }[] }).groups.flatMap((g) => g.rules);
  assert.deepEqual(loaded.map((r) => r.name).sort(), ruleExprs.map((r) => r.alert).sort(), 'Prometheus loaded every rule');
  for (const r of loaded) assert.equal(r.health, 'ok', `${r.name}: ${r.lastError ?? ''}`);
  for (const r of ruleExprs) {
    const answer = await prom.query(r.expr);
    assert.equal(answer.resultType, 'vector', r.alert);
  }

  // Every dashboard: committed as generated, valid Grafana JSON, and every panel's query answers
  // with series carrying the labels its legend names.
  const rendered = renderDashboards();
  assert.deepEqual(readdirSync(DIR).filter((f) => f.endsWith('.json')).sort(), [...rendered.keys()].sort());
  const windowS = Math.ceil((Date.now() - loadStarted) / 1000) + 5;
  for (const [name, text] of rendered) {
    assert.equal(readFileSync(join(DIR, name), 'utf8'), text, `${name} differs from what scripts/gen-dashboards.ts prints: run node scripts/gen-dashboards.ts`);
    const dashboard = JSON.parse(text) as Dashboard;
    assert.ok(typeof dashboard.uid === 'string' && dashboard.schemaVersion >= 36, name);
    const variables = dashboard.templating.list;
    assert.ok(variables.some((v) => v.name === 'datasource' && v.type === 'datasource' && v.query === 'prometheus'), `${name}: a Prometheus data source variable`);
    assert.ok(dashboard.panels.length >= 10, name);
    for (const panel of dashboard.panels) {
      const where = `${name}: "${panel.title}"`;
      assert.equal(panel.datasource.uid, '${datasource}', where);
      assert.ok(panel.targets.length > 0, where);
      let finite = 0;
      for (const target of panel.targets) {
        if (target.expr.includes('$cluster')) assert.ok(variables.some((v) => v.name === 'cluster'), `${where} uses $cluster, which the dashboard must define`);
        const expr = target.expr.replaceAll('$__rate_interval', '20s').replaceAll('$cluster', CLUSTER);
        const answer: QueryResult = panel.type === 'stat' ? await prom.query(expr) : await prom.queryRange(expr, windowS, 2);
        assert.equal(answer.resultType, panel.type === 'stat' ? 'vector' : 'matrix', `${where}: ${expr}`);
        assert.ok(answer.result.length > 0, `${where}: no series for ${expr}`);
        const legendLabels = [...target.legendFormat.matchAll(/\{\{\s*(\w+)\s*\}\}/g)].map((m) => m[1] ?? '');
        for (const series of answer.result) {
          for (const label of legendLabels) assert.ok(series.metric[label] !== undefined, `${where}: the legend names {{${label}}} but ${JSON.stringify(series.metric)} lacks it (${expr})`);
          const values = series.values ?? (series.value === undefined ? [] : [series.value]);
          finite += values.filter(([, v]) => Number.isFinite(Number(v))).length;
        }
      }
      assert.ok(finite > 0, `${where}: every value is NaN`);
    }
  }

  // docs/operations.md's picture (Grafana is not in Debian): ASB_DASHBOARD_PNG=<file> drives half a
  // minute more traffic, then Chromium photographs two panels' queries in Prometheus's own graph page.
  const picture = process.env.ASB_DASHBOARD_PNG;
  if (picture !== undefined) {
    for (let i = 0; i < 20; i++) {
      const claimed = await api<View>(cluster, 'POST', '/v1/sandboxes', { template: 'web' });
      await edgeGet(cluster.edgeUrl, host, { headers: { 'x-access-token': web.accessToken } });
      await edgeGet(cluster.edgeUrl, i % 3 === 0 ? host : '8080-dashnosuchsandbox0000.asb.localhost');
      if (claimed.status === 201) await api(cluster, 'DELETE', `/v1/sandboxes/${claimed.body.id}`);
      await new Promise((resolve) => setTimeout(resolve, 1_500));
    }
    await photograph(prom.url, picture, Math.ceil((Date.now() - loadStarted) / 1000), [panelExpr('fleet.json', 'Claims by cluster'), panelExpr('data-plane.json', 'Router decisions')]);
  }
});

/** The first query of a panel, as the picture shows it (20 s rate window, this test's cluster). */
function panelExpr(file: string, title: string): string {
  const dashboard = JSON.parse(renderDashboards().get(file) ?? '{}') as Dashboard;
  const expr = dashboard.panels.find((p) => p.title === title)?.targets[0]?.expr;
  assert.ok(expr !== undefined, `${file}: no panel "${title}"`);
  return expr.replaceAll('$__rate_interval', '20s').replaceAll('$cluster', CLUSTER);
}

/** A headless Chromium screenshot of Prometheus's graph page showing `exprs` over the last `seconds`. */
async function photograph(prometheusUrl: string, file: string, seconds: number, exprs: string[]): Promise<void> {
  const params = exprs.flatMap((expr, i) => [`g${String(i)}.expr=${encodeURIComponent(expr)}`, `g${String(i)}.tab=0`, `g${String(i)}.range_input=${String(seconds)}s`]);
  const profile = mkdtempSync(join(tmpdir(), 'asb-chromium-'));
  try {
    await run('chromium', [
      '--headless=new', '--disable-gpu', '--hide-scrollbars', `--user-data-dir=${profile}`,
      // Root cannot run Chromium's own sandbox; the page is our loopback Prometheus.
      ...(process.getuid?.() === 0 ? ['--no-sandbox'] : []),
      '--window-size=1200,1640', '--virtual-time-budget=8000', `--screenshot=${resolve(file)}`,
      `${prometheusUrl}/classic/graph?${params.join('&')}`,
    ]);
  } finally {
    rmSync(profile, { recursive: true, force: true });
  }
}

interface Alert { state: string; labels: Record<string, string | undefined>; annotations: Record<string, string | undefined> }

interface Dashboard {
  uid: string;
  schemaVersion: number;
  templating: { list: { name: string; type: string; query?: unknown }[] };
  panels: { title: string; type: string; datasource: { uid: string }; targets: { expr: string; legendFormat: string }[] }[];
}

async function run(file: string, args: string[]): Promise<string> {
  const { stdout, stderr } = await promisify(execFile)(file, args, { timeout: 30_000 });
  return stdout + stderr;
}
