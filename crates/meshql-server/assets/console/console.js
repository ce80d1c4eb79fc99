// The meshql console: plain JavaScript (an ES module), no framework, no build step.
// Everything it shows is read through the service's own APIs with the user's bearer token:
// the console's JSON endpoints (service description, documents at a moment, versions),
// REST (writes and their validation errors), GraphQL (a document and its relationships `at`
// a moment) and /_changes (Server-Sent Events, read with fetch so the token can be sent).

const PREFIX = document.documentElement.dataset.prefix;
const CHANGES = document.documentElement.dataset.changes === 'true';
const TOKEN_KEY = 'meshql.console.token';
const PAGE_SIZE = 20;
const LIST_PAGES = 5; // pages of 1,000 documents read at most for an entity's table
const RECENT = 30; // changes kept in the panel

const state = {
  service: null,
  at: null, // ms since the epoch, or null: live
  earliest: null, // the oldest moment the time control reaches
  route: null,
  view: null, // the current view's {entity, id, refresh()}
  types: new Map(), // GraphQL path + type name -> introspected fields
  changes: [],
  feed: null, // AbortController of the change stream
};

// ---------------------------------------------------------------------------------------------
// helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

function authHeaders(extra = {}) {
  const t = token();
  return t ? { ...extra, authorization: `Bearer ${t}` } : extra;
}

async function api(path, { method = 'GET', body, headers = {} } = {}) {
  const init = { method, headers: authHeaders(headers) };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['content-type'] = 'application/json';
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    return { ok: false, status: 0, body: { error: `the service did not answer: ${e.message}` } };
  }
  const text = await resp.text();
  let parsed = text;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    // not JSON: kept as text
  }
  if (resp.status === 401) banner(`The service refused the credentials: ${errorText(parsed)}. Enter a token above.`);
  return { ok: resp.ok, status: resp.status, body: parsed, headers: resp.headers };
}

function errorText(body) {
  if (body && typeof body === 'object') return body.error || JSON.stringify(body);
  return String(body || '');
}

async function graphql(path, query) {
  const r = await api(path, { method: 'POST', body: { query } });
  return r.body || { errors: [{ message: `HTTP ${r.status}` }] };
}

function banner(text) {
  const b = document.getElementById('banner');
  b.textContent = text || '';
  b.hidden = !text;
}

