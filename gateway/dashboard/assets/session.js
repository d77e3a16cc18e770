// What the cost dashboard and the rules console share: one signed-in key per tab (kept in
// sessionStorage, so signing in on one page signs in the other), the signed-in and signed-out
// page states, the filters a link's #hash may carry, and how money is written. Loaded before
// each page's own script.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_ITEM = "tiergate-key";
const DAY_MS = 86400000;
const session = { key: null };  // the key the page's API calls send

function money(text) {
  // Cents from a cent up; below, the first two significant digits (to the nano-dollar), so a
  // trial's $0.000042 is never shown as $0.00. No figure (null): a dash.
  if (text === null || text === undefined) return "–";
  const n = Number(text);
  const size = Math.abs(n);
  const sign = n < 0 ? "-$" : "$";
  if (size === 0) return "$0.00";
  if (size >= 0.005) {
    return sign + size.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  }
  const digits = Math.min(Math.max(1 - Math.floor(Math.log10(size)), 2), 9);
  return sign + size.toFixed(digits);
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function showSignedIn(key, who) {
  sessionStorage.setItem(KEY_ITEM, key);
  $("signin").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  $("who").textContent = who;
}

function showSignedOut() {
  sessionStorage.removeItem(KEY_ITEM);
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("who").textContent = "";
}

function signOut() {
  session.key = null;
  showSignedOut();
}

function startPage(days, signIn) {
  // The date range's default (the last `days` days, today included), then the filters the
  // link's #hash names; the sign-in form and the sign-out button. Returns the key to sign in
  // with (the link's, else this tab's), and takes a key in the link out of the history.
  $("signin-form").addEventListener("submit", (e) => { e.preventDefault(); signIn($("key").value); });
  $("signout").addEventListener("click", signOut);
  const today = new Date();
  $("to").value = today.toISOString().slice(0, 10);
  $("from").value = new Date(today.getTime() - (days - 1) * DAY_MS).toISOString().slice(0, 10);
  const params = new URLSearchParams(location.hash.slice(1));
  for (const name of ["from", "to", "tenant"]) if (params.get(name)) $(name).value = params.get(name);
  if (params.get("key")) history.replaceState(null, "", location.pathname);
  return params.get("key") || sessionStorage.getItem(KEY_ITEM);
}
