// Overspill web console: a small single-page app over the /v1 REST API (no build step, no third-party code).
//
// Sign-in stores the API key in this tab's sessionStorage; every call sends it as a Bearer token, so the console
// sees exactly what the API lets that key see (its tenant only; finance: pools and costs, no jobs, no submit).
// Pages (hash routes): #/jobs, #/jobs/<id>, #/pools, #/costs. Everything is built with DOM nodes and textContent:
// no API value is ever parsed as HTML. When a page has rendered its data, <body data-ready="<page>"> is set
// (tests and the benchmark wait for it).
"use strict";

const KEY_STORE = "overspill.key";
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const JOB_PAGE = 50;
const state = { key: sessionStorage.getItem(KEY_STORE), who: null, view: 0, timers: [] };

// ---------- small helpers ----------

function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "text") el.textContent = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "css") Object.assign(el.style, value); // CSSOM: allowed by the page's CSP, unlike style=""
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Money arrives as decimal strings; round them as strings, half-even (the broker's display rule,
// broker/finance/money.py), never through binary floats.
function usd(value, places) {
  if (value === null || value === undefined || value === "") return "—";
  let s = String(value).trim();
  const negative = s.startsWith("-");
  if (negative) s = s.slice(1);
  let [whole, frac = ""] = s.split(".");
  if (places === undefined) places = whole === "0" && !/^0*$/.test(frac) && frac.slice(0, 2) === "00" ? 4 : 2;
  const digits = (whole + (frac + "0".repeat(places)).slice(0, places)).split("").map(Number);
  const rest = frac.slice(places);
  const next = Number(rest[0] || 0);
  if (next > 5 || (next === 5 && (/[1-9]/.test(rest.slice(1)) || digits[digits.length - 1] % 2 === 1))) {
    let i = digits.length - 1;
    while (i >= 0 && digits[i] === 9) digits[i--] = 0;
    if (i < 0) digits.unshift(1);
    else digits[i] += 1;
  }
  const intPart = digits.slice(0, digits.length - places).join("").replace(/^0+(?=\d)/, "") || "0";
  const grouped = intPart.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  const fracPart = places ? "." + digits.slice(digits.length - places).join("") : "";
  const zero = /^[0.,]*$/.test(grouped + fracPart);
  return (negative && !zero ? "-$" : "$") + grouped + fracPart;
}

function ratio(part, whole) {
  const p = Number(part), w = Number(whole);
  return w > 0 ? Math.max(0, p / w) : 0;
}

function when(iso) {
  if (!iso) return "—";
  return iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z");
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  const s = Number(seconds);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function badge(text, kind) {
  return h("span", { class: `badge ${kind || text}`, "data-testid": "badge" }, text);
}

function bar(fraction, label, opts = {}) {
  const pct = Math.min(100, fraction * 100);
  const level = fraction >= 1 ? "over" : fraction >= (opts.warn || 0.8) ? "warn" : "ok";
  const marks = (opts.marks || []).map((m) => h("span", { class: "mark", css: { left: `${Math.min(100, m)}%` } }));
  return h(
    "div",
    { class: "bar", title: label, role: "meter", "aria-valuenow": pct.toFixed(0), "aria-label": label },
    h("span", { class: `fill ${level}`, css: { width: `${pct.toFixed(1)}%` } }),
    ...marks,
  );
}

function notice(text, kind = "info", testid) {
  return h("p", { class: `notice ${kind}`, "data-testid": testid }, text);
}

function table(headers, rows, testid) {
  return h(
    "table",
    { "data-testid": testid },
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows),
  );
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// every list answer is a page {items, next_cursor}
const items = (page) => page.items;

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body !== undefined ? JSON.stringify(options.body) : undefined,
  });
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = { message: text };
  }
  if (!response.ok) {
    if (response.status === 401 && !options.signingIn) signOut("Your key was not accepted; sign in again.");
    throw new ApiError(response.status, (body && (body.detail || body.message)) || `HTTP ${response.status}`);
  }
  return body;
}

function every(ms, fn) {
  const view = state.view;
  const id = setInterval(() => {
    if (view !== state.view) clearInterval(id);
    else fn();
  }, ms);
  state.timers.push(id);
}

function ready(page) {
  document.body.dataset.readyAt = String(performance.now()); // ms since navigation start (the benchmark reads it)
  document.body.dataset.ready = page;
}

function can(...roles) {
  return state.who && roles.includes(state.who.role);
}

// ---------- shell, sign-in and routing ----------

function mount(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children);
  return main;
}

function shell() {
  const nav = document.getElementById("nav");
  const signedIn = Boolean(state.who);
  nav.hidden = !signedIn;
  document.getElementById("signout").hidden = !signedIn;
  document.getElementById("who").textContent = signedIn ? `${state.who.tenant} · ${state.who.role}` : "";
  for (const link of nav.querySelectorAll("a")) {
    link.hidden = !signedIn || !link.dataset.roles.split(" ").includes(state.who.role);
    const page = (location.hash.split("/")[1] || "").split("?")[0];
    link.classList.toggle("active", link.dataset.nav === page);
  }
}

function signOut(message) {
  sessionStorage.removeItem(KEY_STORE);
  state.key = null;
  state.who = null;
  state.signOutMessage = message || "";
  location.hash = "#/signin";
  route();
}

function homeFor(role) {
  return role === "finance" ? "#/costs" : "#/jobs";
}

