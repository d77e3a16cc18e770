// tiergate cost dashboard: signs in with an API key (kept in this tab's sessionStorage), reads
// the reports API with it and draws SVG charts. Every value from the API is inserted as text
// (never as HTML): tags and app names come from clients.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac"];
const state = { scoped: null };

function dayNumber(day) { return Math.round(Date.parse(`${day}T00:00:00Z`) / DAY_MS); }
function dayText(n) { return new Date(n * DAY_MS).toISOString().slice(0, 10); }

function dayRange(days) {
  // Every calendar day of the chosen range (or of the data): the axis keeps gaps as gaps.
  const f = filters();
  const first = f.from || days[0];
  const last = f.to || days[days.length - 1];
  const a = Math.min(dayNumber(first), ...days.map(dayNumber));
  const b = Math.max(dayNumber(last), ...days.map(dayNumber));
  return { a, b, n: b - a + 1 };
}

function dateLabels(svg, range, x0, width, y) {
  // Up to 8 date labels, evenly spread over the range, first and last included.
  const count = Math.min(range.n, 8);
  const step = range.n / count;
  for (let k = 0; k < count; k++) {
    const i = Math.min(Math.round(k * step), range.n - 1);
    const label = el("text", { x: x0 + (i + 0.5) * (width / range.n), y, "text-anchor": "middle",
      class: "date-label" }, dayText(range.a + i).slice(5));
    svg.appendChild(label);
  }
}

function el(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v) query.set(k, v);
  const response = await fetch(`${path}?${query}`, { headers: { authorization: `Bearer ${session.key}` } });
  if (!response.ok) {
    let message = `${response.status}`;
    try { message = (await response.json()).error.message; } catch (_) { /* not JSON */ }
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return response;
}

function filters() {
  const tenant = state.scoped ? null : $("tenant").value.trim() || null;
  return { from: $("from").value, to: $("to").value, tenant, app: $("app-filter").value.trim() || null };
}

function legend(container, names) {
  const div = document.createElement("div");
  div.className = "legend";
  names.forEach((name, i) => {
    const span = document.createElement("span");
    const box = document.createElement("i");
    box.style.background = COLORS[i % COLORS.length];
    span.appendChild(box);
    span.appendChild(document.createTextNode(name));
    div.appendChild(span);
  });
  container.appendChild(div);
}

function frame(container, width, height) {
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  container.appendChild(svg);
  return svg;
}

function axis(svg, max, x0, y0, h, w) {
  svg.appendChild(el("line", { x1: x0, y1: y0, x2: x0 + w, y2: y0, stroke: "#999" }));
  svg.appendChild(el("text", { x: x0 - 4, y: y0 - h + 10, "text-anchor": "end" }, money(max)));
  svg.appendChild(el("text", { x: x0 - 4, y: y0, "text-anchor": "end" }, "$0"));
}

function stackedBars(container, rows, split) {
  clear(container);
  const days = [...new Set(rows.map((r) => r.day))].sort();
  const names = [...new Set(rows.map((r) => r[split] || "(none)"))].sort();
  if (!days.length) { container.textContent = "No requests in this period."; return; }
  const totals = days.map((d) => rows.filter((r) => r.day === d)
    .reduce((s, r) => s + Number(r.cost_usd), 0));
  const max = Math.max(...totals, 1e-12);
  const range = dayRange(days);
  const W = 760, H = 230, x0 = 90, y0 = 200, h = 180, step = (W - x0) / range.n;
  const svg = frame(container, W, H);
  axis(svg, max, x0, y0, h, W - x0);
  dateLabels(svg, range, x0, W - x0, y0 + 16);
  days.forEach((day) => {
    const i = dayNumber(day) - range.a;
    let y = y0;
    names.forEach((name, j) => {
      const row = rows.find((r) => r.day === day && (r[split] || "(none)") === name);
      if (!row) return;
      const bh = Math.max((Number(row.cost_usd) / max) * h, Number(row.cost_usd) > 0 ? 1 : 0);
      y -= bh;
      const bw = Math.min(Math.max(step - 4, 1), 60);
      const rect = el("rect", { x: x0 + (i + 0.5) * step - bw / 2, y, width: bw, height: bh,
        fill: COLORS[j % COLORS.length], "data-day": day, "data-series": name, "data-value": row.cost_usd });
      rect.appendChild(el("title", {}, `${day} ${name}: ${money(row.cost_usd)}`));
      svg.appendChild(rect);
    });
  });
  legend(container, names);
}

