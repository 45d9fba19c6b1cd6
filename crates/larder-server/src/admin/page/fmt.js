// The status page's bottom layer: shared constants, the number/byte/time formatters and the
// DOM helpers every panel and chart draws with. No state of its own, nothing run on import.

// How long a stretch of seconds the page keeps and its charts show at most.
export const WINDOW_MS = 300000;
export const DOORS = ['http', 'proxy', 'memcache'];
export const DOOR_COLOR = { http: '#4ea1ff', proxy: '#c08cff', memcache: '#2fd1a6' };
export const OUTCOMES = [
  ['hit', 'hit', '#3ecf8e'],
  ['miss', 'miss', '#f5a524'],
  ['write', 'write', '#4ea1ff'],
  ['delete', 'delete', '#9aa5b8'],
  ['client_error', '4xx', '#ff8a5b'],
  ['server_error', '5xx', '#ff4d6d'],
  ['other', 'other', '#6b7686'],
];
export const STEP_COLOR = {
  policy: '#9aa5b8', budget_wait: '#ff8a5b', body: '#c08cff', blocking_queue: '#f5a524',
  wake: '#e8d06a', index: '#7fd1ff', memory: '#ffb547', disk_read: '#4ea1ff',
  coalesced_wait: '#2fd1a6', origin: '#ff6fb1', write: '#3ecf8e', sync: '#ff4d6d', send: '#a3e36a',
};
const SVG = 'http://www.w3.org/2000/svg';

export const $ = (id) => document.getElementById(id);

// ---------- formatting ----------
export const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
export function fmtNum(v, digits) {
  if (!isNum(v)) return '—';
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 1 : 2) + 'G';
  if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 1 : 2) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  if (a >= 100 || Number.isInteger(v)) return Math.round(v).toString();
  return v.toFixed(digits === undefined ? 1 : digits);
}
export function fmtRate(v) {
  if (!isNum(v)) return '—';
  if (v === 0) return '0';
  if (Math.abs(v) < 10) return v.toFixed(1);
  return fmtNum(v);
}
export function fmtInt(v) { return isNum(v) ? Math.round(v).toString() : '—'; }
export function fmtGroup(v) { return isNum(v) ? Math.round(v).toLocaleString('en-US') : '—'; }
export function fmtBytes(v) {
  if (!isNum(v)) return '—';
  if (v === 0) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  let x = Math.abs(v);
  while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
  const s = i === 0 ? Math.round(x).toString() : x.toFixed(x >= 100 ? 0 : x >= 10 ? 1 : 2);
  return (v < 0 ? '-' : '') + s + ' ' + u[i];
}
// "1.50 MiB" as an axis says it: "1.5M"
export function fmtBytesTick(v) {
  return fmtBytes(v).replace(/(\.\d*?)0+ /, '$1 ').replace('. ', ' ').replace(' ', '').replace('iB', '');
}
export function fmtPct(v, digits) {
  if (!isNum(v)) return '—';
  const p = v * 100;
  if (digits !== undefined) return p.toFixed(digits) + '%';
  return (p >= 99.95 || p === 0 ? p.toFixed(0) : p >= 10 ? p.toFixed(1) : p.toFixed(2)) + '%';
}
export function fmtUs(v) {
  if (!isNum(v) || v <= 0) return '—';
  if (v < 1000) return Math.round(v) + ' µs';
  if (v < 1e6) return (v / 1000).toFixed(v < 1e4 ? 2 : v < 1e5 ? 1 : 0) + ' ms';
  return (v / 1e6).toFixed(2) + ' s';
}
export function fmtSecs(s) {
  if (!isNum(s)) return '—';
  s = Math.max(0, Math.floor(s));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  if (d) return d + 'd ' + h + 'h';
  if (h) return h + 'h ' + m + 'm';
  if (m) return m + 'm ' + sec + 's';
  return sec + 's';
}
export function fmtAgo(ms) { return isNum(ms) ? fmtSecs(ms / 1000) + ' ago' : '—'; }
// the largest unit only: "12s ago", "15m ago", "3h ago"
export function fmtAgoShort(ms) {
  if (!isNum(ms)) return '—';
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return s + 's ago';
  if (s < 3600) return Math.floor(s / 60) + 'm ago';
  if (s < 86400) return Math.floor(s / 3600) + 'h ago';
  return Math.floor(s / 86400) + 'd ago';
}
// a long path cut at its start, where it matters least
export function shortPath(p, max) {
  return p.length > max ? '…' + p.slice(p.length - max + 1) : p;
}
export function fmtClock(ms) {
  if (!isNum(ms) || ms <= 0) return '—';
  const d = new Date(ms);
  const p = (n) => String(n).padStart(2, '0');
  return p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
}

// ---------- DOM helpers ----------
export function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined || k === false) continue;
    e.append(k instanceof Node ? k : String(k));
  }
  return e;
}
export function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}
export function setText(id, v) {
  const e = typeof id === 'string' ? $(id) : id;
  if (e && e.textContent !== v) e.textContent = v;
}
export function setBar(id, frac, warnAt) {
  const e = $(id);
  if (!e) return;
  const f = isNum(frac) ? Math.max(0, Math.min(1, frac)) : 0;
  e.style.width = (f * 100).toFixed(2) + '%';
  e.classList.toggle('warn', warnAt !== undefined && f >= warnAt && f < 0.95);
  e.classList.toggle('bad', warnAt !== undefined && f >= 0.95);
}
// Replaces a container's children only when what it shows changed (keeps hover and
// tooltips steady between refreshes).
export function render(el, sig, build) {
  if (el._sig === sig) return;
  el._sig = sig;
  el.replaceChildren(...[].concat(build()));
}
// A definition list of [name, value, tooltip, class] rows.
export function facts(el, pairs) {
  render(el, JSON.stringify(pairs), () => pairs.flatMap(([k, v, title, cls]) => [
    h('dt', { text: k }), h('dd', { text: v, title: title || v, class: cls }),
  ]));
}
export function sw(color, dashed) {
  const e = h('i', { class: dashed ? 'sw dash' : 'sw' });
  e.style.background = color;
  return e;
}

// A field of one second's point summed over the doors.
export const sumDoors = (p, f) => DOORS.reduce((a, d) => a + ((p.doors && p.doors[d] && p.doors[d][f]) || 0), 0);