function renderSignIn() {
  const input = h("input", {
    type: "password",
    name: "api_key",
    id: "api-key",
    autocomplete: "off",
    placeholder: "ovs_…",
    required: true,
    "data-testid": "api-key",
  });
  const error = h("p", { class: "notice error", "data-testid": "signin-error", hidden: true });
  const form = h(
    "form",
    {
      class: "card signin",
      onsubmit: async (event) => {
        event.preventDefault();
        state.key = input.value.trim();
        try {
          state.who = await api("/v1/whoami", { signingIn: true });
        } catch (exc) {
          state.key = null;
          error.textContent = `Sign-in failed: ${exc.message}`;
          error.hidden = false;
          return;
        }
        sessionStorage.setItem(KEY_STORE, state.key);
        location.hash = homeFor(state.who.role);
      },
    },
    h("h1", {}, "Sign in"),
    h("label", { for: "api-key" }, "API key"),
    input,
    h("button", { type: "submit", "data-testid": "signin" }, "Sign in"),
    state.signOutMessage ? notice(state.signOutMessage, "warn") : null,
    error,
    h("p", { class: "hint" }, "The key stays in this browser tab only (sessionStorage) and is sent to this broker."),
  );
  mount(form);
  ready("signin");
}

async function route() {
  state.view += 1;
  state.timers.forEach(clearInterval);
  state.timers = [];
  delete document.body.dataset.ready;
  if (state.key && !state.who) {
    try {
      state.who = await api("/v1/whoami", { signingIn: true });
    } catch {
      sessionStorage.removeItem(KEY_STORE);
      state.key = null;
    }
  }
  shell();
  const [, page, arg] = location.hash.split("?")[0].split("/");
  if (!state.who) return renderSignIn();
  const pages = {
    jobs: () => (arg ? renderJob(decodeURIComponent(arg)) : renderJobs()),
    pools: renderPools,
    costs: renderCosts,
  };
  const render = pages[page];
  if (!render) {
    location.hash = homeFor(state.who.role);
    return;
  }
  const link = document.querySelector(`#nav a[data-nav="${page}"]`);
  if (link && !link.dataset.roles.split(" ").includes(state.who.role)) {
    mount(notice(`The ${state.who.role} role cannot see ${page} (the API would answer 403).`, "warn", "forbidden"));
    ready("forbidden");
    return;
  }
  try {
    await render();
  } catch (exc) {
    mount(notice(`Could not load this page: ${exc.message}`, "error", "page-error"));
    ready("error");
  }
}

// ---------- jobs ----------

function where(job) {
  const p = job.placement;
  if (!p) return h("span", { class: "muted" }, job.wait_reason || "—");
  return h(
    "span",
    {},
    `${p.provider} ${p.region}/${p.zone} `,
    badge(p.capacity_type.replace("_", "-"), p.capacity_type),
    p.simulated ? h("span", { class: "muted" }, " sim") : null,
  );
}

function spendCell(job) {
  const f = ratio(job.spent_usd, job.max_total_usd);
  return h("div", { class: "spend" }, bar(f, "spend against ceiling"), `${usd(job.spent_usd)} of ${usd(job.max_total_usd)}`);
}

function submitForm() {
  const field = (name, label, attrs = {}) =>
    h("label", {}, label, h("input", { name, "data-testid": `submit-${name}`, ...attrs }));
  const error = h("p", { class: "notice error", "data-testid": "submit-error", hidden: true });
  const form = h(
    "form",
    {
      class: "grid",
      "data-testid": "submit-form",
      onsubmit: async (event) => {
        event.preventDefault();
        const data = Object.fromEntries(new FormData(form).entries());
        const body = {
          name: data.name,
          team: data.team || "default",
          project: data.project || "default",
          image: data.image,
          accelerators: data.accelerators.split(",").map((s) => s.trim()).filter(Boolean),
          gpu_count: Number(data.gpu_count),
          work_gpu_hours: data.work_gpu_hours,
          max_total_usd: data.max_total_usd,
        };
        if (data.max_hourly_usd) body.max_hourly_usd = data.max_hourly_usd;
        try {
          const job = await api("/v1/jobs", {
            method: "POST",
            body,
            headers: { "Idempotency-Key": crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) },
          });
          location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
        } catch (exc) {
          error.textContent = exc.message;
          error.hidden = false;
        }
      },
    },
    field("name", "Name", { required: true, maxlength: 128 }),
    field("team", "Team", { value: "default" }),
    field("project", "Project", { value: "default" }),
    field("image", "Image", { required: true, placeholder: "ghcr.io/acme/train:1.0" }),
    field("accelerators", "GPU types (comma-separated)", { required: true, value: "A100" }),
    field("gpu_count", "GPUs", { type: "number", min: 1, max: 64, value: 1, required: true }),
    field("work_gpu_hours", "Work (GPU-hours)", { required: true, inputmode: "decimal", value: "4" }),
    field("max_total_usd", "Ceiling (USD)", { required: true, inputmode: "decimal", value: "20" }),
    field("max_hourly_usd", "Max USD/hour (optional)", { inputmode: "decimal" }),
    h("div", { class: "actions" }, h("button", { type: "submit", "data-testid": "submit-job" }, "Submit job")),
    error,
  );
  return h("details", { class: "card" }, h("summary", { "data-testid": "submit-toggle" }, "Submit a job"), form);
}

