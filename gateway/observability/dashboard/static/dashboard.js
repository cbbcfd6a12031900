// The dashboard page: asks for a key once (session storage), polls /dashboard/api/data and draws every panel.
// Every number is an element with data-metric (a stable name) and data-value (the exact figure received).

import { PALETTE, columns, hbars, legend, timeColumns, timeLines } from "./charts.js";
import { renderKeys } from "./keys.js";

const KEY = "spillgate.dashboard.key";
const BUCKETS = { 900: 60, 3600: 60, 21600: 300, 86400: 900 }; // whole minutes: the ledger keeps minutes
const KINDS = [
  { key: "replica", name: "self-hosted", color: PALETTE[0] },
  { key: "hosted", name: "hosted", color: PALETTE[1] },
];
const QUANTILES = [
  { key: "p50", name: "p50", color: "#8ecae6" },
  { key: "p95", name: "p95", color: "#219ebc" },
  { key: "p99", name: "p99", color: "#023047" },
];

const $ = (id) => document.getElementById(id);
let timer = null;
let refreshes = 0;

// Formatting ---------------------------------------------------------------------------------------------

// Money to the cent from $1, to a hundredth of a cent below: smaller amounts (float noise included) are $0.00.
function usd(v) {
  if (v === null || v === undefined) return "-";
  const a = Math.abs(v);
  if (a < 0.00005) return "$0.00";
  const sign = v < 0 ? "-" : "";
  if (a < 1) return `${sign}$${a.toFixed(4)}`;
  return `${sign}$${a.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;
}
const perMtok = (v) => (v === null || v === undefined ? "-" : `${usd(v)}/Mtok`);
const ms = (v) => (v === null || v === undefined ? "-" : `${Number((v * 1000).toPrecision(4))} ms`);
const count = (v) => (v === null || v === undefined ? "-" : String(Math.round(v)));
const pct = (v) => (v === null || v === undefined ? "-" : `${(v * 100).toFixed(1)}%`);
const rps = (v) => (v === null || v === undefined ? "-" : `${Number(v.toPrecision(3))}/s`);
const FORMATS = { usd, ms, count, pct, perMtok, rps };

// DOM helpers --------------------------------------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

/** A number as text, tagged with its metric name and exact value for anyone checking the page. */
function num(value, format, metric, tag = "span") {
  const props = { class: "num" };
  if (metric) {
    props["data-metric"] = metric;
    props["data-value"] = value === null || value === undefined ? "" : String(value);
  }
  return el(tag, props, FORMATS[format](value));
}

function stat(label, value, format, metric) {
  return el("div", { class: "stat" }, el("span", { class: "label" }, label), num(value, format, metric));
}

function table(headers, rows) {
  const head = el("tr", {}, ...headers.map((h) => el("th", {}, h)));
  const body = rows.map(({ cells, class: cls }) =>
    el("tr", cls ? { class: cls } : {}, ...cells.map((c) =>
      c instanceof Node ? (c.tagName === "TD" ? c : el("td", {}, c)) : el("td", {}, String(c)))));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
}

const cell = (value, format, metric) => num(value, format, metric, "td");
const message = (text) => el("p", { class: "message" }, text);
const heading = (text) => el("h3", {}, text);

function fill(panel, ...children) {
  $(panel).querySelector(".body").replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}

/** The window as evenly spaced buckets; `slot(t)` is the bucket a ledger row falls in, whatever its alignment. */
function grid(l) {
  const count = Math.max(1, Math.floor((l.until - l.since) / l.bucket_s) + 1);
  return {
    count,
    end: l.since + count * l.bucket_s,
    start: (i) => l.since + i * l.bucket_s,
    slot: (t) => Math.min(count - 1, Math.max(0, Math.floor((t - l.since) / l.bucket_s))),
  };
}

/** The ledger totals' period as a label: "this month", or "ledger total" when the ledger does not say. */
function period(l) {
  if (!l.totals_period) return "ledger total";
  return l.totals_period === "all" ? "all time" : `this ${l.totals_period}`;
}

// Panels -------------------------------------------------------------------------------------------------

function renderSpend(data) {
  const s = data.spend;
  if (!s) {
    const l = data.ledger;
    if (!l.configured || l.error) return fill("panel-spend", message(l.message || l.error));
    return fill("panel-spend",
      el("div", { class: "stats" },
        stat("in window", l.window.usd, "usd", "ledger.window.usd"),
        stat("self-hosted", l.window.replica_usd, "usd", "ledger.window.replica_usd"),
        stat("hosted", l.window.hosted_usd, "usd", "ledger.window.hosted_usd"),
        "usd" in l.totals ? stat(period(l), l.totals.usd, "usd", "ledger.totals.usd") : null),
      hbars("spend-kind", [{ label: data.viewer.tenant, values: { replica: l.window.replica_usd, hosted: l.window.hosted_usd } }],
        KINDS, { format: usd }),
      legend(KINDS));
  }
  const tenants = Object.entries(s.by_tenant).sort((a, b) => b[1] - a[1]);
  fill("panel-spend",
    el("div", { class: "stats" },
      stat("total", s.total_usd, "usd", "spend.total"),
      stat("self-hosted", s.by_kind.replica ?? 0, "usd", "spend.kind.replica"),
      stat("hosted", s.by_kind.hosted ?? 0, "usd", "spend.kind.hosted")),
    hbars("spend-kind", [{ label: "all tenants", values: s.by_kind }], KINDS, { format: usd }),
    legend(KINDS),
    heading("by tenant label"),
    tenants.length
      ? hbars("spend-tenant", tenants.map(([t, v]) => ({ label: t, values: { usd: v } })),
        [{ key: "usd", name: "spend", color: PALETTE[2] }], { format: usd })
      : message("no spend yet"),
    table(["tenant", "spend"], tenants.map(([t, v]) => ({ cells: [t, cell(v, "usd", `spend.tenant.${t}`)] }))),
    data.tenant_labels ? null : el("p", { class: "muted" },
      "Metrics carry tenant=\"all\" (metrics.tenant_labels is off); per-tenant spend is in the ledger panel below."));
}

function renderRent(data) {
  const r = data.rent;
  if (!r) return fill("panel-rent", message(data.restricted));
  if (!r.pools.length) return fill("panel-rent", message("no replica pool is configured"));
  const parts = [
    el("div", { class: "stats" },
      stat("rent since start", r.rent_usd, "usd", "rent.total"),
      stat("idle", r.idle_usd, "usd", "rent.idle")),
    table(["pool", "replicas", "rent", "idle", "utilization", "cost at that use", "hosted, same tokens", "break-even"],
      r.pools.map((p) => ({
        cells: [p.pool, cell(p.replicas, "count", `rent.${p.pool}.replicas`), cell(p.rent_usd, "usd", `rent.${p.pool}.rent`),
          cell(p.idle_usd, "usd", `rent.${p.pool}.idle`), cell(p.utilization, "pct", `rent.${p.pool}.utilization`),
          cell(p.usd_per_mtok, "perMtok", `rent.${p.pool}.usd_per_mtok`),
          cell(p.hosted_usd_per_mtok, "perMtok", `rent.${p.pool}.hosted_usd_per_mtok`),
          cell(p.break_even_utilization, "pct", `rent.${p.pool}.break_even`)],
      }))),
  ];
  const tenants = Object.entries(r.by_tenant);
  if (tenants.length) {
    parts.push(heading("rent by tenant, by share of GPU time"),
      table(["tenant", "share of rent"], tenants.map(([t, v]) => ({ cells: [t, cell(v, "usd", `rent.tenant.${t}`)] }))));
  }
  fill("panel-rent", ...parts);
}

function renderCapacity(data) {
  const c = data.capacity;
  if (!c) return fill("panel-capacity", message(data.restricted));
  if (!c.pools.length) return fill("panel-capacity", message("no replica pool is configured"));
  const why = { demand: "peak demand", pressure: "sustained pressure", min_replicas: "warm minimum" };
  fill("panel-capacity",
    table(["pool", "replicas", "recommended", "because", "peak demand", "per replica", "headroom", "queued",
      "KV", "pressure for", "overflow spills", "their cost", "refused"],
    c.pools.map((p) => ({
      cells: [p.pool, cell(p.replicas, "count", `capacity.${p.pool}.replicas`),
        cell(p.recommended_replicas, "count", `capacity.${p.pool}.recommended`), why[p.reason] || p.reason,
        cell(p.demand.peak_rps, "rps", `capacity.${p.pool}.peak_rps`),
        el("td", {}, num(p.throughput.rps_per_replica, "rps", `capacity.${p.pool}.rps_per_replica`),
          ` (${p.throughput.source})`),
        cell(p.headroom, "pct", `capacity.${p.pool}.headroom`),
        cell(p.pressure.queue_depth, "count", `capacity.${p.pool}.queued`),
        cell(p.pressure.kv_usage, "pct", `capacity.${p.pool}.kv_usage`),
        el("td", {}, `${Math.round(p.pressure.for_s)} of ${Math.round(p.pressure.sustain_s)} s`),
        cell(p.demand.overflow_requests, "count", `capacity.${p.pool}.overflow_requests`),
        cell(p.demand.overflow_usd, "usd", `capacity.${p.pool}.overflow_usd`),
        cell(p.demand.refused_requests, "count", `capacity.${p.pool}.refused_requests`)],
    }))),
    message(`peak: the highest mean arrival rate over ${c.rate_window_s} s within the last ${c.lookback_s} s; ` +
      "spilled overflow is what not having the replicas cost meanwhile; refused: turned away as over capacity " +
      "(429), counted as demand too"));
}

function renderSavings(data) {
  const s = data.savings;
  const l = data.ledger;
  const parts = [];
  if (s) {
    parts.push(
      el("div", { class: "stats" },
        stat("saved", s.savings_usd, "usd", "savings.total"),
        stat("hosted only would cost", s.hosted_equivalent_usd, "usd", "savings.equivalent"),
        stat("rent and hosted spend", s.spend_usd, "usd", "savings.spend"),
        stat("saved share", s.savings_ratio, "pct", "savings.ratio")));
    const series = [
      { key: "hosted_equivalent_usd", name: "hosted only", color: PALETTE[1] },
      { key: "spend_usd", name: "rent + hosted", color: PALETTE[0] },
    ];
    const known = s.routes.filter((r) => r.savings_usd !== null);
    if (known.length) {
      parts.push(columns("savings", known.map((r) => ({ label: r.route, values: r })), series, { format: usd }),
        legend(series));
    } else {
      parts.push(message("no route with a hosted model or a reference_price has served a request yet"));
    }
    parts.push(table(["route", "hosted only", "rent share", "hosted spend", "saved"], s.routes.map((r) => ({
      cells: [r.route, cell(r.hosted_equivalent_usd, "usd", `savings.route.${r.route}.equivalent`),
        cell(r.rent_usd, "usd", `savings.route.${r.route}.rent`),
        cell(r.hosted_usd, "usd", `savings.route.${r.route}.hosted`),
        r.savings_usd === null ? el("td", { class: "message" }, "no baseline: set reference_price")
          : cell(r.savings_usd, "usd", `savings.route.${r.route}.savings`)],
    }))));
  }
  if (l.configured && !l.error) {
    const totalsKnown = "usd" in l.totals && "hosted_equivalent_usd" in l.totals;
    if (l.window.savings_usd !== null) {
      parts.push(heading(s ? "in the window (ledger)" : "in the window"),
        el("div", { class: "stats" },
          stat("saved", l.window.savings_usd, "usd", "ledger.window.savings_usd"),
          stat("hosted only would cost", l.window.hosted_equivalent_usd, "usd", "ledger.window.hosted_equivalent_usd")));
    }
    if (totalsKnown) {
      parts.push(heading(`${period(l)} (ledger)`),
        el("div", { class: "stats" },
          stat("saved", l.totals.hosted_equivalent_usd - l.totals.usd, "usd", "ledger.totals.savings_usd"),
          stat("hosted only would cost", l.totals.hosted_equivalent_usd, "usd", "ledger.totals.hosted_equivalent_usd")));
    }
    parts.push(cumulative(l));
  } else if (!s) {
    parts.push(message(l.message || l.error));
  }
  fill("panel-savings", ...parts);
}

/** Running totals of spend and of the hosted-only equivalent across the window, from zero at its start. */
function cumulative(l) {
  const g = grid(l);
  const usdBy = new Array(g.count).fill(0);
  const eqBy = new Array(g.count).fill(0);
  for (const r of l.series) {
    usdBy[g.slot(r.t)] += r.usd;
    eqBy[g.slot(r.t)] += r.hosted_equivalent_usd;
  }
  let usdSum = 0;
  let eqSum = 0;
  const spent = [[l.since, 0]];
  const eq = [[l.since, 0]];
  for (let i = 0; i < g.count; i++) {
    usdSum += usdBy[i];
    eqSum += eqBy[i];
    const end = Math.min(g.start(i + 1), l.until);
    spent.push([end, usdSum]);
    eq.push([end, eqSum]);
  }
  const lines = [
    // Without a baseline on every row the ledger cannot say what hosted only would have cost.
    ...(l.window.hosted_equivalent_usd === null ? [] : [{ name: "hosted only (cumulative)", color: PALETTE[1], points: eq }]),
    { name: "spent (cumulative)", color: PALETTE[0], points: spent },
  ];
  return el("div", {}, timeLines("savings-time", lines, { format: usd, start: l.since, end: l.until }), legend(lines));
}

function renderSpendTime(data) {
  const l = data.ledger;
  if (!l.configured) return fill("panel-spend-time", message(l.message));
  if (l.error) return fill("panel-spend-time", el("p", { class: "error" }, l.error));
  const g = grid(l);
  const byKind = Array.from({ length: g.count }, (_, i) => ({ t: g.start(i), values: { replica: 0, hosted: 0 } }));
  const byTenant = new Map();
  for (const r of l.series) {
    byKind[g.slot(r.t)].values[r.kind] += r.usd;
    if (!byTenant.has(r.tenant)) byTenant.set(r.tenant, new Array(g.count).fill(0));
    byTenant.get(r.tenant)[g.slot(r.t)] += r.usd;
  }
  const lines = [...byTenant.keys()].sort().map((name, i) => ({
    name, color: PALETTE[(i + 2) % PALETTE.length],
    points: byTenant.get(name).map((v, slot) => [g.start(slot) + l.bucket_s / 2, v]),
  }));
  const opts = { format: usd, start: l.since, end: g.end, step: l.bucket_s };
  // A tenant's Spend panel already shows these figures; an admin's shows the metrics' instead.
  fill("panel-spend-time",
    data.spend === null ? null : el("div", { class: "stats" },
      stat("in window", l.window.usd, "usd", "ledger.window.usd"),
      stat("self-hosted", l.window.replica_usd, "usd", "ledger.window.replica_usd"),
      stat("hosted", l.window.hosted_usd, "usd", "ledger.window.hosted_usd"),
      "usd" in l.totals ? stat(period(l), l.totals.usd, "usd", "ledger.totals.usd") : null),
    el("div", { class: "charts" },
      el("div", {}, heading(`self-hosted and hosted, per ${l.bucket_s} s`),
        timeColumns("spend-time-kind", byKind, KINDS, opts), legend(KINDS)),
      el("div", {}, heading(`by tenant, per ${l.bucket_s} s`),
        lines.length ? timeLines("spend-time-tenant", lines, opts) : message("no spend in the window"),
        legend(lines))));
}

function renderLatency(panel, name, rows, admin) {
  if (!rows.length) return fill(panel, message("no requests yet"));
  const headers = ["backend", "p50", "p95", "p99", ...(admin ? ["requests"] : [])];
  fill(panel,
    columns(name, rows.map((r) => ({ label: r.backend, values: r })), QUANTILES, { format: ms }),
    legend(QUANTILES),
    table(headers, rows.map((r) => ({
      cells: [r.backend, ...QUANTILES.map((q) => cell(r[q.key], "ms", `${name}.${r.backend}.${q.key}`)),
        ...(admin ? [cell(r.count, "count", `${name}.${r.backend}.count`)] : [])],
    }))));
}

function renderRequests(data) {
  const r = data.requests;
  if (!r) return fill("panel-requests", message(data.restricted));
  if (!r.rows.length) return fill("panel-requests", message("no requests yet"));
  const spills = r.rows.filter((row) => row.spill).reduce((s, row) => s + row.hosted, 0);
  fill("panel-requests",
    el("div", { class: "stats" },
      stat("requests", r.total, "count", "requests.total"),
      stat("spilled to hosted", spills, "count", "requests.spilled")),
    hbars("requests", r.rows.map((row) => ({ label: row.reason, values: row })), KINDS, { format: count }),
    legend(KINDS),
    table(["reason", "total", "self-hosted", "hosted", "failed"], r.rows.map((row) => ({
      class: row.spill ? "spill" : "",
      cells: [row.reason, ...["total", "replica", "hosted", "failed"].map(
        (k) => cell(row[k], "count", `requests.${row.reason}.${k}`))],
    }))),
    heading("complex asks by route"),
    table(["route", "requests", "complex", "complex share", "their spend"], data.complexity.routes.map((c) => ({
      cells: [c.route, cell(c.requests, "count", `complexity.${c.route}.requests`),
        cell(c.complex, "count", `complexity.${c.route}.complex`),
        cell(c.complex_share, "pct", `complexity.${c.route}.share`),
        cell(c.complex_spend_usd, "usd", `complexity.${c.route}.spend`)],
    }))));
}

const OUTCOME_COLORS = {
  error: PALETTE[7], client_error: PALETTE[3], client_disconnected: PALETTE[2], gateway_killed: PALETTE[4],
};

/** Requests that failed after reaching a backend (the ledger, over the window) and refusals (the metrics). */
function renderErrors(data) {
  const l = data.errors.ledger;
  const r = data.errors.refusals;
  const parts = [];
  if (!l.configured || l.error) {
    parts.push(message(l.message || l.error));
  } else {
    const outcomes = Object.keys(l.by_outcome);
    const series = outcomes.map((key, i) => ({ key, name: key, color: OUTCOME_COLORS[key] || PALETTE[(i + 5) % PALETTE.length] }));
    const g = grid(l);
    const buckets = Array.from({ length: g.count }, (_, i) => ({ t: g.start(i), values: {} }));
    for (const row of l.series) {
      const values = buckets[g.slot(row.t)].values;
      values[row.outcome] = (values[row.outcome] || 0) + row.requests;
    }
    parts.push(
      el("div", { class: "stats" },
        stat("failed in window", l.total, "count", "errors.window.total"),
        ...outcomes.map((key) => stat(key, l.by_outcome[key], "count", `errors.outcome.${key}`))),
      l.total
        ? el("div", {}, heading(`failed after reaching a backend, per ${l.bucket_s} s`),
          timeColumns("errors-time", buckets, series, { format: count, start: l.since, end: g.end, step: l.bucket_s, whole: true }),
          legend(series))
        : message("no failed request in the window"));
  }
  parts.push(heading("refused before any backend, since the gateway started"));
  parts.push(r.rows.length
    ? table(["status", "code", "requests"], r.rows.map((row) => ({
      cells: [row.status, row.code || "-", cell(row.requests, "count", `refusals.${row.status}.${row.code}`)],
    })))
    : message("no refusals counted"));
  fill("panel-errors", ...parts);
}

/** The latest requests from the ledger, newest first. */
function renderRecent(data) {
  const rc = data.recent;
  if (!rc.configured || rc.error) return fill("panel-recent", message(rc.message || rc.error));
  if (!rc.rows.length) return fill("panel-recent", message("no request booked yet"));
  const admin = data.viewer.role === "admin";
  const headers = ["time", "request id", ...(admin ? ["tenant"] : []), "route", "backend", "user", "outcome",
    "prompt", "cached", "output", "cost"];
  const rows = rc.rows.map((row) => {
    const tr = el("tr", { "data-request-id": row.request_id, class: row.outcome === "ok" ? "" : "failed" },
      el("td", {}, new Date(row.time * 1000).toLocaleTimeString()),
      el("td", { class: "id" }, row.request_id),
      ...(admin ? [el("td", {}, row.tenant)] : []),
      el("td", {}, row.route),
      el("td", {}, row.backend),
      el("td", { class: "user" }, row.user ?? "-"),
      el("td", { class: "outcome" }, row.outcome),
      // The viewer's own requests: named apart from the fleet's token counts, which tenants never see.
      cell(row.prompt_tokens, "count", `recent.${row.id}.prompt`),
      cell(row.cached_tokens, "count", `recent.${row.id}.cached`),
      cell(row.completion_tokens, "count", `recent.${row.id}.output`),
      cell(row.cost_usd, "usd", `recent.${row.id}.cost`));
    return tr;
  });
  const head = el("tr", {}, ...headers.map((h) => el("th", {}, h)));
  fill("panel-recent",
    el("table", { class: "recent" }, el("thead", {}, head), el("tbody", {}, ...rows)),
    el("p", { class: "muted" }, admin
      ? "Every tenant's latest requests; GET /admin/spend/logs pages through all of them."
      : "Your latest requests; GET /v1/spend/logs pages through all of them."));
}

function renderSlo(data) {
  const rows = data.slo;
  if (!rows) return fill("panel-slo", message(data.restricted));
  if (!rows.length) return fill("panel-slo", message("no finished requests with an SLO yet"));
  const series = [
    { key: "met", name: "met", color: PALETTE[6] },
    { key: "ttft_missed", name: "TTFT missed", color: PALETTE[7] },
    { key: "tpot_missed", name: "TPOT missed", color: PALETTE[3] },
  ];
  fill("panel-slo",
    hbars("slo", rows.map((r) => ({ label: r.slo_class, values: r })), series,
      { format: count, total: (row) => row.values.attainment, totalFormat: pct }),
    legend(series),
    table(["SLO class", "attainment", "met", "TTFT missed", "TPOT missed"], rows.map((r) => ({
      cells: [r.slo_class, cell(r.attainment, "pct", `slo.${r.slo_class}.attainment`),
        ...["met", "ttft_missed", "tpot_missed"].map((k) => cell(r[k], "count", `slo.${r.slo_class}.${k}`))],
    }))));
}

function renderCache(data) {
  const rows = data.cache;
  if (!rows.length) return fill("panel-cache", message("no replicas"));
  const series = [{ key: "hit_rate", name: "reported by the replica", color: PALETTE[0] }];
  const admin = data.viewer.role === "admin";
  fill("panel-cache",
    hbars("cache", rows.map((r) => ({ label: r.backend, values: r })), series, { format: pct, max: 1 }),
    table(["replica", "hit rate", "predicted by the index", ...(admin ? ["prompt tokens", "cached tokens"] : [])],
      rows.map((r) => ({
        cells: [r.backend, cell(r.hit_rate, "pct", `cache.${r.backend}.hit_rate`),
          cell(r.predicted_hit_rate, "pct", `cache.${r.backend}.predicted_hit_rate`),
          ...(admin ? [cell(r.prompt_tokens, "count", `cache.${r.backend}.prompt_tokens`),
            cell(r.cached_tokens, "count", `cache.${r.backend}.cached_tokens`)] : [])],
      }))));
}

function renderLoad(data) {
  const rows = data.load;
  const replicas = rows.filter((r) => r.kind === "replica");
  const loadSeries = [
    { key: "running", name: "running", color: PALETTE[2] },
    { key: "queued", name: "queued", color: PALETTE[7] },
  ];
  const health = (r) => {
    const td = el("td", { "data-metric": `load.${r.backend}.healthy`, "data-value": r.healthy ? "1" : "0" },
      r.healthy ? "up" : "down");
    if (!r.healthy) td.className = "down";
    return td;
  };
  fill("panel-load",
    heading("in flight (the gateway's count)"),
    hbars("load-in-flight", rows.map((r) => ({ label: r.backend, values: r })),
      [{ key: "in_flight", name: "in flight", color: PALETTE[4] }], { format: count }),
    heading("replica batch (scraped)"),
    hbars("load-batch", replicas.map((r) => ({ label: r.backend, values: r })), loadSeries, { format: count }),
    legend(loadSeries),
    heading("KV cache usage (scraped)"),
    hbars("load-kv", replicas.map((r) => ({ label: r.backend, values: r })),
      [{ key: "kv_usage", name: "KV usage", color: PALETTE[5] }], { format: pct, max: 1 }),
    table(["backend", "health", "in flight", "running", "queued", "KV usage"], rows.map((r) => ({
      cells: [r.backend, health(r), cell(r.in_flight, "count", `load.${r.backend}.in_flight`),
        ...(r.kind === "replica"
          ? [cell(r.running, "count", `load.${r.backend}.running`), cell(r.queued, "count", `load.${r.backend}.queued`),
            cell(r.kv_usage, "pct", `load.${r.backend}.kv_usage`)]
          : ["-", "-", "-"])],
    }))));
}

function render(data) {
  const admin = data.viewer.role === "admin";
  $("viewer").textContent = admin ? "admin: all tenants" : `tenant: ${data.viewer.tenant}`;
  document.body.dataset.viewer = admin ? "admin" : `tenant:${data.viewer.tenant}`;
  renderSpend(data);
  renderSavings(data);
  renderRent(data);
  renderCapacity(data);
  renderSpendTime(data);
  renderLatency("panel-ttft", "ttft", data.latency.ttft, admin);
  renderLatency("panel-tpot", "tpot", data.latency.tpot, admin);
  renderRequests(data);
  renderErrors(data);
  renderRecent(data);
  renderSlo(data);
  renderCache(data);
  renderLoad(data);
  $("updated").textContent = `updated ${new Date(data.generated_at * 1000).toLocaleTimeString()}`;
  refreshes += 1;
  document.body.dataset.refreshes = String(refreshes);
}

// Key and polling ----------------------------------------------------------------------------------------

function askKey(error = "") {
  clearTimeout(timer);
  $("key-error").textContent = error;
  $("key-input").value = "";
  if (!$("key-dialog").open) $("key-dialog").showModal();
  $("key-input").focus();
}

async function refresh() {
  clearTimeout(timer);
  const key = sessionStorage.getItem(KEY);
  if (!key) return askKey();
  if (document.hidden) return; // polling resumes on visibilitychange
  let wait = 2;
  const windowS = Number($("window").value);
  const url = `/dashboard/api/data?window_s=${windowS}&bucket_s=${BUCKETS[windowS]}`;
  try {
    const response = await fetch(url, { headers: { Authorization: `Bearer ${key}` }, cache: "no-store" });
    const body = await response.json().catch(() => null);
    if (response.status === 401 || response.status === 403) {
      sessionStorage.removeItem(KEY);
      return askKey(body?.error?.message || `refused (${response.status})`);
    }
    if (!response.ok) throw new Error(body?.error?.message || `HTTP ${response.status}`);
    render(body);
    await renderKeys(body.viewer.role === "admin", key);
    wait = body.refresh_s;
    $("status").textContent = "";
  } catch (error) {
    $("status").textContent = `refresh failed: ${error.message}`;
  }
  timer = setTimeout(refresh, wait * 1000);
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY, key);
  $("key-dialog").close();
  refresh();
});
$("key-dialog").addEventListener("cancel", (event) => {
  if (!sessionStorage.getItem(KEY)) event.preventDefault(); // Escape: nothing to show without a key
});
$("change-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  askKey();
});
$("window").addEventListener("change", refresh);
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
refresh();
