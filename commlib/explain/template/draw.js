// The explorer's pictures (model.js reads the data): the ranks and this step's messages as an SVG,
// the same in words, the holdings table and the simulator's timeline and link use.
"use strict";
const SVG_NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Ranks on a circle in rank order (hosts are filled in rank order, so a host is an arc of it,
// drawn as a band behind its ranks); messages as curved arrows bent to the left of their
// direction, so a pair exchanging in both directions shows two arrows.
function drawRanks(c, msgs, locals, k, data) {
  const P = c.P, W = 520, mid = W / 2, R = 185, nodeR = P > 10 ? 15 : 19;
  const at = (r) => [mid + R * Math.sin((2 * Math.PI * r) / P), mid - R * Math.cos((2 * Math.PI * r) / P)];
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${W}`, class: "ranks", role: "img" });
  const nMsg = msgs.length, nLocal = locals.length;
  const desc = k === 0 ? "Start: no message yet." :
    `Step ${k}: ${nMsg} message${nMsg === 1 ? "" : "s"} and ${nLocal} local operation${nLocal === 1 ? "" : "s"} ` +
    "between the ranks on the circle; the list below says each in words.";
  svg.setAttribute("aria-label", desc);
  svg.appendChild(el("svg:title", {}, desc));
  const defs = el("svg:defs");
  for (const [id, colour] of [["head-copy", "#0072B2"], ["head-reduce", "#D55E00"]]) {
    const m = el("svg:marker", { id: `${id}-${data.uid}`, viewBox: "0 0 10 10", refX: "9", refY: "5",
                                 markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
    m.appendChild(el("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: colour }));
    defs.appendChild(m);
  }
  svg.appendChild(defs);
  const hosts = [...new Set(c.hosts)];
  if (hosts.length > 1 && hosts.length < P) {  // one rank per host: every rank is its host, no band
    for (const h of hosts) {
      const rs = c.hosts.map((x, r) => (x === h ? r : -1)).filter((r) => r >= 0);
      const a0 = (2 * Math.PI * (rs[0] - 0.35)) / P, a1 = (2 * Math.PI * (rs[rs.length - 1] + 0.35)) / P;
      const p0 = [mid + R * Math.sin(a0), mid - R * Math.cos(a0)], p1 = [mid + R * Math.sin(a1), mid - R * Math.cos(a1)];
      const large = a1 - a0 > Math.PI ? 1 : 0;
      svg.appendChild(el("svg:path", { class: "host-band", d: `M${p0} A${R},${R} 0 ${large} 1 ${p1}` }));
      const am = (a0 + a1) / 2;
      svg.appendChild(el("svg:text", { class: "host-label", x: mid + (R + 36) * Math.sin(am),
                                       y: mid - (R + 36) * Math.cos(am) + 4 }, `host ${h}`));
    }
  }
  const labelled = nMsg <= 12;
  for (const m of msgs) {
    const [x0, y0] = at(m.src), [x1, y1] = at(m.dst);
    const dx = x1 - x0, dy = y1 - y0, d = Math.hypot(dx, dy), ux = dx / d, uy = dy / d;
    const bend = Math.min(60, 0.22 * d);
    const cx = (x0 + x1) / 2 + uy * bend, cy = (y0 + y1) / 2 - ux * bend;
    const s = shorten(x0, y0, cx, cy, nodeR + 2), e = shorten(x1, y1, cx, cy, nodeR + 4);
    const reduce = m.op === "recv_reduce" || m.op === "get_reduce";
    const text = messageText(m, data.elem_bytes);
    const path = el("svg:path", {
      class: `msg${reduce ? " reduce" : ""}`, d: `M${s[0]},${s[1]} Q${cx},${cy} ${e[0]},${e[1]}`,
      "marker-end": `url(#head-${reduce ? "reduce" : "copy"}-${data.uid})`,
      "data-src": m.src, "data-dst": m.dst, "data-send": regionText(m.send),
      "data-recv": m.recv ? regionText(m.recv) : "", "data-op": m.op, "data-count": m.count });
    path.appendChild(el("svg:title", {}, text));
    svg.appendChild(path);
    if (labelled) {
      const lx = 0.25 * s[0] + 0.5 * cx + 0.25 * e[0], ly = 0.25 * s[1] + 0.5 * cy + 0.25 * e[1];
      const lab = `${reduce ? "+= " : ""}${m.recv ? regionText(m.recv) : "?"} · ${fmtBytes(m.count * data.elem_bytes)}`;
      svg.appendChild(el("svg:text", { class: "msg-label", x: lx, y: ly, "text-anchor": "middle" }, lab));
    }
  }
  for (let r = 0; r < P; r++) {
    const [x, y] = at(r);
    const g = el("svg:g", { class: "node", "data-rank": r });
    g.appendChild(el("svg:circle", { cx: x, cy: y, r: nodeR }));
    g.appendChild(el("svg:text", { x, y }, `${r}`));
    const mine = locals.filter((o) => o.rank === r);
    if (mine.length) {
      const counts = new Map();
      mine.forEach((o) => { const w = o.op === "reduce" ? "+ reduce" : o.op; counts.set(w, (counts.get(w) || 0) + 1); });
      const words = [...counts].map(([w, n]) => (n > 1 ? `${w} ×${n}` : w)).join(", ");
      const t = el("svg:text", { class: "local", x, y: y + nodeR + 12 }, words);
      t.appendChild(el("svg:title", {}, mine.map((o) => localText(o)).join("; ")));
      g.appendChild(t);
    }
    svg.appendChild(g);
  }
  return svg;
}