async function renderJobs() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const filter = params.get("state") || "";
  const cursors = (params.get("after") || "").split(",").filter(Boolean);
  const view = state.view;
  const select = h(
    "select",
    {
      "data-testid": "state-filter",
      onchange: () => {
        location.hash = select.value ? `#/jobs?state=${select.value}` : "#/jobs";
      },
    },
    ["", "pending", "running", "paused", "succeeded", "failed", "cancelled"].map((s) =>
      h("option", { value: s, selected: s === filter }, s || "all states"),
    ),
  );
  const body = h("tbody", {});
  const pager = h("div", { class: "pager" });
  mount(
    h("div", { class: "title" }, h("h1", {}, "Jobs"), select),
    can("admin", "submitter") ? submitForm() : null,
    h(
      "table",
      { "data-testid": "jobs" },
      h("thead", {}, h("tr", {}, ["Job", "State", "Where it runs", "Spend / ceiling", "Team · project", "Submitted"].map((x) => h("th", {}, x)))),
      body,
    ),
    pager,
  );
  async function load() {
    const query = new URLSearchParams({ limit: String(JOB_PAGE) });
    if (filter) query.set("state", filter);
    if (cursors.length) query.set("cursor", cursors[cursors.length - 1]);
    const page = await api(`/v1/jobs?${query}`);
    if (view !== state.view) return;
    body.replaceChildren(
      ...page.items.map((job) =>
        h(
          "tr",
          { "data-job": job.id },
          h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(job.id)}` }, job.name), h("div", { class: "muted small" }, job.id)),
          h("td", { "data-testid": "job-state" }, badge(job.state)),
          h("td", {}, where(job)),
          h("td", {}, spendCell(job)),
          h("td", {}, `${job.team} · ${job.project}`),
          h("td", { class: "small" }, when(job.created_at)),
        ),
      ),
    );
    if (!page.items.length) body.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No jobs yet.")));
    const base = filter ? `state=${filter}&` : "";
    pager.replaceChildren(
      cursors.length
        ? h("a", { href: `#/jobs?${base}after=${cursors.slice(0, -1).join(",")}`, "data-testid": "prev" }, "← Newer")
        : "",
      page.next_cursor
        ? h("a", { href: `#/jobs?${base}after=${[...cursors, page.next_cursor].join(",")}`, "data-testid": "next" }, "Older →")
        : "",
    );
    ready("jobs");
  }
  await load();
  if (!cursors.length) every(3000, () => load().catch(() => {}));
}

// The last 4 KiB of the job's latest attempt's output (GET /v1/jobs/{id}/logs?tail=4096), as plain text; nothing
// when no attempt ran on an instance agent (simulated clouds, Slurm). `overspill logs JOB -f` follows it whole.
async function showLogTail(id, box) {
  const headers = { Accept: "text/plain" };
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  let response;
  try {
    response = await fetch(`/v1/jobs/${encodeURIComponent(id)}/logs?tail=4096`, { headers });
  } catch {
    return;
  }
  const attempt = response.headers.get("X-Overspill-Attempt");
  if (!response.ok || !attempt) {
    box.replaceChildren();
    return;
  }
  const text = await response.text();
  const pre = h("pre", { class: "log", "data-testid": "log-tail" }, text || "(nothing yet)");
  box.replaceChildren(
    h("h2", {}, "Log ", h("span", { class: "muted small" }, `(last 4 KiB of attempt ${attempt}; overspill logs ${id} -f follows it)`)),
    pre,
  );
  pre.scrollTop = pre.scrollHeight; // a tail: the newest lines in view
}

function collapseEvents(events) {
  // The API folds each placement's run of cost accruals into one item (data.accruals, data.from); runs split
  // by a page boundary or another placement's accruals are joined here so the timeline stays readable.
  const out = [];
  for (const e of events) {
    const last = out[out.length - 1];
    const n = (e.data && e.data.accruals) || 1;
    if (e.kind === "cost_accrued" && last && last.kind === "cost_accrued") {
      last.count += n;
      last.to = e.at;
      last.spent = e.data.spent_usd;
    } else {
      const from = (e.data && e.data.from) || e.at;
      out.push({ ...e, count: n, from, to: e.at, spent: e.data && e.data.spent_usd });
    }
  }
  return out;
}

