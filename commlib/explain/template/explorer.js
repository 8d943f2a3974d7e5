// The explorer's controls (draw.js draws, model.js reads the data): the algorithm of each panel,
// P, the count, the step (buttons, slider, keys, play), compare side by side; the state lives in
// the address's #fragment so a link can open a given algorithm, size and step.
"use strict";
const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
DATA.uid = "x";
const names = DATA.algorithms.map((a) => a.name);
const state = {
  algs: [DATA.start.algorithm, names.find((n) => n !== DATA.start.algorithm) || DATA.start.algorithm],
  P: DATA.start.P, count: DATA.start.count, step: 0, compare: false, timer: null,
};
const $ = (id) => document.getElementById(id);

const decoded = new Map();  // cases decoded as they are first shown

function caseOf(alg) {
  const key = `${alg}/${state.P}/${state.count}`;
  if (!decoded.has(key)) decoded.set(key, DATA.cases[key] ? decodeCase(DATA.cases[key]) : null);
  return decoded.get(key);
}

function maxStep() {
  const shown = state.compare ? state.algs : state.algs.slice(0, 1);
  return Math.max(0, ...shown.map((a) => (caseOf(a) ? stepCount(caseOf(a)) : 0)));
}

function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  if (names.includes(h.get("alg"))) {
    state.algs[0] = h.get("alg");
    state.compare = names.includes(h.get("vs"));  // a link names both panels or one
  }
  if (names.includes(h.get("vs"))) state.algs[1] = h.get("vs");
  const P = Number(h.get("P")), n = Number(h.get("count")), k = Number(h.get("step"));
  if (DATA.sizes.includes(P)) state.P = P;
  if (DATA.counts.includes(n)) state.count = n;
  if (Number.isInteger(k) && k >= 0) state.step = k;
}

function writeHash() {
  const h = new URLSearchParams({ alg: state.algs[0], P: state.P, count: state.count, step: state.step });
  if (state.compare) h.set("vs", state.algs[1]);
  history.replaceState(null, "", `#${h}`);
}

function options(select, values, current, label) {
  select.replaceChildren(...values.map((v) => {
    const o = document.createElement("option");
    o.value = v;
    o.textContent = label ? label(v) : v;
    o.selected = String(v) === String(current);
    return o;
  }));
}

function renderPanel(i) {
  const alg = state.algs[i], c = caseOf(alg);
  const panel = el("article", { class: "panel", id: `panel-${i}`, "data-alg": alg, "aria-label": `${alg} panel` });
  const head = el("div", { class: "panel-head" });
  const lab = el("label", {}, "Algorithm ");
  const sel = el("select", { class: "alg", "aria-label": `Algorithm of panel ${i + 1}` });
  options(sel, names, alg);
  sel.addEventListener("change", () => {
    state.algs[i] = sel.value;
    render();
    $(`panel-${i}`).querySelector("select.alg").focus();  // the panel was redrawn: keep the keyboard's place
  });
  lab.appendChild(sel);
  head.appendChild(lab);
  panel.appendChild(head);
  const info = DATA.algorithms.find((a) => a.name === alg);
  panel.appendChild(el("p", { class: "summary" }, info.summary || ""));
  if (!c) { panel.appendChild(el("p", {}, "No data for this size and count.")); return panel; }
  const S = stepCount(c), k = Math.min(state.step, S);
  panel.dataset.step = k;
  panel.dataset.steps = S;
  const byStep = messages(c);
  const msgs = k >= 1 ? byStep[k - 1] || [] : [];
  const locals = k >= 1 ? localOps(c, k - 1) : [];
  const h = el("h2", { class: "step-title" }, k === 0 ? `Start (${S} steps)` : `Step ${k} of ${S}` +
                         (state.step > S ? " — finished" : ""));
  panel.appendChild(h);
  const body = el("div", { class: "panel-body" }), left = el("div"), right = el("div");
  body.append(left, right);
  panel.appendChild(body);
  const fig = el("figure");
  fig.appendChild(drawRanks(c, msgs, locals, k, { uid: `${DATA.uid}${i}`, elem_bytes: DATA.elem_bytes }));
  fig.appendChild(el("figcaption", {}, "Blue arrows store what they carry; dashed vermillion arrows (+=) add it " +
                                        "into the receiver's buffer; a one-sided get or put is drawn the same way, from where the bytes are to where " +
                                        "they land. Labels name the receiving region and the bytes."));
  left.appendChild(fig);
  const list = el("ol", { class: "messages", "aria-label": "This step in words" });
  if (k === 0) list.appendChild(el("li", {}, "Every rank holds its own input; nothing has been sent."));
  msgs.forEach((m) => list.appendChild(el("li", { class: "msg-text" }, messageText(m, DATA.elem_bytes))));
  locals.forEach((o) => list.appendChild(el("li", { class: "local-text" }, localText(o))));
  if (k >= 1 && !msgs.length && !locals.length) list.appendChild(el("li", {}, "Nothing starts in this step."));
  left.appendChild(list);
  right.appendChild(el("div", { class: "scroll" })).appendChild(drawHoldings(c, k));
  right.appendChild(drawSim(c, k, DATA, go));
  return panel;
}

