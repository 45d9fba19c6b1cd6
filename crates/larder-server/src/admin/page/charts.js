// The status page's charts: a small canvas chart engine (stacked, area or log-scale lines over
// the seconds kept, with a hover readout) and the eight charts drawn with it.
import {
  $, isNum, h, setText, sw, sumDoors, WINDOW_MS, DOORS, DOOR_COLOR, OUTCOMES,
  fmtRate, fmtInt, fmtBytes, fmtBytesTick, fmtPct, fmtUs, fmtClock,
} from './fmt.js';

// The charts' time window: the smallest of these that holds every point kept, so that a
// server started moments ago fills its charts too.
const SPANS = [[15000, 5000], [30000, 10000], [60000, 15000], [120000, 30000], [300000, 60000]];
function setView(view, st) {
  view.end = st.now || Date.now();
  const held = st.points.length ? view.end - st.points[0].t : 0;
  const pick = SPANS.find(([span]) => held <= span - 1000) || SPANS[SPANS.length - 1];
  [view.span, view.step] = pick;
}
function tickLabel(ago, view) {
  if (ago === 0) return 'now';
  return '−' + (view.step < 60000 ? Math.round(ago / 1000) + 's' : Math.round(ago / 60000) + 'm');
}
function niceCeilBytes(v) {
  if (!(v > 0)) return 1024;
  let unit = 1;
  while (v / unit >= 1024) unit *= 1024;
  const x = v / unit;
  for (const m of [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]) if (x <= m) return m * unit;
  return 1024 * unit;
}
// A tick step of 1, 2, 2.5 or 5 times a power of ten (whole numbers only for counts).
function niceStep(raw, integer) {
  if (!(raw > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const m = raw / p;
  const step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10) * p;
  return integer ? Math.max(1, Math.ceil(step)) : step;
}
function fmtTick(v) {
  const a = Math.abs(v);
  const short = (x, unit) => String(Number(x.toPrecision(3))) + unit;
  if (a >= 1e9) return short(v / 1e9, 'G');
  if (a >= 1e6) return short(v / 1e6, 'M');
  if (a >= 1e4) return short(v / 1e3, 'k');
  return short(v, '');
}

class Chart {
  // board: {st, view}, the page's state (its points) and the window all charts share.
  // o: {series: [{label, color, get(p), dash, width, alpha}], stacked, area, log, yMax, fmt}
  constructor(board, id, o) {
    this.board = board;
    this.card = $(id);
    this.canvas = this.card.querySelector('canvas');
    this.legendEl = this.card.querySelector('.legend');
    this.o = o;
    this.series = [];
    this.hoverX = null;
    this.setSeries(o.series || []);
    this.canvas.addEventListener('mousemove', (e) => {
      this.hoverX = e.clientX - this.canvas.getBoundingClientRect().left;
      this.draw();
    });
    this.canvas.addEventListener('mouseleave', () => { this.hoverX = null; this.draw(); });
  }

  // One legend item per series, or per group of series (a door's percentiles), each with
  // the latest value (or the hovered second's).
  setSeries(list) {
    const sig = list.map((s) => (s.group || '') + s.label + s.color).join('|');
    if (sig === this.sig) return;
    this.sig = sig;
    this.series = list;
    this.items = [];
    list.forEach((s, i) => {
      const last = this.items[this.items.length - 1];
      if (s.group && last && last.group === s.group) last.idx.push(i);
      else this.items.push({ group: s.group, label: s.group || s.label, color: s.color, dash: !!s.dash && !s.group, idx: [i] });
    });
    for (const it of this.items) it.val = h('b', { text: '—' });
    this.when = h('span', { class: 'when' });
    this.legendEl.replaceChildren(
      ...this.items.map((it) => h('span', { class: 'it' }, sw(it.color, it.dash), it.label, it.val)),
      this.when,
    );
  }

  draw() {
    const c = this.canvas;
    const w = c.clientWidth;
    const hgt = c.clientHeight;
    if (!w || !hgt) return;
    const dpr = window.devicePixelRatio || 1;
    const W = Math.round(w * dpr);
    const H = Math.round(hgt * dpr);
    if (c.width !== W) c.width = W;
    if (c.height !== H) c.height = H;
    const g = c.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, hgt);

    const o = this.o;
    const view = this.board.view;
    const L = 42;
    const R = 6;
    const T = 5;
    const B = 15;
    const pw = w - L - R;
    const ph = hgt - T - B;
    const tEnd = view.end;
    const t0 = tEnd - view.span;
    const pts = this.board.st.points.filter((p) => p.t > t0 - 1000);
    const X = (t) => L + ((t - t0) / view.span) * pw;

    // values, stacked if asked
    const raw = this.series.map((s) => pts.map((p) => {
      let v;
      try { v = s.get(p); } catch (e) { v = null; }
      return isNum(v) ? v : null;
    }));
    const lo = [];
    const hi = [];
    for (let i = 0; i < raw.length; i++) {
      lo.push([]);
      hi.push([]);
      for (let j = 0; j < pts.length; j++) {
        const v = raw[i][j];
        const base = o.stacked && i > 0 ? (hi[i - 1][j] === null ? lo[i - 1][j] : hi[i - 1][j]) : 0;
        lo[i].push(base === null ? 0 : base);
        hi[i].push(v === null ? null : (o.stacked ? (base || 0) + v : v));
      }
    }

    // y scale
    let Y;
    let ticks = [];
    const tickFmt = o.tickFmt || o.fmt;
    if (o.log) {
      let mn = Infinity;
      let mx = 0;
      for (const row of hi) for (const v of row) if (v !== null && v > 0) { mn = Math.min(mn, v); mx = Math.max(mx, v); }
      if (!(mx > 0)) { mn = 10; mx = 1000; }
      let a = Math.floor(Math.log10(mn));
      let b = Math.ceil(Math.log10(mx));
      if (b <= a) b = a + 1;
      if (b - a < 2) a = b - 2;
      Y = (v) => T + ph - ((Math.log10(Math.max(v, Math.pow(10, a))) - a) / (b - a)) * ph;
      for (let k = a; k <= b; k++) ticks.push(Math.pow(10, k));
    } else {
      let mx = 0;
      for (const row of hi) for (const v of row) if (v !== null) mx = Math.max(mx, v);
      const want = Math.max(mx * 1.05, o.minMax || 0) || 1;
      let top;
      let step;
      if (o.yMax !== undefined) {
        top = o.yMax;
        step = top / 4;
      } else if (o.bytes) {
        top = niceCeilBytes(want);
        step = top / 4;
      } else {
        step = niceStep(want / 4, o.integer);
        top = Math.ceil(want / step - 1e-9) * step;
      }
      Y = (v) => T + ph - (v / top) * ph;
      for (let k = 0; k * step <= top + 1e-9; k++) ticks.push(k * step);
    }

    // grid
    g.font = '10px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
    g.lineWidth = 1;
    g.strokeStyle = '#1f2935';
    g.fillStyle = '#6f7c8d';
    g.textAlign = 'right';
    g.textBaseline = 'middle';
    for (const tv of ticks) {
      const y = Math.round(Y(tv)) + 0.5;
      g.beginPath();
      g.moveTo(L, y);
      g.lineTo(L + pw, y);
      g.stroke();
      g.fillText(tickFmt(tv), L - 5, Math.min(Math.max(y, T + 5), T + ph));
    }
    g.textAlign = 'center';
    g.textBaseline = 'alphabetic';
    const nTicks = Math.round(view.span / view.step);
    for (let k = nTicks - 1; k >= 0; k--) {
      const x = Math.round(X(tEnd - k * view.step)) + 0.5;
      if (k > 0) {
        g.beginPath();
        g.moveTo(x, T);
        g.lineTo(x, T + ph);
        g.stroke();
      }
      g.textAlign = k === 0 ? 'right' : 'center';
      g.fillText(tickLabel(k * view.step, view), k === 0 ? L + pw : x, hgt - 3);
    }

    // series
    g.save();
    g.beginPath();
    g.rect(L, T - 1, pw, ph + 2);
    g.clip();
    const gap = (j) => j > 0 && pts[j].t - pts[j - 1].t > 2500;
    const runs = (i) => {
      const out = [];
      let cur = null;
      for (let j = 0; j < pts.length; j++) {
        if (hi[i][j] === null || gap(j)) { if (cur) out.push(cur); cur = null; }
        if (hi[i][j] === null) continue;
        if (!cur) cur = [];
        cur.push(j);
      }
      if (cur) out.push(cur);
      return out;
    };
    this.series.forEach((s, i) => {
      for (const run of runs(i)) {
        if (o.area || o.stacked) {
          g.beginPath();
          run.forEach((j, n) => (n ? g.lineTo : g.moveTo).call(g, X(pts[j].t), Y(hi[i][j])));
          if (run.length === 1) g.lineTo(X(pts[run[0]].t) + 1, Y(hi[i][run[0]]));
          for (let n = run.length - 1; n >= 0; n--) {
            const j = run[n];
            g.lineTo(X(pts[j].t) + (run.length === 1 ? 1 : 0), Y(o.log ? 1 : lo[i][j]));
          }
          g.closePath();
          g.globalAlpha = s.alpha !== undefined ? s.alpha : o.stacked ? 0.35 : 0.14;
          g.fillStyle = s.color;
          g.fill();
          g.globalAlpha = 1;
        }
        g.beginPath();
        run.forEach((j, n) => (n ? g.lineTo : g.moveTo).call(g, X(pts[j].t), Y(hi[i][j])));
        g.strokeStyle = s.color;
        g.lineWidth = s.width || 1.5;
        g.setLineDash(s.dash || []);
        g.globalAlpha = s.lineAlpha || 1;
        g.stroke();
        g.setLineDash([]);
        g.globalAlpha = 1;
      }
    });
    g.restore();

    // hover: the nearest second's values
    let at = pts.length - 1;
    if (this.hoverX !== null && pts.length) {
      const t = t0 + ((this.hoverX - L) / pw) * view.span;
      let best = 0;
      for (let j = 1; j < pts.length; j++) if (Math.abs(pts[j].t - t) < Math.abs(pts[best].t - t)) best = j;
      at = best;
      const x = Math.round(X(pts[at].t)) + 0.5;
      g.strokeStyle = 'rgba(213,221,231,.45)';
      g.lineWidth = 1;
      g.beginPath();
      g.moveTo(x, T);
      g.lineTo(x, T + ph);
      g.stroke();
      this.series.forEach((s, i) => {
        if (hi[i][at] === null) return;
        g.fillStyle = s.color;
        g.beginPath();
        g.arc(x, Y(hi[i][at]), 2.5, 0, 2 * Math.PI);
        g.fill();
      });
    }
    for (const it of this.items) {
      setText(it.val, it.idx.map((i) => (at >= 0 && raw[i][at] !== null ? o.fmt(raw[i][at]) : '—')).join(' / '));
    }
    setText(this.when, this.hoverX !== null && at >= 0 ? fmtClock(pts[at].t) : '');
  }
}