async function renderJob(id) {
  const view = state.view;
  const head = h("div", { class: "title" });
  const cards = h("div", { class: "cards" });
  const timeline = h("ol", { class: "timeline", "data-testid": "timeline" });
  const logBox = h("section", { "data-testid": "log-section" });
  mount(h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")), head, cards, logBox, h("h2", {}, "Timeline"), timeline);
  let job;
  async function load() {
    let events;
    try {
      [job, events] = await Promise.all([api(`/v1/jobs/${encodeURIComponent(id)}`), api(`/v1/jobs/${encodeURIComponent(id)}/events?limit=1000`).then((page) => page.items)]);
    } catch (exc) {
      if (exc.status === 404) {
        mount(h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")), notice(`No job ${id} in your tenant.`, "warn", "job-missing"));
        ready("job");
        return false;
      }
      throw exc;
    }
    if (view !== state.view) return false;
    const cancel =
      can("admin", "submitter") && !TERMINAL.has(job.state)
        ? h(
            "button",
            {
              class: "danger",
              "data-testid": "cancel",
              onclick: async () => {
                if (!confirm(`Cancel ${job.name}?`)) return;
                await api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
                load();
              },
            },
            "Cancel job",
          )
        : null;
    head.replaceChildren(
      h("h1", {}, job.name, " ", h("span", { "data-testid": "job-state" }, badge(job.state))),
      h("span", { class: "muted small" }, job.id),
      cancel,
    );
    const p = job.placement;
    const f = ratio(job.spent_usd, job.max_total_usd);
    cards.replaceChildren(
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Where it runs"),
        p
          ? h(
              "dl",
              { "data-testid": "placement" },
              h("dt", {}, "Pool"), h("dd", {}, p.offering_key),
              h("dt", {}, "Capacity"), h("dd", {}, badge(p.capacity_type.replace("_", "-"), p.capacity_type), p.simulated ? " (simulated)" : ""),
              h("dt", {}, "Price"), h("dd", {}, `${usd(p.hourly_usd)}/h`),
              h("dt", {}, "Placement"), h("dd", {}, `${p.state} · ${p.id}`),
              h("dt", {}, "Started"), h("dd", {}, when(p.started_at)),
              ...(job.wait_reason && (job.state === "starting" || job.state === "pending")
                ? [h("dt", {}, "Note"), h("dd", { "data-testid": "wait-reason" }, job.wait_reason)]
                : []),
            )
          : h("p", { class: "muted", "data-testid": "wait-reason" }, job.wait_reason || (TERMINAL.has(job.state) ? "Not running." : "Waiting.")),
      ),
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Spend against ceiling"),
        h("p", { class: "big" }, h("span", { "data-testid": "job-spent" }, usd(job.spent_usd)), h("span", { class: "muted" }, ` of ${usd(job.max_total_usd)}`)),
        bar(f, "spend against ceiling"),
        h("p", { class: "muted small" }, `${(f * 100).toFixed(1)}% of the ceiling`, job.max_hourly_usd ? ` · max ${usd(job.max_hourly_usd)}/h` : ""),
      ),
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Work"),
        bar(1 - ratio(job.remaining_work_hours, job.work_hours), "work done", {
          warn: 2,
          marks: job.checkpoint ? [job.checkpoint.fraction * 100] : [],
        }),
        h("p", { class: "small" }, `${job.remaining_work_hours} of ${job.work_hours} h left · ${job.attempts} attempt(s)`),
        h(
          "p",
          { class: "small", "data-testid": "job-progress" },
          job.progress
            ? `progress ${job.progress.done} of ${job.progress.total} (${(job.progress.fraction * 100).toFixed(0)}%) · reported ${when(job.progress.reported_at)}`
            : "progress not reported (the work left is estimated from the time run)",
        ),
        h(
          "p",
          { class: "small", "data-testid": "job-checkpoint" },
          job.checkpoint
            ? `last durable checkpoint: ${(job.checkpoint.fraction * 100).toFixed(0)}% of the work (${job.checkpoint.work_hours} h)` +
                (job.checkpoint.units !== null ? ` at ${job.checkpoint.units}` : "")
            : "no durable checkpoint yet",
        ),
        h("p", { class: "muted small" }, `team ${job.team} · project ${job.project}`),
        h("p", { class: "muted small" }, `submitted ${when(job.created_at)}`, job.finished_at ? ` · ended ${when(job.finished_at)}` : ""),
      ),
    );
    timeline.replaceChildren(
      ...collapseEvents(events).map((e) =>
        h(
          "li",
          { class: `event ${e.kind}` },
          h("time", {}, when(e.from)),
          h("span", { class: "kind" }, e.kind.replace(/_/g, " ")),
          e.count > 1
            ? h("span", {}, `${e.count} accruals until ${when(e.to)}; spent ${usd(e.spent)}`)
            : h("span", {}, e.message),
        ),
      ),
    );
    await showLogTail(id, logBox);
    ready("job");
    // An ended job's last accrual may land a tick or more after its state changes: poll until every placement
    // that started has its one closing `cost_accrued` event and the spend stops moving. A placement with nothing
    // left to accrue when it ended writes no such event, so a spend steady for 20 polls (30 s) settles it too.
    const count = (kind) => events.filter((e) => e.kind === kind).length;
    const accrued = count("cost_accrued") >= count("started");
    steadyPolls = TERMINAL.has(job.state) && job.spent_usd === lastSpent ? steadyPolls + 1 : 0;
    lastSpent = job.spent_usd;
    return !(steadyPolls > 0 && (accrued || steadyPolls >= 20));
  }
  let lastSpent = null;
  let steadyPolls = 0;
  let live = await load();
  if (live) {
    every(1500, async () => {
      if (live) live = await load().catch(() => true);
    });
  }
}

// ---------- pools ----------

async function renderPools() {
  const [pools, pressure, ready_] = await Promise.all([
    api("/v1/pools?limit=5000").then(items),
    api("/v1/pressure").then(items),
    // feed states need a key (anonymous callers get only the verdict); a 503 (not ready) still has a body
    fetch("/readyz", { headers: state.key ? { Authorization: `Bearer ${state.key}` } : {} })
      .then((r) => r.json())
      .catch(() => ({ feeds: {} })),
  ]);
  const feeds = Object.entries(ready_.feeds || {});
  const byAcc = new Map();
  for (const p of pools) {
    const g = byAcc.get(p.accelerator) || { pools: 0, spot: null, od: null, onprem: null };
    g.pools += 1;
    const slot = { spot: "spot", on_demand: "od", on_prem: "onprem" }[p.capacity_type];
    if (slot && p.available && (!g[slot] || Number(p.usd_per_gpu_hour) < Number(g[slot].usd_per_gpu_hour))) g[slot] = p;
    byAcc.set(p.accelerator, g);
  }
  const filter = h("input", { type: "search", placeholder: "filter pools: A100 spot us-east…", "data-testid": "pool-filter" });
  const poolRows = pools.map((p) => {
    const risk = p.interruption_rate_per_hour;
    const row = h(
      "tr",
      { "data-text": `${p.key} ${p.capacity_type} ${p.accelerator}`.toLowerCase() },
      h("td", {}, p.key),
      h("td", {}, `${p.accelerator_count}× ${p.accelerator}`),
      h("td", {}, badge(p.capacity_type.replace("_", "-"), p.capacity_type)),
      h("td", { class: "num" }, usd(p.hourly_usd)),
      h("td", { class: "num" }, usd(p.usd_per_gpu_hour)),
      h("td", {}, age(p.age_seconds), " ", p.stale ? badge("stale", "failed") : "", p.estimated ? badge("est.", "paused") : ""),
      h("td", { title: p.interruption_basis }, p.capacity_type === "spot" ? bar(Math.min(1, risk / 0.2), `${risk.toFixed(3)}/h`, { warn: 0.5 }) : "—", p.capacity_type === "spot" ? h("span", { class: "small" }, ` ${risk.toFixed(3)}/h`) : ""),
      h("td", { class: "num" }, p.expected_wait_hours ? `${p.expected_wait_hours.toFixed(1)} h` : "—"),
      h("td", {}, p.available ? "yes" : badge("no", "failed")),
    );
    return row;
  });
  filter.addEventListener("input", () => {
    const words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
    for (const row of poolRows) row.hidden = !words.every((w) => row.dataset.text.includes(w));
  });
  mount(
    h("h1", {}, "Pools"),
    h("h2", {}, "Price feeds"),
    feeds.length
      ? table(
          ["Feed", "Last refresh", "State"],
          feeds.map(([name, f]) =>
            h("tr", {}, h("td", {}, name), h("td", {}, `${age(f.age_seconds)} ago`), h("td", {}, f.failing ? badge("failing", "failed") : f.fresh ? badge("fresh", "succeeded") : badge("stale", "paused"))),
          ),
          "feeds",
        )
      : notice("No feed has reported yet.", "warn"),
    h("h2", {}, "On-prem queue pressure"),
    pressure.length
      ? table(
          ["Cluster", "GPU", "Busy", "Free / total", "Queued jobs (GPUs)", "Expected wait"],
          pressure.map((r) =>
            h(
              "tr",
              {},
              h("td", {}, r.source),
              h("td", {}, r.accelerator),
              h("td", {}, bar(ratio(r.total_gpus - r.free_gpus, r.total_gpus), "busy GPUs", { warn: 0.9 })),
              h("td", { class: "num" }, `${r.free_gpus} / ${r.total_gpus}`),
              h("td", { class: "num" }, `${r.pending_jobs} (${r.pending_gpus})`),
              h("td", { class: "num" }, `${r.expected_wait_hours.toFixed(1)} h`),
            ),
          ),
          "pressure",
        )
      : notice("No on-prem cluster reports pressure.", "info"),
    h("h2", {}, "Cheapest per GPU type (USD per GPU-hour)"),
    table(
      ["GPU", "Pools", "Spot", "On-demand", "On-prem"],
      [...byAcc.entries()].sort().map(([acc, g]) =>
        h(
          "tr",
          {},
          h("td", {}, acc),
          h("td", { class: "num" }, g.pools),
          ...[g.spot, g.od, g.onprem].map((p) => h("td", { class: "num", title: p ? p.key : "" }, p ? usd(p.usd_per_gpu_hour) : "—")),
        ),
      ),
      "cheapest",
    ),
    h("div", { class: "title" }, h("h2", {}, `All pools (${pools.length})`), filter),
    table(["Pool", "GPUs", "Capacity", "USD/h", "USD/GPU-h", "Price age", "Interruption risk", "Wait", "Available"], poolRows, "pools"),
  );
  ready("pools");
}

