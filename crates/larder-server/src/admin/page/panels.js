// The status page's panels: the header, the KPIs, the doors table, the volume ring, memory,
// disks, cluster, errors, hot keys and slow requests, each drawn from the last answers.
import {
  $, isNum, h, svg, setText, setBar, render, facts, sw, sumDoors, DOORS, DOOR_COLOR, STEP_COLOR,
  fmtNum, fmtRate, fmtInt, fmtGroup, fmtBytes, fmtPct, fmtUs, fmtSecs, fmtAgo, fmtAgoShort,
  fmtClock, shortPath,
} from './fmt.js';

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
// (what is drawn of it now, kept to be updated in place: the ring panel's alone)
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
  $('ring').replaceChildren(root);
}
function renderRing(s, p, now) {
  if (!s || !Array.isArray(s.slots)) {
    $('ring').replaceChildren(h('div', { class: 'empty', text: 'The ring is drawn once the store is open.' }));
    ring.n = -1;
    setText('ring-sub', '');
    facts($('ring-facts'), []);
    return;
  }
  const slots = s.slots;
  if (slots.length !== ring.n) buildRing(slots.length);
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

function renderSlow(slow, now) {
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

// Every panel, from the page's state `st`: the last stats, hot and slow answers, and the
// latest second of the series.
export function renderPanels(st) {
  const s = st.stats;
  const p = st.points.length ? st.points[st.points.length - 1] : null;
  const now = Date.now() + st.skew; // the server's clock, as near as the page knows it
  renderHeader(s);
  renderKpis(s, p);
  setText('rate-total', p ? fmtRate(sumDoors(p, 'rate')) : '—');
  renderDoors(s, p);
  renderRing(s, p, now);
  renderMemory(s, p);
  renderDisks(s);
  renderCluster(s);
  renderErrors(s);
  renderHot(st.hot, s);
  renderSlow(st.slow, now);
  if (s && s.budget) setText('budget-cap', 'of ' + fmtBytes(s.budget.capacity_bytes));
}