function fmtTime(ms) {
  if (ms === null || ms === undefined) return '';
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function toLocalInput(ms) {
  const d = new Date(ms);
  return new Date(ms - d.getTimezoneOffset() * 60000).toISOString().slice(0, 23);
}

function fromLocalInput(text) {
  const ms = new Date(text).getTime(); // a datetime-local value is read as local time
  return Number.isFinite(ms) ? ms : null;
}

function short(value) {
  if (value === undefined) return '';
  if (value === null) return 'null';
  if (typeof value === 'object') return JSON.stringify(value);
  return String(value);
}

function entity(name) {
  return state.service?.entities.find((e) => e.name === name);
}

function schemaOf(e) {
  return e?.rest?.schema || null;
}

function columnsOf(e) {
  const props = schemaOf(e)?.properties || {};
  return Object.keys(props).filter((k) => k !== 'id');
}

function docHref(entityName, id) {
  return `#/e/${encodeURIComponent(entityName)}/d/${encodeURIComponent(id)}`;
}

function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

// ---------------------------------------------------------------------------------------------
// GraphQL types (introspection) and the queries built from them

function namedType(t) {
  while (t && t.ofType) t = t.ofType;
  return t;
}

async function typeFields(graphPath, typeName) {
  const key = `${graphPath} ${typeName}`;
  if (state.types.has(key)) return state.types.get(key);
  const q = `{ __type(name: ${JSON.stringify(typeName)}) { fields { name type { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } }`;
  const r = await graphql(graphPath, q);
  const fields = (r.data?.__type?.fields || []).map((f) => {
    const named = namedType(f.type);
    return { name: f.name, kind: named?.kind, type: named?.name };
  });
  state.types.set(key, fields);
  return fields;
}

function scalarNames(fields) {
  return fields.filter((f) => f.kind === 'SCALAR' || f.kind === 'ENUM').map((f) => f.name);
}

/// The selection for a document and each of its relationships (their id and a few scalars).
async function selection(e) {
  const g = e.graphql;
  const fields = await typeFields(g.path, g.type);
  const relNames = new Set(g.resolvers.map((r) => r.field));
  const scalars = scalarNames(fields).filter((n) => !relNames.has(n));
  const rels = [];
  const pick = (names, n) => [...new Set(['id', ...names])].filter((x) => names.includes(x)).slice(0, n);
  for (const r of g.resolvers) {
    const f = fields.find((x) => x.name === r.field);
    if (!f) continue;
    const subFields = await typeFields(g.path, f.type);
    const picked = pick(scalarNames(subFields), 4);
    if (!picked.length) continue;
    // one level further (read at the same moment): the related type's own relationships
    const nested = [];
    for (const x of subFields.filter((y) => y.kind === 'OBJECT').slice(0, 2)) {
      const inner = pick(scalarNames(await typeFields(g.path, x.type)), 3);
      const target = entity(r.entity)?.graphql?.resolvers.find((rr) => rr.field === x.name)?.entity;
      if (inner.length) nested.push({ field: x.name, fields: inner, entity: target });
    }
    rels.push({ resolver: r, fields: picked, nested });
  }
  return { scalars, rels };
}

function relSelection(rels) {
  return rels.map((r) => `${r.resolver.field} { ${r.fields.join(' ')} ${r.nested.map((n) => `${n.field} { ${n.fields.join(' ')} }`).join(' ')} }`).join(' ');
}

function labelOf(fields, d) {
  return fields.filter((f) => f !== 'id' && d[f] !== null && d[f] !== undefined).map((f) => short(d[f])).join(' · ') || d.id;
}

function hasGetById(e) {
  return e?.graphql?.queries.some((q) => q.name === 'getById' && !q.vector);
}

async function exampleQuery(e) {
  const { scalars, rels } = await selection(e);
  const first = await api(`${PREFIX}/api/entities/${encodeURIComponent(e.name)}/documents?limit=1`);
  const id = first.body?.documents?.[0]?.id || 'an-id';
  const rel = rels[0];
  const relText = rel ? `\n    ${rel.resolver.field} {\n      ${rel.fields.join('\n      ')}\n    }` : '';
  return `# ${e.name} by id, with a relationship.\n# at: <ms since the epoch> reads it as it was then.\n{\n  getById(id: ${JSON.stringify(id)}) {\n    ${scalars.join('\n    ')}${relText}\n  }\n}\n`;
}

function graphiqlLink(e, text = 'GraphiQL') {
  if (!e.graphql) return '';
  return el('a', {
    href: e.graphql.path,
    class: 'graphiql',
    onclick: async (ev) => {
      if (!hasGetById(e)) return;
      ev.preventDefault();
      const q = await exampleQuery(e);
      location.href = `${e.graphql.path}#query=${encodeURIComponent(q)}`;
    },
  }, text);
}

// ---------------------------------------------------------------------------------------------
// routing

function parseRoute() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query || '');
  if (params.has('at')) {
    const at = Number(params.get('at'));
    state.at = Number.isFinite(at) && at > 0 ? at : null;
  }
  if (parts[0] === 'e' && parts[1]) {
    if (parts[2] === 'new') return { view: 'form', entity: parts[1] };
    if (parts[2] === 'd' && parts[3] && parts[4] === 'edit') return { view: 'form', entity: parts[1], id: parts[3] };
    if (parts[2] === 'd' && parts[3]) return { view: 'document', entity: parts[1], id: parts[3] };
    return { view: 'list', entity: parts[1] };
  }
  return { view: 'landing' };
}

function crumbs(route) {
  const nav = document.getElementById('crumbs');
  nav.replaceChildren();
  if (route.entity) nav.append(el('a', { href: `#/e/${encodeURIComponent(route.entity)}` }, route.entity));
  if (route.id) nav.append(' / ', el('a', { href: docHref(route.entity, route.id) }, route.id));
  if (route.view === 'form') nav.append(' / ', route.id ? 'edit' : 'new');
}

async function render() {
  const route = parseRoute();
  state.route = route;
  document.body.dataset.ready = 'false';
  crumbs(route);
  banner('');
  const view = document.getElementById('view');
  const timebar = document.getElementById('timebar');
  timebar.hidden = !(route.view === 'list' || route.view === 'document');
  state.view = null;
  try {
    if (!state.service || route.view === 'landing') await loadService();
    if (route.view === 'landing') view.replaceChildren(landing());
    else if (!entity(route.entity)) view.replaceChildren(el('p', { class: 'error' }, `No entity "${route.entity}" in this service.`));
    else if (route.view === 'list') await listView(view, entity(route.entity));
    else if (route.view === 'document') await documentView(view, entity(route.entity), route.id);
    else if (route.view === 'form') await formView(view, entity(route.entity), route.id);
  } catch (e) {
    view.replaceChildren(el('p', { class: 'error' }, `Something failed: ${e.message}`));
  }
  syncTimebar();
  document.body.dataset.ready = 'true';
}

// ---------------------------------------------------------------------------------------------
// landing

async function loadService() {
  const r = await api(`${PREFIX}/api/service`);
  if (!r.ok) throw new Error(errorText(r.body));
  state.service = r.body;
  state.backups = await loadBackups();
  checkHealth();
}

// The service's backups, for a caller allowed to see them (every action on every entity);
// null otherwise — the landing page then leaves them out, without a banner.
async function loadBackups() {
  try {
    const resp = await fetch('/_meshql/backups', { headers: authHeaders() });
    return resp.ok ? await resp.json() : null;
  } catch {
    return null;
  }
}