// ---------- costs ----------
//
// Amounts on this page come rounded by the broker (each row's `display`: cents, half-even, every column adding up
// to its total: the same rule as the CSV/HTML/PDF reports); sums of them are added here in integer cents, never in
// binary floats. Reports are made by POST /v1/report-runs and downloaded with the key (fetch + a blob link: a plain
// link could not carry the Authorization header).

const FORMATS = [["csv", "CSV"], ["focus", "FOCUS"], ["html", "HTML"], ["pdf", "PDF"]];
const FORMAT_LABEL = Object.fromEntries(FORMATS);
const SCHEDULE_PERIODS = [
  ["previous_month", "previous month"],
  ["month_to_date", "month to date"],
  ["previous_week", "previous week"],
  ["previous_day", "previous day"],
];

function cents(text) {
  const s = String(text || "0").trim();
  const negative = s.startsWith("-");
  const [whole, frac = ""] = s.replace(/^-/, "").split(".");
  const c = Number(whole || 0) * 100 + Number((frac + "00").slice(0, 2));
  return negative ? -c : c;
}

function fromCents(c) {
  const a = Math.abs(c);
  return `${c < 0 ? "-" : ""}${Math.floor(a / 100)}.${String(a % 100).padStart(2, "0")}`;
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  return n < 1048576 ? `${(n / 1024).toFixed(1)} kB` : `${(n / 1048576).toFixed(1)} MB`;
}

