// The appliance dashboard: reads the daemon's JSON APIs every few seconds and draws them with uPlot.
// Plain browser JavaScript, no build step, no network beyond the daemon that served this page.
//
// The page reports its state on <body> for tests and probes: data-state is "loading", then
// "rendered" once a refresh drew everything, or "error" (with the message on the page);
// data-charts is the number of uPlot charts drawn and data-points the non-null values they plot;
// data-degraded is "true" while the daemon reports problems with its state dir (the banner shows them);
// data-memory is "on" while load on demand, idle unload, a budget or pressure is (GET /v2/memory), else "off".
"use strict";

(() => {
  const REFRESH_MS = 5000;
  const RANGES = {
    hour: { seconds: 3600, step: 5, label: "last hour" },
    day: { seconds: 86400, step: 300, label: "last day" },
  };
  const PALETTE = {
    blue: "#2563eb", green: "#16a34a", orange: "#ea580c", violet: "#7c3aed",
    teal: "#0d9488", red: "#dc2626", pink: "#db2777", slate: "#475569", amber: "#d97706",
  };
  // Probe sections whose presence means the box has a GPU worth plotting.
  const GPU_SECTIONS = /nvidia|cuda|gpu|jetson|tegra|rocm|amd_gpu/i;

  const fmt = {
    number(v, digits = 2) {
      if (v == null || Number.isNaN(v)) return "—";
      const abs = Math.abs(v);
      if (abs >= 1000) return v.toLocaleString(undefined, { maximumFractionDigits: 0 });
      if (abs >= 100) return v.toFixed(Math.min(digits, 1));
      return v.toFixed(digits);
    },
    bytes(n) {
      if (n == null || Number.isNaN(n)) return "—";
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let i = 0;
      while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
      return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
    },
    compact(v) {  // axis labels: short enough for a narrow gutter
      const abs = Math.abs(v);
      if (abs >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
      if (abs >= 1e3) return `${+(v / 1e3).toFixed(1)}k`;
      return abs > 0 && abs < 10 ? String(+v.toPrecision(2)) : String(Math.round(v));
    },
    ms: (v) => (v == null ? "—" : `${fmt.number(v)} ms`),
    rate: (v) => (v == null ? "—" : `${fmt.number(v)}/s`),
    percent: (v) => (v == null ? "—" : `${fmt.number(v, 1)} %`),
    count: (v) => (v == null ? "—" : fmt.number(v, Number.isInteger(v) ? 0 : 2)),
    time: (unix) => new Date(unix * 1000).toLocaleTimeString(),
  };

  // What the charts grid draws, in order. "source" names the history block the series come from.
  const CHARTS = [
    { id: "throughput", title: "Throughput", unit: "requests per second", source: "series",
      series: [{ key: "throughput", label: "req/s", color: PALETTE.blue }], value: fmt.rate },
    { id: "latency", title: "Latency", unit: "milliseconds, end to end", source: "series",
      series: [{ key: "p50_ms", label: "p50", color: PALETTE.green },
               { key: "p99_ms", label: "p99", color: PALETTE.orange }], value: fmt.ms },
    { id: "queue", title: "Queue time", unit: "milliseconds waiting for a batch slot", source: "series",
      series: [{ key: "queue_ms", label: "queue", color: PALETTE.violet }], value: fmt.ms },
    { id: "batch", title: "Batch size", unit: "inferences per execution", source: "series",
      series: [{ key: "batch_size", label: "batch", color: PALETTE.teal }], value: fmt.count },
    { id: "outcomes", title: "Requests", unit: "per interval", source: "series",
      series: [{ key: "success", label: "ok", color: PALETTE.slate },
               { key: "failure", label: "failed", color: PALETTE.red }], value: fmt.count },
    { id: "system", title: "CPU & memory", unit: "percent of the box", source: "system", percent: true,
      series: [{ key: "cpu_percent", label: "CPU", color: PALETTE.blue },
               { key: "memory_percent", label: "memory", color: PALETTE.pink }], value: fmt.percent },
    { id: "rss", title: "Daemon memory", unit: "resident set size", source: "system", bytes: true,
      series: [{ key: "rss_bytes", label: "RSS", color: PALETTE.amber }], value: fmt.bytes },
    { id: "gpu", title: "GPU", unit: "percent", source: "system", percent: true, gpu: true,
      series: [{ key: "gpu_util_percent", label: "utilisation", color: PALETTE.green },
               { key: "gpu_memory_percent", label: "memory", color: PALETTE.violet }], value: fmt.percent },
  ];

  const view = { range: "hour", model: "", since: 0, until: 0, charts: new Map(), timer: null, busy: false, again: false };
  const $ = (id) => document.getElementById(id);

  // ---- DOM helpers: every value from the daemon goes in as text, never as HTML.

  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value == null || value === false) continue;
      if (key === "class") el.className = value;
      else if (key === "style") el.style.cssText = value;
      else if (key.startsWith("data-")) el.setAttribute(key, value);
      else if (key in el) el[key] = value;
      else el.setAttribute(key, value);
    }
    for (const child of children.flat(Infinity)) {
      if (child == null || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  // A long text (an OpenVINO conversion error runs to 20 lines) shows its first line; the whole text
  // opens on demand, so one failed plan never pushes the models table to three screens.
  function longText(text, cls) {
    const full = String(text == null ? "" : text).trim();
    const first = full.split("\n", 1)[0];
    const shortened = first.length > 160 ? `${first.slice(0, 157)}…` : first;
    if (shortened === full) return h("div", { class: cls }, full);
    return h("details", { class: `${cls} long-text` },
      h("summary", { title: "show the whole text" }, shortened),
      h("pre", {}, full));
  }

  function replaceChildren(el, ...children) {
    el.replaceChildren();
    for (const child of children.flat(Infinity)) if (child != null) el.append(child);
  }

  const pill = (text, kind) => h("span", { class: `pill ${kind || ""}` }, text);

  // ---- errors: shown on the page and marked on <body>, never swallowed.

  function showError(message) {
    document.body.dataset.state = "error";
    const banner = $("error");
    banner.textContent = `Dashboard error: ${message}`;
    banner.hidden = false;
    $("live").classList.add("down");
    $("live-text").textContent = "error";
    console.error(`dashboard: ${message}`);
  }

  function clearError() {
    $("error").hidden = true;
    $("live").classList.remove("down");
  }

  window.onerror = (message, source, line, column, error) => {
    showError(error && error.message ? error.message : String(message));
  };
  window.addEventListener("unhandledrejection", (event) => {
    const reason = event.reason;
    showError(reason && reason.message ? reason.message : String(reason));
  });

  class ApiError extends Error {
    constructor(path, status, message) {
      super(`${path.split("?")[0]} answered ${status}: ${message}`);
      this.status = status;
      this.detail = message;
    }
  }

  async function getJSON(path, init = {}) {
    const response = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" }, ...init });
    const text = await response.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
    if (!response.ok) {
      const detail = body && body.error ? body.error : text.slice(0, 200) || response.statusText;
      throw new ApiError(path, response.status, detail);
    }
    if (body == null) throw new ApiError(path, response.status, "the answer is not JSON");
    return body;
  }

  const postJSON = (path, payload) =>
    getJSON(path, { method: "POST", body: JSON.stringify(payload), headers: { "Content-Type": "application/json" } });

  // ---- the state dir: a read-only or damaged one degrades the daemon, and the page says so.

  const SHOWN_PROBLEMS = 5;

  function renderHealth(health) {
    const state = (health && health.state) || {};
    const problems = Array.isArray(state.problems) ? state.problems : [];
    const banner = $("degraded");
    const degraded = state.writable === false || problems.length > 0;
    document.body.dataset.degraded = String(degraded);
    if (!degraded) {
      banner.hidden = true;
      return;
    }
    const title = state.writable === false
      ? `Degraded: the state dir ${state.path} is read-only${state.reason ? ` (${state.reason})` : ""}. ` +
        "Inference is served from what is readable; nothing is saved."
      : `Degraded: the daemon found problems in its state dir ${state.path}.`;
    const items = problems.slice(0, SHOWN_PROBLEMS).map((p) =>
      h("li", { "data-kind": p.kind }, p.message, h("span", { class: "fix" }, ` To fix: ${p.fix}`)));
    if (problems.length > SHOWN_PROBLEMS) {
      items.push(h("li", null, `…and ${problems.length - SHOWN_PROBLEMS} more (GET /v2/health)`));
    }
    replaceChildren(banner, h("strong", null, title), h("ul", null, items));
    banner.hidden = false;
  }

  // ---- the box: server metadata and the hardware probe.

  // The header names the box (its fleet name and host), not the protocol's server name: every
  // appliance answers "triton" there, for Triton's clients.
  function renderServer(meta, health) {
    const box = (health && health.box) || {};
    $("box-name").textContent = box.name || "appliance";
    $("box-name").title = box.host ? `host ${box.host}` : "";
    $("server-version").textContent = `appliance ${meta.version || ""} · ${box.host || ""} · KServe v2 (Triton protocol)`;
  }

  function renderProbe(probe) {
    $("box-summary").textContent = probe.summary || "";
    $("box-summary").title = probe.summary || "";
    $("box-fingerprint").textContent = probe.fingerprint || "—";
    document.title = `${$("box-name").textContent} · ${probe.fingerprint || ""}`;
    const accelerators = probe.accelerators || [];
    replaceChildren($("box-accelerators"), accelerators.map((a) => pill(a, "accent")));
    const sections = Object.entries(probe.sections || {});
    replaceChildren($("box-sections"), sections.map(([name, section]) => renderSection(name, section)));
  }

  function renderProbeError(error) {
    $("box-summary").textContent = "hardware probe not available yet";
    replaceChildren($("box-sections"), h("p", { class: "muted" }, error.detail || error.message));
  }

  function renderSection(name, section) {
    const status = section.status || "unknown";
    const facts = Object.entries(section).filter(([key]) => key !== "status");
    return h("div", { class: `section ${status}` },
      h("div", { class: "section-head" }, h("h3", {}, sectionTitle(name)), pill(status, statusKind(status))),
      h("dl", {}, facts.map(([key, value]) => [h("dt", {}, key.replace(/_/g, " ")), h("dd", {}, describe(key, value))])));
  }

  const SECTION_TITLES = { cpu: "CPU", gpu: "GPU", nvidia: "NVIDIA", cuda: "CUDA", openvino: "OpenVINO",
                           onnxruntime: "ONNX Runtime", tensorrt: "TensorRT", torch: "PyTorch", npu: "NPU" };

  function sectionTitle(name) {
    const words = name.replace(/_/g, " ");
    return SECTION_TITLES[name] || words.charAt(0).toUpperCase() + words.slice(1);
  }

  function describe(key, value) {
    if (value == null) return "—";
    if (typeof value === "number" && /bytes$/.test(key)) return fmt.bytes(value);
    if (Array.isArray(value)) {
      if (value.length <= 6) return value.map(String).join(", ") || "none";
      return h("span", { title: value.join(" ") }, `${value.length} (${value.slice(0, 5).join(", ")}, …)`);
    }
    if (typeof value === "object") {
      return Object.entries(value).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(" · ");
    }
    return String(value);
  }

  function statusKind(status) {
    const s = String(status).toLowerCase();
    if (s === "present" || s === "ready" || s === "ok" || s === "hit") return "good";
    if (s === "absent" || s === "skipped" || s === "off" || s === "miss" || s === "loading") return "neutral";
    if (s === "rejected") return "warn";
    return "bad";
  }

  // ---- models: the repository index plus, for each ready version, its backend selection.

  async function loadSelections(rows) {
    const ready = rows.filter((row) => row.state === "READY" && row.version != null);
    const answers = await Promise.all(ready.map(async (row) => {
      const path = `/v2/models/${encodeURIComponent(row.name)}/versions/${encodeURIComponent(row.version)}/selection`;
      try {
        return [row, { selection: await getJSON(path) }];
      } catch (error) {
        // A model can go unready between the index and this call: show why, keep the page up.
        if (error instanceof ApiError) return [row, { error: error.detail }];
        throw error;
      }
    }));
    return new Map(answers.map(([row, answer]) => [`${row.name}/${row.version}`, answer]));
  }

  // ---- the response cache: Triton's cache_hit / cache_miss counts per version, over each version's life.

  function cacheSummary(statistics) {
    const perVersion = new Map();
    let hits = 0;
    let misses = 0;
    for (const entry of (statistics && statistics.model_stats) || []) {
      const counts = entry.inference_stats || {};
      const hit = (counts.cache_hit || {}).count || 0;
      const miss = (counts.cache_miss || {}).count || 0;
      if (hit + miss === 0) continue;
      perVersion.set(`${entry.name}/${entry.version}`, { hits: hit, misses: miss });
      hits += hit;
      misses += miss;
    }
    return { perVersion, hits, misses };
  }

  const hitRate = (c) => (c.hits + c.misses ? (100 * c.hits) / (c.hits + c.misses) : null);

  function renderModels(rows, selections, cache) {
    const ready = rows.filter((row) => row.state === "READY").length;
    $("models-count").textContent = `${ready} of ${rows.length} ready`;
    const tbody = $("models").tBodies[0];
    if (!rows.length) {
      replaceChildren(tbody, h("tr", {}, h("td", { colSpan: 6, class: "muted" }, "No models in the repository.")));
      return;
    }
    replaceChildren(tbody, rows.map((row) => {
      const answer = selections.get(`${row.name}/${row.version}`) || {};
      return h("tr", { "data-model": row.name },
        h("td", { class: "model-name" }, row.name, row.origin === "pushed" ? [" ", pill("pushed", "accent")] : null),
        h("td", { class: "mono" }, row.version != null ? row.version : "—"),
        // A loaded model's reason, or an unload the appliance chose, is news, not a failure.
        h("td", {}, pill(row.state, statusKind(row.state)),
          row.reason ? longText(row.reason, row.state === "READY" || row.unload_cause ? "reason quiet" : "reason") : null),
        h("td", {}, renderResidence(row)),
        h("td", {}, renderChosen(row, answer, cache.perVersion.get(`${row.name}/${row.version}`))),
        h("td", {}, renderCandidates(answer)));
    }));
  }

  // ---- memory: what a loaded model holds and why it is loaded or not (the index row's own fields, set
  // while load on demand, idle unload, a budget or pressure is on: docs/memory.md).

  const LOAD_CAUSES = { start: "loaded at start", demand: "loaded on demand", explicit: "loaded explicitly" };
  const UNLOAD_CAUSES = { idle: "unloaded: idle", budget: "unloaded: budget", pressure: "unloaded: pressure" };

  function renderResidence(row) {
    const causes = [
      row.load_cause ? pill(LOAD_CAUSES[row.load_cause] || `loaded: ${row.load_cause}`, "neutral") : null,
      row.unload_cause ? pill(UNLOAD_CAUSES[row.unload_cause] || `unloaded: ${row.unload_cause}`, "warn") : null,
      row.pinned ? pill("pinned", "accent") : null,
    ].filter(Boolean);
    if (row.memory_bytes == null && !causes.length) return h("span", { class: "muted" }, "—");
    return h("div", { class: "residence" },
      row.memory_bytes != null
        ? h("span", { class: "mono memory", title: "its model processes' RSS and the daemon's growth at its load" },
          fmt.bytes(row.memory_bytes))
        : null,
      causes.length ? h("div", { class: "meta" }, causes) : null);
  }

  function renderFleet(fleet) {
    const tbody = $("fleet-boxes").tBodies[0];
    if (!fleet.mdns) {
      $("fleet-count").textContent = "";
      replaceChildren(tbody, h("tr", {}, h("td", { colSpan: 5, class: "muted" }, fleet.reason || "mDNS is off.")));
      return;
    }
    $("fleet-count").textContent = `${fleet.boxes.length} box${fleet.boxes.length === 1 ? "" : "es"} on the LAN`;
    if (!fleet.boxes.length) {
      replaceChildren(tbody, h("tr", {}, h("td", { colSpan: 5, class: "muted" }, "No box answers on the LAN yet.")));
      return;
    }
    replaceChildren(tbody, fleet.boxes.map((box) => h("tr", { "data-box": box.name },
      h("td", { class: "model-name" }, h("a", { href: box.dashboard }, box.name),
        box.self ? [" ", pill("this box", "good")] : null),
      h("td", { class: "mono" }, `${box.addresses.join(", ")}:${box.port}`),
      h("td", {}, box.hw || "—"),
      h("td", { class: "mono" }, String(box.models)),
      h("td", { class: "mono" }, box.version || "—"))));
  }

  function renderChosen(row, answer, cached) {
    if (row.state !== "READY") return h("span", { class: "muted" }, "not serving");
    if (answer.error) return longText(answer.error, "reason");
    const selection = answer.selection || {};
    const responses = cached
      ? pill(`responses ${fmt.percent(hitRate(cached))} from cache`, "accent")
      : null;
    if (!selection.chosen) {
      return h("div", {},
        selection.reason ? longText(selection.reason, "muted") : h("span", { class: "muted" }, "the config's backend"),
        responses ? h("div", { class: "meta" }, responses) : null);
    }
    return h("div", {},
      h("span", { class: "plan chosen" }, selection.chosen),
      h("div", { class: "meta" },
        selection.objective ? pill(`for ${selection.objective}`, "neutral") : null,
        // The plan cache (the measured choice), not the response cache: the pill says which.
        selection.cache ? pill(`plan cache ${selection.cache}`, statusKind(selection.cache)) : null,
        responses));
  }

  function renderCandidates(answer) {
    const selection = answer.selection;
    const candidates = (selection && selection.candidates) || [];
    if (!candidates.length) return h("span", { class: "muted" }, "—");
    const measured = candidates.filter((c) => c.status === "ok" && c.latency_ms != null);
    const slowest = Math.max(...measured.map((c) => c.latency_ms), 0);
    return h("table", { class: "candidates" }, h("tbody", {}, candidates.map((c) => {
      const isChosen = c.plan === selection.chosen;
      const width = slowest > 0 && c.latency_ms != null ? Math.max(2, (100 * c.latency_ms) / slowest) : 0;
      const head = [h("td", { class: "plan" }, isChosen ? "★ " : "", c.plan), h("td", {}, pill(c.status, statusKind(c.status)))];
      if (c.status !== "ok") {
        return h("tr", {}, head, h("td", { colSpan: 3, class: "why" }, longText(c.reason || "", "why-text")));
      }
      return h("tr", { class: isChosen ? "is-chosen" : "" }, head,
        h("td", { class: "bar-cell" },
          h("div", { class: "bar", title: `${fmt.ms(c.latency_ms)} per request` },
            h("span", { style: `width:${width}%` }), h("em", {}, fmt.ms(c.latency_ms)))),
        h("td", { class: "num" }, fmt.rate(c.throughput)),
        h("td", { class: "num muted", title: "largest absolute difference from the reference outputs" },
          describeError(c.max_abs_error)));
    })));
  }

  function describeError(error) {
    if (error == null) return "";
    return error === 0 ? "exact" : `±${error.toExponential(1)}`;
  }

  function renderModelFilter(rows) {
    const select = $("model-filter");
    const names = [...new Set(rows.map((row) => row.name))].sort();
    const current = [...select.options].slice(1).map((o) => o.value);
    if (names.join("\n") === current.join("\n")) return;
    replaceChildren(select, h("option", { value: "" }, "all models"), names.map((n) => h("option", { value: n }, n)));
    select.value = names.includes(view.model) ? view.model : "";
    if (view.model !== select.value) {
      view.model = select.value;
      writeHash();
    }
  }

  // ---- tiles: the few numbers a person looks for first.

  const last = (values) => {
    for (let i = (values || []).length - 1; i >= 0; i--) if (values[i] != null) return values[i];
    return null;
  };
  const sum = (values) => (values || []).reduce((total, v) => total + (v || 0), 0);

  function memoryTile(memory, tile) {
    if (!memory || !memory.active) return null;
    if (memory.budget_bytes == null) {
      return tile("Model memory", fmt.bytes(memory.used_bytes), "held by the loaded models · no budget");
    }
    const share = memory.budget_bytes > 0 ? memory.used_bytes / memory.budget_bytes : 0;
    return tile("Model memory", `${fmt.bytes(memory.used_bytes)} / ${fmt.bytes(memory.budget_bytes)}`,
      `of the budget (${fmt.percent(100 * share)}) · model_memory_budget_mib`, share > 0.9 ? "warn" : "");
  }

  function renderTiles(history, rows, cache, memory) {
    const s = history.series || {};
    const sys = history.system || {};
    const failures = sum(s.failure);
    const ready = rows.filter((row) => row.state === "READY").length;
    const tile = (label, value, note, kind) =>
      h("div", { class: `tile ${kind || ""}` }, h("div", { class: "tile-label" }, label),
        h("div", { class: "tile-value" }, value), h("div", { class: "tile-note" }, note));
    replaceChildren($("tiles"),
      tile("Throughput", fmt.rate(last(s.throughput)), "latest interval"),
      tile("p50 latency", fmt.ms(last(s.p50_ms)), "latest interval"),
      tile("p99 latency", fmt.ms(last(s.p99_ms)), "latest interval"),
      tile("Requests", fmt.count(sum(s.requests)),
        `${RANGES[view.range].label} · ${failures ? `${fmt.count(failures)} failed` : "none failed"}`,
        failures ? "bad" : ""),
      tile("CPU", fmt.percent(last(sys.cpu_percent)), `memory ${fmt.percent(last(sys.memory_percent))}`),
      tile("Models", `${ready} / ${rows.length}`, "ready", ready < rows.length ? "warn" : ""),
      cache.hits + cache.misses
        ? tile("Response cache", fmt.percent(hitRate(cache)),
          `hit rate · ${fmt.count(cache.hits)} hits, ${fmt.count(cache.misses)} misses`)
        : null,
      memoryTile(memory, tile));
  }

  // ---- charts: one uPlot per entry of CHARTS, created once and fed new data on each refresh.

  function chartColumns(def, history) {
    const block = history[def.source] || {};
    const t = block.t || [];
    return [t, ...def.series.map((s) => {
      const values = block[s.key] || [];
      return t.map((_, i) => (values[i] == null ? null : values[i]));
    })];
  }

  // The time of the first sample in the history (null: none): a daemon started ten minutes ago has an
  // hour's window with fifty empty minutes, and its charts begin at its history instead.
  function firstSample(history) {
    let first = null;
    for (const def of CHARTS) {
      const [t, ...series] = chartColumns(def, history);
      const i = t.findIndex((_, k) => series.some((ys) => ys[k] != null));
      if (i !== -1 && (first === null || t[i] < first)) first = t[i];
    }
    return first;
  }

  const countPoints = (columns) => columns.slice(1).reduce((n, ys) => n + ys.filter((v) => v != null).length, 0);

  function wantsChart(def, history, probe) {
    if (!def.gpu) return true;
    if (chartColumns(def, history).slice(1).some((ys) => ys.some((v) => v != null))) return true;
    const sections = (probe && probe.sections) || {};
    return Object.entries(sections).some(([name, s]) => GPU_SECTIONS.test(name) && s.status === "present");
  }

  // A lone value between gaps draws no line; draw it as a dot when uPlot would hide points.
  function isolatedPoints(u, seriesIdx, show) {
    if (show) return null;
    const ys = u.data[seriesIdx];
    const idxs = [];
    for (let i = 0; i < ys.length; i++) {
      if (ys[i] != null && (i === 0 || ys[i - 1] == null) && (i === ys.length - 1 || ys[i + 1] == null)) idxs.push(i);
    }
    return idxs.length ? idxs : null;
  }

  function yRange(def) {
    if (def.percent) return (u, min, max) => [0, max > 100 ? Math.ceil(max / 10) * 10 : 100];
    return (u, min, max) => [0, max == null || !(max > 0) ? 1 : max * 1.15];
  }

  function axisValues(def) {
    if (def.bytes) return (u, splits) => splits.map((v) => fmt.bytes(v));
    if (def.percent) return (u, splits) => splits.map((v) => `${v}%`);
    return (u, splits) => splits.map((v) => fmt.compact(v));
  }

  function createChart(def, columns) {
    const plotArea = h("div", { class: "plot" });
    const card = h("figure", { class: "chart", "data-chart": def.id },
      h("figcaption", {}, h("span", { class: "chart-title" }, def.title), h("span", { class: "muted" }, def.unit)),
      plotArea, h("div", { class: "empty-note" }, "no traffic in this window"));
    $("charts").append(card);
    const axis = { stroke: "#64748b", grid: { stroke: "#eef1f5", width: 1 }, ticks: { stroke: "#e2e8f0", width: 1 },
                   font: "11px system-ui, sans-serif" };
    const options = {
      width: Math.max(240, plotArea.clientWidth),
      height: 190,
      cursor: { drag: { x: false, y: false }, points: { size: 7 } },
      legend: { live: true },
      scales: { x: { time: true, range: () => [view.since, view.until] }, y: { range: yRange(def) } },
      axes: [{ ...axis }, { ...axis, size: def.bytes ? 64 : 48, values: axisValues(def) }],
      series: [
        // Away from the cursor the legend shows each series' latest value rather than dashes.
        { value: (u, v, sidx, idx) => (idx == null ? "latest" : fmt.time(v)) },
        ...def.series.map((s) => ({
          label: s.label, stroke: s.color, width: 2, fill: `${s.color}14`,
          points: { size: 5, fill: s.color, filter: isolatedPoints },
          value: (u, v, sidx, idx) => def.value(idx == null ? last(u.data[sidx]) : v),
        })),
      ],
    };
    const plot = new uPlot(options, columns, plotArea);
    new ResizeObserver(() => {
      const width = Math.max(240, plotArea.clientWidth);
      if (width !== plot.width) plot.setSize({ width, height: 190 });
    }).observe(plotArea);
    return { plot, card };
  }

  function renderCharts(history, probe) {
    let drawn = 0;
    let points = 0;
    for (const def of CHARTS) {
      const existing = view.charts.get(def.id);
      if (!wantsChart(def, history, probe)) {
        if (existing) existing.card.hidden = true;
        continue;
      }
      const columns = chartColumns(def, history);
      const chart = existing || createChart(def, columns);
      view.charts.set(def.id, chart);
      if (existing) chart.plot.setData(columns);
      chart.card.hidden = false;
      const n = countPoints(columns);
      chart.card.classList.toggle("empty", n === 0);
      drawn += 1;
      points += n;
    }
    return { drawn, points };
  }

  // ---- the refresh loop.

  function historyPath() {
    const range = RANGES[view.range];
    const now = Math.floor(Date.now() / 1000);
    const query = new URLSearchParams({ since: String(now - range.seconds), until: String(now), step: String(range.step) });
    if (view.model) query.set("model", view.model);
    return `/v2/history?${query}`;
  }

  async function refresh() {
    const [meta, health, probe, rows, fleet, statistics, memory] = await Promise.all([
      getJSON("/v2"),
      getJSON("/v2/health"),
      getJSON("/v2/probe").catch((error) => {
        if (error instanceof ApiError) return error;  // still probing: the rest of the page is useful
        throw error;
      }),
      postJSON("/v2/repository/index", {}),
      getJSON("/v2/fleet"),
      getJSON("/v2/models/stats").catch((error) => {
        if (error instanceof ApiError) return null;  // statistics refused (a token needed): no hit rate shown
        throw error;
      }),
      getJSON("/v2/memory").catch((error) => {
        if (error instanceof ApiError) return null;  // refused (a token needed): no memory tile
        throw error;
      }),
    ]);
    const cache = cacheSummary(statistics);
    renderFleet(fleet);
    renderServer(meta, health);
    renderHealth(health);
    if (probe instanceof ApiError) renderProbeError(probe); else renderProbe(probe);
    renderModelFilter(rows);  // before asking for history, so that it never names a model that has gone
    const pending = getJSON(historyPath());
    pending.catch(() => {});  // awaited below: an early failure is not an unhandled rejection
    renderModels(rows, await loadSelections(rows), cache);
    const history = await pending;
    renderTiles(history, rows, cache, memory);
    const now = Math.floor(Date.now() / 1000);
    view.since = history.since != null ? history.since : now - RANGES[view.range].seconds;
    view.until = history.until != null ? history.until : now;
    const first = firstSample(history);
    if (first !== null) view.since = Math.max(view.since, Math.min(first - RANGES[view.range].step, view.until - 60));
    const { drawn, points } = renderCharts(history, probe instanceof ApiError ? null : probe);

    clearError();
    $("live-text").textContent = `updated ${fmt.time(now)}`;
    document.body.dataset.charts = String(drawn);
    document.body.dataset.points = String(points);
    document.body.dataset.memory = memory && memory.active ? "on" : "off";
    document.body.dataset.windowSeconds = String(view.until - view.since);
    document.body.dataset.state = "rendered";
  }

  async function tick() {
    clearTimeout(view.timer);
    if (view.busy) {  // a control changed mid-refresh: run again as soon as this one ends
      view.again = true;
      return;
    }
    view.busy = true;
    try {
      await refresh();
    } catch (error) {
      showError(error && error.message ? error.message : String(error));
    } finally {
      view.busy = false;
    }
    if (view.again) {
      view.again = false;
      tick();
      return;
    }
    view.timer = setTimeout(tick, REFRESH_MS);
  }

  // The view lives in the URL (#range=day&model=mlp) so that a link or a reload shows the same thing.
  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    view.range = RANGES[params.get("range")] ? params.get("range") : "hour";
    view.model = params.get("model") || "";
  }

  function writeHash() {
    const params = new URLSearchParams();
    if (view.range !== "hour") params.set("range", view.range);
    if (view.model) params.set("model", view.model);
    history.replaceState(null, "", params.toString() ? `#${params}` : location.pathname);
  }

  function showRange() {
    for (const button of $("range").querySelectorAll("button")) {
      button.setAttribute("aria-checked", String(button.dataset.range === view.range));
    }
  }

  function wireControls() {
    for (const button of $("range").querySelectorAll("button")) {
      button.addEventListener("click", () => {
        view.range = button.dataset.range;
        showRange();
        writeHash();
        tick();
      });
    }
    $("model-filter").addEventListener("change", (event) => {
      view.model = event.target.value;
      writeHash();
      tick();
    });
  }

  if (typeof uPlot !== "function") {
    showError("the chart library did not load (/dashboard/static/vendor/uPlot.iife.min.js)");
    return;
  }
  readHash();
  showRange();
  wireControls();
  tick();
})();
