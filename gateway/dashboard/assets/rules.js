// tiergate rules console: signs in with an API key (this tab's sessionStorage, shared with the
// cost dashboard), reads and changes a tenant's routing rules through /v1/rules, and tries a
// draft (explain side by side, what-if over the ledger) before it is applied. Every value from
// the API is inserted as text, never as HTML: rule files, ids and descriptions come from users.
"use strict";

const state = { own: null, tenant: null, canWrite: false, active: null, timer: null,
  draftValid: false };

function pct(share) { return share === null || share === undefined ? "–" : `${(share * 100).toFixed(1)}%`; }

function node(tag, text, attrs) {
  const el = document.createElement(tag);
  if (text !== undefined && text !== null) el.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "className") el.className = v; else el.setAttribute(k, String(v));
  }
  return el;
}

async function api(path, options) {
  const opts = options || {};
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(opts.params || {})) if (v) query.set(k, v);
  const headers = { authorization: `Bearer ${session.key}` };
  let body = opts.body;
  if (opts.json !== undefined) { body = JSON.stringify(opts.json); headers["content-type"] = "application/json"; }
  const response = await fetch(`${path}${query.toString() ? `?${query}` : ""}`,
    { method: opts.method || "GET", headers, body });
  let data = null;
  try { data = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const error = new Error(data && data.error ? data.error.message : `${response.status}`);
    error.status = response.status;
    error.param = data && data.error ? data.error.param : null;
    error.code = data && data.error ? data.error.code : null;
    throw error;
  }
  return data;
}

function table(headers, rows) {
  const t = node("table");
  const head = t.createTHead().insertRow();
  for (const h of headers) head.appendChild(node("th", h));
  const body = t.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const [k, v] of Object.entries(row.data || {})) tr.dataset[k] = v;
    if (row.className) tr.className = row.className;
    for (const cell of row.cells) {
      const td = tr.insertCell();
      if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
    }
  }
  return t;
}

function bar(share) {
  const span = node("span", null, { className: "share" });
  const i = node("i");
  i.style.width = `${Math.round((share || 0) * 60)}px`;
  span.appendChild(i);
  span.appendChild(document.createTextNode(pct(share)));
  return span;
}

// ---- figures ----

function figureCells(f) {
  return [f.requests.toLocaleString("en-US"), bar(f.large_share), money(f.cost_usd),
    money(f.baseline_usd), money(f.savings_usd)];
}

function renderFigures(data) {
  const container = $("rules-table");
  clear(container);
  $("versions").textContent = `${data.tenant} v${data.rules_version} · global v${data.global_version}`;
  const rows = data.rules.map((r, i) => ({
    className: r.scope === "global" ? "global" : "",
    data: { rule: r.id, scope: r.scope, requests: r.requests, largeShare: r.large_share ?? "",
      cost: r.cost_usd, savings: r.savings_usd },
    cells: [String(i + 1), r.id, r.description || "", ...figureCells(r)],
  }));
  for (const o of data.others) {
    rows.push({ className: "other", data: { rule: o.rule ?? "", requests: o.requests, cost: o.cost_usd },
      cells: ["", o.rule ?? "(not routed: refused)", "no rule fired", ...figureCells(o)] });
  }
  const t = data.totals;
  rows.push({ className: "total", data: { rule: "(total)", requests: t.requests, cost: t.cost_usd,
    savings: t.savings_usd }, cells: ["", "total", "", ...figureCells(t)] });
  if (!data.rules.length) container.appendChild(node("p", "No rules: every request is routed by the classifier's threshold.", { className: "note" }));
  container.appendChild(table(["#", "Rule", "Description", "Requests", "Sent large", "Cost", "Baseline", "Saving"], rows));
}

// ---- editor ----

function setStatus(id, text, kind) {
  const el = $(id);
  el.textContent = text;
  el.className = `status ${kind || ""}`;
}

function gutter(badLine) {
  const pre = $("gutter");
  clear(pre);
  const n = $("source").value.split("\n").length;
  for (let i = 1; i <= n; i++) pre.appendChild(node("span", i, i === badLine ? { className: "bad", "data-line": i } : {}));
  pre.scrollTop = $("source").scrollTop;
}