async function downloadRun(run) {
  const response = await fetch(run.download_url, { headers: { Authorization: `Bearer ${state.key}` } });
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try {
      { const problem = await response.json(); message = problem.detail || problem.message || message; }
    } catch {
      // not JSON: keep the status
    }
    throw new ApiError(response.status, message);
  }
  const url = URL.createObjectURL(await response.blob());
  const link = h("a", { href: url, download: run.filename, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

async function renderCosts() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const range = params.get("range") || "month";
  const by = params.get("by") === "team" ? "team" : "provider";
  // "to" is left to the broker (its clock, not this browser's); this month: `from` too (the API's default window)
  const span =
    range === "30d" ? `from=${encodeURIComponent(new Date(Date.now() - 30 * 86400e3).toISOString())}` : "";
  const picker = h(
    "div",
    { class: "tabs" },
    [["month", "This month"], ["30d", "Last 30 days"]].map(([value, label]) =>
      h("a", { href: `#/costs?range=${value}&by=${by}`, class: value === range ? "active" : "" }, label),
    ),
  );
  const byPicker = h(
    "div",
    { class: "tabs", "data-testid": "chart-by" },
    [["provider", "by provider"], ["team", "by team"]].map(([value, label]) =>
      h("a", { href: `#/costs?range=${range}&by=${value}`, class: value === by ? "active" : "" }, label),
    ),
  );
  const optional = (promise) => promise.catch((exc) => (exc.status === 404 ? null : Promise.reject(exc)));
  let byTeam, byDay, budgets, month;
  try {
    [byTeam, byDay, budgets, month] = await Promise.all([
      api(`/v1/costs?group_by=team,provider&${span}`),
      api(`/v1/costs?group_by=day,${by}&${span}`),
      optional(api("/v1/budgets").then(items)),
      range === "month" ? null : api("/v1/costs?group_by=month"), // this month's window, from the broker's clock
    ]);
  } catch (exc) {
    if (exc.status === 404) {
      mount(h("div", { class: "title" }, h("h1", {}, "Costs"), picker), notice("The costs API is not available on this broker (GET /v1/costs answered 404).", "warn", "costs-unavailable"));
      ready("costs");
      return;
    }
    throw exc;
  }
  const total = byTeam.total || {};
  const shown = total.display || {};
  const savingsPct = ratio(shown.savings_usd, shown.on_demand_usd) * 100;
  const net = fromCents(cents(shown.on_demand_usd) - cents(shown.cost_usd));
  const reports = h("div", { "data-testid": "reports" });
  const thisMonth = ((month || byTeam).from || "").slice(0, 7);
  mount(
    h("div", { class: "title" }, h("h1", {}, "Costs"), picker),
    h("p", { class: "muted", "data-testid": "cost-period" }, `${byTeam.title || ""} · `, byTeam.as_of ? `data as of ${when(byTeam.as_of)}` : "no ledger entries in this period"),
    h(
      "div",
      { class: "cards" },
      h("section", { class: "card" }, h("h2", {}, "Spend"), h("p", { class: "big", "data-testid": "cost-total" }, usd(shown.cost_usd))),
      h("section", { class: "card" }, h("h2", {}, "On-demand equivalent"), h("p", { class: "big", "data-testid": "cost-on-demand" }, usd(shown.on_demand_usd)), h("p", { class: "muted small" }, "what the useful work would have cost on on-demand")),
      h("section", { class: "card" }, h("h2", {}, "Saved by spot"), h("p", { class: "big good", "data-testid": "cost-savings" }, usd(shown.savings_usd)), h("p", { class: "muted small" }, `${savingsPct.toFixed(1)}% below on-demand, on useful work`)),
      h("section", { class: "card" }, h("h2", {}, "Lost to preemptions"), h("p", { class: "big bad", "data-testid": "cost-wasted" }, usd(shown.wasted_usd)), h("p", { class: "muted small", "data-testid": "cost-net" }, `net saving ${usd(net)}`)),
    ),
    h("div", { class: "title" }, h("h2", {}, `Spend per day by ${by}`), byPicker),
    dayChart(byDay, by),
    h("h2", {}, "By team and provider"),
    costsTable(byTeam),
    h("h2", {}, "Reports"),
    reports,
    h("h2", {}, "Budgets"),
    budgets === null
      ? notice("The budgets API is not available on this broker.", "warn", "budgets-unavailable")
      : budgets.length
        ? table(
            ["Budget", "Period", "Spent / amount", "Forecast", "Thresholds", "Fired"],
            budgets.map((b) =>
              h(
                "tr",
                {},
                h("td", {}, `${typeof b.scope === "string" ? b.scope : JSON.stringify(b.scope)} ${b.name}`, b.hard ? " " : "", b.hard ? badge("hard", "failed") : ""),
                h("td", { class: "small" }, `${b.period} · ${when(b.period_start || b.starts_at)} → ${when(b.period_end || b.ends_at)}`),
                h("td", {}, bar(ratio(b.spent_usd, b.amount_usd), "spent against budget", { marks: b.thresholds || [] }), `${usd(b.spent_usd)} of ${usd(b.amount_usd)}`),
                h("td", { class: "num" }, usd(b.forecast_usd)),
                h("td", {}, (b.thresholds || []).map((t) => `${t}%`).join(" ")),
                h("td", {}, (b.fired || []).map((t) => badge(`${t}%`, "paused"))),
              ),
            ),
            "budgets",
          )
        : notice("No budgets defined.", "info"),
  );
  await renderReports(reports, thisMonth);
  ready("costs");
}

function costsTable(data) {
  const rows = data.rows || [];
  const cells = (d) => [
    h("td", { class: "num" }, usd(d.cost_usd)),
    h("td", { class: "num" }, usd(d.wasted_usd)),
    h("td", { class: "num" }, usd(d.on_demand_usd)),
    h("td", { class: "num good" }, usd(d.savings_usd)),
  ];
  const t = data.total || {};
  return h(
    "table",
    { "data-testid": "costs-by-team" },
    h("thead", {}, h("tr", {}, ["Team", "Provider", "Spend", "Lost to preemptions", "On-demand equivalent", "Saved by spot", "Entries"].map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, h("td", {}, r.team), h("td", {}, r.provider), ...cells(r.display || {}), h("td", { class: "num" }, r.entries)))),
    h("tfoot", {}, h("tr", { "data-testid": "costs-total" }, h("td", {}, "Total"), h("td", {}), ...cells(t.display || {}), h("td", { class: "num" }, t.entries ?? ""))),
  );
}

// The reports block: export now, the schedules and the runs made (finance and admin keys manage them all). After
// an export or a schedule change only the lists are redrawn (the export panel keeps its status line).
async function renderReports(container, thisMonth) {
  const lists = h("div", { class: "cards" });
  const runs = h("div", {});
  const load = async () => {
    const view = state.view;
    const [madeRuns, schedules] = await Promise.all([
      api("/v1/report-runs?limit=20").then(items).catch((exc) => (exc.status === 404 ? null : Promise.reject(exc))),
      api("/v1/report-schedules").then(items).catch((exc) => (exc.status === 404 ? null : Promise.reject(exc))),
    ]);
    if (view !== state.view) return false;
    if (madeRuns === null) {
      container.replaceChildren(notice("The reports API is not available on this broker.", "warn", "reports-unavailable"));
      return false;
    }
    lists.replaceChildren(schedulesPanel(schedules || [], load));
    runs.replaceChildren(runsTable(madeRuns));
    return true;
  };
  if (await load()) {
    container.replaceChildren(h("div", { class: "cards" }, exportPanel(thisMonth, load), lists), h("h3", {}, "Report runs"), runs);
  }
}

function exportPanel(thisMonth, refresh) {
  const status = h("p", { class: "small", "data-testid": "export-status", role: "status" });
  const month = h("input", { type: "month", value: thisMonth, max: thisMonth, required: true, "data-testid": "export-month" });
  const buttons = FORMATS.map(([fmt, label]) =>
    h("button", { type: "button", "data-testid": `export-${fmt}`, onclick: () => produce(fmt, label) }, label),
  );
  async function produce(fmt, label) {
    buttons.forEach((b) => (b.disabled = true));
    status.className = "small";
    status.textContent = `Producing the ${label} report of ${month.value}…`;
    try {
      const run = await api("/v1/report-runs", { method: "POST", body: { period: month.value, format: fmt } });
      await downloadRun(run);
      status.textContent = `Downloaded ${run.filename} (${bytes(run.size_bytes)}): ${run.period_title}.`;
      await refresh();
    } catch (exc) {
      status.className = "notice error small";
      status.textContent = `Export failed: ${exc.message}`;
    } finally {
      buttons.forEach((b) => (b.disabled = false));
    }
  }
  return h(
    "section",
    { class: "card", "data-testid": "export" },
    h("h2", {}, "Export a month"),
    h("div", { class: "row" }, h("label", {}, "Month ", month), ...buttons),
    h("p", { class: "hint" }, "The current month is reported to date. CSV, HTML and PDF are in cents that add up to the totals; FOCUS 1.2 keeps the ledger's exact amounts."),
    status,
  );
}