function render() {
  const S = maxStep();
  state.step = Math.min(Math.max(0, state.step), S);
  const range = $("step");
  range.max = S;
  range.value = state.step;
  $("step-label").textContent = state.step === 0 ? `Start (of ${S} steps)` : `Step ${state.step} of ${S}`;
  $("size").value = state.P;
  $("count").value = state.count;
  $("compare").checked = state.compare;
  const panels = $("panels");
  const shown = state.compare ? [0, 1] : [0];
  panels.className = state.compare ? "two" : "";
  panels.replaceChildren(...shown.map(renderPanel));
  $("play").textContent = state.timer ? "⏸ Pause" : "▶ Play";
  $("play").setAttribute("aria-label", state.timer ? "Pause" : "Play");
  writeHash();
}

function go(k) {
  state.step = k;
  render();
}

function play() {
  if (state.timer) { clearInterval(state.timer); state.timer = null; render(); return; }
  if (state.step >= maxStep()) state.step = 0;
  state.timer = setInterval(() => {
    if (state.step >= maxStep()) { clearInterval(state.timer); state.timer = null; render(); return; }
    go(state.step + 1);
  }, 1000);
  render();
}

function init() {
  readHash();
  const sizes = DATA.sizes, counts = DATA.counts;
  $("about").textContent = `${DATA.collective}: every registered algorithm's real schedule (commlib's registry), ` +
    `what each rank holds after each step (the verifier) and each step's time on ${DATA.topology} (the simulator).`;
  $("legend").textContent = "xR is rank R's input; x0+x1 is their sum; x0+…+x3 sums ranks 0 to 3; [a:b] names " +
    "the source elements where they differ from the column's. ✓: the value the rank ends with; a red frame: " +
    "changed in this step; –: not written yet. ★: the step that bounds the simulated time.";
  $("range").textContent = `This page carries P = ${sizes.join(", ")} and counts ${counts.join(", ")} ` +
    `(${Object.keys(DATA.cases).length} cases, precomputed by commlib explain; other sizes: run it again).`;
  options($("size"), sizes, state.P);
  options($("count"), counts, state.count);
  $("size").addEventListener("change", (e) => { state.P = Number(e.target.value); render(); });
  $("count").addEventListener("change", (e) => { state.count = Number(e.target.value); render(); });
  $("compare").addEventListener("change", (e) => { state.compare = e.target.checked; render(); });
  $("step").addEventListener("input", (e) => go(Number(e.target.value)));
  $("first").addEventListener("click", () => go(0));
  $("back").addEventListener("click", () => go(state.step - 1));
  $("fwd").addEventListener("click", () => go(state.step + 1));
  $("last").addEventListener("click", () => go(maxStep()));
  $("play").addEventListener("click", play);
  window.addEventListener("hashchange", () => { readHash(); render(); });  // a link to another step
  document.addEventListener("keydown", (e) => {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target.tagName;
    if (t === "SELECT" || (t === "INPUT" && e.target.type !== "checkbox" && e.target.type !== "range")) return;
    if (e.key === "ArrowRight") go(state.step + 1);
    else if (e.key === "ArrowLeft") go(state.step - 1);
    else if (e.key === "Home") go(0);
    else if (e.key === "End") go(maxStep());
    else if (e.key === " " && t !== "BUTTON" && t !== "INPUT") play();  // Space still presses and ticks
    else if (e.key === "c" || e.key === "C") { state.compare = !state.compare; render(); }
    else return;
    e.preventDefault();
  });
  render();
}

init();