function renderDiff(el, diff) {
  clear(el);
  if (!diff) { el.appendChild(node("span", "(no change)", { className: "hunk" })); return; }
  for (const line of diff.replace(/\n$/, "").split("\n")) {
    const kind = line.startsWith("@@") || line.startsWith("---") || line.startsWith("+++") ? "hunk"
      : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "";
    el.appendChild(node("span", line, { className: kind || "ctx" }));
    if (!kind) el.appendChild(document.createTextNode("\n"));
  }
}

async function validate() {
  const source = $("source").value;
  $("editor-section").dataset.state = "checking";
  try {
    const result = await api(`/v1/rules/${encodeURIComponent(state.tenant)}/validate`, { method: "POST", body: source });
    state.draftValid = true;
    gutter(null);
    setStatus("validation", `Valid: ${result.rules.length} rule${result.rules.length === 1 ? "" : "s"}${result.rules.length ? ` (${result.rules.join(", ")})` : ""}.`, "ok");
    renderDiff($("diff"), result.diff);
    $("apply").disabled = !result.diff;
    $("editor-section").dataset.state = result.diff ? "changed" : "valid";
  } catch (error) {
    if (error.status === 401) { signOut(); return; }
    state.draftValid = false;
    const line = /^line (\d+):/.exec(error.message);
    gutter(line ? Number(line[1]) : null);
    setStatus("validation", error.message, "bad");
    clear($("diff"));
    $("diff").appendChild(node("span", "(no diff: the draft does not validate)", { className: "hunk" }));
    $("validation").dataset.param = error.param || "";
    $("apply").disabled = true;
    $("editor-section").dataset.state = "invalid";
  }
}

function scheduleValidate() {
  gutter(null);
  clearTimeout(state.timer);
  state.timer = setTimeout(validate, 250);
}

function draftSource() {
  // The draft to try: the editor's text when this key may edit and it is valid.
  return state.canWrite && state.draftValid ? $("source").value : null;
}

async function apply() {
  const author = $("author").value.trim();
  try {
    const v = await api(`/v1/rules/${encodeURIComponent(state.tenant)}`,
      { method: "PUT", body: $("source").value, params: { author } });
    setStatus("apply-status", `Applied as version ${v.version} by ${v.author}; live in every gateway process within a second.`, "ok");
    $("apply-status").dataset.version = v.version;
    await load();
  } catch (error) {
    setStatus("apply-status", error.message, "bad");
  }
}

async function rollback(to) {
  try {
    const v = await api(`/v1/rules/${encodeURIComponent(state.tenant)}/rollback`,
      { method: "POST", params: { to: String(to), author: $("author").value.trim() } });
    setStatus("apply-status", `Rolled back: version ${v.version} restores version ${to} (by ${v.author}).`, "ok");
    $("apply-status").dataset.version = v.version;
    await load();
  } catch (error) {
    setStatus("apply-status", error.message, "bad");
  }
}

function renderHistory(versions) {
  const container = $("history");
  clear(container);
  if (!versions.length) { container.textContent = "No versions yet."; return; }
  const current = versions[versions.length - 1].version;
  const rows = versions.slice().reverse().map((v) => {
    const details = node("details");
    details.appendChild(node("summary", v.diff ? `${v.diff.split("\n").filter((l) => /^[+-][^+-]/.test(l)).length} lines changed` : "no change"));
    const pre = node("pre", null, { className: "diff" });
    renderDiff(pre, v.diff);
    details.appendChild(pre);
    let action = "";
    if (v.version === current) action = "active";
    else if (state.canWrite) {
      action = node("button", `Roll back to v${v.version}`, { type: "button", "data-rollback": v.version });
      action.addEventListener("click", () => rollback(v.version));
    }
    const what = v.action === "rollback" && v.restored ? `rollback to v${v.restored}` : v.action;
    return { data: { version: v.version }, cells: [`v${v.version}`, v.created_at.replace("T", " ").slice(0, 19),
      v.author, what, details, action] };
  });
  container.appendChild(table(["Version", "Time (UTC)", "Author", "Action", "Diff", ""], rows));
}

// ---- playground ----