function runsTable(runs) {
  if (!runs.length) return notice("No report runs yet.", "info", "report-runs-empty");
  return table(
    ["Made", "Period", "Format", "State", "Sent to", "Size", ""],
    runs.map((r) => {
      const error = h("div", { class: "small bad" }, r.error || "");
      const download = h(
        "button",
        {
          type: "button",
          class: "secondary",
          "data-testid": "run-download",
          onclick: async () => {
            error.textContent = "";
            try {
              await downloadRun(r);
            } catch (exc) {
              error.textContent = `Download failed: ${exc.message}`;
            }
          },
        },
        "Download",
      );
      return h(
        "tr",
        { "data-run": r.id },
        h("td", { class: "small" }, when(r.created_at), r.schedule_id ? h("div", { class: "muted" }, "scheduled") : null),
        h("td", {}, r.period_title || `${when(r.period_start)} → ${when(r.period_end)}`),
        h("td", {}, FORMAT_LABEL[r.format] || r.format),
        h("td", {}, badge(r.state), error),
        h("td", { class: "small" }, r.delivered_to || r.delivery_state || "—"),
        h("td", { class: "num" }, r.size_bytes ? bytes(r.size_bytes) : "—"),
        h("td", {}, r.size_bytes ? download : ""),
      );
    }),
    "report-runs",
  );
}

function destinationText(d) {
  if (!d || !d.type) return "kept here (download)";
  if (d.type === "email") return `email ${(d.to || []).join(", ")}`;
  if (d.type === "webhook") return `webhook ${String(d.url || "").replace(/\?.*/, "")}`;
  if (d.type === "s3") return `s3://${d.bucket}/${d.prefix || ""}`;
  if (d.type === "directory") return `directory ${d.path}`;
  return d.type;
}

function schedulesPanel(schedules, refresh) {
  const error = h("p", { class: "notice error small", "data-testid": "schedule-error", hidden: true });
  const field = (label, input) => h("label", {}, label, input);
  const select = (name, options, value) =>
    h("select", { name, "data-testid": `schedule-${name}` }, options.map(([v, l]) => h("option", { value: v, selected: v === value }, l)));
  const form = h(
    "form",
    {
      class: "grid",
      "data-testid": "schedule-form",
      onsubmit: async (event) => {
        event.preventDefault();
        const data = Object.fromEntries(new FormData(form).entries());
        const where = String(data.destination_value || "").trim();
        const destination =
          data.destination_type === "email" ? { type: "email", to: where.split(",").map((x) => x.trim()).filter(Boolean) }
          : data.destination_type === "webhook" ? { type: "webhook", url: where }
          : data.destination_type === "directory" ? { type: "directory", path: where }
          : data.destination_type === "s3" ? { type: "s3", bucket: where.split("/")[0], prefix: where.split("/").slice(1).join("/") }
          : {};
        try {
          await api("/v1/report-schedules", {
            method: "POST",
            body: { name: data.name, cron: data.cron, timezone: data.timezone, period: data.period, format: data.format, destination },
          });
          await refresh();
        } catch (exc) {
          error.textContent = exc.message;
          error.hidden = false;
        }
      },
    },
    field("Name", h("input", { name: "name", required: true, maxlength: 128, "data-testid": "schedule-name" })),
    field("Cron", h("input", { name: "cron", required: true, value: "0 6 1 * *", "data-testid": "schedule-cron" })),
    field("Time zone", h("input", { name: "timezone", required: true, value: "UTC", "data-testid": "schedule-timezone" })),
    field("Period", select("period", SCHEDULE_PERIODS, "previous_month")),
    field("Format", select("format", FORMATS, "pdf")),
    field("Send to", select("destination_type", [["", "nowhere (download)"], ["email", "email"], ["webhook", "webhook"], ["directory", "directory"], ["s3", "S3 bucket/prefix"]], "")),
    field("Address, URL, path or bucket/prefix", h("input", { name: "destination_value", "data-testid": "schedule-destination" })),
    h("div", { class: "actions" }, h("button", { type: "submit", "data-testid": "schedule-create" }, "Create schedule")),
    error,
  );
  const rows = schedules.map((s) => {
    const remove = h(
      "button",
      {
        type: "button",
        class: "danger",
        "data-testid": "schedule-delete",
        onclick: async () => {
          if (remove.dataset.armed !== "yes") {
            remove.dataset.armed = "yes"; // a second click confirms (no blocking dialog)
            remove.textContent = "Delete: sure?";
            return;
          }
          try {
            await api(`/v1/report-schedules/${encodeURIComponent(s.id)}`, { method: "DELETE" });
            await refresh();
          } catch (exc) {
            error.textContent = exc.message;
            error.hidden = false;
          }
        },
      },
      "Delete",
    );
    const period = Object.fromEntries(SCHEDULE_PERIODS)[s.period] || s.period;
    return h(
      "tr",
      { "data-schedule": s.id },
      h("td", {}, s.name, s.enabled ? "" : h("span", { class: "muted" }, " (paused)")),
      h("td", { class: "small" }, `${s.cron} (${s.timezone})`, h("div", { class: "muted" }, `next ${when(s.next_run_at)}`)),
      h("td", {}, `${FORMAT_LABEL[s.format] || s.format}, ${period}`),
      h("td", { class: "small" }, destinationText(s.destination)),
      h("td", {}, remove),
    );
  });
  return h(
    "section",
    { class: "card", "data-testid": "schedules" },
    h("h2", {}, "Schedules"),
    schedules.length
      ? table(["Name", "When", "Report", "Sent to", ""], rows, "report-schedules")
      : notice("No report schedules.", "info", "report-schedules-empty"),
    h("details", {}, h("summary", { "data-testid": "schedule-toggle" }, "New schedule"), form),
  );
}