function shorten(x, y, cx, cy, by) {
  const dx = cx - x, dy = cy - y, d = Math.hypot(dx, dy) || 1;
  return [x + (dx / d) * by, y + (dy / d) * by];
}

function messageText(m, elemBytes) {
  return messageWords(m, elemBytes) + (m.of ? ` (one ${m.of} of rank ${m.by})` : "");
}

function messageWords(m, elemBytes) {
  const size = `${m.count} element${m.count === 1 ? "" : "s"}, ${fmtBytes(m.count * elemBytes)}`;
  if (m.op === "put") return `rank ${m.src} → rank ${m.dst}: rank ${m.src} puts its ${regionText(m.send)} (${size}) into rank ${m.dst}'s ${regionText(m.recv)}`;
  if (m.op === "get" || m.op === "get_reduce")
    return `rank ${m.src} → rank ${m.dst}: rank ${m.dst} ${m.op === "get" ? "gets" : "gets and adds"} rank ${m.src}'s ` +
           `${regionText(m.send)} (${size}) ${m.op === "get" ? "into" : "to"} its ${regionText(m.recv)}`;
  const into = !m.recv ? "no matching receive" :
    m.op === "recv_reduce" ? `rank ${m.dst} adds it to ${regionText(m.with || m.recv)} into ${regionText(m.recv)}`
                           : `rank ${m.dst} stores it in ${regionText(m.recv)}`;
  return `rank ${m.src} → rank ${m.dst}: sends ${regionText(m.send)} (${size}); ${into}`;
}

function localText(o) {
  if (o.op === "reduce") return `rank ${o.rank} reduces ${regionText(o.src)} into ${regionText(o.dst)}`;
  if (o.op === "copy") return `rank ${o.rank} copies ${regionText(o.src)} to ${regionText(o.dst)}`;
  if (o.op === "signal") return `rank ${o.rank} signals rank ${o.peer} (flag ${o.tag}) after its data`;
  if (o.op === "wait") return `rank ${o.rank} waits for rank ${o.peer}'s signal (flag ${o.tag}) before its data`;
  const parts = [o.peer !== null ? `peer ${o.peer}` : "", o.src ? `from ${regionText(o.src)}` : "",
                 o.dst ? `to ${regionText(o.dst)}` : ""].filter(Boolean);
  return `rank ${o.rank}: ${o.op} ${parts.join(", ")}`;
}

// The holdings after position k: one row per rank, one column per block of each buffer shown.
function drawHoldings(c, k) {
  const S = stepCount(c);
  const table = el("table", { class: "holdings" });
  table.appendChild(el("caption", {}, k === 0 ? "What each rank holds before its first step" :
    `What each rank holds after step ${k} (the verifier's symbolic values)`));
  const shown = [1, 2].map((b) => [b, columns(c, b)]).filter(([, bounds]) => bounds.length > 1);
  const head = el("tr");
  head.appendChild(el("th", { scope: "col" }, "rank"));
  for (const [b, bounds] of shown)
    for (let i = 0; i + 1 < bounds.length; i++)
      head.appendChild(el("th", { scope: "col" }, `${BUFFERS[b]}[${bounds[i]}:${bounds[i + 1]}]`));
  table.appendChild(head);
  const multiHost = new Set(c.hosts).size > 1 && new Set(c.hosts).size < c.P;
  for (let r = 0; r < c.P; r++) {
    const tr = el("tr");
    tr.appendChild(el("th", { scope: "row" }, multiHost ? `${r} (host ${c.hosts[r]})` : `${r}`));
    for (const [b, bounds] of shown) {
      const now = cells(holdingAt(c, r, k)[b], bounds);
      const before = k > 0 ? cells(holdingAt(c, r, k - 1)[b], bounds) : now;
      const end = cells(holdingAt(c, r, S)[b], bounds);
      now.forEach((cell, i) => {
        if (!cell) { tr.appendChild(el("td", { class: "none" }, "")); return; }
        const state = cell.src < 0 ? "empty" : sameCell(cell, end[i]) ? "final" : "partial";
        const changed = k > 0 && !sameCell(cell, before[i]) && cell.src >= 0;
        const td = el("td", { class: state + (changed ? " changed" : ""), "data-rank": r, "data-buf": BUFFERS[b],
                              "data-start": cell.start, "data-len": cell.len, "data-src": cell.src,
                              "data-ranks": cell.ranks.join(",") },
                      cellLabel(cell) + (state === "final" ? " ✓" : ""));
        td.title = cell.src < 0 ? "not written yet" :
          `elements ${cell.src}..${cell.src + cell.len - 1} reduced from the inputs of ranks ${cell.ranks.join(", ")}` +
          (changed ? " (changed in this step)" : "");
        tr.appendChild(td);
      });
    }
    table.appendChild(tr);
  }
  return table;
}

