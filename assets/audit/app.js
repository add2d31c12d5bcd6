// The spend page. Every value from the ledger reaches the page as a text node
// (element.append(string) / textContent), never as markup: an upstream message is
// text the vendor wrote, and it must not run here. No innerHTML anywhere in this file.
'use strict';
(function () {
  const KEY = 'purser.audit.token';
  const $ = (id) => document.getElementById(id);
  let chart = null;
  let cursor = null;

  // --- small helpers -------------------------------------------------------
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c == null ? '' : c instanceof Node ? c : String(c));
    return e;
  }
  const clear = (node) => { while (node.firstChild) node.removeChild(node.firstChild); };

  // Exact decimal sums: amounts come as decimal text and must add up to the cent of a
  // cent, which binary floats do not. (Floats only feed the chart's bar heights.)
  function parseDec(s) {
    let neg = false;
    if (s.startsWith('-')) { neg = true; s = s.slice(1); }
    const [i, f = ''] = s.split('.');
    return { n: BigInt((i || '0') + f) * (neg ? -1n : 1n), scale: f.length };
  }
  function addDec(a, b) {
    const A = parseDec(a), B = parseDec(b);
    const scale = Math.max(A.scale, B.scale);
    const n = A.n * 10n ** BigInt(scale - A.scale) + B.n * 10n ** BigInt(scale - B.scale);
    const neg = n < 0n;
    let digits = (neg ? -n : n).toString().padStart(scale + 1, '0');
    let out = scale ? digits.slice(0, -scale) + '.' + digits.slice(-scale) : digits;
    if (scale) out = out.replace(/0+$/, '').replace(/\.$/, '');
    return (neg ? '-' : '') + out;
  }
  const isZero = (s) => parseDec(s).n === 0n;
  const sum = (xs) => xs.reduce(addDec, '0');

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, params) {
    const token = sessionStorage.getItem(KEY) || '';
    const q = new URLSearchParams(params || {}).toString();
    const r = await fetch('v1/' + path + (q ? '?' + q : ''), {
      headers: { Authorization: 'Bearer ' + token },
    });
    if (!r.ok) {
      let message = r.statusText;
      try { message = (await r.json()).error.message; } catch (_) { /* not JSON */ }
      throw new ApiError(r.status, message);
    }
    return r;
  }

  function filters() {
    const p = {};
    for (const name of ['provider', 'policy', 'client', 'model', 'class']) {
      const v = $('f-' + name).value.trim();
      if (v) p[name] = v;
    }
    if ($('f-since').value) p.since = $('f-since').value + 'T00:00:00Z';
    if ($('f-until').value) p.until = $('f-until').value + 'T00:00:00Z';
    return p;
  }

  function showError(message) {
    const box = $('error');
    box.textContent = message;
    box.hidden = false;
  }
  function hideError() { $('error').hidden = true; $('error').textContent = ''; }

  // A refused token: no data may stay on screen.
  function lockOut(message) {
    sessionStorage.removeItem(KEY);
    $('main').hidden = true;
    for (const id of ['budgets', 'failures', 'requests']) clear($(id).tBodies[0]);
    for (const id of ['total-spend', 'total-exposure', 'total-attempts', 'n-requests', 'n-refused', 'n-failed', 'n-failover']) $(id).textContent = '…';
    if (chart) { chart.destroy(); chart = null; }
    $('sign-out').hidden = true;
    showError(message);
  }

  function fail(e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
      lockOut('The audit API refused this token (' + e.status + '): ' + e.message);
    } else {
      showError('Could not load: ' + e.message);
    }
  }

  // --- panels ---------------------------------------------------------------
  async function loadTotals() {
    const body = await (await api('spend', { ...filters(), group_by: 'provider' })).json();
    for (const c of document.querySelectorAll('.currency')) c.textContent = body.currency;
    $('total-spend').textContent = sum(body.rows.map((r) => r.cost));
    $('total-exposure').textContent = sum(body.rows.map((r) => r.maybe_billed_cost));
    $('total-attempts').textContent = String(body.rows.reduce((n, r) => n + r.attempts, 0));
    const list = $('providers');
    clear(list);
    for (const r of body.rows) list.append(el('option', { value: r.key }));
  }

  const PALETTE = ['#0b57d0', '#1e8e3e', '#8e24aa', '#00796b', '#5d4037', '#c2185b', '#3949ab', '#607d8b'];
  function bucketLabel(b, bucket) {
    if (bucket === 'hour') return b.slice(5, 13).replace('T', ' ') + ':00';
    if (bucket === 'month') return b.slice(0, 7);
    return b.slice(0, 10);
  }

  async function loadChart() {
    const bucket = $('bucket').value, group = $('group').value;
    const body = await (await api('spend/series', { ...filters(), bucket, group_by: group })).json();
    const buckets = [...new Set(body.rows.map((r) => r.bucket))].sort();
    const keys = [...new Set(body.rows.map((r) => r.key))].sort();
    const cell = new Map(body.rows.map((r) => [r.bucket + '\u0000' + r.key, r]));
    const datasets = keys.map((k, i) => ({
      label: k,
      stack: 'billed',
      backgroundColor: PALETTE[i % PALETTE.length],
      data: buckets.map((b) => Number((cell.get(b + '\u0000' + k) || { cost: '0' }).cost)),
    }));
    datasets.push({
      label: 'may have been billed (worst case)',
      stack: 'exposure',
      backgroundColor: '#f4b400',
      borderColor: '#8a3b00',
      borderWidth: 1,
      data: buckets.map((b) => Number(sum(body.rows.filter((r) => r.bucket === b).map((r) => r.maybe_billed_cost)))),
    });
    const canvas = $('chart');
    canvas.setAttribute('aria-label', 'Spend per ' + bucket + ' stacked by ' + group + ', ' + buckets.length + ' steps, ' + keys.length + ' groups; totals are in the Totals section.');
    if (chart) chart.destroy();
    chart = new window.Chart(canvas, {
      type: 'bar',
      data: { labels: buckets.map((b) => bucketLabel(b, bucket)), datasets },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: {
          x: { stacked: true },
          y: {
            stacked: true,
            beginAtZero: true,
            title: { display: true, text: body.currency },
            ticks: { callback: (v) => Number(v).toLocaleString('en', { maximumSignificantDigits: 4 }) },
          },
        },
        plugins: { legend: { position: 'bottom' } },
      },
    });
  }

  function windowEnd(start, period) {
    const d = new Date(start);
    if (period === 'day') d.setUTCDate(d.getUTCDate() + 1);
    else if (period === 'week') d.setUTCDate(d.getUTCDate() + 7);
    else if (period === 'month') d.setUTCMonth(d.getUTCMonth() + 1);
    else return null;
    return d;
  }
  const utc = (d) => d.toISOString().slice(0, 16).replace('T', ' ');

  function runOut(b, now) {
    const start = new Date(b.window_start);
    const used = Number(addDec(b.spent, b.reserved));
    const elapsed = now - start;
    if (parseDec(b.remaining).n <= 0n) return { text: 'reached', late: true };
    if (!(used > 0) || elapsed <= 0) return { text: 'not at this rate', late: false };
    const at = new Date(now.getTime() + Number(b.remaining) / (used / elapsed));
    const end = windowEnd(start, b.period);
    if (end && at >= end) return { text: 'not this window', late: false };
    return { text: utc(at), late: true };
  }

  async function loadBudgets() {
    const body = await (await api('budgets')).json();
    const tbody = $('budgets').tBodies[0];
    clear(tbody);
    const now = new Date();
    for (const b of body.budgets) {
      const r = runOut(b, now);
      tbody.append(el('tr', {},
        el('td', {}, b.policy), el('td', {}, b.period),
        el('td', { class: 'num' }, b.limit), el('td', { class: 'num' }, b.spent),
        el('td', { class: 'num' }, b.reserved), el('td', { class: 'num' }, b.remaining),
        el('td', { class: r.late ? 'late' : '' }, r.text)));
    }
    if (!body.budgets.length) tbody.append(el('tr', {}, el('td', { colspan: '7' }, 'No budgets configured.')));
  }

  async function loadFailures() {
    const body = await (await api('failures', filters())).json();
    const n = body.requests;
    $('n-requests').textContent = String(n.total);
    $('n-refused').textContent = String(n.refused);
    $('n-failed').textContent = String(n.failed);
    $('n-failover').textContent = String(n.served_after_failover);
    const tbody = $('failures').tBodies[0];
    clear(tbody);
    const rows = body.attempts.filter((r) => r.class !== 'success');
    for (const r of rows) {
      tbody.append(el('tr', {}, el('td', {}, r.provider), el('td', {}, r.class), el('td', { class: 'num' }, String(r.attempts))));
    }
    if (!rows.length) tbody.append(el('tr', {}, el('td', { colspan: '3' }, 'No failed attempts.')));
  }

  // An attempt that may have been billed without proof shows its worst case: the
  // ledger's cost for it (often 0) is not what it may cost.
  function attemptCost(a) {
    if (a.billing === 'maybe_billed') {
      return el('span', { class: 'exposure', title: 'may have been billed; proven cost ' + a.cost }, 'up to ' + a.worst_case);
    }
    return a.cost;
  }

  function attemptsTable(req) {
    const head = ['#', 'Provider', 'Upstream model', 'Class', 'Reason', 'Status', 'Input tokens', 'Output tokens', 'Cost', 'Billing', 'Cost basis', 'Plan id', 'Message'];
    const t = el('table', { class: 'attempts' },
      el('caption', {}, 'Attempts of ' + req.id + ', in order'),
      el('thead', {}, el('tr', {}, ...head.map((h) => el('th', { scope: 'col' }, h)))));
    const tb = el('tbody');
    for (const a of req.attempts) {
      tb.append(el('tr', { 'data-seq': String(a.seq) },
        el('td', { class: 'seq' }, String(a.seq)),
        el('td', { class: 'provider' }, a.provider),
        el('td', { class: 'upstream' }, a.upstream_model),
        el('td', { class: 'klass' }, a.class || 'in flight'),
        el('td', { class: 'reason' }, a.reason || ''),
        el('td', { class: 'status' }, a.status == null ? '' : String(a.status)),
        el('td', { class: 'num in' }, a.input_tokens == null ? '' : String(a.input_tokens)),
        el('td', { class: 'num out' }, a.output_tokens == null ? '' : String(a.output_tokens)),
        el('td', { class: 'num cost' }, attemptCost(a)),
        el('td', { class: 'billing' }, a.billing),
        el('td', { class: 'basis' }, a.cost_basis || ''),
        el('td', { class: 'plan mono' }, req.plan_id),
        el('td', { class: 'message' }, a.message || '')));
    }
    t.append(tb);
    return t;
  }

  function requestRow(req, tbody) {
    const exposure = sum(req.attempts.filter((a) => a.billing === 'maybe_billed').map((a) => a.worst_case));
    const detailId = 'attempts-' + req.id;
    const open = el('button', { type: 'button', class: 'open', 'aria-expanded': 'false', 'aria-controls': detailId, 'aria-label': 'Show attempts of ' + req.id }, '▸');
    const row = el('tr', { 'data-request-id': req.id },
      el('td', {}, open),
      el('td', {}, req.received_at.slice(0, 19).replace('T', ' ')),
      el('td', { class: 'mono' }, req.id),
      el('td', {}, req.policy), el('td', {}, req.client), el('td', {}, req.model),
      el('td', {}, req.outcome), el('td', {}, req.served_by || ''),
      el('td', { class: 'num' }, req.cost),
      el('td', { class: 'num exposure' }, isZero(exposure) ? '' : 'up to ' + exposure));
    const detail = el('tr', { class: 'detail', id: detailId, hidden: '' }, el('td', { colspan: '10' }, attemptsTable(req)));
    open.addEventListener('click', () => {
      const shown = open.getAttribute('aria-expanded') === 'true';
      open.setAttribute('aria-expanded', String(!shown));
      open.textContent = shown ? '▸' : '▾';
      detail.hidden = shown;
    });
    tbody.append(row, detail);
  }

  async function loadRequests(more) {
    const tbody = $('requests').tBodies[0];
    if (!more) { clear(tbody); cursor = null; }
    const params = { ...filters(), limit: '50' };
    if (more && cursor) params.cursor = cursor;
    const body = await (await api('requests', params)).json();
    for (const r of body.requests) requestRow(r, tbody);
    cursor = body.next_cursor;
    $('more').hidden = !cursor;
    if (!tbody.rows.length) tbody.append(el('tr', {}, el('td', { colspan: '10' }, 'No requests match this filter.')));
  }

  async function exportCsv() {
    const status = $('export-status');
    status.textContent = 'Preparing…';
    try {
      const blob = await (await api('attempts.csv', filters())).blob();
      const url = URL.createObjectURL(blob);
      const a = el('a', { href: url, download: 'attempts.csv' });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      status.textContent = 'Downloaded attempts.csv';
    } catch (e) { status.textContent = ''; fail(e); }
  }

  async function loadAll() {
    hideError();
    try {
      // Totals first: a refused token stops here, before anything is drawn.
      await loadTotals();
      $('main').hidden = false;
      $('sign-out').hidden = false;
      await Promise.all([loadChart(), loadBudgets(), loadFailures(), loadRequests(false)]);
      document.body.setAttribute('data-loaded', 'true');
    } catch (e) { fail(e); }
  }

  // --- wiring -----------------------------------------------------------------
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $('token').value);
    $('token').value = '';
    document.body.removeAttribute('data-loaded');
    loadAll();
  });
  $('sign-out').addEventListener('click', () => lockOut('Token forgotten.'));
  $('filters').addEventListener('submit', (ev) => { ev.preventDefault(); document.body.removeAttribute('data-loaded'); loadAll(); });
  $('reset').addEventListener('click', () => { $('filters').reset(); loadAll(); });
  for (const id of ['bucket', 'group']) $(id).addEventListener('change', () => loadChart().catch(fail));
  $('more').addEventListener('click', () => loadRequests(true).catch(fail));
  $('export').addEventListener('click', exportCsv);
  if (sessionStorage.getItem(KEY)) loadAll();
})();