function lines(container, xs, series, range, empty) {
  // xs: days (YYYY-MM-DD), placed by date on the range's axis; a single day is a dot.
  clear(container);
  if (!xs.length) { container.textContent = empty || "No data."; return; }
  const max = Math.max(...series.flatMap((s) => s.values), 1e-12);
  range = range || dayRange(xs);
  const W = 760, H = 230, x0 = 90, y0 = 200, h = 180, step = (W - x0) / range.n;
  const svg = frame(container, W, H);
  axis(svg, max, x0, y0, h, W - x0);
  dateLabels(svg, range, x0, W - x0, y0 + 16);
  const xOf = (day) => x0 + (dayNumber(day) - range.a + 0.5) * step;
  series.forEach((s, j) => {
    const color = s.color || COLORS[j % COLORS.length];
    const points = s.values.map((v, i) => `${xOf(xs[i])},${y0 - (v / max) * h}`).join(" ");
    svg.appendChild(el("polyline", { points, fill: "none", stroke: color,
      "stroke-width": 2, "stroke-dasharray": s.dashed ? "5,4" : "none", "data-series": s.name }));
    s.values.forEach((v, i) => svg.appendChild(el("circle", { cx: xOf(xs[i]), cy: y0 - (v / max) * h,
      r: 3, fill: color, "data-day": xs[i], "data-series": s.name, "data-value": v })));
  });
  legend(container, series.map((s) => s.name));
}

function hbars(container, items, scale) {
  // scale: the value a full bar stands for (default: the largest value); marks: vertical lines
  // (e.g. a budget's limit) at a value.
  clear(container);
  if (!items.length) { container.textContent = "No data."; return; }
  const max = scale || Math.max(...items.map((i) => i.value), 1e-12);
  const W = 900, row = 24, x0 = 300, bar = W - x0 - 190;
  const svg = frame(container, W, items.length * row + 8);
  items.forEach((item, i) => {
    const label = el("text", { x: 2, y: i * row + 16 }, item.label);
    label.appendChild(el("title", {}, item.label));
    svg.appendChild(label);
    svg.appendChild(el("rect", { x: x0, y: i * row + 4, height: row - 8,
      width: Math.max(Math.min(item.value / max, 1) * bar, 1), fill: item.color || COLORS[i % COLORS.length],
      "data-label": item.label, "data-value": item.raw, "data-ratio": item.value / max }));
    svg.appendChild(el("text", { x: x0 + bar + 8, y: i * row + 16 }, item.text));
  });
  return { svg, x0, bar, max, height: items.length * row + 8 };
}

function tenantTable(container, byTenant, byTenantTier, trueups) {
  // Per tenant: requests, cost, baseline, savings, the share of its requests on large
  // deployments, its GPU true-up: a finance lead's first question.
  clear(container);
  if (!byTenant.length) { container.textContent = "No requests in this period."; return; }
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  for (const title of ["Tenant", "Requests", "Cost", "Baseline", "Savings", "Share large", "GPU true-up"]) {
    const th = document.createElement("th");
    th.textContent = title;
    head.appendChild(th);
  }
  const body = table.createTBody();
  for (const r of byTenant) {
    const large = byTenantTier.filter((x) => x.tenant === r.tenant && x.tier === "large")
      .reduce((s, x) => s + x.requests, 0);
    const trueup = trueups.filter((t) => t.tenant === r.tenant).reduce((s, t) => s + Number(t.trueup_usd), 0);
    const tr = body.insertRow();
    tr.dataset.tenantRow = r.tenant;
    tr.dataset.cost = r.cost_usd;
    tr.dataset.shareLarge = r.requests ? large / r.requests : 0;
    const cells = [r.tenant, r.requests.toLocaleString("en-US"), money(r.cost_usd), money(r.baseline_usd),
      money(r.savings_usd), share(large, r.requests), money(trueup)];
    for (const text of cells) tr.insertCell().textContent = text;
  }
  container.appendChild(table);
}

function share(part, whole) {
  const w = Number(whole);
  return w > 0 ? `${((Number(part) / w) * 100).toFixed(1)}%` : "–";
}

