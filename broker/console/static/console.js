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

// Money arrives as decimal strings; round them as strings (half up), never through binary floats.
function usd(value, places) {
  if (value === null || value === undefined || value === "") return "—";
  let s = String(value).trim();
  const negative = s.startsWith("-");
  if (negative) s = s.slice(1);
  let [whole, frac = ""] = s.split(".");
  if (places === undefined) places = whole === "0" && !/^0*$/.test(frac) && frac.slice(0, 2) === "00" ? 4 : 2;
  const digits = (whole + (frac + "0".repeat(places)).slice(0, places)).split("").map(Number);
  if (Number(frac[places] || 0) >= 5) {
    let i = digits.length - 1;
    while (i >= 0 && digits[i] === 9) digits[i--] = 0;
    if (i < 0) digits.unshift(1);
    else digits[i] += 1;
  }
  const intPart = digits.slice(0, digits.length - places).join("").replace(/^0+(?=\d)/, "") || "0";
  const grouped = intPart.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  const fracPart = places ? "." + digits.slice(digits.length - places).join("") : "";
  return (negative ? "-$" : "$") + grouped + fracPart;
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
    throw new ApiError(response.status, (body && body.message) || `HTTP ${response.status}`);
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

function collapseEvents(events) {
  // Cost accruals come every tick; fold each run of them into one line so the timeline stays readable.
  const out = [];
  for (const e of events) {
    const last = out[out.length - 1];
    if (e.kind === "cost_accrued" && last && last.kind === "cost_accrued") {
      last.count += 1;
      last.to = e.at;
      last.spent = e.data.spent_usd;
    } else {
      out.push({ ...e, count: 1, from: e.at, to: e.at, spent: e.data && e.data.spent_usd });
    }
  }
  return out;
}

async function renderJob(id) {
  const view = state.view;
  const head = h("div", { class: "title" });
  const cards = h("div", { class: "cards" });
  const timeline = h("ol", { class: "timeline", "data-testid": "timeline" });
  mount(h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")), head, cards, h("h2", {}, "Timeline"), timeline);
  let job;
  async function load() {
    let events;
    try {
      [job, events] = await Promise.all([api(`/v1/jobs/${encodeURIComponent(id)}`), api(`/v1/jobs/${encodeURIComponent(id)}/events`)]);
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
        bar(1 - ratio(job.remaining_work_hours, job.work_hours), "work done", { warn: 2 }),
        h("p", { class: "small" }, `${job.remaining_work_hours} of ${job.work_hours} h left · ${job.attempts} attempt(s)`),
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
    ready("job");
    // An ended job's last accrual may land a moment after its state changes: poll until the spend settles too.
    const settled = TERMINAL.has(job.state) && job.spent_usd === lastSpent;
    lastSpent = job.spent_usd;
    return !settled;
  }
  let lastSpent = null;
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
    api("/v1/pools?limit=5000"),
    api("/v1/pressure"),
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
  let byTeam, byDay, budgets;
  try {
    [byTeam, byDay, budgets] = await Promise.all([
      api(`/v1/costs?group_by=team,provider&${span}`),
      api(`/v1/costs?group_by=day,${by}&${span}`),
      api("/v1/budgets").catch((exc) => (exc.status === 404 ? null : Promise.reject(exc))),
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
  const savingsPct = ratio(total.savings_usd, total.on_demand_usd) * 100;
  mount(
    h("div", { class: "title" }, h("h1", {}, "Costs"), picker),
    h(
      "div",
      { class: "cards" },
      h("section", { class: "card" }, h("h2", {}, "Spend"), h("p", { class: "big", "data-testid": "cost-total" }, usd(total.cost_usd))),
      h("section", { class: "card" }, h("h2", {}, "On-demand equivalent"), h("p", { class: "big" }, usd(total.on_demand_usd))),
      h("section", { class: "card" }, h("h2", {}, "Spot savings"), h("p", { class: "big good", "data-testid": "cost-savings" }, usd(total.savings_usd)), h("p", { class: "muted small" }, `${savingsPct.toFixed(1)}% below on-demand`)),
    ),
    h("div", { class: "title" }, h("h2", {}, `Spend per day by ${by}`), byPicker),
    dayChart(byDay.rows || [], by),
    h("h2", {}, "By team and provider"),
    table(
      ["Team", "Provider", "Spend", "On-demand equivalent", "Savings", "Entries"],
      (byTeam.rows || []).map((r) =>
        h("tr", {}, h("td", {}, r.team), h("td", {}, r.provider), h("td", { class: "num" }, usd(r.cost_usd)), h("td", { class: "num" }, usd(r.on_demand_usd)), h("td", { class: "num good" }, usd(r.savings_usd)), h("td", { class: "num" }, r.entries)),
      ),
      "costs-by-team",
    ),
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
  ready("costs");
}

function dayChart(rows, by) {
  // Stacked bars per day (SVG), one colour per provider (or team).
  const days = [...new Set(rows.map((r) => r.day))].sort();
  const providers = [...new Set(rows.map((r) => r[by]))].sort();
  if (!days.length) return notice("No spend in this period.", "info");
  const totals = days.map((d) => rows.filter((r) => r.day === d).reduce((s, r) => s + Number(r.cost_usd), 0));
  const max = Math.max(...totals) || 1;
  const W = 720, H = 180, gap = 2, bw = Math.min(48, Math.max(2, W / days.length - gap));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H + 20}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("data-testid", "spend-chart");
  days.forEach((d, i) => {
    let y = H;
    providers.forEach((p, j) => {
      const row = rows.find((r) => r.day === d && r[by] === p);
      if (!row) return;
      const hgt = (Number(row.cost_usd) / max) * H;
      y -= hgt;
      const rect = document.createElementNS(ns, "rect");
      rect.setAttribute("x", String(i * (bw + gap)));
      rect.setAttribute("y", String(y));
      rect.setAttribute("width", String(bw));
      rect.setAttribute("height", String(Math.max(0, hgt)));
      rect.setAttribute("class", `series s${j % 6}`);
      const title = document.createElementNS(ns, "title");
      title.textContent = `${d} ${p}: ${usd(row.cost_usd)}`;
      rect.append(title);
      svg.append(rect);
    });
    if (days.length <= 31 && (days.length <= 16 || i % 2 === 0)) {
      const label = document.createElementNS(ns, "text");
      label.setAttribute("x", String(i * (bw + gap) + bw / 2));
      label.setAttribute("y", String(H + 14));
      label.setAttribute("class", "axis");
      label.textContent = String(d).slice(5);
      svg.append(label);
    }
  });
  const legend = h("p", { class: "legend small" }, providers.map((p, j) => h("span", { class: `key s${j % 6}` }, p)));
  return h("div", { class: "card" }, svg, legend, h("p", { class: "muted small" }, `${days[0]} → ${days[days.length - 1]}`));
}

// ---------- start ----------

window.addEventListener("hashchange", route);
document.getElementById("signout").addEventListener("click", () => signOut("Signed out."));
route();
