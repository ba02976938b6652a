// Brook's dashboard: vanilla JS, no build step. Fed by the API's event streams, read
// with fetch() so that the bearer token travels in a header (EventSource cannot send one).
"use strict";

const TOKEN_KEY = "brook.token";
const STATUSES = ["waiting", "pending", "running", "completed", "failed", "cancelled"];
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const MAX_FEED = 60;
const MAX_FAILURES = 20;

const $ = (selector) => document.querySelector(selector);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// -- talking to the API ------------------------------------------------------------------

class Unauthorized extends Error {}

function authHeaders(extra = {}) {
  const headers = { ...extra };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  return headers;
}

async function api(path, options = {}) {
  const resp = await fetch(path, { ...options, headers: authHeaders(options.headers) });
  if (resp.status === 401) {
    askToken(Boolean(sessionStorage.getItem(TOKEN_KEY)));
    throw new Unauthorized(path);
  }
  return resp;
}

async function getJson(path) {
  const resp = await api(path);
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

async function post(path, body) {
  const options = { method: "POST" };
  if (body !== undefined) {
    options.body = JSON.stringify(body);
    options.headers = { "Content-Type": "application/json" };
  }
  const resp = await api(path, options);
  const doc = await resp.json().catch(() => ({}));
  return { ok: resp.ok, status: resp.status, doc };
}

// Server-sent events over fetch(): resumes with Last-Event-ID after any cut.
function openStream(path, { onEvent, onOpen, onDown, onEnd }) {
  const control = new AbortController();
  let lastId = null;
  let stopped = false;
  const handle = { stop() { stopped = true; control.abort(); }, finish() { stopped = true; } };
  (async () => {
    while (!stopped) {
      try {
        const headers = authHeaders({ Accept: "text/event-stream" });
        if (lastId) headers["Last-Event-ID"] = lastId;
        const resp = await fetch(path, { headers, signal: control.signal });
        if (resp.status === 401) { askToken(true); return; }
        if (resp.status === 204 || resp.status === 404) { onEnd && onEnd(resp.status); return; }
        if (resp.status === 400) lastId = null;  // an id this API no longer takes: start afresh
        if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
        onOpen && onOpen();
        await readEvents(resp.body, (event) => {
          if (event.id !== null) lastId = event.id;
          if (event.event && !stopped) onEvent(event.event, event.data.join("\n"));
        });
        if (stopped) { onEnd && onEnd(200); return; }
      } catch (err) {
        if (control.signal.aborted) return;
      }
      onDown && onDown();
      await sleep(1000);
    }
  })();
  return handle;
}

async function readEvents(body, dispatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { id: null, event: "", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    for (;;) {
      const match = buffer.match(/\r\n|\r|\n/);
      // A lone "\r" at the end may be the first half of "\r\n": wait for the rest.
      if (!match || (match[0] === "\r" && match.index === buffer.length - 1)) break;
      const line = buffer.slice(0, match.index);
      buffer = buffer.slice(match.index + match[0].length);
      if (line === "") {
        dispatch(event);
        event = { id: null, event: "", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let data = colon < 0 ? "" : line.slice(colon + 1);
      if (data.startsWith(" ")) data = data.slice(1);
      if (field === "data") event.data.push(data);
      else if (field === "event") event.event = data;
      else if (field === "id") event.id = data;
    }
  }
}

// -- the token -----------------------------------------------------------------------------

function askToken(refused) {
  const dialog = $("#token-dialog");
  $("#token-error").hidden = !refused;
  if (refused) sessionStorage.removeItem(TOKEN_KEY);
  if (!dialog.open) dialog.showModal();
}

$("#token-form").addEventListener("submit", () => {
  sessionStorage.setItem(TOKEN_KEY, $("#token-input").value.trim());
  $("#token-input").value = "";
  route();
});
$("#token-button").addEventListener("click", () => askToken(false));

// -- formatting ------------------------------------------------------------------------------

function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  return new Date(iso).toLocaleString();
}

const pretty = (value) => (value === null || value === undefined ? "—" : JSON.stringify(value, null, 2));
const short = (id) => id.slice(-8);
const jobLink = (job) => el("a", { href: `#/jobs/${job.id}`, title: job.id }, el("code", {}, short(job.id)));

function progressBar(progress, big = false) {
  const bar = el("div", { class: "bar" });
  const label = el("span", { class: "label" });
  const box = el("div", { class: big ? "progress big" : "progress" }, bar, label);
  setProgress(box, progress);
  return box;
}

function setProgress(box, progress) {
  const fraction = progress && typeof progress.fraction === "number" ? progress.fraction : null;
  box.classList.toggle("unknown", fraction === null);
  box.querySelector(".bar").style.width = fraction === null ? "100%" : `${Math.round(fraction * 100)}%`;
  const pct = fraction === null ? "running" : `${Math.round(fraction * 100)}%`;
  box.querySelector(".label").textContent = progress && progress.message ? `${pct} · ${progress.message}` : pct;
  box.dataset.fraction = fraction === null ? "" : String(fraction);
}

// -- charts (inline SVG, drawn by hand) ----------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svgNode(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

function drawBars(svg, stacks, colors) {
  svg.replaceChildren();
  const n = stacks[0].length;
  const totals = stacks[0].map((_, i) => stacks.reduce((sum, s) => sum + s[i], 0));
  const max = Math.max(1e-9, ...totals);
  const w = 600 / n;
  for (let i = 0; i < n; i++) {
    let y = 120;
    stacks.forEach((stack, k) => {
      const h = (stack[i] / max) * 112;
      if (h <= 0) return;
      y -= h;
      svg.append(svgNode("rect", { x: i * w + 1, y, width: Math.max(w - 2, 1), height: h, fill: colors[k] }));
    });
  }
  svg.append(svgNode("text", { x: 4, y: 12, "font-size": 10, fill: "#6b7385" }));
  svg.lastChild.textContent = `max ${max.toFixed(max < 10 ? 1 : 0)}`;
}

function drawLines(svg, series, colors) {
  svg.replaceChildren();
  const values = series.flat().filter((v) => v !== null);
  const max = Math.max(1, ...values);
  const n = series[0].length;
  series.forEach((line, k) => {
    let d = "";
    line.forEach((v, i) => {
      if (v === null) return;
      const x = (i + 0.5) * (600 / n);
      const y = 118 - (v / max) * 108;
      d += `${d ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
    });
    if (d) svg.append(svgNode("path", { d, fill: "none", stroke: colors[k], "stroke-width": 2, "vector-effect": "non-scaling-stroke" }));
    line.forEach((v, i) => {  // a dot per bucket, so that a lone sample shows too
      if (v === null) return;
      svg.append(svgNode("rect", { x: (i + 0.5) * (600 / n) - 2, y: 118 - (v / max) * 108 - 2, width: 4, height: 4, fill: colors[k] }));
    });
  });
  svg.append(svgNode("text", { x: 4, y: 12, "font-size": 10, fill: "#6b7385" }));
  svg.lastChild.textContent = `max ${Math.round(max)} ms`;
}

// -- the overview ----------------------------------------------------------------------------

const overview = {
  running: new Map(),
  failures: new Map(),
  features: { retry: false, queues: false, quotas: false, queuePut: false, schedules: false, scheduleActions: false, triggers: false, triggerActions: false },
  readOnly: false,  // a read-only token: no action is offered (the API would answer 403)
  stream: null,
  statsTimer: null,
  triggersTimer: null,
  statsDue: false,
  statsBusy: false,
};

async function detectFeatures() {
  try {
    const paths = Object.entries((await getJson("/openapi.json")).paths || {});
    const has = (re, method) => paths.some(([path, item]) => re.test(path) && item[method]);
    overview.readOnly = (await getJson("/stats")).access === "read";
    const can = !overview.readOnly;
    overview.features = {
      retry: can && has(/^\/jobs\/\{[^}]+\}\/retry$/, "post"),
      queues: has(/^\/queues$/, "get"),
      quotas: has(/^\/quotas$/, "get"),
      queuePut: can && has(/^\/queues\/\{[^}]+\}$/, "put"),
      schedules: has(/^\/schedules$/, "get"),
      scheduleActions: can && has(/^\/schedules\/\{[^}]+\}\/pause$/, "post"),
      triggers: has(/^\/triggers$/, "get"),
      triggerActions: can && has(/^\/triggers\/\{[^}]+\}\/pause$/, "post"),
    };
  } catch (err) {
    if (err instanceof Unauthorized) throw err;
  }
}

function renderCounts(counts) {
  const names = [...STATUSES, ...Object.keys(counts).filter((s) => !STATUSES.includes(s))];
  for (const status of names) {  // in place: a card is created once, then only its number changes
    let card = document.getElementById(`count-${status}`);
    if (!card) {
      card = el("div", { class: `card ${status}`, id: `count-${status}` },
        el("div", { class: "n" }), el("div", { class: "label" }, status));
      $("#counts").append(card);
    }
    card.querySelector(".n").textContent = counts[status] ?? 0;
  }
}

async function renderQueues(queues) {
  let info = new Map();
  if (overview.features.queues) {
    try {
      info = new Map((await getJson("/queues")).queues.map((q) => [q.name, q]));
    } catch (err) { /* shown without the extra columns */ }
  }
  const names = [...new Set([...Object.keys(queues), ...info.keys()])].sort();
  const extra = overview.features.queues;
  $("#queues thead").replaceChildren(el("tr", {}, el("th", {}, "queue"), STATUSES.map((s) => el("th", {}, s)),
    extra ? [el("th", {}, "concurrency"), el("th", {}, "")] : []));
  $("#queues tbody").replaceChildren(...names.map((name) => {
    const q = info.get(name);
    const cells = STATUSES.map((s) => el("td", {}, (queues[name] || {})[s] || (q && q.counts && q.counts[s]) || 0));
    const more = extra ? [el("td", {}, q && q.concurrency !== null && q.concurrency !== undefined ? q.concurrency : "—"),
      el("td", {}, q && overview.features.queuePut ? queueButton(q) : "")] : [];
    return el("tr", {}, el("td", {}, el("code", {}, name), q && q.paused ? " (paused)" : ""), cells, more);
  }));
}

// Each quota: its limits, what its windows hold, the attempts holding it, the adaptive
// rate, when a 429 closed it until, its debt and the units its ledger counted today.
async function renderQuotas() {
  if (!overview.features.quotas) return;
  const quotas = (await getJson("/quotas")).quotas;
  $("#quotas-panel").hidden = quotas.length === 0;
  const windowOf = (w) => (w ? `${w.limit}/${w.per_seconds}s` : null);
  $("#quotas tbody").replaceChildren(...quotas.map((q) => {
    const limits = [["units", windowOf(q.units)], ["requests", windowOf(q.requests)],
      ["concurrency", q.concurrency ?? null]].filter(([, v]) => v !== null).map(([k, v]) => `${k} ${v}`);
    const used = Object.entries(q.used || {}).map(([k, v]) => `${k} ${Math.round(v)}`).join(", ");
    return el("tr", { "data-quota": q.name }, el("td", {}, el("code", {}, q.name)),
      el("td", {}, limits.join(", ")), el("td", { class: "num" }, used),
      el("td", { class: "num" }, q.running ?? 0), el("td", { class: "num" }, `×${q.effective_rate}`),
      el("td", {}, q.closed_until ? new Date(q.closed_until).toLocaleTimeString() : "—"),
      el("td", { class: "num" }, q.debt ? Math.round(q.debt) : 0),
      el("td", { class: "num" }, q.today ? Math.round(q.today.units) : 0));
  }));
}

function queueButton(queue) {
  return el("button", {
    type: "button",
    onclick: async () => {
      const body = { concurrency: queue.concurrency ?? null, rate: queue.rate ?? null, paused: !queue.paused };
      await api(`/queues/${encodeURIComponent(queue.name)}`, {
        method: "PUT", body: JSON.stringify(body), headers: { "Content-Type": "application/json" },
      });
      refreshStats();
    },
  }, queue.paused ? "Resume" : "Pause");
}

async function renderSchedules() {
  if (!overview.features.schedules) return;
  $("#schedules-panel").hidden = false;
  const { schedules } = await getJson("/schedules");
  if (!schedules.length) {
    $("#schedules tbody").replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "empty" }, "No schedules declared.")));
    return;
  }
  $("#schedules tbody").replaceChildren(...schedules.map((s) => el("tr", {},
    el("td", {}, el("code", {}, s.name), s.paused ? " (paused)" : ""), el("td", {}, el("code", {}, s.cron)),
    el("td", {}, s.task), el("td", {}, s.next_run ? new Date(s.next_run).toLocaleString() : "—"),
    el("td", {}, overview.features.scheduleActions ? el("button", {
      type: "button",
      onclick: async () => { await post(`/schedules/${encodeURIComponent(s.name)}/${s.paused ? "resume" : "pause"}`); renderSchedules(); },
    }, s.paused ? "Resume" : "Pause") : ""))));
}

async function renderTriggers() {
  if (!overview.features.triggers) return;
  $("#triggers-panel").hidden = false;
  const { triggers } = await getJson("/triggers");
  if (!triggers.length) {
    $("#triggers tbody").replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "empty" }, "No triggers declared.")));
    return;
  }
  $("#triggers tbody").replaceChildren(...triggers.map((t) => el("tr", { "data-trigger": t.name },
    el("td", {}, el("code", {}, t.name), t.paused ? " (paused)" : "",
      t.history_lost ? el("span", { class: "warn", title: `history lost at ${t.history_lost_at}` }, ` history lost ×${t.history_lost}`) : ""),
    el("td", {}, el("code", {}, t.collection)), el("td", {}, t.task),
    el("td", { class: "follower" }, t.follower || "—"),
    el("td", { class: "num lag" }, t.lag_s === null ? "—" : `${t.lag_s.toFixed(1)} s`),
    el("td", { class: "num jobs-made" }, String(t.jobs_made)),
    el("td", {
      class: t.skipped ? "num skipped warn" : "num skipped",
      title: t.last_skipped ? `last: document ${t.last_skipped.document_id} (change ${t.last_skipped.change_id}) at ${t.last_skipped.at}: ${t.last_skipped.reason}` : "",
    }, String(t.skipped ?? 0)),
    el("td", {}, overview.features.triggerActions ? el("button", {
      type: "button",
      onclick: async () => { await post(`/triggers/${encodeURIComponent(t.name)}/${t.paused ? "resume" : "pause"}`); renderTriggers(); },
    }, t.paused ? "Resume" : "Pause") : ""))));
}

function renderCharts(series) {
  const perSecond = (values) => values.map((v) => v / series.step_s);
  drawBars($("#chart-throughput"), [perSecond(series.completed), perSecond(series.failed)], ["#2e9e5b", "#d64545"]);
  drawLines($("#chart-wait"), [series.wait_p50_ms, series.wait_p95_ms], ["#2b7bb9", "#d68a1c"]);
  const last = series.completed.length - 1;
  const done = series.completed[last - 1] + series.failed[last - 1];
  $("#throughput-now").textContent = `${(done / series.step_s).toFixed(1)} jobs/s`;
  const p50 = [...series.wait_p50_ms].reverse().find((v) => v !== null);
  $("#wait-now").textContent = p50 === undefined ? "" : `p50 ${p50} ms`;
}

async function refreshStats() {
  // At most one request in flight; events that arrive meanwhile ask for one more after it.
  if (overview.statsBusy) { overview.statsDue = true; return; }
  overview.statsBusy = true;
  try {
    const stats = await getJson("/stats");
    renderCounts(stats.counts);
    renderCharts(stats.series);
    await renderQueues(stats.queues);
    await renderQuotas();
  } catch (err) { /* the next event or tick tries again */ }
  overview.statsBusy = false;
  if (overview.statsDue) {
    overview.statsDue = false;
    setTimeout(refreshStats, 500);
  }
}

function cancelButton(job) {
  if (overview.readOnly) return "";
  return el("button", {
    type: "button", class: "danger", "data-cancel": job.id,
    onclick: async (ev) => { ev.target.disabled = true; await post(`/jobs/${job.id}/cancel`); },
  }, "Cancel");
}

function renderRunning() {
  const jobs = [...overview.running.values()].sort((a, b) => (a.started_at || "").localeCompare(b.started_at || ""));
  $("#running-count").textContent = jobs.length ? `(${jobs.length})` : "";
  $("#running-empty").hidden = jobs.length > 0;
  const body = $("#running tbody");
  const rows = new Map([...body.children].map((tr) => [tr.dataset.id, tr]));
  const wanted = new Set(jobs.map((j) => j.id));
  for (const [id, tr] of rows) if (!wanted.has(id)) tr.remove();
  for (const job of jobs) {
    let tr = rows.get(job.id);
    if (!tr) {
      tr = el("tr", { "data-id": job.id }, el("td", {}, jobLink(job)), el("td", {}, job.task), el("td", { class: "attempt" }),
        el("td", {}, progressBar(job.progress)), el("td", { class: "started" }), el("td", {}, cancelButton(job)));
      body.append(tr);
    }
    tr.querySelector(".attempt").textContent = `${job.attempts}/${job.max_attempts}`;
    tr.querySelector(".started").textContent = ago(job.started_at);
    setProgress(tr.querySelector(".progress"), job.progress);
  }
}

function failureItem(job) {
  const err = job.error || {};
  return el("li", { "data-id": job.id },
    jobLink(job), " ", el("strong", {}, job.task), " ", el("span", { class: "msg" }, `${err.type || "Error"}: ${err.message || ""}`),
    " ", el("span", { class: "muted" }, ago(job.finished_at)), " ",
    overview.features.retry ? el("button", { type: "button", onclick: () => post(`/jobs/${job.id}/retry`) }, "Retry") : "",
    err.traceback ? el("details", {}, el("summary", {}, "traceback"), el("pre", {}, err.traceback)) : "");
}

function renderFailures() {
  const jobs = [...overview.failures.values()].sort((a, b) => (b.finished_at || "").localeCompare(a.finished_at || "")).slice(0, MAX_FAILURES);
  $("#failures-empty").hidden = jobs.length > 0;
  $("#failures").replaceChildren(...jobs.map(failureItem));
}

function addToFeed(job) {
  const feed = $("#feed");
  feed.prepend(el("li", {}, el("time", {}, new Date().toLocaleTimeString()), jobLink(job), " ",
    el("span", { class: `badge ${job.status}` }, job.status), " ", job.task,
    job.progress && job.status === "running" ? ` ${Math.round(job.progress.fraction * 100)}%` : ""));
  while (feed.children.length > MAX_FEED) feed.lastChild.remove();
}

function onJob(job) {
  addToFeed(job);
  if (job.status === "running") overview.running.set(job.id, job); else overview.running.delete(job.id);
  if (job.status === "failed") overview.failures.set(job.id, job); else overview.failures.delete(job.id);
  renderRunning();
  renderFailures();
  refreshStats();
}

async function loadLists() {
  const [running, failed] = await Promise.all([
    getJson("/jobs?status=running&limit=200"),
    getJson(`/jobs?status=failed&limit=${MAX_FAILURES}`),
  ]);
  overview.running = new Map(running.jobs.map((j) => [j.id, j]));
  overview.failures = new Map(failed.jobs.map((j) => [j.id, j]));
  renderRunning();
  renderFailures();
}

function setLive(on) {
  const badge = $("#live");
  badge.className = on ? "live on" : "live off";
  badge.textContent = on ? "live" : "reconnecting…";
}

async function showOverview() {
  $("#overview").hidden = false;
  $("#job").hidden = true;
  await detectFeatures();
  await Promise.all([refreshStats(), loadLists(), renderSchedules().catch(() => {}), renderTriggers().catch(() => {})]);
  if (overview.features.triggers && !overview.triggersTimer) {  // lags move without events
    overview.triggersTimer = setInterval(() => { if (!$("#overview").hidden) renderTriggers().catch(() => {}); }, 5000);
  }
  overview.stream = openStream("/events", {
    onOpen: () => setLive(true),
    onDown: () => setLive(false),
    onEvent: (kind, data) => {
      if (kind === "job") onJob(JSON.parse(data));
      if (kind === "reset") loadLists();
    },
  });
  overview.statsTimer = setInterval(() => { refreshStats(); renderRunning(); }, 5000);
}

// -- one job ---------------------------------------------------------------------------------

const jobView = { stream: null, job: null, id: null, body: {}, bodyKey: null, shown: Promise.resolve() };

// A job's events leave its payload and result out: they are read with the job itself
// (`GET /jobs/{id}`) when they may have changed (a new status or attempt, a debounced
// submit), kept for the events in between, and the event is shown with them.
function onJobEvent(job) {
  jobView.shown = jobView.shown.then(async () => {
    const key = `${job.status}/${job.attempts}/${job.debounced}`;
    if (key !== jobView.bodyKey) {
      const whole = await getJson(`/jobs/${encodeURIComponent(job.id)}`).catch(() => null);
      if (whole) jobView.body = { payload: whole.payload, result: whole.result };
      jobView.bodyKey = key;
    }
    if (jobView.id === job.id) renderJob({ ...job, ...jobView.body });
  });
}

function renderJob(job) {
  jobView.job = job;
  $("#job-task").textContent = job.task;
  $("#job-id").textContent = job.id;
  const badge = $("#job-status");
  badge.textContent = job.status;
  badge.className = `badge ${job.status}`;
  $("#job-cancel").hidden = overview.readOnly || TERMINAL.has(job.status);
  $("#job-retry").hidden = !(overview.features.retry && (job.status === "failed" || job.status === "cancelled"));
  const progress = $("#job-progress");
  progress.hidden = !(job.progress || job.status === "running");
  if (!progress.hidden) {
    if (!progress.firstChild) progress.replaceWith(Object.assign(progressBar(job.progress, true), { id: "job-progress" }));
    setProgress($("#job-progress"), job.progress);
  }
  const fields = ["status", "queue", "priority", "attempts", "max_attempts", "run_at", "start_by", "deadline",
    "created_at", "started_at", "finished_at", "timeout_s", "idempotency_key", "lease_owner", "lease_expires_at",
    "cancel_requested"];
  const rows = fields.filter((f) => f in job).map((f) =>
    el("tr", {}, el("th", {}, f), el("td", {}, job[f] === null ? "—" : String(job[f]))));
  // Rerun from a step: the job this one reruns, and its reruns, as links.
  for (const [name, ids] of [["rerun_of", job.rerun_of ? [job.rerun_of] : []], ["reruns", job.reruns || []]]) {
    if (ids.length) rows.push(el("tr", { class: "links" }, el("th", {}, name), el("td", {}, ids.flatMap((id) => [jobLink({ id }), " "]))));
  }
  $("#job-fields tbody").replaceChildren(...rows);
  $("#job-payload").textContent = pretty(job.payload);
  $("#job-result").textContent = pretty(job.result);
  $("#job-error-panel").hidden = !job.error;
  if (job.error) {
    $("#job-error").textContent = `${job.error.type}: ${job.error.message}`;
    $("#job-traceback").textContent = job.error.traceback || "";
  }
  renderDurable(job);
  $("#job-history tbody").replaceChildren(...(job.history || []).map((h) => {
    const { at, status, attempt, ...rest } = h;
    return el("tr", {}, el("td", {}, at ? new Date(at).toLocaleString() : ""), el("td", {}, el("span", { class: `badge ${status}` }, status)),
      el("td", {}, attempt ?? ""), el("td", {}, Object.keys(rest).length ? JSON.stringify(rest) : ""));
  }));
}

function bytes(n) {
  if (typeof n !== "number") return "";
  if (n < 1024) return `${n} B`;
  return n < 1024 * 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1024 / 1024).toFixed(2)} MiB`;
}

// Durable steps and what a suspended job waits for (a sleep, or a signal on a key).
function renderDurable(job) {
  const waiting = job.waiting_for;
  $("#job-waiting-panel").hidden = !(waiting && job.status === "pending");
  if (waiting && job.status === "pending") {
    const until = waiting.until ? new Date(waiting.until).toLocaleString() : null;
    const due = job.run_at ? new Date(job.run_at).toLocaleString() : "";
    const what = waiting.kind === "quota"
      ? `room in quota “${waiting.name}” (${waiting.reason || "full"}), looked at again by ${due}`
      : waiting.kind === "signal"
        ? `a signal on “${waiting.key}”${until ? `, or its timeout at ${until}` : ""}`
        : `its wake time, ${until}`;
    const step = waiting.kind === "quota" ? "" : ` (step ${waiting.step || ""})`;
    $("#job-waiting").textContent = `Waiting for ${what}, holding no worker${step}.`;
  }
  const steps = job.steps || [];
  $("#job-steps-panel").hidden = steps.length === 0;
  $("#job-steps tbody").replaceChildren(...steps.map((s) => el("tr", {},
    el("td", {}, s.name), el("td", {}, s.at ? new Date(s.at).toLocaleString() : ""),
    el("td", {}, typeof s.duration_ms === "number" ? `${s.duration_ms.toFixed(1)} ms` : ""),
    el("td", {}, bytes(s.size)), el("td", {}, s.carried_from ? "0 (carried)" : (s.attempt ?? "")))));
}

async function showJob(id) {
  $("#overview").hidden = true;
  $("#job").hidden = false;
  $("#job-action-result").textContent = "";
  Object.assign(jobView, { id, body: {}, bodyKey: null });
  await detectFeatures();
  showOutput(id);
  jobView.stream = openStream(`/jobs/${encodeURIComponent(id)}/events`, {
    onOpen: () => setLive(true),
    onDown: () => setLive(false),
    onEnd: (status) => {
      if (status === 404) { $("#job-task").textContent = "No such job"; $("#job-id").textContent = id; }
      $("#live").className = "live done";
      $("#live").textContent = "finished";
    },
    onEvent: (kind, data) => {
      if (kind !== "job") return;
      const job = JSON.parse(data);
      onJobEvent(job);
      if (TERMINAL.has(job.status)) jobView.stream.finish();
    },
  });
}

// The job's output stream (what its task emits): every attempt in turn, each chunk as it
// is written, until `end`. Text is appended as text nodes, never parsed as HTML.
const outputView = { stream: null, pre: null, chunks: 0 };

function outputAttempt(attempt) {
  outputView.pre = el("pre", { class: "output" });
  $("#job-output").append(el("div", { class: "output-attempt", "data-attempt": attempt },
    el("h3", {}, `attempt ${attempt}`), outputView.pre));
}

function outputChunk(chunk) {
  if (!outputView.pre) outputAttempt(chunk.attempt);
  const pre = outputView.pre;
  const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 8;
  pre.append(chunk.kind === "text" ? String(chunk.data) : JSON.stringify(chunk.data) + "\n");
  if (atBottom) pre.scrollTop = pre.scrollHeight;  // follow the end, unless scrolled back
  outputView.chunks += 1;
  $("#job-output-panel").hidden = false;
  $("#job-output-state").textContent = `${outputView.chunks} chunks, live`;
}

function showOutput(id) {
  if (outputView.stream) outputView.stream.stop();
  Object.assign(outputView, { pre: null, chunks: 0 });
  $("#job-output").replaceChildren();
  $("#job-output-panel").hidden = true;
  outputView.stream = openStream(`/jobs/${encodeURIComponent(id)}/output`, {
    onEvent: (kind, data) => {
      const doc = JSON.parse(data);
      if (kind === "attempt") outputAttempt(doc.attempt);
      else if (kind === "output") outputChunk(doc);
      else if (kind === "end") {
        outputView.stream.finish();
        $("#job-output-state").textContent = `${outputView.chunks} chunks, ${doc.status}`;
      }
    },
  });
}

async function jobAction(action) {
  const job = jobView.job;
  if (!job) return;
  const { ok, doc } = await post(`/jobs/${job.id}/${action}`);
  $("#job-action-result").textContent = ok ? `${action}: ${doc.status}` : `${action} refused: ${doc.detail}`;
  if (ok && action === "retry") showJob(job.id);  // a new story: follow it
}

$("#job-cancel").addEventListener("click", () => jobAction("cancel"));
$("#job-retry").addEventListener("click", () => jobAction("retry"));

// -- search ----------------------------------------------------------------------------------

const searchView = { next: null, query: "" };

function searchRow(job) {
  const err = job.error;
  return el("tr", { "data-id": job.id }, el("td", {}, jobLink(job)), el("td", {}, job.task),
    el("td", {}, el("span", { class: `badge ${job.status}` }, job.status)), el("td", {}, job.queue),
    el("td", {}, job.key ?? "—"), el("td", {}, ago(job.created_at)),
    el("td", { class: "msg" }, err ? `${err.type}: ${err.message}` : ""));
}

function searchQuery() {
  const form = new FormData($("#search-form"));
  const params = new URLSearchParams();
  for (const [name, value] of form.entries()) {
    if (!value) continue;
    params.set(name, name === "since" ? new Date(value).toISOString() : value);
  }
  params.set("limit", "50");
  return params;
}

async function runSearch(more = false) {
  const params = more ? new URLSearchParams(searchView.query) : searchQuery();
  if (more && searchView.next) params.set("after", searchView.next);
  // A search too broad for the API's time bound answers 422 `search_too_broad`, saying how
  // to narrow it: shown as it is.
  const resp = await api(`/jobs?${params}`);
  const page = await resp.json().catch(() => ({}));
  $("#search-error").hidden = resp.ok;
  if (!resp.ok) {
    $("#search-error").textContent = typeof page.detail === "string" ? page.detail : `search refused: HTTP ${resp.status}`;
    return;
  }
  if (!more) searchView.query = searchQuery().toString();
  searchView.next = page.next;
  const rows = page.jobs.map(searchRow);
  if (more) $("#search-results tbody").append(...rows);
  else $("#search-results tbody").replaceChildren(...rows);
  $("#search-empty").hidden = $("#search-results tbody").children.length > 0;
  $("#search-more").hidden = !page.next;
}

$("#search-form").addEventListener("submit", (event) => { event.preventDefault(); runSearch(); });
$("#search-more").addEventListener("click", () => runSearch(true));

// -- failures, grouped -----------------------------------------------------------------------

// What each button changes: retry the failed jobs of a group; cancel the ones waiting for
// a retry (stop retrying them).
const BULK = {
  retry: { status: "failed", verb: "Retry" },
  cancel: { status: "pending", verb: "Cancel" },
};

function bulkButton(action, group) {
  const n = action === "retry" ? group.failed : group.retrying;
  return el("button", { type: "button", "data-bulk": action, disabled: n === 0 || null,
    onclick: () => confirmBulk(action, group) }, `${BULK[action].verb} these`);
}

async function confirmBulk(action, group) {
  const filter = { status: BULK[action].status, task: group.task, error_type: group.error_type };
  const dry = await post(`/jobs/${action}`, { ...filter, dry_run: true });
  if (!dry.ok) { $("#bulk-result").textContent = `refused: ${JSON.stringify(dry.doc.detail)}`; return; }
  const dialog = $("#bulk-dialog");
  $("#bulk-title").textContent = `${BULK[action].verb} ${group.error_type} in ${group.task}?`;
  $("#bulk-count").textContent = `This will ${action} ${dry.doc.count} job${dry.doc.count === 1 ? "" : "s"}.`;
  $("#bulk-count").dataset.count = String(dry.doc.count);
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "ok") return;
    const done = await post(`/jobs/${action}`, filter);
    $("#bulk-result").textContent = done.ok ? `${action}: ${done.doc.count} jobs` : `refused: ${JSON.stringify(done.doc.detail)}`;
    await showFailures();
  };
  dialog.showModal();
}

function groupRow(group) {
  const latest = group.latest || {};
  const err = latest.error || {};
  return el("tr", { "data-type": group.error_type ?? "", "data-task": group.task },
    el("td", {}, el("strong", {}, group.error_type ?? "—")), el("td", {}, group.task),
    el("td", { class: "num failed-count" }, group.failed), el("td", { class: "num retrying-count" }, group.retrying),
    el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(latest.id)}` }, String(latest.id).slice(-8)), " ",
      el("span", { class: "msg" }, err.message || ""), " ", el("span", { class: "muted" }, ago(latest.at)),
      err.traceback ? el("details", {}, el("summary", {}, "latest traceback"), el("pre", { class: "traceback" }, err.traceback)) : ""),
    el("td", {}, bulkButton("retry", group), " ", bulkButton("cancel", group)));
}

async function showFailures() {
  const { groups } = await getJson("/failures?limit=100");
  $("#failure-groups tbody").replaceChildren(...groups.map(groupRow));
  $("#failure-groups-empty").hidden = groups.length > 0;
}

// -- routing ---------------------------------------------------------------------------------

function stopAll() {
  for (const stream of [overview.stream, jobView.stream, outputView.stream]) if (stream) stream.stop();
  overview.stream = jobView.stream = jobView.id = outputView.stream = null;
  clearInterval(overview.statsTimer);
}

async function route() {
  stopAll();
  $("#token-button").hidden = document.body.dataset.auth !== "1";
  if (document.body.dataset.auth === "1" && !sessionStorage.getItem(TOKEN_KEY)) {
    askToken(false);
    return;
  }
  const match = location.hash.match(/^#\/jobs\/([^/]+)$/);
  const page = match ? "job" : { "#/search": "search", "#/failures": "failures-view" }[location.hash] || "overview";
  for (const id of ["overview", "job", "search", "failures-view"]) $(`#${id}`).hidden = id !== page;
  try {
    if (match) await showJob(decodeURIComponent(match[1]));
    else if (page === "search") await runSearch();
    else if (page === "failures-view") await showFailures();
    else await showOverview();
  } catch (err) {
    if (!(err instanceof Unauthorized)) console.error(err);
  }
}

window.addEventListener("hashchange", route);
route();