function estimatedTable(container, rows) {
  // One row per tenant: its cost, the part priced from estimated usage, that share, and the
  // requests booked in part from estimates (the cost report's estimated, estimated_usd).
  clear(container);
  if (!rows.length) { container.textContent = "No requests in this period."; return; }
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  for (const title of ["Tenant", "Cost", "Estimated", "Share", "Requests estimated"]) {
    const th = document.createElement("th");
    th.textContent = title;
    head.appendChild(th);
  }
  const body = table.createTBody();
  for (const r of rows) {
    const tr = body.insertRow();
    tr.dataset.tenant = r.tenant;
    tr.dataset.estimated = r.estimated_usd;
    const cells = [r.tenant, money(r.cost_usd), money(r.estimated_usd),
      share(r.estimated_usd, r.cost_usd), r.estimated.toLocaleString("en-US")];
    for (const text of cells) tr.insertCell().textContent = text;
  }
  container.appendChild(table);
}

function setCard(id, text, raw) {
  const node = $(id);
  node.textContent = text;
  node.dataset.value = raw;
}

async function loadCosts(f) {
  const split = $("split").value;
  const [bySplit, byDay, byTag, byTenant, byTenantTier, byApp] = await Promise.all([
    api("/v1/reports/costs", { ...f, group_by: `day,${split}` }).then((r) => r.json()),
    api("/v1/reports/costs", { ...f, group_by: "day" }).then((r) => r.json()),
    api("/v1/reports/costs", { ...f, group_by: "tag" }).then((r) => r.json()),
    api("/v1/reports/costs", { ...f, group_by: "tenant" }).then((r) => r.json()),
    api("/v1/reports/costs", { ...f, group_by: "tenant,tier" }).then((r) => r.json()),
    api("/v1/reports/costs", { ...f, group_by: "app" }).then((r) => r.json()),
  ]);
  const trueup = byDay.gpu_trueup;
  setCard("total-trueup", money(trueup.trueup_usd), trueup.trueup_usd);
  tenantTable($("table-tenants"), byTenant.rows, byTenantTier.rows, trueup.rows);
  hbars($("chart-apps"), byApp.rows.sort((a, b) => Number(b.cost_usd) - Number(a.cost_usd)).slice(0, 10)
    .map((r) => ({ label: r.app === null ? "(no app)" : r.app, value: Number(r.cost_usd), raw: r.cost_usd,
      text: `${money(r.cost_usd)} · ${r.requests}` })));
  const t = byDay.totals;
  setCard("total-cost", money(t.cost_usd), t.cost_usd);
  setCard("total-baseline", money(t.baseline_usd), t.baseline_usd);
  setCard("total-savings", money(t.savings_usd), t.savings_usd);
  setCard("total-requests", t.requests.toLocaleString("en-US"), t.requests);
  setCard("total-unknown", t.unknown_price.toLocaleString("en-US"), t.unknown_price);
  setCard("total-estimated", money(t.estimated_usd), t.estimated_usd);
  $("total-estimated-share").textContent =
    `${share(t.estimated_usd, t.cost_usd)} of cost · ${t.estimated.toLocaleString("en-US")} requests`;
  estimatedTable($("table-estimated"), byTenant.rows);
  stackedBars($("chart-spend"), bySplit.rows, split);
  lines($("chart-savings"), byDay.rows.map((r) => r.day), [
    { name: "cost", values: byDay.rows.map((r) => Number(r.cost_usd)) },
    { name: "baseline", values: byDay.rows.map((r) => Number(r.baseline_usd)), dashed: true },
  ]);
  const tags = byTag.rows.filter((r) => r.tag !== null)
    .sort((a, b) => Number(b.cost_usd) - Number(a.cost_usd)).slice(0, 10);
  hbars($("chart-tags"), tags.map((r) => ({ label: r.tag, value: Number(r.cost_usd), raw: r.cost_usd,
    text: `${money(r.cost_usd)} · ${r.requests}` })));
}

