// Writes the Grafana dashboards in clusters/components/dashboards/ (fleet.json, cluster.json,
// data-plane.json) from the panel lists below: one place says what each panel asks Prometheus,
// the JSON is the same shape for every panel. Run `node scripts/gen-dashboards.ts` after a
// change; test/dashboards.test.ts fails while the committed files differ from what this prints,
// and runs every panel's query against a real Prometheus scraping a running system.
//
// Labels the queries rely on: `cluster` is a target label the scrape config gives every worker,
// router and Envoy target (the hub's own series carry `cluster` themselves); `job` is asb-worker,
// asb-router, asb-envoy or asb-hub (docs/operations.md, "Dashboards and alerts").
import { writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const DASHBOARD_DIR = 'clusters/components/dashboards';

interface Target {
  expr: string;
  /** Grafana's legend: {{label}} names a label every series of the query carries. */
  legend: string;
}

interface Panel {
  title: string;
  description: string;
  /** stat: one number now (an instant query); timeseries: a graph over time (a range query). */
  type: 'stat' | 'timeseries';
  unit: string;
  targets: Target[];
}

const RATE = '[$__rate_interval]';

function ts(title: string, description: string, unit: string, ...targets: Target[]): Panel {
  return { title, description, type: 'timeseries', unit, targets };
}

function stat(title: string, description: string, unit: string, expr: string): Panel {
  return { title, description, type: 'stat', unit, targets: [{ expr, legend: '' }] };
}

/** p50 and p99 of a histogram, summed over `by` (plus le). */
function quantiles(metric: string, selector: string, by: string[], legendPrefix: string): Target[] {
  const keep = [...by, 'le'].join(', ');
  return [0.5, 0.99].map((q) => ({
    expr: `histogram_quantile(${String(q)}, sum by (${keep}) (rate(${metric}_bucket${selector}${RATE})))`,
    legend: `${legendPrefix}p${String(q * 100)}`,
  }));
}

const FLEET: Panel[] = [
  stat('Clusters linked to the hub', 'Worker clusters whose sync link to the hub is up now, of those the hub knows (asb_hub_cluster_connected).', 'none', 'sum(asb_hub_cluster_connected)'),
  stat('Sandboxes running', 'Running sandboxes in every cluster.', 'none', 'sum(asb_sandboxes{phase="Running"})'),
  stat('Warm sandboxes ready', 'Ready, unclaimed warm-pool members in every cluster.', 'none', 'sum(asb_warm_pool_ready_replicas)'),
  stat('Claims per second', 'Bound claims per second, all clusters.', 'reqps', `sum(rate(asb_claims_total{result="bound"}${RATE}))`),
  ts('Claims by cluster', 'Bound claims per second by cluster and launch (warm: from a pool; cold: a new pod), and failed claims.', 'reqps',
    { expr: `sum by (cluster, launch) (rate(asb_claims_total{result="bound"}${RATE}))`, legend: '{{cluster}} {{launch}}' },
    { expr: `sum by (cluster) (rate(asb_claims_total{result="failed"}${RATE}))`, legend: '{{cluster}} failed' }),
  ts('Warm pools', 'Ready members against desired replicas, per pool. Ready at 0 while desired is not: claims go cold or are refused.', 'none',
    { expr: 'sum by (cluster, namespace, pool) (asb_warm_pool_ready_replicas)', legend: '{{cluster}} {{namespace}}/{{pool}} ready' },
    { expr: 'sum by (cluster, namespace, pool) (asb_warm_pool_desired_replicas)', legend: '{{cluster}} {{namespace}}/{{pool}} desired' }),
  ts('Warm claim latency', 'Request to bound sandbox for claims served from a warm pool.', 's', ...quantiles('asb_claim_seconds', '{launch="warm"}', ['cluster'], '{{cluster}} ')),
  ts('Create latency (cold)', 'Request to ready sandbox when no warm member was there: a new pod.', 's', ...quantiles('asb_claim_seconds', '{launch="cold"}', ['cluster'], '{{cluster}} ')),
  ts('Wake latency', 'A hibernated sandbox woken until it is ready again (the worker\'s view).', 's', ...quantiles('asb_wake_seconds', '', ['cluster'], '{{cluster}} ')),
  ts('Sandboxes by phase', 'Sandboxes in every cluster by phase.', 'none', { expr: 'sum by (phase) (asb_sandboxes)', legend: '{{phase}}' }),
  ts('Errors by reason', 'API answers that were errors, by error code (docs/errors.md), per cluster.', 'reqps',
    { expr: `sum by (cluster, code) (rate(asb_api_errors_total${RATE})) > 0`, legend: '{{cluster}} {{code}}' }),
  ts('Sandbox failures by reason', 'Sandboxes that entered a failure (could not start, pull, restore; evicted; OOM; exited), by reason.', 'none',
    { expr: `sum by (cluster, reason) (increase(asb_sandbox_failures_total${RATE})) > 0`, legend: '{{cluster}} {{reason}}' }),
  ts('Memory: checkpoints and restores', 'Pauses that asked to keep memory, and wakes from a memory checkpoint, by result.', 'none',
    { expr: `sum by (result) (increase(asb_checkpoints_total${RATE}))`, legend: 'checkpoint {{result}}' },
    { expr: `sum by (result) (increase(asb_memory_restores_total${RATE}))`, legend: 'restore {{result}}' }),
  ts('Data disk free', 'Share of each worker\'s data disk (store, images, volumes, checkpoints) still free.', 'percentunit',
    { expr: 'min by (cluster, instance) (asb_data_disk_free_bytes / asb_data_disk_size_bytes)', legend: '{{cluster}} {{instance}}' }),
];

const C = '{cluster="$cluster"}';
const CLUSTER: Panel[] = [
  stat('Workers up', 'Worker API processes Prometheus reaches in this cluster.', 'none', 'sum(up{job="asb-worker", cluster="$cluster"})'),
  stat('Linked to the hub', '1 while this cluster\'s sync link to the hub is up (the hub\'s view).', 'none', 'max(asb_hub_cluster_connected{cluster="$cluster"})'),
  stat('Sandboxes', 'Sandboxes in this cluster, any phase.', 'none', `sum(asb_sandboxes${C})`),
  stat('Routers on the route feed', 'Routers connected to this cluster\'s route feed: at 0, the edge cannot route to new sandboxes.', 'none', `sum(asb_route_feed_connections${C})`),
  ts('Sandboxes by phase', 'Sandboxes by phase.', 'none', { expr: `sum by (phase) (asb_sandboxes${C})`, legend: '{{phase}}' }),
  ts('Warm pools', 'Ready members against desired replicas, per pool.', 'none',
    { expr: `sum by (namespace, pool) (asb_warm_pool_ready_replicas${C})`, legend: '{{namespace}}/{{pool}} ready' },
    { expr: `sum by (namespace, pool) (asb_warm_pool_desired_replicas${C})`, legend: '{{namespace}}/{{pool}} desired' }),
  ts('Claims', 'Claims per second by launch and result.', 'reqps', { expr: `sum by (launch, result) (rate(asb_claims_total${C}${RATE}))`, legend: '{{launch}} {{result}}' }),
  ts('Claim and create latency', 'Request to bound sandbox, by launch (warm, cold).', 's', ...quantiles('asb_claim_seconds', C, ['launch'], '{{launch}} ')),
  ts('Wake latency', 'A hibernated sandbox woken until it is ready again.', 's', ...quantiles('asb_wake_seconds', C, [], '')),
  ts('API requests', 'Worker API requests per second by route and status code.', 'reqps', { expr: `sum by (route, code) (rate(asb_http_requests_total${C}${RATE}))`, legend: '{{route}} {{code}}' }),
  ts('Errors by reason', 'API answers that were errors, by error code.', 'reqps', { expr: `sum by (code) (rate(asb_api_errors_total${C}${RATE})) > 0`, legend: '{{code}}' }),
  ts('Sandbox failures by reason', 'Sandboxes that entered a failure, by reason.', 'none', { expr: `sum by (reason) (increase(asb_sandbox_failures_total${C}${RATE})) > 0`, legend: '{{reason}}' }),
  ts('Reconciles', 'Controller reconciles per second by controller and result (ok, requeue, error).', 'ops', { expr: `sum by (controller, result) (rate(asb_reconcile_total${C}${RATE}))`, legend: '{{controller}} {{result}}' }),
  ts('Store write latency', 'Store write call to durable commit, by operation (p99).', 's',
    { expr: `histogram_quantile(0.99, sum by (op, le) (rate(asb_store_write_seconds_bucket${C}${RATE})))`, legend: '{{op}} p99' }),
  ts('Data disk', 'Free and total bytes of each worker\'s data disk.', 'bytes',
    { expr: `sum by (instance) (asb_data_disk_free_bytes${C})`, legend: '{{instance}} free' },
    { expr: `sum by (instance) (asb_data_disk_size_bytes${C})`, legend: '{{instance}} size' }),
  ts('Egress from sandboxes', 'Outbound connection attempts per second decided by the kernel rules, by verdict.', 'cps', { expr: `sum by (verdict) (rate(asb_egress_connections_total${C}${RATE}))`, legend: '{{verdict}}' }),
];

const EDGE = '{cluster="$cluster", envoy_http_conn_manager_prefix="edge"}';
const DATA_PLANE: Panel[] = [
  stat('Requests held now', 'Requests the router holds while their sandbox wakes or its id is looked up.', 'none', `sum(asb_router_held_requests${C})`),
  stat('Routes', 'Route entries in the router\'s table.', 'none', `sum(asb_router_routes${C})`),
  stat('Edge requests per second', 'Requests per second on Envoy\'s edge listener.', 'reqps', `sum(rate(envoy_http_downstream_rq_xx${EDGE}${RATE}))`),
  stat('ExtProc streams failed', 'ext_proc streams to the router that failed, over the last 5 minutes.', 'none', `sum(increase(envoy_http_ext_proc_streams_failed${EDGE}[5m]))`),
  ts('Edge requests by status class', 'Requests per second on Envoy\'s edge listener by response class.', 'reqps',
    { expr: `sum by (envoy_response_code_class) (rate(envoy_http_downstream_rq_xx${EDGE}${RATE}))`, legend: '{{envoy_response_code_class}}xx' }),
  ts('Edge request latency', 'Envoy\'s downstream request time on the edge listener.', 'ms', ...quantiles('envoy_http_downstream_rq_time', EDGE, [], '')),
  ts('Router decisions', 'Requests the router decided per second: route, or the status it answered itself.', 'reqps', { expr: `sum by (result) (rate(asb_router_requests_total${C}${RATE}))`, legend: '{{result}}' }),
  ts('ExtProc streams', 'ext_proc streams Envoy opened to the router, and those that failed or timed out.', 'ops',
    { expr: `sum(rate(envoy_http_ext_proc_streams_started${EDGE}${RATE}))`, legend: 'started' },
    { expr: `sum(rate(envoy_http_ext_proc_streams_failed${EDGE}${RATE}))`, legend: 'failed' },
    { expr: `sum(rate(envoy_http_ext_proc_message_timeouts${EDGE}${RATE}))`, legend: 'message timeouts' }),
  ts('Held requests', 'Requests held now, waiting for a wake or a lookup.', 'none', { expr: `sum(asb_router_held_requests${C})`, legend: 'held' }),
  ts('Wake waits', 'How long requests were held for a wake or lookup, by how the hold ended.', 's', ...quantiles('asb_router_hold_seconds', C, ['result'], '{{result}} ')),
  ts('Wakes on first connection', 'Resume calls the router made for traffic to a hibernated sandbox, by result.', 'none', { expr: `sum by (result) (increase(asb_router_wakes_total${C}${RATE}))`, legend: '{{result}}' }),
  ts('Auth failures', 'Requests refused for a missing or wrong key or token: at the router (edge) and at the worker.', 'reqps',
    { expr: `sum by (result) (rate(asb_router_requests_total{cluster="$cluster", result=~"401|403"}${RATE}))`, legend: 'router {{result}}' },
    { expr: `sum by (code) (rate(asb_http_requests_total{cluster="$cluster", code=~"401|403"}${RATE}))`, legend: 'worker {{code}}' }),
  ts('Lookups of unknown ids', 'Ids the route table lacked, asked of the worker or refused, by result.', 'ops', { expr: `sum by (result) (rate(asb_router_lookups_total${C}${RATE}))`, legend: '{{result}}' }),
  ts('Upstreams', 'Requests per second Envoy sent to each upstream (router, sandboxes, worker API), by response class.', 'reqps',
    { expr: `sum by (envoy_cluster_name, envoy_response_code_class) (rate(envoy_cluster_upstream_rq_xx{cluster="$cluster"}${RATE}))`, legend: '{{envoy_cluster_name}} {{envoy_response_code_class}}xx' }),
  ts('Route feed', 'Route entries the worker publishes against those in the router\'s table.', 'none',
    { expr: `sum(asb_route_feed_entries${C})`, legend: 'published' },
    { expr: `sum(asb_router_routes${C})`, legend: 'in the router' }),
];

function datasourceRef(): { type: string; uid: string } {
  return { type: 'prometheus', uid: '${datasource}' };
}

function clusterVariable(): unknown {
  const query = 'label_values(asb_sandboxes, cluster)';
  return {
    name: 'cluster',
    label: 'Cluster',
    type: 'query',
    datasource: datasourceRef(),
    definition: query,
    query: { query, refId: 'PrometheusVariableQueryEditor-VariableQuery' },
    refresh: 2,
    sort: 1,
    current: {},
    hide: 0,
    includeAll: false,
    multi: false,
    options: [],
  };
}

function dashboard(uid: string, title: string, description: string, panels: Panel[], perCluster: boolean): unknown {
  let x = 0;
  let y = 0;
  let rowHeight = 0;
  const laidOut = panels.map((p, i) => {
    const w = p.type === 'stat' ? 6 : 12;
    const h = p.type === 'stat' ? 4 : 8;
    if (x + w > 24) {
      x = 0;
      y += rowHeight;
      rowHeight = 0;
    }
    const gridPos = { h, w, x, y };
    x += w;
    rowHeight = Math.max(rowHeight, h);
    return {
      id: i + 1,
      type: p.type,
      title: p.title,
      description: p.description,
      datasource: datasourceRef(),
      gridPos,
      fieldConfig: { defaults: { unit: p.unit, ...(p.type === 'timeseries' ? { custom: { drawStyle: 'line', lineWidth: 1, fillOpacity: 10, showPoints: 'never', spanNulls: true } } : {}) }, overrides: [] },
      options: p.type === 'stat'
        ? { reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false }, colorMode: 'value', graphMode: 'area', textMode: 'auto' }
        : { legend: { displayMode: 'list', placement: 'bottom', showLegend: true }, tooltip: { mode: 'multi', sort: 'desc' } },
      targets: p.targets.map((t, j) => ({ refId: String.fromCharCode(65 + j), datasource: datasourceRef(), expr: t.expr, legendFormat: t.legend, range: p.type === 'timeseries', instant: p.type === 'stat' })),
    };
  });
  return {
    uid,
    title,
    description,
    tags: ['agent-sandbox'],
    editable: true,
    graphTooltip: 1,
    schemaVersion: 39,
    version: 1,
    refresh: '30s',
    time: { from: 'now-6h', to: 'now' },
    timezone: 'browser',
    annotations: { list: [] },
    links: [{ title: 'Agent Sandbox', type: 'dashboards', tags: ['agent-sandbox'], asDropdown: true }],
    templating: {
      list: [
        { name: 'datasource', label: 'Data source', type: 'datasource', query: 'prometheus', current: {}, hide: 0, refresh: 1, options: [] },
        ...(perCluster ? [clusterVariable()] : []),
      ],
    },
    panels: laidOut,
  };
}

/** File name → content of every dashboard in DASHBOARD_DIR. */
export function renderDashboards(): Map<string, string> {
  const files = new Map<string, string>();
  const put = (name: string, d: unknown): void => void files.set(name, `${JSON.stringify(d, null, 2)}\n`);
  put('fleet.json', dashboard('asb-fleet', 'Agent Sandbox / Fleet', 'Every cluster at once: claims, pools, latency of claims, creates and wakes, errors and failures by reason.', FLEET, false));
  put('cluster.json', dashboard('asb-cluster', 'Agent Sandbox / Cluster', 'One worker cluster (the cluster variable): its sandboxes, pools, claims, API, controllers, store and disk.', CLUSTER, true));
  put('data-plane.json', dashboard('asb-data-plane', 'Agent Sandbox / Data plane', 'One cluster\'s edge: Envoy, the ExtProc router, held requests, wakes on first connection, auth failures.', DATA_PLANE, true));
  return files;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  for (const [name, text] of renderDashboards()) writeFileSync(join(repoRoot, DASHBOARD_DIR, name), text);
  console.log(`wrote ${[...renderDashboards().keys()].join(', ')} in ${DASHBOARD_DIR}`);
}