// The page's charts, drawing the points of `st` (its shared state); draw() redraws them all.
export function createCharts(st) {
  const board = { st, view: { end: 0, span: WINDOW_MS, step: 60000 } };
  const charts = {
    rate: new Chart(board, 'c-rate', {
      stacked: true, fmt: fmtRate, tickFmt: fmtTick, minMax: 4,
      series: DOORS.map((d) => ({ label: d, color: DOOR_COLOR[d], get: (p) => p.doors[d].rate })),
    }),
    outcome: new Chart(board, 'c-outcome', {
      stacked: true, fmt: fmtRate, tickFmt: fmtTick, minMax: 4,
      series: OUTCOMES.map(([f, label, color]) => ({ label, color, get: (p) => sumDoors(p, f) })),
    }),
    // A second without reads has no ratio: the server sends null, drawn as a gap.
    hits: new Chart(board, 'c-hits', {
      stacked: true, yMax: 1, fmt: (v) => fmtPct(v, 1), tickFmt: (v) => Math.round(v * 100) + '%',
      series: [
        { label: 'memory', color: '#ffb547', get: (p) => p.memory_hit_ratio },
        { label: 'disk', color: '#5b8def', get: (p) => p.disk_hit_ratio },
      ],
    }),
    lat: new Chart(board, 'c-lat', { log: true, fmt: fmtUs, tickFmt: (v) => fmtUs(v).replace(' ', ''), series: [] }),
    bytes: new Chart(board, 'c-bytes', {
      area: true, bytes: true, fmt: (v) => fmtBytes(v) + '/s', tickFmt: fmtBytesTick,
      series: [
        { label: 'in', color: '#2fd1a6', get: (p) => p.bytes_in },
        { label: 'out', color: '#4ea1ff', get: (p) => p.bytes_out },
      ],
    }),
    store: new Chart(board, 'c-store', {
      fmt: fmtRate, tickFmt: fmtTick, minMax: 4,
      series: [
        { label: 'puts', color: '#3ecf8e', get: (p) => p.puts },
        { label: 'disk reads', color: '#5b8def', get: (p) => p.disk_reads },
        { label: 'promotions', color: '#ffb547', get: (p) => p.promotions },
        { label: 'reinserted', color: '#c08cff', get: (p) => p.reinserted },
        { label: 'coalesced', color: '#2fd1a6', get: (p) => p.coalesced_reads },
        { label: 'deletes', color: '#9aa5b8', get: (p) => p.deletes },
      ],
    }),
    budget: new Chart(board, 'c-budget', {
      area: true, bytes: true, fmt: fmtBytes, tickFmt: fmtBytesTick, minMax: 1024,
      series: [{ label: 'in use', color: '#c08cff', get: (p) => p.budget_used_bytes }],
    }),
    wait: new Chart(board, 'c-wait', {
      area: true, integer: true, fmt: fmtInt, tickFmt: fmtTick, minMax: 4,
      series: [{ label: 'waiting', color: '#ff8a5b', get: (p) => p.waiting }],
    }),
  };
  return {
    draw() {
      setView(board.view, st);
      charts.lat.setSeries(latencySeries(st.points));
      for (const c of Object.values(charts)) c.draw();
    },
  };
}

// The latency chart shows the doors that carried requests in the window (http at least).
function latencySeries(points) {
  const active = DOORS.filter((d) => points.some((p) => p.doors && p.doors[d] && p.doors[d].rate > 0));
  const doors = active.length ? active : ['http'];
  const out = [];
  for (const d of doors) {
    out.push({ group: d, label: 'p50', color: DOOR_COLOR[d], width: 1.2, lineAlpha: 0.55, get: (p) => p.doors[d].p50_us || null });
    out.push({ group: d, label: 'p99', color: DOOR_COLOR[d], width: 1.6, get: (p) => p.doors[d].p99_us || null });
    out.push({ group: d, label: 'p99.9', color: DOOR_COLOR[d], width: 1.2, dash: [4, 3], get: (p) => p.doors[d].p999_us || null });
  }
  return out;
}
