// madlib_mop dashboard: polls the app's JSON routes and draws them with Plotly.js.
// Read-only: the page only GETs.  Text from the database is set as text, never as HTML.
"use strict";

const RUNNING_STATES = new Set(["created", "queued", "running"]);
const CATEGORY10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const PLOT_CONFIG = {displaylogo: false, responsive: true,
                     modeBarButtonsToRemove: ["select2d", "lasso2d"]};

const state = {
  pollMs: 2000, jobs: [], selected: null, userSelected: false, polls: 0,
  loaded: {curves: null, schedule: null, after: null}, afterPending: null, jobsShown: null, models: 0,
  timer: null, busy: false, again: false, cyclesShown: null,
};

// ---- helpers ---------------------------------------------------------------------------------
function $(id) { return document.getElementById(id); }

async function getJSON(path) {
  const response = await fetch(path, {cache: "no-store", headers: {Accept: "application/json"}});
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = new Error((body && body.error) || `${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

function cell(row, field, text, numeric) {
  const td = document.createElement("td");
  td.dataset.field = field;
  if (numeric) td.className = "n";
  if (text instanceof Node) td.appendChild(text); else td.textContent = text == null ? "" : String(text);
  row.appendChild(td);
  return td;
}

function pad(n) { return String(n).padStart(2, "0"); }

function formatTime(iso, withDate) {
  if (!iso) return "";
  const t = new Date(iso);
  const time = `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`;
  return withDate ? `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ${time}` : time;
}

function sameDay(iso) {
  return !!iso && new Date(iso).toDateString() === new Date().toDateString();
}

function formatSeconds(seconds) {
  if (seconds == null || !isFinite(seconds)) return "";
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 120) return `${seconds} s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
}

function number(value, digits) {
  if (value == null) return "";
  return digits == null ? String(value) : Number(value).toFixed(digits);
}

function colour(key) {
  // Stable per mst_key: Plotly's ten colours while they suffice, else hues spread by the golden angle.
  if (state.models <= CATEGORY10.length) return CATEGORY10[(key - 1 + CATEGORY10.length) % CATEGORY10.length];
  return `hsl(${Math.round((key * 137.508) % 360)}, 65%, 45%)`;
}

function stateBadge(value) {
  const span = document.createElement("span");
  span.className = `state state-${value}`;
  span.textContent = value;
  return span;
}

function progressBar(percent) {
  const wrap = document.createElement("span");
  const bar = document.createElement("span");
  bar.className = "bar";
  const fill = document.createElement("span");
  fill.style.width = `${Math.min(100, Math.max(0, percent || 0))}%`;
  bar.appendChild(fill);
  const label = document.createElement("span");
  label.className = "pct";
  label.textContent = percent == null ? "" : `${number(percent, 1)} %`;
  wrap.append(bar, label);
  return wrap;
}

function whenText(job) {
  if (job.finished_at) {
    const took = job.started_at ? (new Date(job.finished_at) - new Date(job.started_at)) / 1000 : null;
    return formatTime(job.finished_at, !sameDay(job.finished_at)) +
           (took != null ? ` (took ${formatSeconds(took)})` : "");
  }
  if (job.eta) {
    const left = (new Date(job.eta) - Date.now()) / 1000;
    return `ETA ${formatTime(job.eta)}` + (left >= 1 ? ` (in ${formatSeconds(left)})` : "");
  }
  if (job.state === "queued" && job.queue_position) return `queued: position ${job.queue_position}`;
  return "";
}

function setNote(id, text, isError) {
  const note = $(id);
  note.textContent = text || "";
  note.classList.toggle("error", !!isError);
}

function emptyPlot(id) {
  const div = $(id);
  if (div.data) Plotly.purge(div);
  div.style.height = "";
  div.classList.add("empty");
}

function draw(id, traces, layout) {
  const div = $(id);
  div.classList.remove("empty");
  return Plotly.react(div, traces, Object.assign({
    margin: {l: 60, r: 20, t: 30, b: 45}, font: {size: 12},
    paper_bgcolor: "#fff", plot_bgcolor: "#fff", uirevision: String(state.selected),
  }, layout), PLOT_CONFIG);
}

// ---- the jobs table ----------------------------------------------------------------------------
function renderJobs() {
  // Rebuilt only when something changed: a row stays the same element between polls (and
  // under the pointer that is about to click it).
  const clock = state.jobs.some((j) => j.eta) ? Math.floor(Date.now() / 5000) : 0;  // "in N s"
  const shown = JSON.stringify([state.selected, state.jobs, new Date().toDateString(), clock]);
  if (shown === state.jobsShown) return;
  state.jobsShown = shown;
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  for (const job of state.jobs) {
    const tr = document.createElement("tr");
    tr.dataset.jobId = job.job_id;
    tr.classList.toggle("selected", job.job_id === state.selected);
    cell(tr, "job_id", job.job_id, true);
    cell(tr, "model_output_table", job.model_output_table).title = job.model_output_table;
    cell(tr, "state", stateBadge(job.state)).dataset.value = job.state;
    cell(tr, "progress", progressBar(job.percent_done));
    cell(tr, "subepochs", `${job.subepochs_done} / ${job.subepochs_total}`, true);
    cell(tr, "models", job.models, true);
    cell(tr, "models_training", job.models_training, true);
    cell(tr, "models_finished", job.models_finished, true);
    cell(tr, "models_stopped", job.models_stopped, true);
    cell(tr, "models_failed", job.models_failed, true);
    cell(tr, "started_at", formatTime(job.started_at, !sameDay(job.started_at))).title =
      formatTime(job.started_at, true);
    cell(tr, "when", whenText(job));
    tr.addEventListener("click", () => select(job.job_id, true));
    body.appendChild(tr);
  }
  $("no-jobs").hidden = state.jobs.length > 0;
}

function renderJob(job) {
  $("job-panel").hidden = !job;
  for (const id of ["curves-panel", "schedule-panel", "after-panels"]) $(id).hidden = !job;
  if (!job) return;
  $("job-title").textContent = `Job ${job.job_id}: ${job.model_output_table}`;
  const facts = [
    ["state", stateBadge(job.state)],
    ["sub-epochs", `${job.subepochs_done} of ${job.subepochs_total} (${number(job.percent_done, 1)} %)`],
    ["epochs", `${number(job.epochs_done, 2)} of ${number(job.epochs_total, 2)}`],
    ["models", `${job.models}: ${job.models_training} training, ${job.models_waiting} waiting, ` +
               `${job.models_finished} finished, ${job.models_stopped} stopped, ${job.models_failed} failed`],
    ["segments", job.segments + (job.workers ? ` (${job.workers} workers)` : "")],
    ["started", formatTime(job.started_at, true)],
    [job.finished_at ? "ended" : "expected", whenText(job)],
  ];
  const box = $("job-facts");
  box.replaceChildren();
  for (const [name, value] of facts) {
    if (value === "" || value == null) continue;
    const span = document.createElement("span");
    span.dataset.fact = name;
    const label = document.createElement("b");
    label.textContent = `${name}: `;
    span.append(label, value instanceof Node ? value : document.createTextNode(value));
    box.appendChild(span);
  }
  $("job-error").hidden = !job.last_error;
  $("job-error").textContent = job.last_error ? `last error: ${job.last_error}` : "";
}

// ---- the panels --------------------------------------------------------------------------------
function renderCurves(data, jobId) {
  state.models = Math.max(state.models, data.all_models.length);
  const div = $("curves");
  div.dataset.job = jobId;
  div.dataset.models = data.models.length;
  if (!data.models.length) {
    emptyPlot("curves");
    setNote("curves-note", "No iteration has finished yet: curves appear as models finish iterations.");
    return;
  }
  const metrics = data.metrics, gap = 0.08, width = (1 - gap * (metrics.length - 1)) / metrics.length;
  const traces = [], layout = {annotations: [], legend: {title: {text: "mst_key"}}, showlegend: true};
  metrics.forEach((metric, k) => {
    const axis = k === 0 ? "" : String(k + 1);
    layout[`xaxis${axis}`] = {domain: [k * (width + gap), k * (width + gap) + width],
                              title: {text: "iteration"}, anchor: `y${axis}`, dtick: 1, zeroline: false};
    layout[`yaxis${axis}`] = {title: {text: metric}, anchor: `x${axis}`, zeroline: false};
  });
  const shown = new Set();
  for (const model of data.models) {
    const stopped = ["stopped", "diverged", "failed"].includes(model.status);
    for (const series of model.series) {
      const k = metrics.indexOf(series.metric), axis = k === 0 ? "" : String(k + 1);
      const name = `${model.mst_key}` + (model.label ? ` ${model.label}` : "") + (stopped ? ` (${model.status})` : "");
      traces.push({
        type: "scatter", mode: series.iterations.length > 1 ? "lines" : "markers",
        x: series.iterations, y: series.values, xaxis: `x${axis}`, yaxis: `y${axis}`,
        name, legendgroup: String(model.mst_key), showlegend: !shown.has(model.mst_key),
        line: {color: colour(model.mst_key), dash: series.split === "training" ? "dash" : "solid",
               width: stopped ? 1 : 2},
        opacity: stopped ? 0.55 : 1,
        meta: {mst_key: model.mst_key, split: series.split, metric: series.metric},
        hovertemplate: `mst_key ${model.mst_key}: ${series.split} ${series.metric} %{y:.4f}` +
                       "<br>iteration %{x}<extra></extra>",
      });
      shown.add(model.mst_key);
    }
  }
  draw("curves", traces, layout);
  const waiting = data.all_models.length - data.models.length;
  setNote("curves-note", `${data.models.length} models` +
          (waiting > 0 ? `; ${waiting} more have not finished an iteration yet` : "") +
          ` (read from ${data.source === "_info" ? "the job's _info table" : "the view " + data.source}).`);
}

function renderSchedule(data, jobId) {
  const div = $("schedule");
  div.dataset.job = jobId;
  div.dataset.count = data.count;
  div.dataset.drawn = data.drawn;
  if (!data.drawn) {
    emptyPlot("schedule");
    setNote("schedule-note", data.count ? `${data.count} sub-epochs, none with times to draw.`
                                        : "No sub-epoch has finished yet.");
    return;
  }
  state.models = Math.max(state.models, data.models.length);
  const label = (segment) => `segment ${segment}`;
  const fewBars = data.drawn <= 400;
  const traces = data.models.map((model) => ({
    type: "bar", orientation: "h", name: String(model.mst_key),
    y: model.segment.map(label), base: model.start, x: model.seconds,
    marker: {color: colour(model.mst_key), line: {color: "#fff", width: 0.5}},
    text: fewBars ? model.segment.map(() => String(model.mst_key)) : undefined,
    textposition: fewBars ? "inside" : "none", insidetextanchor: "middle",
    textfont: {color: "#fff", size: 10}, constraintext: "both",
    customdata: model.step.map((step, i) => [step, model.start[i], model.seconds[i]]),
    meta: {mst_key: model.mst_key},
    hovertemplate: `mst_key ${model.mst_key}, sub-epoch %{customdata[0]}<br>%{y}: ` +
                   "from %{customdata[1]:.2f} s for %{customdata[2]:.2f} s<extra></extra>",
  }));
  const rows = data.segments.map(label);
  // Tall enough for a row per segment, and for the legend's keys (it scrolls past 20).
  const height = Math.max(110 + 46 * rows.length, 110 + 22 * Math.min(traces.length, 20));
  div.style.height = `${height}px`;
  draw("schedule", traces, {
    barmode: "overlay", bargap: 0.25, legend: {title: {text: "mst_key"}}, height,
    xaxis: {title: {text: `seconds since the first sub-epoch (${formatTime(data.start, true)})`},
            zeroline: false},
    yaxis: {categoryorder: "array", categoryarray: rows, autorange: "reversed"},
  });
  setNote("schedule-note", `${data.count} sub-epochs of ${data.models.length} models on ` +
          `${data.segments.length} segments; gaps: the segment was idle.`);
}

function renderImportance(data, jobId) {
  const div = $("importance");
  div.dataset.job = jobId;
  div.dataset.outcome = !data.available ? "unavailable" : data.error ? "error" : "chart";
  if (!data.available || data.error) {
    emptyPlot("importance");
    const e = data.error;
    setNote("importance-note", data.available
      ? `${e.message}` + (e.detail ? `\n${e.detail}` : "") + (e.hint ? `\nHINT: ${e.hint}` : "")
      : `Not available: ${data.reason}.`, !!data.error);
    return;
  }
  draw("importance", [{
    type: "bar", orientation: "h", y: data.rows.map((r) => r.hyperparameter),
    x: data.rows.map((r) => r.importance), marker: {color: "#2563eb"},
    hovertemplate: "%{y}: %{x:.3f}<extra></extra>",
  }], {yaxis: {autorange: "reversed", automargin: true}, xaxis: {title: {text: "importance"}},
       margin: {l: 20, r: 20, t: 10, b: 45}});
  setNote("importance-note", `${data.rows.length} hyperparameters, most important first.`);
}

function axisTitle(column, metric) {
  const [split, kind] = [column.split("_")[0], column.split("_").slice(1).join("_")];
  if (kind === "metrics_final") return `${split} ${metric || "metric"} (final)`;
  if (kind === "loss_final") return `${split} loss (final)`;
  return column.replaceAll("_", " ");
}

function renderPareto(data, jobId) {
  const div = $("pareto");
  div.dataset.job = jobId;
  div.dataset.outcome = !data.available ? "unavailable" : data.error ? "error" : "chart";
  if (!data.available || data.error) {
    emptyPlot("pareto");
    const e = data.error;
    setNote("pareto-note", data.available ? `${e.message}` + (e.hint ? `\nHINT: ${e.hint}` : "")
                                          : `Not available: ${data.reason}.`, !!data.error);
    return;
  }
  const front = new Set(data.front);
  const xTitle = axisTitle(data.x, data.metric), yTitle = axisTitle(data.y, data.metric);
  const others = data.models.filter((m) => !front.has(m.mst_key));
  const best = data.models.filter((m) => front.has(m.mst_key)).sort((a, b) => a.x - b.x);
  const trace = (models, extra) => Object.assign({
    type: "scatter", x: models.map((m) => m.x), y: models.map((m) => m.y),
    text: models.map((m) => String(m.mst_key)), customdata: models.map((m) => m.mst_key),
    textposition: "top center", cliponaxis: false,
    hovertemplate: `mst_key %{customdata}<br>${xTitle}: %{x:.4g}<br>${yTitle}: %{y:.4f}<extra></extra>`,
  }, extra);
  draw("pareto", [
    trace(others, {name: "other models", mode: "markers+text", meta: {front: false},
                   marker: {color: "#9aa5b1", size: 9}, textfont: {color: "#6b7785", size: 10}}),
    trace(best, {name: "Pareto front", mode: "lines+markers+text", meta: {front: true},
                 // Sorted by cost (lower is better): the staircase bounds what the front dominates.
                 line: {color: "#d62728", shape: "hv", width: 1.5},
                 marker: {color: "#d62728", size: 12, symbol: "star"}, textfont: {color: "#d62728"}}),
  ], {xaxis: {title: {text: xTitle}, type: data.x === "parameter_count" ? "log" : "linear"},
      yaxis: {title: {text: yTitle}},
      legend: {orientation: "h", y: -0.25}, margin: {l: 60, r: 20, t: 10, b: 70}});
  setNote("pareto-note", `${best.length} of ${data.models.length} models on the front ` +
          `(objectives: ${data.objectives.join(", ")}).`);
}

function renderCycles(cycles) {
  // Redrawn only when a cycle changed.
  const shown = JSON.stringify(cycles);
  if (shown === state.cyclesShown) return;
  state.cyclesShown = shown;
  $("cycles-panel").hidden = cycles.length === 0;
  if (!cycles.length) return;
  const names = [...new Set(cycles.map((c) => c.cycle_name))];
  const traces = names.map((name, k) => {
    const done = cycles.filter((c) => c.cycle_name === name && c.best_value != null);
    return {
      type: "scatter", mode: "lines+markers", name, x: done.map((c) => c.cycle), y: done.map((c) => c.best_value),
      line: {color: CATEGORY10[k % CATEGORY10.length]}, meta: {cycle_name: name},
      // The name goes in as data, not into the template (Plotly reads a template's %{...}).
      text: done.map(() => name),
      customdata: done.map((c) => [c.num_rows, c.appended, c.configurations, c.carried_over, c.best_mst_key, c.objective]),
      hovertemplate: "%{text}, cycle %{x}: %{customdata[5]} %{y:.4f} (mst_key %{customdata[4]})<br>" +
                     "%{customdata[0]} rows (%{customdata[1]} new), %{customdata[2]} configurations, " +
                     "%{customdata[3]} carried over<extra></extra>",
    };
  });
  const objectives = [...new Set(cycles.map((c) => c.objective).filter((o) => o))];
  draw("cycles", traces, {xaxis: {title: {text: "cycle"}, dtick: 1}, yaxis: {title: {text: objectives.join(", ") || "best value"}},
                          legend: {title: {text: "cycle_name"}}});
  const open = cycles.filter((c) => c.state !== "finished").length;
  setNote("cycles-note", `${cycles.length} cycles of ${names.length} name${names.length > 1 ? "s" : ""}` +
          (open ? `; ${open} not finished` : "") + " (the view cycle_results).");
}

// ---- polling -----------------------------------------------------------------------------------
function select(jobId, byUser) {
  if (byUser) {
    state.userSelected = true;
    history.replaceState(null, "", `#job=${jobId}`);
  }
  if (state.selected !== jobId) {
    state.selected = jobId;
    state.models = 0;
    state.loaded = {curves: null, schedule: null, after: null};
    for (const id of ["curves", "schedule", "importance", "pareto"]) emptyPlot(id);
    // The row is marked at once: a poll already under way may draw the new job's panels
    // before the next one would redraw the table.
    renderJobs();
  }
  if (byUser) poll();
}

async function refreshPanels(job) {
  const id = job.job_id, running = RUNNING_STATES.has(job.state);
  const key = `${id}|${job.state}|${job.subepochs_done}|${job.updated_at}`;
  const work = [];
  // A panel that cannot be read (its job's tables dropped since, say) says why in its note;
  // the others, and the jobs table, go on.
  const panel = (name, render, wanted) => {
    if (!wanted) return;
    work.push(getJSON(`api/jobs/${id}/${name}`).then(
      (data) => { if (state.selected === id) { render(data, id); state.loaded[name] = key; } },
      (error) => { if (state.selected === id) setNote(`${name}-note`, `could not read: ${error.message}`, true); }));
  };
  // Curves change when models finish iterations (their `_info` rows): read them on every poll
  // while the job runs; the schedule changes with each sub-epoch recorded.
  panel("curves", renderCurves, running || state.loaded.curves !== key);
  panel("schedule", renderSchedule, state.loaded.schedule !== key);
  // Importance and the front are computed by the server when asked (seconds, the first
  // time): they are read once per job and state, without holding up the live panels.
  const afterKey = `${id}|${job.state}`;
  if (state.loaded.after !== afterKey && state.afterPending !== afterKey) {
    state.afterPending = afterKey;
    Promise.all([getJSON(`api/jobs/${id}/importance`), getJSON(`api/jobs/${id}/pareto`)])
      .then(([importance, pareto]) => {
        if (state.selected !== id) return;
        renderImportance(importance, id);
        renderPareto(pareto, id);
        state.loaded.after = afterKey;
      })
      .catch((error) => {
        setNote("importance-note", `could not read: ${error.message}`, true);
        setNote("pareto-note", `could not read: ${error.message}`, true);
      })
      .finally(() => { if (state.afterPending === afterKey) state.afterPending = null; });
  }
  await Promise.all(work);
}

async function poll() {
  if (state.busy) { state.again = true; return; }
  state.busy = true;
  clearTimeout(state.timer);
  const status = $("status");
  try {
    state.jobs = (await getJSON("api/jobs")).jobs;
    const ids = new Set(state.jobs.map((j) => j.job_id));
    if (!state.userSelected || !ids.has(state.selected)) {
      select(state.jobs.length ? state.jobs[0].job_id : null, false);  // the newest job
    }
    renderJobs();
    renderCycles((await getJSON("api/cycles")).cycles);
    const job = state.jobs.find((j) => j.job_id === state.selected) || null;
    renderJob(job);
    if (job) await refreshPanels(job);
    status.textContent = `live: updated ${formatTime(new Date().toISOString())}, every ${state.pollMs / 1000} s`;
    status.classList.remove("error");
  } catch (error) {
    status.textContent = `could not read: ${error.message}`;
    status.classList.add("error");
  } finally {
    state.polls += 1;
    document.body.dataset.polls = state.polls;
    document.body.dataset.selectedJob = state.selected == null ? "" : state.selected;
    state.busy = false;
    if (state.again) { state.again = false; setTimeout(poll, 0); }
    else state.timer = setTimeout(poll, state.pollMs);
  }
}

async function start() {
  const wanted = /job=(\d+)/.exec(location.hash);
  if (wanted) { state.selected = Number(wanted[1]); state.userSelected = true; }
  try {
    const session = await getJSON("api/session");
    state.pollMs = Math.round(1000 * (session.poll_seconds || 2));
    $("who").textContent = `${session.role} @ ${session.database}: madlib_mop ` +
      `${session.version || "?"} in schema ${session.schema}, PostgreSQL ${session.server_version}`;
  } catch (error) {
    $("status").textContent = `could not read: ${error.message}`;
  }
  poll();
}

start();
