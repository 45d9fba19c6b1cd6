// larder's status page, its entry point: the page's state, the token form, the connection's
// state, and the polling of this server's /_larder/ endpoints every second.
// Plain ES2020 modules (this one imports fmt.js, charts.js and panels.js), no libraries,
// nothing fetched from anywhere but this origin; the page's CSP allows no inline script or
// style, so every style the page sets goes through the CSSOM.
import { $, setText, setBar, fmtClock, WINDOW_MS } from './fmt.js';
import { createCharts } from './charts.js';
import { renderPanels } from './panels.js';

const POLL_MS = 1000;
const TIMEOUT_MS = 4000;
const MAX_POINTS = 300;
const TOKEN_KEY = 'larder.token';
const body = document.body;

function readToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
}
function writeToken(t) {
  try {
    if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* storage refused: keep it in memory only */ }
}

// The page's state, all of it: the panels and the charts read it, only this module writes it.
const st = {
  token: readToken(),
  points: [],
  lastT: 0,
  started: null,
  now: 0,          // the server's clock at the last series answer
  skew: 0,         // server clock minus ours
  stats: null,
  hot: null,
  slow: null,
  health: null,
  auth: false,
  timer: 0,
  inflight: false,
  ready: false,
};

const charts = createCharts(st);

function renderAll() {
  renderPanels(st);
  charts.draw();
}

// ---------- connection state ----------
function setConn(kind, text) {
  const e = $('conn-state');
  e.className = 'conn ' + kind;
  setText(e, text);
  $('dash').classList.toggle('stale', kind === 'bad');
  const lost = $('lost');
  if (kind === 'bad') {
    if (lost.hidden) setText('lost-since', fmtClock(Date.now()));
    lost.hidden = false;
  } else {
    lost.hidden = true;
  }
}
function setReady(v) {
  st.ready = v;
  body.dataset.ready = v ? '1' : '0';
}
function setRecovery(label, text) {
  const el = $('recovery');
  if (!label) { el.hidden = true; return; }
  el.hidden = false;
  setText('recovery-label', label);
  setText('recovery-text', text);
  const m = /(\d+(?:\.\d+)?)% of/.exec(text);
  setBar('recovery-bar', m ? Number(m[1]) / 100 : 0);
}
function clearData() {
  st.points = [];
  st.lastT = 0;
  st.stats = null;
  st.hot = null;
  st.slow = null;
  st.now = 0;
  renderAll();
}

// ---------- auth ----------
function needToken() {
  const hadToken = !!st.token;
  st.auth = true;
  st.token = '';
  writeToken('');
  st.started = null;
  clearData();
  setRecovery('');
  setReady(false);
  body.classList.add('locked');
  setConn('wait', 'token required');
  const msg = $('token-msg');
  msg.textContent = hadToken
    ? 'The server refused that token (401). Enter the right one to see its figures.'
    : 'This server asks for a bearer token before it shows its figures.';
  msg.classList.toggle('err', hadToken);
  $('auth').hidden = false;
  $('token-form').hidden = false;
  const input = $('token');
  input.value = '';
  input.focus();
}
$('token-form').addEventListener('submit', (e) => {
  e.preventDefault(); // the CSP allows no form submission: the page sends the token itself
  const t = $('token').value.trim();
  if (!t) return;
  if (!/^[\x21-\x7e]+$/.test(t)) {
    const msg = $('token-msg');
    msg.textContent = 'A token is printable ASCII without spaces.';
    msg.classList.add('err');
    return;
  }
  st.token = t;
  writeToken(t);
  st.auth = false;
  $('token').value = '';
  $('token-form').hidden = true;
  $('auth').hidden = true;
  body.classList.remove('locked');
  setConn('wait', 'connecting…');
  poll();
});

// ---------- polling ----------
async function get(path) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
  const headers = { Accept: 'application/json' };
  if (st.token) headers.Authorization = 'Bearer ' + st.token;
  try {
    const r = await fetch(path, { headers, cache: 'no-store', credentials: 'omit', signal: ctl.signal });
    const text = await r.text();
    return { status: r.status, text };
  } finally {
    clearTimeout(timer);
  }
}
function parse(r) {
  if (r.status !== 200) return null;
  try { return JSON.parse(r.text); } catch (e) { return null; }
}

function schedule(began) {
  clearTimeout(st.timer);
  if (st.auth) return;
  st.timer = setTimeout(poll, Math.max(50, POLL_MS - (performance.now() - began)));
}

function disconnected() {
  setConn('bad', 'disconnected — retrying');
  setReady(false);
  setText('rate-total', '—');
}

async function poll() {
  if (st.inflight || st.auth) return;
  st.inflight = true;
  const began = performance.now();
  try {
    await pollOnce();
  } finally {
    st.inflight = false;
    schedule(began);
  }
}

async function pollOnce() {
  let answers;
  try {
    answers = await Promise.all([
      get('/_larder/stats'),
      get('/_larder/series?since=' + st.lastT),
      get('/_larder/hot?n=10'),
      get('/_larder/slow?n=10'),
    ]);
  } catch (e) {
    // refused, reset or timed out: the server is away (a bug below is no such thing, and
    // is left to surface in the console)
    disconnected();
    return;
  }
  const [rs, rp, rh, rw] = answers;
  if ([rs, rp, rh, rw].some((r) => r.status === 401)) {
    needToken();
    return;
  }
  const series = parse(rp);
  let stats = parse(rs);
  const started = (series && series.started_ms) || (stats && stats.started_ms) || null;
  if (started !== null && st.started !== null && started !== st.started) {
    // the server restarted: its figures start over, and so does the page
    // (every point of the new run is later than the old run's last one, so the series
    // answer asked with the old `since` holds all of it)
    clearData();
  }
  if (started !== null) st.started = started;

  if (series && Array.isArray(series.points)) {
    st.now = series.now_ms;
    st.skew = series.now_ms - Date.now();
    for (const pt of series.points) {
      if (pt.t > st.lastT) st.points.push(pt);
    }
    if (st.points.length) st.lastT = st.points[st.points.length - 1].t;
    const cut = st.now - WINDOW_MS - 2000;
    let drop = 0;
    while (drop < st.points.length && st.points[drop].t < cut) drop++;
    drop = Math.max(drop, st.points.length - MAX_POINTS);
    if (drop > 0) st.points.splice(0, drop);
  }

  if (rs.status === 503) {
    // still recovering (or stopping): the health line says how far it is
    let line = '';
    try {
      const hr = await get('/_larder/health');
      line = hr.text.trim();
    } catch (e) { line = ''; }
    if (/^recovering/.test(line)) setRecovery('Recovering', line.replace(/^recovering:?\s*/, ''));
    else setRecovery('Not ready', line || 'the store is not open yet');
    stats = null;
  } else {
    setRecovery('');
  }
  if (stats) st.stats = stats;
  const hot = parse(rh);
  if (hot) st.hot = hot;
  const slow = parse(rw);
  if (slow) st.slow = slow;

  setConn('ok', 'connected');
  renderAll();
  // for tests and scripts: which run of the server is shown, and how many seconds of it
  body.dataset.started = st.started === null ? '' : String(st.started);
  body.dataset.points = String(st.points.length);
  if (stats && series) setReady(true);
  else if (!stats) setReady(false);
}

// ---------- start ----------
let resizeTimer = 0;
window.addEventListener('resize', () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => charts.draw(), 100);
});
renderAll();
poll();
