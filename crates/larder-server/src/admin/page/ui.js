// larder's status page: polls this server's /_larder/ endpoints every second and draws them.
// Plain ES2020, no libraries, nothing fetched from anywhere but this origin; the page's CSP
// allows no inline script or style, so every style set here goes through the CSSOM.
'use strict';
(() => {
  const POLL_MS = 1000;
  const TIMEOUT_MS = 4000;
  const WINDOW_MS = 300000;
  const MAX_POINTS = 300;
  const TOKEN_KEY = 'larder.token';
  const DOORS = ['http', 'proxy', 'memcache'];
  const DOOR_COLOR = { http: '#4ea1ff', proxy: '#c08cff', memcache: '#2fd1a6' };
  const OUTCOMES = [
    ['hit', 'hit', '#3ecf8e'],
    ['miss', 'miss', '#f5a524'],
    ['write', 'write', '#4ea1ff'],
    ['delete', 'delete', '#9aa5b8'],
    ['client_error', '4xx', '#ff8a5b'],
    ['server_error', '5xx', '#ff4d6d'],
    ['other', 'other', '#6b7686'],
  ];
  const STEP_COLOR = {
    policy: '#9aa5b8', budget_wait: '#ff8a5b', body: '#c08cff', blocking_queue: '#f5a524',
    wake: '#e8d06a', index: '#7fd1ff', memory: '#ffb547', disk_read: '#4ea1ff',
    coalesced_wait: '#2fd1a6', origin: '#ff6fb1', write: '#3ecf8e', sync: '#ff4d6d', send: '#a3e36a',
  };
  const SVG = 'http://www.w3.org/2000/svg';

  const $ = (id) => document.getElementById(id);
  const body = document.body;

  function readToken() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
  }
  function writeToken(t) {
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* storage refused: keep it in memory only */ }
  }

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

  // ---------- formatting ----------
  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  function fmtNum(v, digits) {
    if (!isNum(v)) return '—';
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 1 : 2) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 1 : 2) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    if (a >= 100 || Number.isInteger(v)) return Math.round(v).toString();
    return v.toFixed(digits === undefined ? 1 : digits);
  }
  function fmtRate(v) {
    if (!isNum(v)) return '—';
    if (v === 0) return '0';
    if (Math.abs(v) < 10) return v.toFixed(1);
    return fmtNum(v);
  }
  function fmtInt(v) { return isNum(v) ? Math.round(v).toString() : '—'; }
  function fmtGroup(v) { return isNum(v) ? Math.round(v).toLocaleString('en-US') : '—'; }
  function fmtBytes(v) {
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
  function fmtBytesTick(v) {
    return fmtBytes(v).replace(/(\.\d*?)0+ /, '$1 ').replace('. ', ' ').replace(' ', '').replace('iB', '');
  }
  function fmtPct(v, digits) {
    if (!isNum(v)) return '—';
    const p = v * 100;
    if (digits !== undefined) return p.toFixed(digits) + '%';
    return (p >= 99.95 || p === 0 ? p.toFixed(0) : p >= 10 ? p.toFixed(1) : p.toFixed(2)) + '%';
  }
  function fmtUs(v) {
    if (!isNum(v) || v <= 0) return '—';
    if (v < 1000) return Math.round(v) + ' µs';
    if (v < 1e6) return (v / 1000).toFixed(v < 1e4 ? 2 : v < 1e5 ? 1 : 0) + ' ms';
    return (v / 1e6).toFixed(2) + ' s';
  }
  function fmtSecs(s) {
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
  function fmtAgo(ms) { return isNum(ms) ? fmtSecs(ms / 1000) + ' ago' : '—'; }
  // the largest unit only: "12s ago", "15m ago", "3h ago"
  function fmtAgoShort(ms) {
    if (!isNum(ms)) return '—';
    const s = Math.max(0, Math.floor(ms / 1000));
    if (s < 60) return s + 's ago';
    if (s < 3600) return Math.floor(s / 60) + 'm ago';
    if (s < 86400) return Math.floor(s / 3600) + 'h ago';
    return Math.floor(s / 86400) + 'd ago';
  }
  // a long path cut at its start, where it matters least
  function shortPath(p, max) {
    return p.length > max ? '…' + p.slice(p.length - max + 1) : p;
  }
  function fmtClock(ms) {
    if (!isNum(ms) || ms <= 0) return '—';
    const d = new Date(ms);
    const p = (n) => String(n).padStart(2, '0');
    return p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
  }
  const serverNow = () => Date.now() + st.skew;

  // ---------- DOM helpers ----------
  function h(tag, attrs, ...kids) {
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
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  function setText(id, v) {
    const e = typeof id === 'string' ? $(id) : id;
    if (e && e.textContent !== v) e.textContent = v;
  }
  function setBar(id, frac, warnAt) {
    const e = $(id);
    if (!e) return;
    const f = isNum(frac) ? Math.max(0, Math.min(1, frac)) : 0;
    e.style.width = (f * 100).toFixed(2) + '%';
    e.classList.toggle('warn', warnAt !== undefined && f >= warnAt && f < 0.95);
    e.classList.toggle('bad', warnAt !== undefined && f >= 0.95);
  }
  // Replaces a container's children only when what it shows changed (keeps hover and
  // tooltips steady between refreshes).
  function render(el, sig, build) {
    if (el._sig === sig) return;
    el._sig = sig;
    el.replaceChildren(...[].concat(build()));
  }
  // A definition list of [name, value, tooltip, class] rows.
  function facts(el, pairs) {
    render(el, JSON.stringify(pairs), () => pairs.flatMap(([k, v, title, cls]) => [
      h('dt', { text: k }), h('dd', { text: v, title: title || v, class: cls }),
    ]));
  }
  function sw(color, dashed) {
    const e = h('i', { class: dashed ? 'sw dash' : 'sw' });
    e.style.background = color;
    return e;
  }

  // ---------- charts ----------
  // The charts' time window: the smallest of these that holds every point kept, so that a
  // server started moments ago fills its charts too.
  const SPANS = [[15000, 5000], [30000, 10000], [60000, 15000], [120000, 30000], [300000, 60000]];
  const view = { end: 0, span: WINDOW_MS, step: 60000 };
  function setView() {
    view.end = st.now || Date.now();
    const held = st.points.length ? view.end - st.points[0].t : 0;
    const pick = SPANS.find(([span]) => held <= span - 1000) || SPANS[SPANS.length - 1];
    [view.span, view.step] = pick;
  }
  function tickLabel(ago) {
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
    // o: {series: [{label, color, get(p), dash, width, alpha}], stacked, area, log, yMax, fmt}
    constructor(id, o) {
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
      const L = 42;
      const R = 6;
      const T = 5;
      const B = 15;
      const pw = w - L - R;
      const ph = hgt - T - B;
      const tEnd = view.end;
      const t0 = tEnd - view.span;
      const pts = st.points.filter((p) => p.t > t0 - 1000);
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
      let fmtTick = o.tickFmt || o.fmt;
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
        g.fillText(fmtTick(tv), L - 5, Math.min(Math.max(y, T + 5), T + ph));
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
        g.fillText(tickLabel(k * view.step), k === 0 ? L + pw : x, hgt - 3);
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

  const sumDoors = (p, f) => DOORS.reduce((a, d) => a + ((p.doors && p.doors[d] && p.doors[d][f]) || 0), 0);
  const readsIn = (p) => (p.hits_memory || 0) + (p.hits_disk || 0) + (p.misses || 0);

  const charts = {
    rate: new Chart('c-rate', {
      stacked: true, fmt: fmtRate, tickFmt: fmtTick, minMax: 4,
      series: DOORS.map((d) => ({ label: d, color: DOOR_COLOR[d], get: (p) => p.doors[d].rate })),
    }),
    outcome: new Chart('c-outcome', {
      stacked: true, fmt: fmtRate, tickFmt: fmtTick, minMax: 4,
      series: OUTCOMES.map(([f, label, color]) => ({ label, color, get: (p) => sumDoors(p, f) })),
    }),
    hits: new Chart('c-hits', {
      stacked: true, yMax: 1, fmt: (v) => fmtPct(v, 1), tickFmt: (v) => Math.round(v * 100) + '%',
      series: [
        { label: 'memory', color: '#ffb547', get: (p) => (readsIn(p) > 0 ? p.memory_hit_ratio : null) },
        { label: 'disk', color: '#5b8def', get: (p) => (readsIn(p) > 0 ? p.disk_hit_ratio : null) },
      ],
    }),
    lat: new Chart('c-lat', { log: true, fmt: fmtUs, tickFmt: (v) => fmtUs(v).replace(' ', ''), series: [] }),
    bytes: new Chart('c-bytes', {
      area: true, bytes: true, fmt: (v) => fmtBytes(v) + '/s', tickFmt: fmtBytesTick,
      series: [
        { label: 'in', color: '#2fd1a6', get: (p) => p.bytes_in },
        { label: 'out', color: '#4ea1ff', get: (p) => p.bytes_out },
      ],
    }),
    store: new Chart('c-store', {
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
    budget: new Chart('c-budget', {
      area: true, bytes: true, fmt: fmtBytes, tickFmt: fmtBytesTick, minMax: 1024,
      series: [{ label: 'in use', color: '#c08cff', get: (p) => p.budget_used_bytes }],
    }),
    wait: new Chart('c-wait', {
      area: true, integer: true, fmt: fmtInt, tickFmt: fmtTick, minMax: 4,
      series: [{ label: 'waiting', color: '#ff8a5b', get: (p) => p.waiting }],
    }),
  };

  // The latency chart shows the doors that carried requests in the window (http at least).
  function latencySeries() {
    const active = DOORS.filter((d) => st.points.some((p) => p.doors && p.doors[d] && p.doors[d].rate > 0));
    const doors = active.length ? active : ['http'];
    const out = [];
    for (const d of doors) {
      out.push({ group: d, label: 'p50', color: DOOR_COLOR[d], width: 1.2, lineAlpha: 0.55, get: (p) => p.doors[d].p50_us || null });
      out.push({ group: d, label: 'p99', color: DOOR_COLOR[d], width: 1.6, get: (p) => p.doors[d].p99_us || null });
      out.push({ group: d, label: 'p99.9', color: DOOR_COLOR[d], width: 1.2, dash: [4, 3], get: (p) => p.doors[d].p999_us || null });
    }
    return out;
  }

  function drawCharts() {
    setView();
    charts.lat.setSeries(latencySeries());
    for (const c of Object.values(charts)) c.draw();
  }
  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(drawCharts, 100);
  });

  // ---------- panels ----------
  const latest = () => (st.points.length ? st.points[st.points.length - 1] : null);

  function renderHeader(s) {
    setText('version', s ? 'v' + s.version : '');
    setText('uptime', s ? fmtSecs(s.uptime_seconds) : '—');
    setText('started', s ? fmtClock(s.started_ms) : '—');
    const node = s && s.cluster ? s.cluster.self : '';
    setText('node', node);
    const flags = [];
    if (s && s.degraded) flags.push(['degraded', 'bad']);
    if (s && s.started_empty) flags.push(['started empty', '']);
    render($('flags'), JSON.stringify(flags), () => flags.map(([t, c]) => h('span', { class: 'flag ' + c, text: t })));
  }

  function renderKpis(s, p) {
    if (!s) {
      for (const id of ['kpi-hit', 'kpi-keys', 'kpi-disk', 'kpi-mem', 'kpi-io', 'kpi-budget', 'kpi-slow']) setText(id, '—');
      for (const id of ['kpi-rate-sub', 'kpi-hit-sub', 'kpi-keys-sub', 'kpi-disk-sub', 'kpi-mem-sub', 'kpi-io-sub', 'kpi-budget-sub', 'kpi-slow-sub']) setText(id, '');
      for (const id of ['kpi-disk-bar', 'kpi-mem-bar', 'kpi-budget-bar']) setBar(id, 0);
      return;
    }
    setText('kpi-rate-sub', p ? DOORS.filter((d) => s.doors[d].requests > 0 || d !== 'proxy')
      .map((d) => (d === 'memcache' ? 'mc' : d) + ' ' + fmtRate(p.doors[d].rate)).join(' · ') : '');
    setText('kpi-hit', fmtPct(s.hit_ratio, 1));
    setText('kpi-hit-sub', 'mem ' + fmtPct(s.memory_hit_ratio, 1) + ' · disk ' + fmtPct(s.disk_hit_ratio, 1));
    setText('kpi-keys', fmtGroup(s.keys));
    setText('kpi-keys-sub', p ? 'puts ' + fmtRate(p.puts) + '/s · del ' + fmtRate(p.deletes) + '/s' : '');
    setText('kpi-disk', fmtBytes(s.bytes_used));
    setBar('kpi-disk-bar', s.bytes_used / s.capacity_bytes);
    setText('kpi-disk-sub', 'of ' + fmtBytes(s.capacity_bytes) + ' · ' + fmtPct(s.bytes_used / s.capacity_bytes, 1));
    setText('kpi-mem', fmtBytes(s.memory_bytes));
    setBar('kpi-mem-bar', s.memory_capacity ? s.memory_bytes / s.memory_capacity : 0);
    setText('kpi-mem-sub', s.memory_capacity ? 'of ' + fmtBytes(s.memory_capacity) + ' · ' + fmtGroup(s.memory_entries) + ' entries' : 'off');
    setText('kpi-io', p ? fmtBytes(p.bytes_out) + '/s' : '—');
    setText('kpi-io-sub', p ? 'out · in ' + fmtBytes(p.bytes_in) + '/s' : '');
    const b = s.budget || {};
    setText('kpi-budget', fmtBytes(b.used_bytes));
    setBar('kpi-budget-bar', b.capacity_bytes ? b.used_bytes / b.capacity_bytes : 0, 0.8);
    setText('kpi-budget-sub', 'of ' + fmtBytes(b.capacity_bytes) + ' · ' + fmtInt(b.waiting) + ' waiting');
    const sl = s.slow || {};
    setText('kpi-slow', fmtGroup(sl.seen));
    setText('kpi-slow-sub', sl.threshold_ms > 0 ? 'over ' + fmtUs(sl.threshold_ms * 1000) : 'tracing off');
  }

  function renderDoors(s, p) {
    for (const d of DOORS) {
      const row = $('door-' + d);
      const c = s && s.doors && s.doors[d];
      const q = p && p.doors && p.doors[d];
      // digits only: a test compares this with /_larder/stats
      setText('hits-' + d, c ? String(c.hit) : '');
      row.classList.toggle('idle', !c || c.requests === 0);
      for (const td of row.querySelectorAll('td[data-f]')) {
        const f = td.dataset.f;
        let v = '';
        if (f === 'rate') v = q ? fmtRate(q.rate) : '';
        else if (f === 'p50' || f === 'p99' || f === 'p999') v = q && q.rate > 0 ? fmtUs(q[f + '_us']) : (q ? '—' : '');
        else if (c) v = String(c[f]);
        setText(td, v);
        if (f === 'client_error' || f === 'server_error') td.classList.toggle('err', !!c && c[f] > 0);
      }
    }
  }

  // The ring: one segment per slot, clockwise from the top; its fill (from the inside out) the
  // volume's share of volume_size, its shade the volume's age, the write head outlined.
  const ringEl = $('ring');
  const ring = { n: -1 };
  const RO = 110;
  const RI = 78;
  function polar(r, a) { return [r * Math.cos(a), r * Math.sin(a)]; }
  function sector(r0, r1, a0, a1) {
    const large = a1 - a0 > Math.PI ? 1 : 0;
    const [x0, y0] = polar(r1, a0);
    const [x1, y1] = polar(r1, a1);
    const [x2, y2] = polar(r0, a1);
    const [x3, y3] = polar(r0, a0);
    const f = (v) => v.toFixed(2);
    return `M${f(x0)} ${f(y0)}A${r1} ${r1} 0 ${large} 1 ${f(x1)} ${f(y1)}L${f(x2)} ${f(y2)}A${r0} ${r0} 0 ${large} 0 ${f(x3)} ${f(y3)}Z`;
  }
  function buildRing(n) {
    ring.n = n;
    // room beside the ring for the write head's label, wherever the head is
    const root = svg('svg', { viewBox: '-240 -158 480 318', role: 'img', 'aria-label': 'volume ring' });
    ring.segs = [];
    const step = (2 * Math.PI) / Math.max(n, 1);
    const gapA = Math.min(0.035, step * 0.12);
    for (let i = 0; i < n; i++) {
      const a0 = -Math.PI / 2 + i * step + gapA / 2;
      const a1 = a0 + step - gapA;
      const g = svg('g', { class: 'seg-hit' });
      const bg = svg('path', { class: 'seg-bg', d: sector(RI, RO, a0, a1) });
      const fill = svg('path', { d: '' });
      const outline = svg('path', { class: 'seg-unused', d: sector(RI, RO, a0, a1) });
      const title = svg('title', {});
      g.append(bg, fill, outline, title);
      root.append(g);
      ring.segs.push({ a0, a1, bg, fill, outline, title });
    }
    ring.head = svg('path', { class: 'head-mark', d: '' });
    ring.headLabel = svg('text', { class: 'hl' });
    ring.headLabel2 = svg('text', { class: 'hl2' });
    ring.c1 = svg('text', { class: 'c1', 'text-anchor': 'middle', x: 0, y: -6 });
    ring.c2 = svg('text', { class: 'c2', 'text-anchor': 'middle', x: 0, y: 12 });
    ring.c3 = svg('text', { class: 'c2', 'text-anchor': 'middle', x: 0, y: 27 });
    root.append(ring.head, ring.headLabel, ring.headLabel2, ring.c1, ring.c2, ring.c3);
    ringEl.replaceChildren(root);
  }
  function renderRing(s, p) {
    if (!s || !Array.isArray(s.slots)) {
      ringEl.replaceChildren(h('div', { class: 'empty', text: 'The ring is drawn once the store is open.' }));
      ring.n = -1;
      setText('ring-sub', '');
      facts($('ring-facts'), []);
      return;
    }
    const slots = s.slots;
    if (slots.length !== ring.n) buildRing(slots.length);
    const now = serverNow();
    const used = slots.filter((v) => v.started_ms > 0);
    const newest = Math.max(...used.map((v) => v.started_ms), 0);
    const oldest = Math.min(...used.map((v) => v.started_ms), newest);
    const span = Math.max(newest - oldest, 1);
    slots.forEach((v, i) => {
      const seg = ring.segs[i];
      const isHead = i === s.active_volume;
      const fill = s.volume_size ? Math.max(0, Math.min(1, v.bytes / s.volume_size)) : 0;
      if (v.started_ms > 0) {
        const age = used.length > 1 ? (newest - v.started_ms) / span : 0; // 0 newest .. 1 oldest
        const light = 68 - age * 38;
        const sat = 95 - age * 40;
        const r1 = RI + Math.max(fill, 0.025) * (RO - RI);
        seg.fill.setAttribute('d', sector(RI, r1, seg.a0, seg.a1));
        seg.fill.setAttribute('fill', `hsl(212, ${sat.toFixed(0)}%, ${light.toFixed(0)}%)`);
      } else {
        seg.fill.setAttribute('d', '');
      }
      seg.outline.setAttribute('class', isHead ? 'seg-head' : v.started_ms > 0 ? '' : 'seg-unused');
      if (!isHead && v.started_ms > 0) seg.outline.setAttribute('d', '');
      else seg.outline.setAttribute('d', sector(RI, RO, seg.a0, seg.a1));
      seg.title.textContent = `slot ${i}${isHead ? ' (write head)' : ''}\n`
        + (v.started_ms > 0
          ? `generation ${v.generation}, dir ${v.dir}\n${fmtBytes(v.bytes)} of ${fmtBytes(s.volume_size)} (${fmtPct(fill, 1)})\nstarted ${fmtAgo(now - v.started_ms)}`
          : 'unused');
    });
    // the write head's marker, with the reinsertion rate beside it
    const hs = ring.segs[s.active_volume];
    if (hs) {
      const a = (hs.a0 + hs.a1) / 2;
      const [tx, ty] = polar(RO + 4, a);
      const [bx1, by1] = polar(RO + 14, a - 0.06);
      const [bx2, by2] = polar(RO + 14, a + 0.06);
      ring.head.setAttribute('d', `M${tx.toFixed(1)} ${ty.toFixed(1)}L${bx1.toFixed(1)} ${by1.toFixed(1)}L${bx2.toFixed(1)} ${by2.toFixed(1)}Z`);
      const [lx, ly] = polar(RO + 22, a);
      const cos = Math.cos(a);
      const anchor = cos > 0.35 ? 'start' : cos < -0.35 ? 'end' : 'middle';
      const sin = Math.sin(a);
      const y1 = sin < -0.5 ? ly - 14 : sin > 0.5 ? ly + 8 : ly - 3;
      for (const [el, y] of [[ring.headLabel, y1], [ring.headLabel2, y1 + 13]]) {
        el.setAttribute('x', lx.toFixed(1));
        el.setAttribute('y', y.toFixed(1));
        el.setAttribute('text-anchor', anchor);
      }
      ring.headLabel.textContent = 'head: slot ' + s.active_volume;
      ring.headLabel2.textContent = '↻ reinsert ' + (p && isNum(p.reinserted) ? fmtRate(p.reinserted) : '—') + '/s';
    }
    ring.c1.textContent = fmtPct(s.capacity_bytes ? s.bytes_used / s.capacity_bytes : 0, 1);
    ring.c2.textContent = fmtBytes(s.bytes_used) + ' of ' + fmtBytes(s.capacity_bytes);
    ring.c3.textContent = used.length + ' of ' + slots.length + ' volumes used';
    setText('ring-sub', slots.length + ' × ' + fmtBytes(s.volume_size));
    const rec = s.recovery || {};
    facts($('ring-facts'), [
      ['rotations', fmtGroup(s.rotations)],
      ['evicted vols', fmtGroup(s.volumes_evicted)],
      ['reinserted', fmtGroup(s.reinserted)],
      ['reins. bytes', fmtBytes(s.reinserted_bytes)],
      ['last recovery', isNum(rec.millis) ? fmtUs(rec.millis * 1000) : '—'],
      ['recovered', fmtGroup(rec.records) + ' rec'],
    ]);
  }

  function renderMemory(s, p) {
    if (!s) {
      setText('mem-policy', '');
      setBar('mem-bar', 0);
      facts($('mem-facts'), []);
      return;
    }
    setText('mem-policy', s.memory_policy ? 'policy ' + s.memory_policy : 'off');
    setBar('mem-bar', s.memory_capacity ? s.memory_bytes / s.memory_capacity : 0);
    facts($('mem-facts'), [
      ['used', fmtBytes(s.memory_bytes) + ' · ' + fmtPct(s.memory_capacity ? s.memory_bytes / s.memory_capacity : 0, 1)],
      ['capacity', fmtBytes(s.memory_capacity)],
      ['entries', fmtGroup(s.memory_entries)],
      ['promotions/s', p ? fmtRate(p.promotions) : '—'],
      ['promotions', fmtGroup(s.promotions)],
      ['memory hits', fmtGroup(s.memory_hits) + ' · ' + fmtPct(s.memory_hit_ratio, 1)],
      ['disk hits', fmtGroup(s.disk_hits) + ' · ' + fmtPct(s.disk_hit_ratio, 1)],
    ]);
  }

  function renderDisks(s) {
    const el = $('disks');
    if (!s || !Array.isArray(s.dirs)) {
      render(el, '', () => []);
      setText('disks-sub', '');
      return;
    }
    setText('disks-sub', s.dirs.length + (s.dirs.length === 1 ? ' directory' : ' directories'));
    render(el, JSON.stringify(s.dirs), () => s.dirs.map((d) => {
      const total = d.bytes_used + d.free_bytes;
      const cls = d.state === 'ok' ? '' : /fail|miss|error|bad/i.test(d.state) ? 'bad' : 'warn';
      const bar = h('i', { class: cls });
      bar.style.width = (total > 0 ? Math.min(100, (d.bytes_used / total) * 100) : 0).toFixed(2) + '%';
      return h('div', { class: 'disk', title: d.path + '\nid ' + d.id },
        h('div', { class: 'row1' },
          h('span', { class: 'path', text: shortPath(d.path, 30) }),
          h('span', { class: 'pill ' + cls, text: d.state })),
        h('div', { class: 'bar' }, bar),
        h('div', { class: 'row2' },
          h('span', { text: fmtBytes(d.bytes_used) + ' · ' + d.volumes + (d.volumes === 1 ? ' vol' : ' vols') }),
          h('span', { text: fmtBytes(d.free_bytes) + ' free' })));
    }));
  }

  function renderCluster(s) {
    const el = $('cluster');
    if (!s) {
      render(el, '', () => []);
      setText('cluster-sub', '');
      return;
    }
    const c = s.cluster;
    if (!c) {
      setText('cluster-sub', '');
      render(el, 'standalone', () => h('div', { class: 'empty', text: 'Standalone: this node is in no cluster (--cluster-nodes not set).' }));
      return;
    }
    setText('cluster-sub', (c.hash ? c.hash + ' · ' : '') + c.nodes.length + (c.nodes.length === 1 ? ' node' : ' nodes'));
    render(el, JSON.stringify(c), () => {
      const bar = h('i', {});
      bar.style.width = (Math.max(0, Math.min(1, c.share)) * 100).toFixed(2) + '%';
      const totalW = c.nodes.reduce((a, n) => a + (n.weight || 0), 0) || 1;
      return [
        h('div', { class: 'share', title: 'share of the keys this node (' + c.self + ') owns' }, h('b', { text: fmtPct(c.share, 1) }), h('span', { class: 'muted', text: 'of keys owned here' })),
        h('div', { class: 'bar big' }, bar),
        h('dl', { class: 'facts' },
          h('dt', { text: 'foreign writes' }), h('dd', { text: fmtGroup(c.foreign_writes) }),
          isNum(c.foreign_ttl_seconds) ? [h('dt', { text: 'foreign ttl' }), h('dd', { text: fmtSecs(c.foreign_ttl_seconds) })] : null),
        h('div', { class: 'nodes' }, c.nodes.map((n) => h('div', { class: n.name === c.self ? 'self' : '' },
          h('span', { class: 'n', text: n.name, title: n.name }),
          n.name === c.self ? h('span', { class: 'pill info', text: 'self' }) : null,
          h('span', { class: 'muted', text: 'w ' + n.weight + ' · ' + fmtPct(n.weight / totalW, 0) })))),
      ];
    });
  }

  // {"http": {"body": 1}, …}: the total, and a line per leaf for the tooltip
  function deepSum(o, path, lines) {
    if (isNum(o)) {
      if (o) lines.push(path + ': ' + o);
      return o;
    }
    if (!o || typeof o !== 'object') return 0;
    return Object.entries(o).reduce((a, [k, v]) => a + deepSum(v, path ? path + '.' + k : k, lines), 0);
  }

  function renderErrors(s) {
    const el = $('err-facts');
    if (!s) {
      facts(el, []);
      return;
    }
    const count = (name, v, title) => [name, fmtGroup(v), title || '', v > 0 ? 'bad' : ''];
    const refusals = [];
    const lates = [];
    const m = s.memcache || {};
    facts(el, [
      ['memcache conns', fmtGroup(m.curr_connections) + ' open', fmtGroup(m.total_connections) + ' since start'],
      count('rejected conns', m.rejected_connections),
      count('refused requests', deepSum(s.refusals, '', refusals), refusals.join('\n')),
      count('deadline closes', deepSum(s.deadline_closes, '', lates), lates.join('\n')),
      count('read failures', s.read_failures),
      count('write failures', s.write_failures),
      count('sync failures', s.sync_failures),
      count('corrupt reads', s.corrupt_reads),
    ]);
  }

  function renderHot(hot, s) {
    const el = $('hot');
    if (!hot || !hot.doors) {
      render(el, '', () => []);
      setText('hot-sub', '');
      return;
    }
    setText('hot-sub', '≈ requests, one in ' + hot.sample_every + ' sampled, halving every ' + hot.half_life_seconds + ' s');
    const doors = DOORS.filter((d) => hot.doors[d] && (hot.doors[d].keys.length || hot.doors[d].largest.length
      || (s && s.doors[d] && s.doors[d].requests > 0) || d !== 'proxy'));
    render(el, JSON.stringify(doors.map((d) => hot.doors[d])), () => doors.map((d) => {
      const x = hot.doors[d];
      const maxReq = Math.max(1, ...x.keys.map((k) => k.requests));
      const keyRows = x.keys.map((k) => {
        const mini = h('i', {});
        mini.style.width = ((k.requests / maxReq) * 100).toFixed(1) + '%';
        mini.style.background = DOOR_COLOR[d];
        return h('tr', {},
          h('td', { class: 'key', text: k.key + (k.cut ? '…' : ''), title: k.key + (k.cut ? ' (cut)' : '') }),
          h('td', { class: 'num', text: fmtGroup(k.requests) + (k.error ? ' ±' + fmtNum(k.error) : ''), title: k.error ? 'up to ' + k.error + ' of these may be other keys' : '' }),
          h('td', { class: 'rel' }, h('div', { class: 'mini' }, mini)));
      });
      const bigRows = x.largest.slice(0, 5).map((k) => h('tr', {},
        h('td', { class: 'key', text: k.key, title: k.key }),
        h('td', { class: 'num', text: fmtBytes(k.bytes) })));
      return h('div', {},
        h('h4', {}, h('i', { class: 'dot d-' + d }), d),
        x.keys.length ? h('table', { class: 'kv' }, keyRows) : h('div', { class: 'empty', text: 'no sampled requests yet' }),
        h('h5', { text: 'largest values' }),
        x.largest.length ? h('table', { class: 'kv' }, bigRows) : h('div', { class: 'empty', text: 'none served yet' }));
    }));
  }

  function renderSlow(slow) {
    const el = $('slow');
    const legend = $('slow-legend');
    if (!slow || !Array.isArray(slow.traces)) {
      render(el, '', () => []);
      render(legend, '', () => []);
      setText('slow-sub', '');
      return;
    }
    setText('slow-sub', slow.threshold_ms > 0
      ? 'over ' + fmtUs(slow.threshold_ms * 1000) + ' · ' + fmtGroup(slow.seen) + ' seen · newest first'
      : 'tracing off (threshold 0)');
    const steps = new Set();
    const now = serverNow();
    // Rebuilt when the traces change; the "ago" column is brought up to date every second.
    render(el, JSON.stringify(slow.traces.map((t) => [t.at_ms, t.key, t.total_us])), () => {
      el._ago = [];
      if (!slow.traces.length) return h('div', { class: 'empty', text: 'No request has been slower than the threshold yet.' });
      const rows = slow.traces.map((t) => {
        const total = Math.max(t.total_us, 1e-3);
        const wf = h('div', { class: 'wf' });
        const tips = [];
        for (const sp of t.spans) {
          tips.push('  '.repeat(sp.depth) + sp.step + ' ' + fmtUs(sp.us) + (sp.bytes ? ' ' + fmtBytes(sp.bytes) : '') + ' @' + fmtUs(sp.start_us));
          if (sp.depth !== 0) continue;
          steps.add(sp.step);
          const left = (sp.start_us / total) * 100;
          const width = (sp.us / total) * 100;
          const seg = h('i', { title: sp.step + ' ' + fmtUs(sp.us) + (sp.bytes ? ' · ' + fmtBytes(sp.bytes) : '') });
          seg.style.left = Math.max(0, Math.min(100, left)).toFixed(2) + '%';
          seg.style.width = Math.max(0, Math.min(100 - left, width)).toFixed(2) + '%';
          seg.style.background = STEP_COLOR[sp.step] || '#9aa5b8';
          if (width > 14) seg.textContent = sp.step;
          wf.append(seg);
        }
        tips.push('untraced ' + fmtUs(t.untraced_us) + (t.dropped_spans ? ' · ' + t.dropped_spans + ' spans dropped' : ''));
        wf.title = tips.join('\n');
        const code = String(t.status || '');
        const ago = h('td', { title: new Date(t.at_ms).toLocaleString() });
        el._ago.push([ago, t.at_ms]);
        return h('tr', {},
          ago,
          h('td', { text: t.door }),
          h('td', { text: t.method }),
          h('td', { class: 'key', text: t.key, title: t.key }),
          h('td', { class: 'st-' + (/^[0-9]/.test(code) ? code.charAt(0) : code), text: code }),
          h('td', { class: 'num', text: fmtUs(t.total_us) }),
          h('td', {}, wf));
      });
      const cols = [66, 74, 54, null, 68, 64, 216].map((w) => {
        const c = h('col', {});
        if (w) c.style.width = w + 'px';
        return c;
      });
      return h('table', {}, h('colgroup', {}, cols),
        h('thead', {}, h('tr', {}, ['when', 'door', 'method', 'key', 'status'].map((t) => h('th', { text: t })),
          h('th', { class: 'num', text: 'total' }), h('th', { text: 'depth-0 spans (share of total)' }))),
        h('tbody', {}, rows));
    });
    for (const [td, at] of el._ago || []) setText(td, fmtAgoShort(now - at));
    const present = [...steps].sort();
    if (present.length || !slow.traces.length) {
      render(legend, present.join(','), () => [
        ...present.map((s) => h('span', {}, sw(STEP_COLOR[s] || '#9aa5b8'), s)),
        slow.traces.length ? h('span', {}, h('i', { class: 'sw unt' }), 'untraced') : null,
      ].filter(Boolean));
    }
  }

  function renderAll() {
    const s = st.stats;
    const p = latest();
    renderHeader(s);
    renderKpis(s, p);
    setText('rate-total', p ? fmtRate(sumDoors(p, 'rate')) : '—');
    renderDoors(s, p);
    renderRing(s, p);
    renderMemory(s, p);
    renderDisks(s);
    renderCluster(s);
    renderErrors(s);
    renderHot(st.hot, s);
    renderSlow(st.slow);
    if (s && s.budget) setText('budget-cap', 'of ' + fmtBytes(s.budget.capacity_bytes));
    drawCharts();
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
  renderAll();
  poll();
})();