// The simulator's view: each step's time as a bar (the longest, which bounds the time, starred)
// and the bytes each link carries in this step.
function drawSim(c, k, data, go) {
  const sim = c.sim, box = el("div", { class: "sim" }), nHosts = new Set(c.hosts).size;
  const S = sim.step_s.length;
  box.appendChild(el("p", { class: "simtext" },
    `Simulated on ${data.topology} (${nHosts === c.P && nHosts > 1 ? "one rank per host" :
                                      `${nHosts} host${nHosts === 1 ? "" : "s"}`}, ` +
    `${data.elem_bytes} B per element): ${fmtTime(sim.time_s)} in all.`));
  const peak = Math.max(...sim.step_s, 1e-30);
  const bars = el("div", { class: "timeline", role: "group", "aria-label": "Time of each step" });
  sim.step_s.forEach((t, i) => {
    const cls = `bar${i === k - 1 ? " current" : ""}${i === sim.bounding_step ? " bounding" : ""}`;
    const b = el("button", { type: "button", class: cls, style: `height:${Math.max(3, (100 * t) / peak)}%`,
                             "aria-label": `step ${i + 1}: ${fmtTime(t)}${i === sim.bounding_step ? ", bounds the time" : ""}` });
    b.title = b.getAttribute("aria-label");
    b.addEventListener("click", () => go(i + 1));
    bars.appendChild(b);
  });
  box.appendChild(bars);
  const j = sim.bounding_step;
  const line = k === 0 || k > S ? "" :
    `Step ${k}: ${fmtTime(sim.step_s[k - 1])}, all ranks done at ${fmtTime(sim.step_end_s[k - 1])}. `;
  const ties = sim.step_s.filter((t) => j >= 0 && t >= sim.step_s[j] * (1 - 1e-3)).length;
  const bound = j < 0 ? "" : ties > 1 ? `★ ${ties} steps tie for the longest (${fmtTime(sim.step_s[j])}), step ${j + 1} first.`
                                      : `★ Step ${j + 1} bounds the time: the longest, ${fmtTime(sim.step_s[j])}.`;
  box.appendChild(el("p", { class: "simtext" }, line + bound));
  const rows = k >= 1 && k <= S ? sim.link_bytes[k - 1] : [];
  const totals = new Map(sim.total_link_bytes);
  const table = el("table", { class: "links" });
  const caption = k < 1 || k > S ? "Bytes each link carries in all steps" : rows.length ? `Bytes each link carries in step ${k}`
    : `No link carries bytes in step ${k} (local work only); in all steps:`;
  table.appendChild(el("caption", {}, caption));
  table.appendChild(rowOf("th", ["link", "this step", "", "all steps"]));
  const list = (rows.length ? rows : sim.total_link_bytes).slice().sort((a, b) => b[1] - a[1]);
  const most = list.length ? list[0][1] : 0;
  for (const [link, bytes] of list.slice(0, 10)) {
    const tr = rowOf("td", [sim.links[link], rows.length ? fmtBytes(bytes) : "–", "", fmtBytes(totals.get(link) || 0)]);
    tr.children[2].appendChild(el("span", { class: "linkbar", style: `width:${Math.round((60 * bytes) / (most || 1))}px` }));
    if (bytes === most && list[list.length - 1][1] < most) {  // the busiest, when not all are
      tr.className = "busiest";
      tr.children[0].textContent += " (busiest)";
    }
    table.appendChild(tr);
  }
  if (list.length > 10) table.appendChild(rowOf("td", [`… ${list.length - 10} more links`, "", "", ""]));
  box.appendChild(el("div", { class: "scroll" }, undefined)).appendChild(table);
  return box;
}

function rowOf(tag, texts) {
  const tr = el("tr");
  texts.forEach((t) => tr.appendChild(el(tag, {}, t)));
  return tr;
}
