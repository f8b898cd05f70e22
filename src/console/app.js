// The console page: log in with an API key (checked against GET /v1/federation, kept in
// sessionStorage), then every POLL_MS redraw the clusters, pools and sandboxes from the hub, with
// pause, resume, delete and a terminal per sandbox. Everything from the API is put in the page as
// text (textContent), never as HTML.
import { api, ApiError, storedKey, storeKey } from './api.js';
import { TerminalSession } from './terminal.js';

const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);

let pollTimer;
let terminal;

function showError(el, message) {
  el.textContent = message;
  el.hidden = message === '';
}

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function fillTable(table, rows, emptyText, columns) {
  const body = table.tBodies[0];
  if (rows.length === 0) {
    const tr = document.createElement('tr');
    const td = cell(emptyText, 'empty');
    td.colSpan = columns;
    tr.append(td);
    body.replaceChildren(tr);
  } else {
    body.replaceChildren(...rows);
  }
}

function age(createdAt) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(createdAt)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

function renderFederation(fed) {
  const clusterRows = fed.clusters.map((c) => {
    const tr = document.createElement('tr');
    tr.dataset.cluster = c.name;
    const health = c.drained ? `${c.health} (drained)` : c.health;
    tr.append(cell(c.name), cell(c.region), cell(health, `health health-${c.health}`), cell(String(c.appliedVersion)), cell(String(c.lag)));
    return tr;
  });
  fillTable($('clusters'), clusterRows, 'no cluster is registered at the hub', 5);
  const poolRows = [];
  for (const c of fed.clusters) {
    for (const [pool, p] of Object.entries(c.pools).sort(([a], [b]) => a.localeCompare(b))) {
      const tr = document.createElement('tr');
      tr.append(cell(c.name), cell(pool), cell(p.template), cell(`${p.ready} / ${p.desired}`));
      poolRows.push(tr);
    }
  }
  fillTable($('pools'), poolRows, 'no warm pool reported', 4);
}

function button(label, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  b.addEventListener('click', onClick);
  return b;
}

async function act(what, method, path) {
  try {
    await api(method, path);
    showError($('error'), '');
    await refresh();
  } catch (err) {
    showError($('error'), `${what} failed: ${err.message}`);
  }
}

function renderSandboxes(list) {
  const rows = list.items.map((s) => {
    const tr = document.createElement('tr');
    tr.dataset.sandbox = s.id;
    const path = `/v1/sandboxes/${encodeURIComponent(s.id)}`;
    const actions = document.createElement('td');
    actions.append(
      button('Terminal', () => openTerminal(s.id)),
      button('Pause', () => act(`pause ${s.id}`, 'POST', `${path}/pause`)),
      button('Resume', () => act(`resume ${s.id}`, 'POST', `${path}/resume`)),
      button('Delete', () => {
        if (confirm(`Delete sandbox ${s.id}?`)) void act(`delete ${s.id}`, 'DELETE', path);
      }),
    );
    // Why a Failed or Expired sandbox stopped, as the API says it (ErrImagePull: image ... could not be pulled).
    const why = s.reason === undefined ? '' : `${s.reason}: ${s.message ?? ''}`;
    tr.append(cell(s.id, 'id'), cell(s.phase, 'state'), cell(why, 'reason'), cell(age(s.createdAt)), cell(s.owner), cell(s.cluster ?? ''), cell(`${s.namespace}/${s.template}`), actions);
    return tr;
  });
  fillTable($('sandboxes'), rows, 'no sandbox yet (create one with asb create or POST /v1/sandboxes)', 8);
  const away = list.unreachable ?? [];
  showError($('unreachable'), away.length === 0 ? '' : `not listed from: ${away.map((u) => `${u.cluster} (${u.reason})`).join('; ')}`);
}

async function refresh() {
  try {
    const [fed, list] = await Promise.all([api('GET', '/v1/federation'), api('GET', '/v1/sandboxes')]);
    renderFederation(fed);
    renderSandboxes(list);
    showError($('error'), '');
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      logout(`the API key is no longer accepted: ${err.message}`);
      return;
    }
    showError($('error'), `could not refresh: ${err.message}`);
  }
}

function closeTerminal() {
  terminal?.close();
  terminal = undefined;
  $('terminal-panel').hidden = true;
}

function openTerminal(id) {
  closeTerminal();
  $('terminal-panel').hidden = false;
  $('terminal-title').textContent = id;
  const status = (text) => ($('terminal-status').textContent = text);
  terminal = new TerminalSession($('terminal'), status);
  terminal.connect(id).catch((err) => status(`could not open the terminal: ${err.message}`));
}

function startPolling() {
  clearInterval(pollTimer);
  void refresh();
  pollTimer = setInterval(() => void refresh(), POLL_MS);
}

function enter(key) {
  $('login').hidden = true;
  $('main').hidden = false;
  $('logout').hidden = false;
  $('who').textContent = `key ${key.split('_')[1] ?? ''}`;
  startPolling();
}

function logout(message = '') {
  clearInterval(pollTimer);
  closeTerminal();
  storeKey(null);
  $('main').hidden = true;
  $('logout').hidden = true;
  $('who').textContent = '';
  $('login').hidden = false;
  showError($('login-error'), message);
}

$('login-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const key = $('key').value.trim();
  try {
    await api('GET', '/v1/federation', { key });
  } catch (err) {
    const why = err instanceof ApiError && err.status === 401 ? `the hub refused this API key: ${err.message}` : `could not log in: ${err.message}`;
    showError($('login-error'), why);
    return;
  }
  storeKey(key);
  showError($('login-error'), '');
  $('key').value = '';
  enter(key);
});
$('logout').addEventListener('click', () => logout());
$('terminal-close').addEventListener('click', closeTerminal);

const saved = storedKey();
if (saved !== null) enter(saved);
