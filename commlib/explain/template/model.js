// The explorer's reading of its embedded data (commlib/explain/data.py): which messages and local
// operations a step holds, and what each rank's buffers hold after it. No drawing here.
"use strict";
const BUFFERS = ["input", "output", "scratch"];
const OPS = ["send", "recv", "recv_reduce", "copy", "reduce", "get", "get_reduce", "put", "signal", "wait", "reduce_to_all", "reduce_from_all"];
const ONE_SIDED = ["get", "get_reduce", "put"];  // drawn as arrows from where the bytes are to where they land
// Ops that read every rank's src (no peer named), drawn as arrows too: a get_reduce from every peer
// (every peer's src added), and for reduce_to_all a put to every peer (the result stored there).
const EVERY_RANK = ["reduce_to_all", "reduce_from_all"];

// A case from the page's compact form (commlib/explain/codec.py, encode_case): ops of 9 integers,
// runs flat with contributor sets as bit masks, 0 for a buffer unchanged since the step before.
function decodeCase(c) {
  const region = (b, off, n) => (b < 0 ? null : [BUFFERS[b], off, n]);
  const ranks = (mask) => {
    const out = [];
    for (let r = 0; mask > 0; r++, mask = Math.floor(mask / 2)) if (mask % 2) out.push(r);
    return out;
  };
  const schedules = c.schedules.map((s) => ({
    scratch_count: s.scratch_count,
    steps: s.steps.map((ops) => ops.map((o) => {
      const op = { op: typeof o[0] === "string" ? o[0] : OPS[o[0]], peer: o[1] < 0 ? null : o[1],
                   dst: region(o[2], o[3], o[4]), src: region(o[5], o[6], o[7]) };
      if (op.op === "signal" || op.op === "wait") op.tag = o[8];
      return op;
    })),
  }));
  const holdings = c.holdings.map((per) => {
    const prev = [null, null, null];
    return per.map((row) => row.map((flat, b) => {
      if (flat === null) return (prev[b] = null);
      if (!Array.isArray(flat)) return prev[b];
      const runs = [];
      for (let i = 0; i < flat.length; i += 4) runs.push([flat[i], flat[i + 1], flat[i + 2], ranks(flat[i + 3])]);
      return (prev[b] = runs);
    }));
  });
  return Object.assign({}, c, { schedules, holdings });
}

function regionText(g) {
  return `${g[0]}[${g[1]}:${g[1] + g[2]}]`;
}

// Steps of a case: the longest rank's (ranks may have different numbers of steps).
function stepCount(c) {
  return Math.max(0, ...c.schedules.map((s) => s.steps.length));
}

// Every message of the case, sends paired with receives first in, first out per ordered pair of
// ranks (the verifier's and the executor's matching rule), listed under the sender's step.
function messages(c) {
  const sends = new Map(), recvs = new Map();
  c.schedules.forEach((s, r) => s.steps.forEach((ops, k) => ops.forEach((o) => {
    if (o.op === "send") push(sends, `${r}>${o.peer}`, { k, o });
    else if (o.op === "recv" || o.op === "recv_reduce") push(recvs, `${o.peer}>${r}`, { k, o });
  })));
  const byStep = [];
  for (const [pair, list] of sends) {
    const [src, dst] = pair.split(">").map(Number);
    const got = recvs.get(pair) || [];
    list.forEach((snd, i) => {
      const rcv = got[i];
      const m = { src, dst, step: snd.k, send: snd.o.src, count: snd.o.src[2],
                  op: rcv ? rcv.o.op : "unmatched", recv: rcv ? rcv.o.dst : null,
                  with: rcv && rcv.o.op === "recv_reduce" ? rcv.o.src : null, recvStep: rcv ? rcv.k : -1 };
      (byStep[snd.k] = byStep[snd.k] || []).push(m);
    });
  }
  // One-sided ops: a rank reads (get) or writes (put) a peer's buffer by itself, in its own step.
  c.schedules.forEach((s, r) => s.steps.forEach((ops, k) => ops.forEach((o) => {
    if (!ONE_SIDED.includes(o.op)) return;
    const get = o.op !== "put";
    (byStep[k] = byStep[k] || []).push({ src: get ? o.peer : r, dst: get ? r : o.peer, step: k, send: o.src,
                                         count: o.src[2], op: o.op, recv: o.dst, with: o.op === "get_reduce" ? o.dst : null,
                                         by: r, recvStep: k });
  })));
  c.schedules.forEach((s, r) => s.steps.forEach((ops, k) => ops.forEach((o) => {
    if (!EVERY_RANK.includes(o.op)) return;
    for (let q = 0; q < c.schedules.length; q++) {
      if (q === r) continue;
      const l = (byStep[k] = byStep[k] || []);
      l.push({ src: q, dst: r, step: k, send: o.src, count: o.src[2], op: "get_reduce", recv: o.dst, with: o.dst,
               by: r, recvStep: k, of: o.op });
      if (o.op === "reduce_to_all")
        l.push({ src: r, dst: q, step: k, send: o.dst, count: o.dst[2], op: "put", recv: o.dst, with: null,
                 by: r, recvStep: k, of: o.op });
    }
  })));
  byStep.forEach((l) => l.sort((a, b) => a.src - b.src || a.dst - b.dst));
  return byStep;
}

