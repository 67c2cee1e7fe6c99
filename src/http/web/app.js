// batcher's live view. It pages through GET /api/groups (never all of
// them: one page at a time, the page in view refreshed every 2 s) and
// follows GET /api/batches, a stream of Server-Sent Events, one per batch.
// When the API answers 401 it asks for a token, kept in sessionStorage and
// sent as `Authorization: Bearer` (as `?token=` to EventSource, which cannot
// set headers).
"use strict";

const REFRESH_MS = 2000;
const FEED_MAX = 50;
const MAX_CALLS_PER_PAGE = 50;
const TOKEN_KEY = "batcher.token";
const REASON_PREFIX = "FLUSH_REASON_";

const state = {
  prefix: new URLSearchParams(location.search).get("prefix") || "",
  pageSize: 100,
  // tokens[i] fetches page i + 1; tokens[0] is the first page's "".
  tokens: [""],
  page: 0,
  next: "",
  timer: null,
  source: null,
  // Bumped when the filter or the page changes, so late replies are dropped.
  generation: 0,
  // The service's clock less the browser's (ms), from the x-batcher-now
  // header: due times count down by the service's clock.
  clockOffset: 0,
};

const $ = (id) => document.getElementById(id);

/** An element with a class and text. */
function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

/**
 * GET `path` with `params` (or, with `send`, its method and JSON body);
 * throws an Error carrying the HTTP status, the gRPC status name (`code`)
 * and the error's details.
 */
async function api(path, params, send) {
  const url = new URL(path, location.href);
  for (const [name, value] of Object.entries(params)) {
    if (value !== "" && value !== undefined) url.searchParams.set(name, value);
  }
  const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
  const init = { headers };
  if (send) {
    init.method = send.method;
    init.body = JSON.stringify(send.body);
    headers["Content-Type"] = "application/json";
  }
  const sent = Date.now();
  const response = await fetch(url, init);
  const serverNow = Number(response.headers.get("x-batcher-now"));
  if (serverNow > 0) state.clockOffset = serverNow - (sent + Date.now()) / 2;
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.error?.message || response.statusText);
    error.status = response.status;
    error.code = body.error?.status || "";
    error.details = body.error?.details || [];
    throw error;
  }
  return body;
}

function notice(text) {
  const box = $("notice");
  box.textContent = text;
  box.hidden = !text;
}

// ---- open groups ----

/** Fetches the page in view, shows it, and schedules the next refresh. */
async function refresh() {
  clearTimeout(state.timer);
  const generation = state.generation;
  try {
    const page = await fetchPage(state.tokens[state.page]);
    if (generation !== state.generation) return;
    state.next = page.next;
    if (page.limits) showLimits(page.limits);
    showGroups(page.groups);
    notice("");
    startFeed();
  } catch (error) {
    if (generation !== state.generation) return;
    if (error.status === 401) {
      askToken();
      return; // refreshing starts again with a token
    }
    notice(`Cannot list the groups: ${error.message}`);
  }
  state.timer = setTimeout(refresh, REFRESH_MS);
}

/**
 * One page of groups from `pageToken`. A reply may hold fewer groups than
 * asked even when more follow (the service scans a bounded stretch of the
 * due order per call, so a rare prefix among many groups comes back in
 * short or empty pages): follow the tokens, a bounded number of calls, until
 * the page is full or the listing ends.
 */
async function fetchPage(pageToken) {
  const groups = [];
  let token = pageToken;
  let limits = null;
  for (let calls = 0; calls < MAX_CALLS_PER_PAGE; calls += 1) {
    const reply = await api("api/groups", {
      prefix: state.prefix,
      page_size: state.pageSize - groups.length,
      page_token: token,
    });
    // The first page's first reply carries the limits on open groups.
    if (!token) {
      limits = { rows: reply.openGroupLimits || [], oldest: reply.oldestLimitedGroupAge };
    }
    groups.push(...(reply.groups || []));
    token = reply.nextPageToken || "";
    if (!token || groups.length >= state.pageSize) break;
  }
  return { groups, next: token, limits };
}

