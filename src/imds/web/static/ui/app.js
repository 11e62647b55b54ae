// imds admin page: vanilla JS over the admin API. The token lives in sessionStorage (this tab only).
"use strict";

const KEY = "imds-admin-token";
const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem(KEY) || ""; }

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: "Bearer " + token() }, cache: "no-store" });
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_e) { body = { message: text }; }
  if (!response.ok) {
    const error = new Error((body && body.message) || response.status + " " + response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function status(text, isError) {
  const node = $("status");
  node.textContent = text;
  node.className = isError ? "error" : "muted";
}

function showToken() {
  $("token-state").textContent = token() ? "token set for this tab" : "no token";
}

async function runSearch(event) {
  if (event) event.preventDefault();
  const q = $("search").value.trim();
  const tbody = $("results").querySelector("tbody");
  tbody.replaceChildren();
  status("searching…");
  try {
    const body = await api("/device-search?q=" + encodeURIComponent(q));
    for (const item of body.instances) {
      const row = el("tr");
      row.dataset.id = item.id;
      row.append(el("td", item.hostname || "-"), el("td", item.id),
                 el("td", item.entries.map((e) => e.entry).join(", ") || "-"),
                 el("td", [item.metadata ? "metadata" : "", item.userdata_bytes !== null ? "userdata" : "",
                           item.os ? "os" : ""].filter(Boolean).join(", ")));
      row.addEventListener("click", () => openRecord(item.id));
      tbody.append(row);
    }
    status(body.instances.length + " instance(s)" + (q ? " matching " + q : ""));
  } catch (error) {
    status("search failed: " + error.message, true);
  }
}

function flavorBox(name, preview) {
  const box = el("div", null, "flavor");
  box.dataset.flavor = name;
  box.append(el("h4", name));
  if (preview === null || preview === undefined) {
    box.append(el("p", "serves nothing for this instance", "muted"));
  } else {
    box.append(el("pre", typeof preview === "string" ? preview : JSON.stringify(preview, null, 2)));
  }
  return box;
}

async function openRecord(id) {
  $("record-panel").hidden = false;
  $("record-title").textContent = id;
  const facts = $("record-facts");
  facts.replaceChildren();
  $("flavors").replaceChildren(el("p", "loading…", "muted"));
  try {
    const explained = await api("/explain/" + encodeURIComponent(id));
    const instance = explained.instance;
    for (const [key, value] of [["hostname", instance.hostname || "-"],
                                ["entries", instance.entries.map((e) => e.entry + " (" + e.kind + ")").join(", ") || "-"],
                                ["userdata", instance.userdata_bytes === null ? "-" : instance.userdata_bytes + " bytes"],
                                ["os record", instance.os ? "yes" : "-"]]) {
      facts.append(el("dt", key), el("dd", value));
    }
    $("flavors").replaceChildren(...Object.entries(explained.previews).map(([n, p]) => flavorBox(n, p)));
    const record = await api("/device-records/" + encodeURIComponent(id));
    $("record-json").textContent = JSON.stringify(record, null, 2);
  } catch (error) {
    $("flavors").replaceChildren(el("p", "could not load: " + error.message, "error"));
  }
  loadEvents(id);
}

async function loadEvents(id) {
  // Hook for the instance channel: GET /device-events/{id} (events the instance posted).
  const list = $("events");
  try {
    const body = await api("/device-events/" + encodeURIComponent(id));
    list.replaceChildren(...(body.events.length ? body.events.map((e) =>
      el("li", [e.at || e.received_at || "", e.state, e.code ?? "", e.message || ""].join(" "))) :
      [el("li", "no events", "muted")]));
  } catch (error) {
    list.replaceChildren(el("li", error.status === 404 ? "no event channel on this server" :
                                  "events unavailable: " + error.message, "muted"));
  }
}

async function loadChanges() {
  const list = $("changes");
  try {
    const body = await api("/device-changes?limit=20");
    list.replaceChildren(...body.changes.map((c) => {
      const item = el("li", "#" + c.seq + " " + (c.hostname || "-") + " " + c.instance_id + (c.present ? "" : " (deleted)"));
      if (c.present) item.addEventListener("click", () => openRecord(c.instance_id));
      return item;
    }));
    if (!body.changes.length) list.replaceChildren(el("li", "no changes yet", "muted"));
  } catch (error) {
    list.replaceChildren(el("li", "changes unavailable: " + error.message, "error"));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  showToken();
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    showToken();
    runSearch();
    loadChanges();
  });
  $("token-clear").addEventListener("click", () => { sessionStorage.removeItem(KEY); showToken(); });
  $("search-form").addEventListener("submit", runSearch);
  $("changes-refresh").addEventListener("click", loadChanges);
  if (token()) { runSearch(); loadChanges(); }
});