function push(map, key, v) {
  if (!map.has(key)) map.set(key, []);
  map.get(key).push(v);
}

// Copies and reductions inside a rank at step k, and ops of kinds this page does not draw (listed
// in words only).
function localOps(c, k) {
  const out = [];
  c.schedules.forEach((s, r) => (s.steps[k] || []).forEach((o) => {
    if (!["send", "recv", "recv_reduce", ...ONE_SIDED, ...EVERY_RANK].includes(o.op))
      out.push({ rank: r, op: o.op, peer: o.peer, dst: o.dst, src: o.src, tag: o.tag });
  }));
  return out;
}

// What rank r holds at position k (0: before its first step; k: after its step k - 1).
function holdingAt(c, r, k) {
  const h = c.holdings[r];
  return h[Math.min(k, h.length - 1)];
}

// Column boundaries of buffer b: every run boundary of any rank at any position, so one column
// is one block that moves or combines as a unit.
function columns(c, b) {
  const cuts = new Set([0]);
  let size = -1;
  c.holdings.forEach((per) => per.forEach((bufs) => {
    const runs = bufs[b];
    if (!runs) return;
    runs.forEach((x) => { cuts.add(x[0]); cuts.add(x[0] + x[1]); size = Math.max(size, x[0] + x[1]); });
  }));
  if (size <= 0) return [];
  return [...cuts].filter((x) => x <= size).sort((a, b) => a - b);
}

// The cells of one rank's buffer for the given boundaries: {start, len, src, ranks} or null past
// the buffer's end.
function cells(runs, bounds) {
  const out = [];
  for (let i = 0; i + 1 < bounds.length; i++) {
    const a = bounds[i], len = bounds[i + 1] - a;
    const run = runs && runs.find((x) => x[0] <= a && a < x[0] + x[1]);
    if (!run) { out.push(null); continue; }
    out.push({ start: a, len, src: run[2] >= 0 ? run[2] + (a - run[0]) : run[2], ranks: run[3] });
  }
  return out;
}

// "x0", "x0+x3", "x0+…+x5+x7": the inputs a value is reduced from (ranks in runs of four or
// more are shortened).
function contribLabel(ranks) {
  const parts = [];
  for (let i = 0; i < ranks.length;) {
    let j = i;
    while (j + 1 < ranks.length && ranks[j + 1] === ranks[j] + 1) j++;
    if (j - i >= 3) parts.push(`x${ranks[i]}+…+x${ranks[j]}`);
    else for (let q = i; q <= j; q++) parts.push(`x${ranks[q]}`);
    i = j + 1;
  }
  return parts.join("+");
}

function cellLabel(cell) {
  if (!cell) return "";
  if (cell.src < 0) return "–";
  const where = cell.src !== cell.start ? `[${cell.src}:${cell.src + cell.len}]` : "";
  return contribLabel(cell.ranks) + where;
}

function sameCell(a, b) {
  return !!a && !!b && a.src === b.src && a.ranks.join() === b.ranks.join();
}

function fmtTime(s) {
  if (s >= 1e-3) return `${(s * 1e3).toPrecision(3)} ms`;
  if (s >= 1e-6) return `${(s * 1e6).toPrecision(3)} µs`;
  if (s > 0) return `${(s * 1e9).toPrecision(3)} ns`;
  return "0 s";
}

function fmtBytes(b) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return `${Number.isInteger(b) ? b : b.toPrecision(3)} ${units[i]}`;
}