function renderPlan(id, plan, note) {
  const box = $(id);
  const dl = box.querySelector("dl");
  clear(dl);
  box.dataset.tier = "";
  box.dataset.rule = "";
  const add = (term, value, field, className) => {
    dl.appendChild(node("dt", term));
    dl.appendChild(node("dd", value, { "data-field": field, className: className || "" }));
  };
  if (!plan) { add("", note, "note"); return; }
  if (plan.object === "error") { add("refused", `${plan.status} ${plan.code}: ${plan.message}`, "error"); box.dataset.rule = "refused"; return; }
  box.dataset.tier = plan.tier;
  box.dataset.rule = plan.rule;
  add("tier", plan.tier, "tier", `tier tier-${plan.tier}`);
  add("deployment", plan.deployments[0], "deployment");
  add("rule", plan.rule, "rule");
  add("score", plan.score === null ? "–" : plan.score.toFixed(3), "score");
  add("threshold", plan.threshold === null || plan.threshold === undefined ? "– (pinned)" : plan.threshold.toFixed(3), "threshold");
  add("fallback chain", plan.deployments.slice(1).join(" → ") || "none", "fallback");
  add("worst-case cost", money(plan.worst_case_usd), "worst");
  add("reason", plan.reason, "reason");
  if (plan.skipped_rules.length) add("rules not matched", plan.skipped_rules.map((s) => `${s.rule}: ${s.why}`).join("; "), "skipped");
  add("rules version", String(plan.rules_version), "version");
}

async function explain() {
  const tags = $("play-tags").value.trim();
  const headers = {};
  if ($("play-app").value.trim()) headers["x-tiergate-app"] = $("play-app").value.trim();
  if (tags) headers["x-tiergate-tags"] = tags;
  const draft = draftSource();
  try {
    const data = await api(`/v1/rules/${encodeURIComponent(state.tenant)}/explain`, { method: "POST", json: {
      request: { model: $("play-model").value.trim() || "auto", messages: [{ role: "user", content: $("prompt").value }] },
      headers, draft } });
    renderPlan("plan-active", data.active);
    renderPlan("plan-draft", data.draft, "The draft does not validate: fix it to compare.");
    const differs = data.draft && (data.draft.tier !== data.active.tier || data.draft.rule !== data.active.rule);
    $("plan-draft").classList.toggle("differs", Boolean(differs));
    document.body.dataset.explained = "true";
  } catch (error) {
    renderPlan("plan-active", null, error.message);
    renderPlan("plan-draft", null, "");
  }
}

// ---- what-if ----

function whatIfRow(label, key, fmt, data) {
  const cells = [label];
  for (const side of ["booked", "active", "draft"]) cells.push(fmt(data[side][key], data[side]));
  let delta = "";
  if (key.endsWith("_usd")) delta = money(String(Number(data.draft[key]) - Number(data.active[key])));
  else if (key === "large_share") delta = data.draft.large_share === null || data.active.large_share === null ? "–"
    : `${((data.draft.large_share - data.active.large_share) * 100).toFixed(1)} pts`;
  else delta = String(data.draft[key] - data.active[key]);
  cells.push(delta);
  return { data: { metric: key, draft: data.draft[key] ?? "", active: data.active[key] ?? "" }, cells };
}