async function loadWhatIf(f) {
  const data = await (await api("/v1/reports/what-if", f)).json();
  const items = data.scenarios.map((s) => ({
    label: `${s.name.replace(/_/g, " ")}${s.model ? ` (${s.model})` : ""}`,
    title: s.includes,
    value: s.cost_usd === null ? 0 : Number(s.cost_usd), raw: s.cost_usd === null ? "" : s.cost_usd,
    text: s.cost_usd === null ? "price unknown" : money(s.cost_usd),
  }));
  const drawn = hbars($("chart-whatif"), items);
  const notes = document.createElement("ul");
  notes.className = "note";
  for (const s of data.scenarios) {
    const li = document.createElement("li");
    li.textContent = `${s.name.replace(/_/g, " ")}: ${s.includes}`;
    notes.appendChild(li);
  }
  if (drawn) $("chart-whatif").appendChild(notes);
}

async function loadBudgets(f) {
  const container = $("chart-budgets");
  const data = await (await api("/v1/reports/budgets", { tenant: f.tenant })).json();
  clear(container);
  if (!data.budgets.length) { container.textContent = "No budgets configured."; return; }
  // Each bar is its spend against its own limit: a full bar is the limit (the red line).
  const drawn = hbars(container, data.budgets.map((b) => ({
    label: `${b.tenant} · ${b.budget}${b.app ? ` app ${b.app}` : ""}${b.tag ? ` tag ${b.tag}` : ""}`,
    value: Number(b.spent_usd) / Number(b.limit_usd), raw: b.spent_usd,
    color: Number(b.spent_usd) >= Number(b.limit_usd) ? "#e15759" : "#59a14f",
    text: `${money(b.spent_usd)} of ${money(b.limit_usd)} (${share(b.spent_usd, b.limit_usd)})`,
  })), 1);
  drawn.svg.appendChild(el("line", { x1: drawn.x0 + drawn.bar, x2: drawn.x0 + drawn.bar, y1: 0,
    y2: drawn.height, stroke: "#e15759", "stroke-dasharray": "3,3", class: "limit" }));
  // Burn-down of the first tenant-wide budget: cumulative spend over its window vs the limit.
  const wide = data.budgets.find((b) => !b.app && !b.tag);
  if (!wide) return;
  const from = wide.window_start.slice(0, 10);
  const last = new Date(Date.parse(wide.window_end) - DAY_MS).toISOString().slice(0, 10);
  const days = await (await api("/v1/reports/costs",
    { from, to: last, tenant: wide.tenant, group_by: "day" })).json();
  let sum = 0;
  const cumulative = days.rows.map((r) => (sum += Number(r.cost_usd)));
  const burn = document.createElement("div");
  container.appendChild(burn);
  const range = { a: dayNumber(from), b: dayNumber(last), n: dayNumber(last) - dayNumber(from) + 1 };
  lines(burn, days.rows.map((r) => r.day), [
    { name: `${wide.tenant} · ${wide.budget}: spent`, values: cumulative },
    { name: "limit", values: cumulative.map(() => Number(wide.limit_usd)), dashed: true, color: "#e15759" },
  ], range, `No spend yet in the window of ${wide.tenant} · ${wide.budget} (from ${from}).`);
}

async function refresh() {
  $("error").textContent = "";
  const f = filters();
  try {
    await Promise.all([loadCosts(f), loadWhatIf(f), loadBudgets(f)]);
    document.body.dataset.loaded = "true";
  } catch (error) {
    $("error").textContent = error.message;
    if (error.status === 401) signOut();
  }
}

async function downloadCsv() {
  const f = filters();
  const response = await api("/v1/reports/costs", { ...f, group_by: `day,tenant,${$("split").value}`, format: "csv" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = `tiergate-costs-${f.tenant || "all"}-${f.from}-${f.to}.csv`;
  link.click();
  URL.revokeObjectURL(link.href);
}

async function signIn(key) {
  session.key = key;
  $("signin-error").textContent = "";
  try {
    const probe = await (await api("/v1/reports/costs", { group_by: "tenant", from: $("from").value })).json();
    state.scoped = probe.tenant;
  } catch (error) {
    session.key = null;
    $("signin-error").textContent = error.status === 401 || error.status === 403
      ? "This key cannot read cost reports." : error.message;
    return;
  }
  $("tenant-label").hidden = Boolean(state.scoped);
  showSignedIn(key, state.scoped ? `tenant ${state.scoped}` : "all tenants (finance/admin)");
  await refresh();
}

function init() {
  const key = startPage(30, signIn);
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
  $("split").addEventListener("change", refresh);
  $("csv").addEventListener("click", downloadCsv);
  if (key) signIn(key);
}

document.addEventListener("DOMContentLoaded", init);