async function checkHealth() {
  const status = document.getElementById('status');
  const probe = async (path) => {
    try {
      const resp = await fetch(path);
      return resp.ok;
    } catch {
      return false;
    }
  };
  const [health, ready] = await Promise.all([probe(state.service.health), probe(state.service.ready)]);
  status.replaceChildren(
    el('a', { href: state.service.health, class: health ? 'ok' : 'bad', id: 'health' }, health ? 'healthy' : 'unhealthy'),
    ' ',
    el('a', { href: state.service.ready, class: ready ? 'ok' : 'bad', id: 'ready' }, ready ? 'ready' : 'not ready'),
  );
}

function landing() {
  const s = state.service;
  const rows = s.entities.map((e) =>
    el('tr', { dataset: { entity: e.name } },
      el('td', {}, el('a', { href: `#/e/${encodeURIComponent(e.name)}`, class: 'entity-link' }, e.name)),
      el('td', { class: 'num count' },
        e.count === null ? el('span', { class: 'muted', title: e.count_error }, e.count_code || 'n/a') : `${e.count}${e.count_capped ? '+' : ''}`),
      el('td', {}, e.storage, el('span', { class: 'muted' }, ` (${e.backend})`)),
      el('td', {}, e.rest ? el('code', {}, e.rest.path) : '—', ' ', e.rest ? el('a', { href: e.rest.docs }, 'Swagger UI') : ''),
      el('td', {}, e.graphql ? el('code', {}, e.graphql.path) : '—', ' ', e.graphql ? graphiqlLink(e) : ''),
    ));
  return el('div', {},
    el('h1', {}, 'Entities'),
    el('p', { class: 'muted' },
      `${s.entities.length} entities. Every write is a new version: open a document for its history, or move the time control on a list to read it as it was. `,
      s.changes ? 'Changes stream in on the right as they are written.' : 'The change feed is off in this service.'),
    el('table', { id: 'entities', class: 'grid' },
      el('thead', {}, el('tr', {}, ['entity', 'documents', 'storage', 'REST', 'GraphQL'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    processorsSection(s.processors || []),
    backupsSection(state.backups),
  );
}

function fmtBytes(n) {
  if (n >= 1048576) return `${(n / 1048576).toFixed(1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${n} B`;
}

// Backups: each with its moment, size and the command that restores it (copied with a
// click), and a button that takes one now.
function backupsSection(b) {
  if (!b) return el('div', {});
  const settings = [
    `in ${b.dir}`,
    b.schedule ? `on the schedule "${b.schedule}" (UTC)` : 'no schedule',
    b.keep ? `the newest ${b.keep} kept` : 'all kept',
    b.s3 ? `uploaded to ${b.s3}` : null,
  ].filter(Boolean).join(', ');
  const rows = b.backups.map((x) =>
    el('tr', { dataset: { backup: x.name } },
      el('td', {}, x.name),
      el('td', {}, fmtTime(x.taken_at_ms)),
      el('td', { class: 'num size' }, fmtBytes(x.bytes)),
      el('td', { class: 'num' }, `${x.pause_ms.toFixed(1)} ms`),
      el('td', {}, el('code', { class: 'restore' }, x.restore), ' ',
        el('button', { type: 'button', class: 'copy', onclick: () => navigator.clipboard?.writeText(x.restore) }, 'copy')),
    ));
  const take = el('button', { type: 'button', id: 'take-backup' }, 'Take a backup now');
  const note = el('span', { class: 'muted', id: 'backup-note' }, '');
  take.onclick = async () => {
    take.disabled = true;
    note.textContent = ' taking a backup…';
    const r = await api('/_meshql/backup', { method: 'POST' });
    note.textContent = r.ok ? ` taken: ${r.body.name} (${fmtBytes(r.body.bytes)})` : ` failed: ${errorText(r.body)}`;
    state.backups = await loadBackups();
    take.disabled = false;
    if (r.ok) render();
  };
  return el('div', {},
    el('h2', {}, 'Backups'),
    el('p', { class: 'muted' }, `Backups ${settings}. A restore writes a new data directory; add --at TIME for an earlier moment.`),
    b.backups.length
      ? el('table', { id: 'backups', class: 'grid' },
        el('thead', {}, el('tr', {}, ['backup', 'taken', 'size', 'writes paused', 'restore'].map((h) => el('th', {}, h)))),
        el('tbody', {}, rows))
      : el('p', { id: 'backups', class: 'muted' }, 'No backup yet.'),
    el('p', {}, take, note),
  );
}

// Processors of the change feed: what each reads and writes, how far behind it is, and the
// inputs it set aside (dead letters, newest first).
function processorsSection(processors) {
  if (processors.length === 0) return el('div', {});
  const rows = processors.map((p) =>
    el('tr', { dataset: { processor: p.name } },
      el('td', {}, p.name, el('span', { class: 'muted' }, ` (${p.type})`)),
      el('td', {}, p.inputs.join(', '), ' → ', el('a', { href: `#/e/${encodeURIComponent(p.output)}` }, p.output)),
      el('td', { class: 'num lag' }, `${p.lag}`, el('span', { class: 'muted' }, p.lag ? ` (${p.lag_seconds.toFixed(1)} s)` : '')),
      el('td', { class: 'num' }, `${p.position}`),
      el('td', { class: 'num dead' }, `${p.dead_letters}`),
    ));
  const letters = processors.flatMap((p) => p.recent_dead_letters.map((d) =>
    el('li', {}, el('code', {}, p.name), ' ', el('code', {}, d.change_id), ': ', d.reason)));
  return el('div', {},
    el('h2', {}, 'Processors'),
    el('table', { id: 'processors', class: 'grid' },
      el('thead', {}, el('tr', {}, ['processor', 'reads → writes', 'lag (changes)', 'position', 'dead letters'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    letters.length ? el('div', { id: 'dead-letters' }, el('h3', {}, 'Recent dead letters'), el('ul', {}, letters)) : el('div', {}),
  );
}

// ---------------------------------------------------------------------------------------------
// the time control

function syncTimebar() {
  const slider = document.getElementById('at-slider');
  const input = document.getElementById('at-input');
  const label = document.getElementById('at-label');
  const live = document.getElementById('live-button');
  const now = Date.now();
  const min = Math.min(state.earliest ?? now - 3600_000, now - 1000);
  slider.dataset.min = min;
  slider.dataset.max = now;
  if (state.at === null) {
    slider.value = 1000;
    input.value = '';
    label.textContent = 'live: the current documents, updated as writes land';
    live.classList.add('on');
  } else {
    slider.value = Math.round(((state.at - min) / (now - min)) * 1000);
    input.value = toLocalInput(state.at);
    label.textContent = `as of ${fmtTime(state.at)}`;
    live.classList.remove('on');
  }
  document.body.dataset.at = state.at === null ? 'live' : String(state.at);
}

function setAt(at) {
  state.at = at;
  syncTimebar();
  state.view?.refresh();
}

function wireTimebar() {
  const slider = document.getElementById('at-slider');
  const input = document.getElementById('at-input');
  const reread = debounce(() => state.view?.refresh(), 150);
  slider.addEventListener('input', () => {
    const min = Number(slider.dataset.min);
    const max = Number(slider.dataset.max);
    const v = Number(slider.value);
    state.at = v >= 1000 ? null : Math.round(min + ((max - min) * v) / 1000);
    const keep = slider.value;
    syncTimebar();
    slider.value = keep;
    reread();
  });
  input.addEventListener('change', () => {
    const at = input.value ? fromLocalInput(input.value) : null;
    setAt(at);
  });
  document.getElementById('live-button').addEventListener('click', () => setAt(null));
}

// ---------------------------------------------------------------------------------------------
// an entity's documents

async function readDocuments(e) {
  const docs = [];
  let after = '';
  let truncated = false;
  for (let page = 0; page < LIST_PAGES; page++) {
    const params = new URLSearchParams();
    if (state.at !== null) params.set('at', state.at);
    if (after) params.set('after', after);
    const r = await api(`${PREFIX}/api/entities/${encodeURIComponent(e.name)}/documents?${params}`);
    if (!r.ok) throw new Error(errorText(r.body));
    docs.push(...r.body.documents);
    if (!r.body.next) return { docs, truncated };
    after = r.body.next;
    truncated = page === LIST_PAGES - 1;
  }
  return { docs, truncated };
}

async function listView(view, e) {
  const columns = columnsOf(e);
  const ui = { sort: null, desc: false, filter: '', page: 0, docs: [], truncated: false, flash: new Set() };
  const table = el('table', { id: 'documents', class: 'grid' });
  const info = el('p', { class: 'muted', id: 'list-info' });
  const pager = el('div', { class: 'pager' });
  const filter = el('input', { id: 'filter', type: 'search', placeholder: 'filter: any text in any column', 'aria-label': 'filter' });
  filter.addEventListener('input', () => {
    ui.filter = filter.value.trim().toLowerCase();
    ui.page = 0;
    draw();
  });

  function rowsShown() {
    let rows = ui.docs;
    if (ui.filter) {
      rows = rows.filter((d) =>
        [d.id, ...columns.map((c) => short(d.payload?.[c]))].some((v) => String(v).toLowerCase().includes(ui.filter)));
    }
    if (ui.sort) {
      const key = ui.sort;
      const val = (d) => (key === 'id' ? d.id : key === '@version' ? d.created_at : d.payload?.[key]);
      rows = [...rows].sort((a, b) => {
        const x = val(a);
        const y = val(b);
        let c;
        if (x === undefined || x === null) c = y === undefined || y === null ? 0 : -1;
        else if (y === undefined || y === null) c = 1;
        else if (typeof x === 'number' && typeof y === 'number') c = x - y;
        else c = short(x).localeCompare(short(y));
        return ui.desc ? -c : c;
      });
    }
    return rows;
  }

  function draw() {
    const rows = rowsShown();
    const pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
    ui.page = Math.min(ui.page, pages - 1);
    const shown = rows.slice(ui.page * PAGE_SIZE, (ui.page + 1) * PAGE_SIZE);
    const head = ['id', ...columns, '@version'].map((c) =>
      el('th', {
        class: 'sortable',
        dataset: { column: c },
        onclick: () => {
          ui.desc = ui.sort === c ? !ui.desc : false;
          ui.sort = c;
          ui.page = 0;
          draw();
        },
      }, c === '@version' ? 'version time' : c, ui.sort === c ? (ui.desc ? ' ▼' : ' ▲') : ''));
    const body = shown.map((d) =>
      el('tr', { dataset: { id: d.id }, class: ui.flash.has(d.id) ? 'flash' : undefined },
        el('td', {}, el('a', { href: docHref(e.name, d.id), class: 'doc-link' }, d.id.slice(0, 8) + '…')),
        columns.map((c) => el('td', { dataset: { field: c } }, short(d.payload?.[c]))),
        el('td', { class: 'muted' }, fmtTime(d.created_at)),
      ));
    table.replaceChildren(el('thead', {}, el('tr', {}, head)), el('tbody', {}, body));
    info.textContent = `${ui.docs.length}${ui.truncated ? '+ (the first ' + ui.docs.length + ')' : ''} document${ui.docs.length === 1 ? '' : 's'} ${state.at === null ? 'now' : 'as of ' + fmtTime(state.at)}` +
      (ui.filter ? `, ${rows.length} matching` : '');
    pager.replaceChildren(
      el('button', { type: 'button', disabled: ui.page === 0, onclick: () => { ui.page--; draw(); } }, '‹ previous'),
      ` page ${ui.page + 1} of ${pages} `,
      el('button', { type: 'button', disabled: ui.page >= pages - 1, onclick: () => { ui.page++; draw(); } }, 'next ›'),
    );
  }

  let latest = 0;
  async function refresh(changedId) {
    const before = new Set(ui.docs.map((d) => d.id));
    const mine = ++latest;
    try {
      const { docs, truncated } = await readDocuments(e);
      if (mine !== latest || state.view?.refresh !== refresh) return; // a newer read, or another page
      ui.docs = docs;
      ui.truncated = truncated;
      ui.flash = new Set(changedId ? [changedId] : docs.filter((d) => before.size && !before.has(d.id)).map((d) => d.id));
      if (state.earliest === null) await findEarliest();
      draw();
      document.body.dataset.listAt = state.at === null ? 'live' : String(state.at);
      document.body.dataset.listVersion = String(Date.now());
    } catch (err) {
      info.textContent = '';
      table.replaceChildren(el('caption', { class: 'error' }, err.message));
    }
  }

  view.replaceChildren(
    el('div', { class: 'title' },
      el('h1', {}, e.name),
      el('span', { class: 'links' },
        e.rest && !e.rest.read_only ? el('a', { href: `#/e/${encodeURIComponent(e.name)}/new`, class: 'button', id: 'new-document' }, `new ${e.name}`) : '',
        ' ', e.rest ? el('a', { href: e.rest.docs }, 'Swagger UI') : '',
        ' ', graphiqlLink(e))),
    el('div', { class: 'tools' }, filter, info),
    table,
    pager,
  );
  // a burst of writes (a bulk create) is one re-read
  let changed = [];
  const reread = debounce(() => {
    const ids = changed;
    changed = [];
    refresh(ids.length === 1 ? ids[0] : undefined);
  }, 100);
  state.view = {
    entity: e.name,
    refresh,
    onChange: (c) => {
      if (state.at !== null) return;
      changed.push(c.id);
      reread();
    },
  };
  await refresh();
}

/// The oldest moment the time control reaches: the first change still in the feed.
async function findEarliest() {
  if (!CHANGES) return;
  const r = await api('/_changes?since=0&limit=1');
  const first = r.body?.changes?.[0];
  if (first) state.earliest = first.created_at;
}

// ---------------------------------------------------------------------------------------------
// a document: as of a moment (GraphQL, relationships included), and its history

function diff(prev, next) {
  const out = [];
  const keys = new Set([...Object.keys(prev || {}), ...Object.keys(next || {})]);
  for (const k of keys) {
    if (k === 'id') continue;
    const a = prev?.[k];
    const b = next?.[k];
    if (JSON.stringify(a) === JSON.stringify(b)) continue;
    if (a === undefined) out.push(el('li', { class: 'added' }, el('b', {}, k), ': ', short(b)));
    else if (b === undefined) out.push(el('li', { class: 'removed' }, el('b', {}, k), ': ', el('s', {}, short(a))));
    else out.push(el('li', { class: 'changed' }, el('b', {}, k), ': ', el('s', {}, short(a)), ' → ', short(b)));
  }
  return out;
}

function history(e, versions) {
  const items = [];
  let prev = null;
  versions.forEach((v, i) => {
    const kind = v.deleted ? 'deleted' : i === 0 || prev?.deleted ? 'created' : 'updated';
    items.push(el('li', { class: `version ${kind}`, dataset: { at: v.created_at } },
      el('div', {},
        el('b', {}, kind), ' at ',
        el('a', { href: '#', class: 'version-at', onclick: (ev) => { ev.preventDefault(); setAt(v.created_at); } }, fmtTime(v.created_at)),
        el('span', { class: 'muted' }, ` (${v.created_at})`)),
      v.deleted ? el('p', { class: 'muted' }, 'tombstone: the document is deleted from this moment') :
        el('ul', { class: 'diff' }, i === 0 || prev?.deleted ? diff({}, v.payload) : diff(prev.payload, v.payload))));
    prev = v;
  });
  return el('ol', { id: 'history', reversed: true }, items.reverse());
}

async function documentAt(e, id) {
  if (hasGetById(e)) {
    const { scalars, rels } = await selection(e);
    const at = state.at !== null ? `, at: ${state.at}` : '';
    const relSel = relSelection(rels);
    const q = `{ getById(id: ${JSON.stringify(id)}${at}) { ${scalars.join(' ')} ${relSel} } }`;
    const r = await graphql(e.graphql.path, q);
    return { doc: r.data?.getById || null, errors: r.errors || [], rels };
  }
  const r = await api(`${PREFIX}/api/entities/${encodeURIComponent(e.name)}/documents/${encodeURIComponent(id)}/versions`);
  const visible = (r.body?.versions || []).filter((v) => state.at === null || v.created_at <= state.at).pop();
  return { doc: visible && !visible.deleted ? visible.payload : null, errors: [], rels: [] };
}

function relationships(rels, doc) {
  if (!rels.length) return '';
  const asList = (value) => (Array.isArray(value) ? value : value ? [value] : []);
  const link = (target, fields, d, cls) =>
    target && d.id ? el('a', { href: docHref(target, d.id), class: cls }, labelOf(fields, d)) : labelOf(fields, d);
  const items = rels.map(({ resolver, fields, nested }) => {
    const list = asList(doc[resolver.field]);
    const links = list.map((d) =>
      el('li', {},
        link(resolver.entity, fields, d, 'rel-link'),
        d.id ? el('span', { class: 'muted' }, ` ${d.id}`) : '',
        nested.map((n) => {
          const inner = asList(d[n.field]);
          if (!inner.length) return '';
          return el('div', { class: 'nested', dataset: { field: n.field } },
            el('span', { class: 'muted' }, `${n.field}: `),
            inner.flatMap((x, i) => [i ? ', ' : '', link(n.entity, n.fields, x, 'nested-link')]));
        })));
    return el('div', { class: 'relationship', dataset: { field: resolver.field } },
      el('h3', {}, resolver.field, el('span', { class: 'muted' }, resolver.entity ? ` → ${resolver.entity}` : resolver.url ? ` → ${resolver.url}` : '')),
      links.length ? el('ul', {}, links) : el('p', { class: 'muted' }, 'none'));
  });
  return el('section', { id: 'relationships' }, el('h2', {}, 'Relationships'), items);
}

async function documentView(view, e, id) {
  const current = el('section', { id: 'document' });
  const hist = el('section', {}, el('h2', {}, 'History'));
  let latest = 0;
  async function refresh() {
    const mine = ++latest;
    const [vr, at] = await Promise.all([
      api(`${PREFIX}/api/entities/${encodeURIComponent(e.name)}/documents/${encodeURIComponent(id)}/versions`),
      documentAt(e, id),
    ]);
    if (mine !== latest || state.view?.refresh !== refresh) return; // a newer read, or another page
    const versions = vr.ok ? vr.body.versions : [];
    if (versions.length) state.earliest = Math.min(state.earliest ?? Infinity, versions[0].created_at - 1);
    const when = state.at === null ? 'now' : `as of ${fmtTime(state.at)}`;
    const rows = at.doc ? Object.entries(at.doc).filter(([k]) => !at.rels.some((r) => r.resolver.field === k)) : [];
    current.replaceChildren(
      el('h2', {}, `The document ${when}`),
      at.doc ? el('table', { class: 'fields' }, el('tbody', {}, rows.map(([k, v]) => el('tr', { dataset: { field: k } }, el('th', {}, k), el('td', {}, short(v)))))) :
        el('p', { class: 'muted', id: 'absent' }, `No visible version ${when} (not yet created, deleted, or not yours to see).`),
      at.errors.length ? el('ul', { class: 'error' }, at.errors.map((x) => el('li', {}, x.message))) : '',
      at.doc ? relationships(at.rels, at.doc) : '',
    );
    hist.replaceChildren(el('h2', {}, `History (${versions.length} version${versions.length === 1 ? '' : 's'})`),
      vr.ok ? history(e, versions) : el('p', { class: 'error' }, errorText(vr.body)));
    syncTimebar();
    document.body.dataset.docVersion = String(Date.now());
  }
  view.replaceChildren(
    el('div', { class: 'title' },
      el('h1', {}, `${e.name} `, el('code', {}, id)),
      el('span', { class: 'links' },
        e.rest && !e.rest.read_only ? el('a', { href: `${docHref(e.name, id)}/edit`, class: 'button', id: 'edit-document' }, 'edit') : '',
        ' ',
        e.rest && !e.rest.read_only ? el('button', {
          type: 'button', id: 'delete-document', class: 'danger',
          onclick: async () => {
            if (!confirm(`Delete ${e.name} ${id}? (A tombstone version is written; history stays.)`)) return;
            const r = await api(`${e.rest.path}/${encodeURIComponent(id)}`, { method: 'DELETE' });
            if (!r.ok) banner(`Delete failed: ${errorText(r.body)}`);
            else refresh();
          },
        }, 'delete') : '')),
    el('div', { class: 'two' }, current, hist),
  );
  const reread = debounce(refresh, 100);
  state.view = {
    entity: e.name,
    id,
    refresh,
    onChange: (c) => {
      if (c.id === id && state.at === null) reread();
    },
  };
  await refresh();
}

// ---------------------------------------------------------------------------------------------
// forms from the JSON Schema

function fieldInput(name, prop, value) {
  const attrs = { name, id: `field-${name}`, dataset: { field: name } };
  if (Array.isArray(prop.enum)) {
    return el('select', attrs,
      el('option', { value: '' }, '—'),
      prop.enum.map((v) => el('option', { value: JSON.stringify(v), selected: JSON.stringify(v) === JSON.stringify(value) }, short(v))));
  }
  const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== 'null') : prop.type;
  if (type === 'boolean') {
    return el('select', attrs,
      el('option', { value: '' }, '—'),
      el('option', { value: 'true', selected: value === true }, 'true'),
      el('option', { value: 'false', selected: value === false }, 'false'));
  }
  if (type === 'object' || type === 'array') {
    return el('textarea', { ...attrs, rows: 3, placeholder: type === 'array' ? '[ … ] (JSON)' : '{ … } (JSON)' }, value === undefined ? '' : JSON.stringify(value, null, 2));
  }
  const hint = [type, prop.format].filter(Boolean).join(', ');
  return el('input', { ...attrs, type: 'text', value: value === undefined || value === null ? '' : String(value), placeholder: hint });
}

/// The value typed in a field as JSON: numbers and booleans as such when the schema says so;
/// anything else as the text typed, so the server's validation names what is wrong.
function fieldValue(input, prop) {
  const raw = input.value;
  if (raw === '') return undefined;
  if (input.tagName === 'SELECT') return JSON.parse(raw);
  const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== 'null') : prop.type;
  if (type === 'object' || type === 'array') {
    try {
      return JSON.parse(raw);
    } catch {
      return raw;
    }
  }
  if ((type === 'integer' || type === 'number') && raw.trim() !== '' && Number.isFinite(Number(raw))) return Number(raw);
  return raw;
}

/// The field a validation error concerns: its path, or the property a message about the
/// document as a whole names ("\"x\" is a required property").
function errorField(detail, names) {
  const path = String(detail.path || detail.instancePath || '').replace(/^\//, '');
  const top = path.split('/')[0];
  if (top && names.includes(top)) return top;
  const quoted = String(detail.message || '').match(/["'`]([^"'`]+)["'`]/g) || [];
  for (const q of quoted) {
    const n = q.slice(1, -1);
    if (names.includes(n)) return n;
  }
  return null;
}

async function formView(view, e, id) {
  const schema = schemaOf(e) || { properties: {} };
  const props = schema.properties || {};
  const names = Object.keys(props).filter((k) => k !== 'id');
  const required = new Set(schema.required || []);
  let existing = {};
  if (id) {
    const r = await api(`${e.rest.path}/${encodeURIComponent(id)}`);
    if (!r.ok) {
      view.replaceChildren(el('p', { class: 'error' }, `Cannot read ${e.name} ${id}: ${errorText(r.body)}`));
      return;
    }
    existing = r.body;
  }
  const general = el('ul', { class: 'error', id: 'form-errors' });
  const rows = names.map((n) => {
    const prop = props[n] || {};
    return el('div', { class: 'field', dataset: { field: n } },
      el('label', { for: `field-${n}` }, n, required.has(n) ? el('span', { class: 'req', title: 'required' }, ' *') : ''),
      fieldInput(n, prop, existing[n]),
      prop.description ? el('small', { class: 'muted' }, prop.description) : '',
      el('div', { class: 'field-error', dataset: { field: n } }));
  });
  const form = el('form', { id: 'document-form', class: 'doc-form', novalidate: true },
    rows,
    general,
    el('div', { class: 'actions' },
      el('button', { type: 'submit', id: 'save' }, id ? 'save new version' : `create ${e.name}`),
      ' ',
      el('a', { href: id ? docHref(e.name, id) : `#/e/${encodeURIComponent(e.name)}` }, 'cancel')));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const payload = {};
    // fields the schema does not describe are kept on an update (a PUT replaces the payload)
    for (const [k, v] of Object.entries(existing)) if (k !== 'id' && !names.includes(k)) payload[k] = v;
    for (const n of names) {
      const v = fieldValue(form.elements[n], props[n] || {});
      if (v !== undefined) payload[n] = v;
    }
    form.querySelectorAll('.field-error').forEach((x) => { x.textContent = ''; });
    form.querySelectorAll('.field.invalid').forEach((x) => x.classList.remove('invalid'));
    general.replaceChildren();
    const r = id
      ? await api(`${e.rest.path}/${encodeURIComponent(id)}`, { method: 'PUT', body: payload })
      : await api(e.rest.path, { method: 'POST', body: payload });
    if (r.ok || r.status === 303) {
      const newId = id || r.body?.id || (r.headers.get('location') || '').split('/').pop();
      location.hash = newId ? docHref(e.name, newId) : `#/e/${encodeURIComponent(e.name)}`;
      return;
    }
    const details = Array.isArray(r.body?.details) ? r.body.details : [];
    if (!details.length) general.append(el('li', {}, errorText(r.body) || `HTTP ${r.status}`));
    for (const d of details) {
      const f = errorField(d, names);
      const target = f && form.querySelector(`.field-error[data-field="${CSS.escape(f)}"]`);
      if (target) {
        target.append(el('div', {}, d.message));
        target.parentElement.classList.add('invalid');
      } else {
        general.append(el('li', {}, d.path && d.path !== '/' ? `${d.path}: ${d.message}` : d.message));
      }
    }
    form.dataset.failed = String(Date.now());
  });
  view.replaceChildren(el('h1', {}, id ? `Edit ${e.name} ` : `New ${e.name}`, id ? el('code', {}, id) : ''),
    el('p', { class: 'muted' }, 'The form follows the entity\'s JSON Schema; the server validates what is sent and its messages appear beside the fields.'),
    form);
}

// ---------------------------------------------------------------------------------------------
// the change feed: Server-Sent Events read with fetch (EventSource cannot send a token)

function showChange(c) {
  state.changes.unshift(c);
  state.changes.length = Math.min(state.changes.length, RECENT);
  const list = document.getElementById('changes-list');
  const item = el('li', { class: `change ${c.op}`, dataset: { entity: c.entity, id: c.id, position: c.position } },
    el('span', { class: `op ${c.op}` }, c.op), ' ',
    el('a', { href: c.op === 'delete' ? `#/e/${encodeURIComponent(c.entity)}` : docHref(c.entity, c.id) }, c.entity),
    ' ', el('span', { class: 'muted' }, (c.payload?.name ? `${c.payload.name} · ` : '') + fmtTime(c.created_at)));
  list.prepend(item);
  while (list.children.length > RECENT) list.lastChild.remove();
}

async function recentChanges() {
  const head = await api('/_changes?since=now&limit=1');
  if (!head.ok) return null;
  const last = head.body.last;
  const from = Math.max(0, last - RECENT);
  const r = await api(`/_changes?since=${from}&limit=${RECENT}`);
  for (const c of r.body?.changes || []) showChange(c);
  return last;
}

async function follow() {
  if (!CHANGES) {
    document.getElementById('feed-state').textContent = 'The change feed is off in this service.';
    return;
  }
  state.feed?.abort();
  const controller = new AbortController();
  state.feed = controller;
  document.getElementById('changes-list').replaceChildren();
  state.changes = [];
  const feedState = document.getElementById('feed-state');
  let position = await recentChanges();
  while (!controller.signal.aborted) {
    try {
      const resp = await fetch(`/_changes?since=${position ?? 'now'}`, {
        headers: authHeaders({ accept: 'text/event-stream' }),
        signal: controller.signal,
      });
      if (resp.status === 401 || resp.status === 403) {
        // refused: no retry until the token changes (which restarts the feed)
        feedState.textContent = `not shown: ${errorText(await resp.json().catch(() => ''))}`;
        document.body.dataset.feed = 'refused';
        return;
      }
      if (!resp.ok) throw new Error(`${resp.status} ${errorText(await resp.json().catch(() => ''))}`);
      feedState.textContent = 'live';
      document.body.dataset.feed = 'live';
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const event = { id: null, type: 'message', data: [] };
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) continue;
            const i = line.indexOf(':');
            const field = i < 0 ? line : line.slice(0, i);
            const val = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
            if (field === 'id') event.id = val;
            else if (field === 'event') event.type = val;
            else if (field === 'data') event.data.push(val);
          }
          if (event.id !== null) position = Number(event.id);
          if (event.type === 'change' && event.data.length) {
            const change = JSON.parse(event.data.join('\n'));
            showChange(change);
            if (state.view && state.view.entity === change.entity) state.view.onChange?.(change);
          }
        }
      }
    } catch (err) {
      if (controller.signal.aborted) return;
      feedState.textContent = `reconnecting (${err.message})`;
    }
    document.body.dataset.feed = 'reconnecting';
    await new Promise((r) => setTimeout(r, 2000));
  }
}

// ---------------------------------------------------------------------------------------------
// start

function wireToken() {
  const form = document.getElementById('token-form');
  const input = document.getElementById('token-input');
  input.value = token();
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = input.value.trim().replace(/^Bearer\s+/i, '');
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
    state.service = null;
    render();
    follow();
  });
  document.getElementById('token-clear').addEventListener('click', () => {
    input.value = '';
    sessionStorage.removeItem(TOKEN_KEY);
    state.service = null;
    render();
    follow();
  });
}

wireToken();
wireTimebar();
window.addEventListener('hashchange', render);
render();
follow();