async function whatIf() {
  const container = $("whatif");
  clear(container);
  container.textContent = "Replaying…";
  try {
    const data = await api(`/v1/rules/${encodeURIComponent(state.tenant)}/what-if`,
      { method: "POST", body: draftSource() ?? (state.active.source || ""), params: { days: $("days").value } });
    clear(container);
    container.appendChild(node("p", `${data.replayed.toLocaleString("en-US")} of ${data.rows.toLocaleString("en-US")} routed requests of the last ${data.days} days replayed${data.truncated ? " (the newest only)" : ""}.`, { className: "note", id: "whatif-summary" }));
    const num = (v) => (v ?? 0).toLocaleString("en-US");
    container.appendChild(table(["", "Booked (ledger)", "Active rules (replayed)", "Draft (predicted)", "Draft − active"], [
      whatIfRow("Requests", "requests", num, data),
      whatIfRow("Sent large", "large_share", (v) => pct(v), data),
      whatIfRow("Refused by the rules", "refused", num, data),
      whatIfRow("Cost", "cost_usd", money, data),
      whatIfRow("Baseline", "baseline_usd", money, data),
      whatIfRow("Saving vs baseline", "savings_usd", money, data),
    ]));
    if (data.not_replayable.length) {
      const warn = node("div", null, { className: "warn", id: "not-replayable" });
      warn.appendChild(node("strong", "Not replayed (the ledger keeps no prompts): "));
      warn.appendChild(document.createTextNode(data.not_replayable.map((u) =>
        `${u.rows} request${u.rows === 1 ? "" : "s"} reach ${u.rules} rule ${u.rule} whose ${u.conditions.join(", ")} cannot be checked`).join("; ") + ". They are left out of the figures above rather than guessed."));
      container.appendChild(warn);
    }
    if (data.approximate.length) {
      container.appendChild(node("p", `Approximate: ${data.approximate.map((a) => `${a.rule} (${a.condition}: counted prompt tokens stand for the estimate)`).join(", ")}. Spill-over, sticky conversations and live queue signals are not replayed.`, { className: "note" }));
    } else {
      container.appendChild(node("p", "Spill-over, sticky conversations and live queue signals are not replayed; costs are list prices of each plan's first deployment.", { className: "note" }));
    }
    document.body.dataset.whatif = "true";
  } catch (error) {
    clear(container);
    container.appendChild(node("p", error.message, { className: "error" }));
  }
}

// ---- loading ----

async function load() {
  $("error").textContent = "";
  state.tenant = state.own || $("tenant").value.trim();
  if (!state.tenant) { $("error").textContent = "Name a tenant."; return; }
  const t = encodeURIComponent(state.tenant);
  try {
    const [figures, current, history] = await Promise.all([
      api(`/v1/rules/${t}/figures`, { params: { from: $("from").value, to: $("to").value } }),
      api(`/v1/rules/${t}`),
      api(`/v1/rules/${t}/versions`),
    ]);
    state.canWrite = figures.can_write;
    state.active = current;
    renderFigures(figures);
    $("source").value = current.source || "rules: []\n";
    $("source").readOnly = !state.canWrite;
    for (const id of ["apply-form", "diff-box", "whatif-section", "plan-draft"]) $(id).hidden = !state.canWrite;
    $("mode").textContent = state.canWrite ? `editing ${state.tenant}` : `read only: this key cannot change ${state.tenant}'s rules`;
    renderHistory(history.data);
    state.draftValid = false;
    if (state.canWrite) await validate(); else { gutter(null); setStatus("validation", ""); clear($("diff")); }
    document.body.dataset.loaded = "true";
    document.body.dataset.tenant = state.tenant;
  } catch (error) {
    $("error").textContent = error.message;
    document.body.dataset.loaded = "error";
    if (error.status === 401) signOut();
  }
}

async function signIn(key) {
  session.key = key;
  $("signin-error").textContent = "";
  let list;
  try {
    list = await api("/v1/rules");
  } catch (error) {
    session.key = null;
    $("signin-error").textContent = error.status === 401 || error.status === 403
      ? "This key cannot read routing rules." : error.message;
    return;
  }
  state.own = list.tenant;
  const names = list.data.map((d) => d.tenant);
  clear($("tenants"));
  for (const name of names) $("tenants").appendChild(node("option", null, { value: name }));
  if (!state.own && !$("tenant").value) $("tenant").value = names.find((n) => n !== "_global") || "";
  $("tenant-label").hidden = Boolean(state.own);
  showSignedIn(key, `${list.principal}${state.own ? ` · tenant ${state.own}` : " · every tenant"}`);
  await load();
}

function init() {
  const key = startPage(7, signIn);
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); load(); });
  $("source").addEventListener("input", () => { if (state.canWrite) scheduleValidate(); });
  $("source").addEventListener("scroll", () => { $("gutter").scrollTop = $("source").scrollTop; });
  $("apply-form").addEventListener("submit", (e) => { e.preventDefault(); apply(); });
  $("revert").addEventListener("click", () => { $("source").value = state.active.source || "rules: []\n"; validate(); });
  $("play-form").addEventListener("submit", (e) => { e.preventDefault(); explain(); });
  $("whatif-form").addEventListener("submit", (e) => { e.preventDefault(); whatIf(); });
  if (key) signIn(key);
}

document.addEventListener("DOMContentLoaded", init);
