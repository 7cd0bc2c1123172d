// mosto dashboard: renders /ui/events (Server-Sent Events) into the page.
// Plain DOM and SVG; data goes in with textContent only.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const SVGNS = "http://www.w3.org/2000/svg";
  let state = null, selPair = null, lop = null, lopVersion = 0, rendered = false;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function fmt(v, d) { return v === null || v === undefined || v < 0 ? "-" : Number(v).toFixed(d === undefined ? 1 : d); }
  function bytes(v) {
    const u = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
    while (v >= 1000 && i < u.length - 1) { v /= 1000; i++; }
    return v.toFixed(i ? 1 : 0) + " " + u[i];
  }
  function age(s) {
    if (!(s >= 0)) return "-";
    if (s < 90) return s.toFixed(0) + " s";
    if (s < 5400) return (s / 60).toFixed(0) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }
  function rttColor(ms) { return ms < 50 ? "#2a9d4b" : ms < 150 ? "#e0a800" : "#d33"; }
  function heat(ms, maxMS) {
    const f = Math.min(1, ms / Math.max(maxMS, 1));
    return "hsl(" + (120 - 120 * f).toFixed(0) + ",70%," + (88 - 25 * f).toFixed(0) + "%)";
  }
  function kv(m) {
    if (!m) return "";
    return Object.keys(m).sort().filter((k) => m[k] > 0).map((k) => k + ":" + m[k]).join(" ");
  }
  function rtt(i, j) { const r = state.matrix.rtt_ms; return r && r[i] && r[i][j] !== null && r[i][j] !== undefined ? r[i][j] : null; }

  function renderController() {
    const c = state.controller;
    $("c-leader").textContent = c.leader ? "this controller" : "no (follower)";
    $("c-store").textContent = c.store || "-";
    $("c-version").textContent = c.version;
    $("c-feps").textContent = c.feps;
    $("c-key").textContent = c.keys_rotated ? age(c.key_age_s) : "no key yet";
    $("c-at").textContent = new Date(state.at).toLocaleTimeString();
  }

  function project(lat, lon) { return [(lon + 180) * 2, (90 - lat) * 2]; }

  function renderMap() {
    const m = $("map");
    while (m.firstChild) m.removeChild(m.firstChild);
    // Zoom to the FEPs (20 degrees around them), keeping the 2:1 aspect.
    let x0 = 720, y0 = 360, x1 = 0, y1 = 0;
    (state.feps || []).forEach((f) => { const p = project(f.lat, f.lon); x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); y0 = Math.min(y0, p[1]); y1 = Math.max(y1, p[1]); });
    if (x0 > x1) { x0 = 0; x1 = 720; y0 = 0; y1 = 360; }
    let w = Math.max(x1 - x0 + 80, 2 * (y1 - y0 + 80), 120), h = w / 2;
    const cx = (x0 + x1) / 2, cy = (y0 + y1) / 2;
    w = Math.min(w, 720); h = Math.min(h, 360);
    const vx = Math.min(Math.max(cx - w / 2, 0), 720 - w), vy = Math.min(Math.max(cy - h / 2, 0), 360 - h);
    m.setAttribute("viewBox", vx.toFixed(1) + " " + vy.toFixed(1) + " " + w.toFixed(1) + " " + h.toFixed(1));
    const k = w / 720;
    const step = k < 0.3 ? 10 : 30;
    for (let lon = -180; lon <= 180; lon += step) m.appendChild(svg("line", { x1: (lon + 180) * 2, y1: 0, x2: (lon + 180) * 2, y2: 360, class: "grid", "stroke-width": 0.5 * k }));
    for (let lat = -90; lat <= 90; lat += step) m.appendChild(svg("line", { x1: 0, y1: (90 - lat) * 2, x2: 720, y2: (90 - lat) * 2, class: "grid", "stroke-width": 0.5 * k }));
    const names = state.matrix.names || [], idx = {};
    names.forEach((n, i) => { idx[n] = i; });
    const pos = {};
    (state.feps || []).forEach((f) => { pos[f.id] = project(f.lat, f.lon); });
    for (let i = 0; i < names.length; i++) {
      for (let j = i + 1; j < names.length; j++) {
        const a = rtt(i, j), b = rtt(j, i);
        if (a === null && b === null) continue;
        const v = a === null ? b : b === null ? a : (a + b) / 2;
        const p = pos[names[i]], q = pos[names[j]];
        if (!p || !q) continue;
        const l = svg("line", { x1: p[0], y1: p[1], x2: q[0], y2: q[1], class: "link", stroke: rttColor(v), "stroke-width": 1.6 * k });
        const t = svg("title", {}); t.textContent = names[i] + " - " + names[j] + ": " + v.toFixed(1) + " ms";
        l.appendChild(t); m.appendChild(l);
      }
    }
    (state.feps || []).forEach((f) => {
      const p = pos[f.id];
      const col = f.status === "up" ? "#2a9d4b" : f.status === "down" ? "#d33" : "#999";
      const c = svg("circle", { cx: p[0], cy: p[1], r: 4 * k, fill: col, class: "fep", "stroke-width": k });
      const t = svg("title", {}); t.textContent = f.id + " (" + (f.location || "") + "): " + f.status;
      c.appendChild(t); m.appendChild(c);
      const lb = svg("text", { x: p[0] + 5 * k, y: p[1] - 4 * k, class: "lbl", "font-size": 9 * k }); lb.textContent = f.id; m.appendChild(lb);
    });
  }

  function renderFEPs() {
    const tb = $("feps").tBodies[0];
    tb.textContent = "";
    const now = new Date(state.at).getTime();
    (state.feps || []).forEach((f) => {
      const tr = el("tr"); tr.id = "fep:" + f.id;
      const s = f.stats || {};
      const last = f.last_report ? age((now - new Date(f.last_report).getTime()) / 1000) : "-";
      [f.id, f.location || "", null, last, fmt(f.flows_per_s, 1), bytes(f.bytes_per_s || 0) + "/s", f.active,
        f.refusals, kv(s.direct) || "0", kv(s.pool), s.table_version || "-"].forEach((v, k) => {
        const td = k === 2 ? el("td", f.status, "st-" + f.status) : el("td", v);
        if (k === 7 && s.refusals) td.title = kv(s.refusals);
        tr.appendChild(td);
      });
      tb.appendChild(tr);
    });
  }

  function renderMatrix() {
    const t = $("matrix"), names = state.matrix.names || [];
    t.textContent = "";
    let maxMS = 0;
    names.forEach((_, i) => names.forEach((_, j) => { const v = rtt(i, j); if (v !== null && v > maxMS) maxMS = v; }));
    const hr = el("tr"); hr.appendChild(el("th", ""));
    names.forEach((n) => hr.appendChild(el("th", n)));
    t.appendChild(hr);
    names.forEach((a, i) => {
      const tr = el("tr"); tr.appendChild(el("th", a));
      names.forEach((b, j) => {
        const td = el("td");
        td.id = "rtt:" + a + ">" + b;
        if (i === j) { td.className = "self"; tr.appendChild(td); return; }
        const v = rtt(i, j);
        if (v !== null) { td.textContent = v.toFixed(1); td.dataset.ms = v; td.style.background = heat(v, maxMS); }
        else { td.textContent = "-"; }
        if (selPair === a + ">" + b) td.classList.add("sel");
        td.addEventListener("click", () => { selPair = a + ">" + b; renderMatrix(); renderHistory(); });
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
  }

  function renderHistory() {
    const h = $("hist");
    if (!selPair) return;
    h.textContent = "";
    const pts = (state.history || {})[selPair] || [];
    h.appendChild(el("p", selPair.replace(">", " \u2192 ") + ": " + pts.length + " value(s) seen"));
    if (pts.length === 0) return;
    const W = 500, H = 90, t0 = new Date(pts[0].at).getTime(), t1 = Math.max(new Date(pts[pts.length - 1].at).getTime(), new Date(state.at).getTime());
    let maxMS = 1; pts.forEach((p) => { if (p.ms > maxMS) maxMS = p.ms; });
    const s = svg("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H });
    let d = "", lastY = null;
    pts.forEach((p, k) => {
      const x = t1 > t0 ? (new Date(p.at).getTime() - t0) / (t1 - t0) * (W - 10) + 5 : 5;
      const y = p.ms < 0 ? H - 2 : H - 5 - p.ms / maxMS * (H - 15);
      d += (k ? " H" + x.toFixed(1) + " V" : "M" + x.toFixed(1) + " ") + y.toFixed(1);
      lastY = y;
    });
    d += " H" + (W - 5);
    s.appendChild(svg("path", { d: d, fill: "none", stroke: "#1d6fb8", "stroke-width": 1.5 }));
    const lab = svg("text", { x: 5, y: 10, class: "lbl" }); lab.textContent = "max " + maxMS.toFixed(1) + " ms";
    s.appendChild(lab);
    h.appendChild(s);
    const ol = el("ol");
    pts.slice().reverse().forEach((p) => ol.appendChild(el("li", new Date(p.at).toLocaleTimeString() + "  " + (p.ms < 0 ? "unmeasured/unreachable" : p.ms.toFixed(1) + " ms"))));
    h.appendChild(ol);
    void lastY;
  }

  function renderChanges() {
    const ol = $("changes"); ol.textContent = "";
    (state.changes || []).slice(0, 20).forEach((c) => {
      ol.appendChild(el("li", new Date(c.at).toLocaleTimeString() + "  " + c.from + " \u2192 " + c.to + ": " + fmt(c.old_ms) + " \u2192 " + fmt(c.new_ms) + " ms"));
    });
  }

  function renderDests() {
    const tb = $("dests").tBodies[0]; tb.textContent = "";
    (state.destinations || []).forEach((d) => {
      const tr = el("tr");
      [d.id, d.prefix, d.egp || "-", d.by || "-", kv(d.rtt_ms)].forEach((v) => tr.appendChild(el("td", v)));
      tb.appendChild(tr);
    });
  }

  function renderLoPs() {
    const sel = $("lop"), lops = Object.keys(state.tables || {}).sort();
    if (lop === null && lops.length) lop = lops[0];
    if (sel.options.length !== lops.length || lops.some((l, i) => sel.options[i].value !== l)) {
      sel.textContent = "";
      lops.forEach((l) => { const o = el("option", l); o.value = l; sel.appendChild(o); });
      if (lop !== null) sel.value = lop;
    }
    const v = (state.tables || {})[lop];
    if (lop !== null && v && v !== lopVersion) loadTable(lop, v);
  }

  function loadTable(l, v) {
    lopVersion = v;
    fetch("table/" + encodeURIComponent(l), { cache: "no-store" }).then((r) => r.ok ? r.json() : Promise.reject(r.status)).then((t) => {
      if (l !== lop) return;
      $("t-meta").textContent = "version " + t.version + ", computed " + new Date(t.computed).toLocaleString() + ", " + Object.keys(t.members || {}).length + " members";
      const tb = $("chains").tBodies[0]; tb.textContent = "";
      ((t.table || {}).chains || []).forEach((c) => {
        const tr = el("tr");
        [c.from, c.to, bytes(c.size), c.rounds, c.path.join(" \u2192 "), fmt(c.cost_ms), fmt(c.sum_ms), fmt(c.max_ms)].forEach((x) => tr.appendChild(el("td", x)));
        tb.appendChild(tr);
      });
    }).catch(() => { lopVersion = 0; });
  }

  function render() {
    const t0 = performance.now();
    renderController(); renderMap(); renderFEPs(); renderMatrix(); renderHistory(); renderChanges(); renderLoPs(); renderDests();
    document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
    if (!rendered) { rendered = true; document.body.dataset.firstRenderMs = performance.now().toFixed(1); }
    document.body.dataset.renderMs = (performance.now() - t0).toFixed(1);
  }

  $("lop").addEventListener("change", (e) => { lop = e.target.value; lopVersion = 0; renderLoPs(); });

  function connect() {
    const es = new EventSource("events");
    es.addEventListener("state", (e) => {
      state = JSON.parse(e.data);
      $("c-live").textContent = "live"; $("c-live").className = "";
      render();
    });
    es.onerror = () => { $("c-live").textContent = "reconnecting"; $("c-live").className = "off"; };
  }
  // The state the page came with: the first render needs no other request.
  const s0 = JSON.parse($("state0") ? $("state0").textContent : "null");
  if (s0) { state = s0; document.body.dataset.firstFrom = "page"; render(); }
  connect();
})();