/**
 * Shows each limit on open groups with the groups open under it, and the
 * age of the oldest of them; hidden while no limit is set.
 */
function showLimits(limits) {
  const list = $("limits");
  const items = limits.rows.map((limit) => {
    const open = Number(limit.openGroups || 0);
    const most = Number(limit.limit || 0);
    const item = el("li");
    item.dataset.limit = limit.name;
    item.append(el("span", "limit-name", limit.name), " ");
    item.append(bar(open, most, `${open} / ${most} open`));
    return item;
  });
  if (limits.oldest) {
    const seconds = Math.round(parseFloat(limits.oldest));
    items.push(el("li", "oldest", `Oldest group under a limit opened ${seconds} s ago`));
  }
  list.replaceChildren(...items);
  list.hidden = limits.rows.length === 0;
}

/** Starts again from the first page (after a change of filter or size). */
function restart() {
  state.generation += 1;
  state.tokens = [""];
  state.page = 0;
  refresh();
}

function showGroups(groups) {
  const rows = groups.map(groupRow);
  if (rows.length === 0) {
    const row = el("tr", "empty");
    const where = state.prefix ? ` under “${state.prefix}”` : "";
    const text = state.next
      ? `No open group${where} in this stretch of the list; Next looks further.`
      : `No open group${where}.`;
    const cell = el("td", "", text);
    cell.colSpan = 6;
    row.append(cell);
    rows.push(row);
  }
  document.querySelector("#groups tbody").replaceChildren(...rows);
  tick();
  $("prev").disabled = state.page === 0;
  $("next").disabled = !state.next;
  $("page").textContent = `Page ${state.page + 1} · ${groups.length} groups`;
  $("groups-status").textContent = `Updated ${new Date().toLocaleTimeString()}.`;
}

function groupRow(group) {
  const row = el("tr");
  row.dataset.key = group.key;
  const key = el("th", "key", group.key);
  key.scope = "row";
  const size = group.size || 0;
  const items = el("td");
  items.append(bar(size, group.maxItems, `${size} / ${group.maxItems ?? "∞"}`));
  const bytes = el("td");
  const byteCount = Number(group.bytes || 0);
  bytes.append(group.maxBytes
    ? bar(byteCount, Number(group.maxBytes), `${formatBytes(byteCount)} / ${formatBytes(Number(group.maxBytes))}`)
    : el("span", "plain", formatBytes(byteCount)));
  const capacity = el("td", "capacity");
  const limits = Object.entries(group.capacity || {});
  for (const [name, limit] of limits) {
    const sum = Number(group.measures?.[name] || 0);
    capacity.append(bar(sum, Number(limit), `${name} ${sum} / ${limit}`));
  }
  if (limits.length === 0) capacity.append(el("span", "none", "—"));
  const due = el("td", "due");
  due.dataset.due = group.dueAt ? Date.parse(group.dueAt) : "";
  const reason = shortReason(group.dueReason);
  const by = el("td");
  by.append(el("span", `badge reason-${reason.toLowerCase()}`, reason.toLowerCase().replace("_", " ")));
  row.append(key, items, bytes, capacity, due, by);
  return row;
}

/** A bar of `value` against `max`, with `label` on it, as an ARIA meter. */
function bar(value, max, label) {
  const meter = el("div", "bar");
  const share = max > 0 ? Math.min(value / max, 1) : 0;
  meter.setAttribute("role", "meter");
  meter.setAttribute("aria-valuemin", "0");
  meter.setAttribute("aria-valuemax", String(max || 0));
  meter.setAttribute("aria-valuenow", String(value));
  meter.setAttribute("aria-valuetext", label);
  const fill = el("div", share >= 0.9 ? "fill high" : share >= 0.6 ? "fill mid" : "fill");
  fill.style.width = `${(share * 100).toFixed(1)}%`;
  meter.append(fill, el("span", "bar-label", label));
  return meter;
}