function tickStepCents(maxCents) {
  // The y axis's step, in whole cents: the smallest of 1, 2, 2.5, 3, 4, 5, 6 and 8 times a power of ten whose four
  // steps reach the highest day. Every tick is then a whole number of cents ($0.05, $0.10, $0.15), never $0.0625
  // shown as $0.06 beside $0.13.
  if (!(maxCents > 0)) return 25;
  const raw = maxCents / 4;
  for (let p = 10 ** Math.floor(Math.log10(raw)); ; p *= 10) {
    for (const m of [1, 2, 2.5, 3, 4, 5, 6, 8]) {
      const step = Math.round(m * p * 1e6) / 1e6;
      if (step >= 1 && Number.isInteger(step) && step >= raw - 1e-9) return step;
    }
  }
}

function axisLabel(cents, stepCents) {
  const places = stepCents % 100 === 0 ? 0 : 2;
  return `$${(cents / 100).toLocaleString("en-US", { minimumFractionDigits: places, maximumFractionDigits: places })}`;
}

function daysBetween(from, to) {
  // every UTC day of the window [from, to) (ISO 8601 times), as YYYY-MM-DD
  const out = [];
  const end = Date.parse(String(to).replace(/\.\d+/, ""));
  const last = Number.isNaN(end) ? String(to).slice(0, 10) : new Date(end - 1).toISOString().slice(0, 10);
  for (let d = new Date(`${String(from).slice(0, 10)}T00:00:00Z`); out.length < 400; d.setUTCDate(d.getUTCDate() + 1)) {
    const day = d.toISOString().slice(0, 10);
    if (day > last) break;
    out.push(day);
  }
  return out;
}

function dayChart(data, by) {
  // Stacked bars per day (SVG), one colour per provider (or team), a y axis in dollars with gridlines, every
  // segment's amount as a tooltip and, where there is room, each day's total above its bar. Every day of the
  // window has its slot, spend or not.
  const rows = data.rows || [];
  const names = [...new Set(rows.map((r) => r[by]))].sort();
  if (!rows.length) return notice("No spend in this period.", "info");
  const days = [...new Set([...daysBetween(data.from, data.to), ...rows.map((r) => r.day)])].sort();
  const cell = new Map(rows.map((r) => [`${r.day}|${r[by]}`, r]));
  const dayCents = days.map((d) => names.reduce((sum, n) => sum + cents((cell.get(`${d}|${n}`) || { display: {} }).display.cost_usd), 0));
  const step = tickStepCents(Math.max(0, ...dayCents));
  const top = (4 * step) / 100; // dollars at the top of the axis
  const W = 760, H = 250, L = 64, R = 12, T = 22, B = 26;
  const plotW = W - L - R, plotH = H - T - B;
  const slot = plotW / days.length, bw = Math.min(48, Math.max(2, slot * 0.8));
  const ns = "http://www.w3.org/2000/svg";
  const el = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "data-testid": "spend-chart" });
  svg.append(el("title", {}, `Spend per day by ${by}`), el("text", { x: L - 6, y: 12, class: "ylabel" }, "USD per day"));
  for (let k = 0; k <= 4; k += 1) {
    const y = T + plotH - (plotH * k) / 4;
    svg.append(el("line", { x1: L, x2: W - R, y1: y, y2: y, class: k ? "grid" : "baseline" }));
    svg.append(el("text", { x: L - 6, y: y + 4, class: "yaxis", "data-testid": "y-tick" }, axisLabel(step * k, step)));
  }
  const labelEvery = Math.ceil(days.length / 12);
  days.forEach((d, i) => {
    const x = L + i * slot + (slot - bw) / 2;
    let y = T + plotH;
    names.forEach((n, j) => {
      const row = cell.get(`${d}|${n}`);
      const c = row ? cents(row.display.cost_usd) : 0;
      if (c <= 0) return;
      const hgt = (c / 100 / top) * plotH;
      y -= hgt;
      const rect = el("rect", { x, y, width: bw, height: hgt, class: `series s${j % 6}` });
      rect.append(el("title", {}, `${d} ${n}: ${usd(row.display.cost_usd)} (day total ${usd(fromCents(dayCents[i]))})`));
      svg.append(rect);
    });
    const value = usd(fromCents(dayCents[i]));
    const roomy = usd(fromCents(Math.max(...dayCents))).length * 6 <= slot; // else only the highest day is labelled
    if (dayCents[i] > 0 && (roomy || i === dayCents.indexOf(Math.max(...dayCents)))) {
      svg.append(el("text", { x: x + bw / 2, y: y - 4, class: "value", "data-testid": "bar-value" }, value));
    }
    if (i % labelEvery === 0) svg.append(el("text", { x: x + bw / 2, y: T + plotH + 14, class: "axis" }, String(d).slice(5)));
  });
  const peak = dayCents.indexOf(Math.max(...dayCents));
  const totalCents = dayCents.reduce((a, b) => a + b, 0);
  const legend = h("p", { class: "legend small" }, names.map((n, j) => h("span", { class: `key s${j % 6}` }, n)));
  return h(
    "div",
    { class: "card" },
    svg,
    legend,
    h("p", { class: "muted small", "data-testid": "chart-summary" }, `${days[0]} → ${days[days.length - 1]} · total ${usd(fromCents(totalCents))} · highest day ${days[peak]}: ${usd(fromCents(dayCents[peak]))}`),
  );
}

// ---------- start ----------

window.addEventListener("hashchange", route);
document.getElementById("signout").addEventListener("click", () => signOut("Signed out."));
route();