/** Updates every countdown from the due times of the rows. */
function tick() {
  const now = Date.now() + state.clockOffset;
  for (const cell of document.querySelectorAll("td.due")) {
    const due = Number(cell.dataset.due);
    cell.textContent = cell.dataset.due === "" ? "—" : formatCountdown(due - now);
    cell.classList.toggle("soon", due - now < 10_000);
  }
}

function formatCountdown(ms) {
  if (ms <= 0) return "due now";
  const seconds = ms / 1000;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const s = Math.floor(seconds) % 60;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m ${String(s).padStart(2, "0")}s`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours}h ${String(minutes % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)} days`;
}

function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function shortReason(reason) {
  return (reason || "UNSPECIFIED").replace(REASON_PREFIX, "");
}

// ---- batches flushing ----

function setFeedStatus(status, text) {
  document.body.dataset.feed = status;
  $("feed-status").textContent = text;
}

/** Opens the event stream, unless it is open already. */
function startFeed() {
  if (state.source) return;
  const url = new URL("api/batches", location.href);
  if (state.prefix) url.searchParams.set("prefix", state.prefix);
  if (token()) url.searchParams.set("token", token());
  const source = new EventSource(url);
  state.source = source;
  setFeedStatus("connecting", "connecting…");
  source.onopen = () => setFeedStatus("live", "live");
  source.onmessage = (event) => showBatch(JSON.parse(event.data));
  source.addEventListener("error", (event) => {
    if (event.data) notice(`The feed failed: ${JSON.parse(event.data).error?.message}`);
    if (source.readyState !== EventSource.CLOSED) {
      setFeedStatus("reconnecting", "reconnecting…");
      return;
    }
    // Refused (or not an event stream): try again later, as refresh() did.
    setFeedStatus("offline", "offline");
    if (state.source === source) state.source = null;
  });
}

function stopFeed() {
  state.source?.close();
  state.source = null;
}

function showBatch(batch) {
  const reason = shortReason(batch.reason);
  const entry = el("li", `batch reason-${reason.toLowerCase()}`);
  entry.dataset.key = batch.key;
  entry.dataset.id = batch.id;
  const flushed = batch.flushedAt ? new Date(batch.flushedAt) : new Date();
  const time = el("time", "when", flushed.toLocaleTimeString());
  time.dateTime = flushed.toISOString();
  const count = (batch.items || []).length;
  const waited = batch.openedAt ? (flushed - new Date(batch.openedAt)) / 1000 : 0;
  entry.append(
    time,
    el("span", `badge reason-${reason.toLowerCase()}`, reason.toLowerCase().replace("_", " ")),
    el("strong", "key", batch.key),
    el("span", "count", `${count} ${count === 1 ? "item" : "items"} · open ${waited.toFixed(1)} s`),
  );
  const feed = $("feed");
  feed.prepend(entry);
  while (feed.children.length > FEED_MAX) feed.lastElementChild.remove();
}

// ---- the controls ----

function askToken() {
  stopFeed();
  setFeedStatus("offline", "needs a token");
  notice(token() ? "That token was refused." : "");
  $("login").hidden = false;
  $("token").focus();
}

function init() {
  $("prefix").value = state.prefix;
  $("filter").addEventListener("submit", (event) => {
    event.preventDefault();
    state.prefix = $("prefix").value.trim();
    const url = new URL(location.href);
    if (state.prefix) url.searchParams.set("prefix", state.prefix);
    else url.searchParams.delete("prefix");
    history.replaceState(null, "", url);
    $("feed").replaceChildren();
    stopFeed();
    restart();
  });
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    $("login").hidden = true;
    restart();
  });
  $("next").addEventListener("click", () => {
    if (!state.next) return;
    state.tokens[state.page + 1] = state.next;
    state.page += 1;
    state.generation += 1;
    refresh();
  });
  $("prev").addEventListener("click", () => {
    if (state.page === 0) return;
    state.page -= 1;
    state.generation += 1;
    refresh();
  });
  $("page-size").addEventListener("change", () => {
    state.pageSize = Number($("page-size").value);
    restart();
  });
  setInterval(tick, 250);
  refresh();
}

init();
