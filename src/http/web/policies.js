// batcher's policies, the Policies tab (#policies): each policy of the
// policy store (GET /api/policies, by the key-prefix filter), with its
// revision, its set fields and who last wrote it; an edit form per policy
// that sends only the changed fields, in the update mask, with the etag the
// form loaded (PATCH /api/policies/{name}); and its history
// (GET /api/revisions?name=). A policy changed meanwhile by someone else
// answers 409: the form says so and reloads the policy, keeping nothing of
// the edit. Uses app.js's api(), el(), $(), notice() and askToken().
"use strict";

const POLICY_PAGE = 100;
const HISTORY_PAGE = 20;

const policyView = {
  // The next page's token of the list, "" at its end.
  next: "",
  // Bumped at each fresh listing, so late pages are dropped.
  generation: 0,
};

// ---- the fields, in the forms of the config file ----

const DURATION_UNITS = { d: 86_400_000, h: 3_600_000, m: 60_000, min: 60_000, s: 1000, ms: 1 };
const BYTE_UNITS = { b: 1, kb: 1e3, mb: 1e6, gb: 1e9, kib: 1024, mib: 1024 ** 2, gib: 1024 ** 3 };

/** A JSON-mapping duration ("240s", "0.500s") as "4m", "1h 30m", "500ms". */
function showDuration(json) {
  if (json === undefined) return "";
  let ms = Math.round(parseFloat(json) * 1000);
  if (ms === 0) return "0s";
  const parts = [];
  for (const [unit, size] of [["d", 864e5], ["h", 36e5], ["m", 6e4], ["s", 1e3], ["ms", 1]]) {
    if (ms >= size) parts.push(`${Math.floor(ms / size)}${unit}`);
    ms %= size;
  }
  return parts.join(" ");
}

/** "4m", "1h 30m", "90s", "500ms" as a JSON-mapping duration ("240.000s"). */
function parseDuration(text) {
  const spans = [...text.matchAll(/(\d+(?:\.\d+)?)\s*([a-z]+)\s*/gi)];
  const whole = spans.map((m) => m[0]).join("");
  const units = spans.map((m) => DURATION_UNITS[m[2].toLowerCase()]);
  if (spans.length === 0 || whole !== text || units.includes(undefined)) {
    throw new Error("is not a duration: use such as 90s, 4m or 1h 30m");
  }
  const ms = Math.round(spans.reduce((sum, m, i) => sum + parseFloat(m[1]) * units[i], 0));
  return `${Math.floor(ms / 1000)}.${String(ms % 1000).padStart(3, "0")}s`;
}

function showBytes(json) {
  if (json === undefined) return "";
  const n = Number(json);
  for (const [unit, size] of [["GiB", 1024 ** 3], ["MiB", 1024 ** 2], ["KiB", 1024]]) {
    if (n >= size && n % size === 0) return `${n / size} ${unit}`;
  }
  return String(n);
}

function parseBytes(text) {
  const match = /^(\d+)\s*([a-z]*)$/i.exec(text);
  const size = match && (match[2] === "" ? 1 : BYTE_UNITS[match[2].toLowerCase()]);
  if (!size) throw new Error("is not a size: use such as 65536, 512 KiB or 1 MiB");
  return String(Number(match[1]) * size);
}

function parseCount(text) {
  if (!/^\d+$/.test(text)) throw new Error("is not a whole number");
  return Number(text);
}

function showCapacity(json) {
  return Object.entries(json?.limits || {}).map(([name, n]) => `${name}=${n}`).join(", ");
}

function parseCapacity(text) {
  const limits = {};
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const match = /^([^=\s]+)\s*=\s*(\d+)$/.exec(part);
    if (!match) throw new Error("is not a capacity: use such as weight_g=20000, volume_l=3");
    limits[match[1]] = match[2];
  }
  return { limits };
}

/** The names `overflow` takes, as the config file writes them. */
const OVERFLOWS = ["refuse", "flush_oldest"];

function parseOverflow(text) {
  if (!OVERFLOWS.includes(text)) throw new Error(`is not an overflow: use ${OVERFLOWS.join(" or ")}`);
  return text;
}

function parseCutoffs(text) {
  return { times: text.split(/[\s,]+/).filter(Boolean) };
}

/**
 * The editable fields: name, JSON-mapping name, how to show and read, and
 * for a field of a few names, those names (a menu instead of a text box).
 */
const FIELDS = [
  ["max_items", "maxItems", (v) => (v === undefined ? "" : String(v)), parseCount],
  ["max_wait", "maxWait", showDuration, parseDuration],
  ["max_bytes", "maxBytes", showBytes, parseBytes],
  ["max_idle", "maxIdle", showDuration, parseDuration],
  ["capacity", "capacity", showCapacity, parseCapacity],
  ["cutoffs", "cutoffs", (v) => (v?.times || []).join(", "), parseCutoffs],
  ["timezone", "timezone", (v) => v ?? "", (text) => text],
  ["deadline_lead", "deadlineLead", showDuration, parseDuration],
  ["min_items", "minItems", (v) => (v === undefined ? "" : String(v)), parseCount],
  ["max_age", "maxAge", showDuration, parseDuration],
  ["max_groups", "maxGroups", (v) => (v === undefined ? "" : String(v)), parseCount],
  ["overflow", "overflow", (v) => v ?? "", parseOverflow, OVERFLOWS],
].map(([name, json, show, parse, choices]) => ({ name, json, show, parse, choices }));

/** A field's text from the form as its JSON value; undefined when empty. */
function readField(field, text) {
  const trimmed = text.trim();
  return trimmed === "" ? undefined : field.parse(trimmed);
}

// ---- the list ----

/** The part of a policy's name after "policies/", for the page and URLs. */
function shortName(name) {
  return name.replace(/^policies\//, "");
}

function policyUrl(name) {
  const rest = shortName(name);
  const pattern = rest.startsWith("keys/") ? rest.slice(5) : null;
  return pattern === null ? `api/${name}` : `api/policies/keys/${encodeURIComponent(pattern)}`;
}

function setPoliciesStatus(text) {
  $("policies-status").textContent = text;
}

/** Lists the policies from the first page (with `more`, the next page). */
async function loadPolicies(more) {
  if (!more) policyView.generation += 1;
  const generation = policyView.generation;
  setPoliciesStatus("loading…");
  try {
    const page = await api("api/policies", {
      prefix: state.prefix,
      page_size: POLICY_PAGE,
      page_token: more ? policyView.next : "",
    });
    if (generation !== policyView.generation) return;
    showPolicies(page.policies || [], more);
    policyView.next = page.nextPageToken || "";
    $("policies-more").hidden = !policyView.next;
    $("policies-off").hidden = true;
    setPoliciesStatus(`listed at store revision ${page.revision || 0}`);
  } catch (error) {
    if (generation !== policyView.generation) return;
    policiesFailed(error);
  }
}

function policiesFailed(error) {
  setPoliciesStatus("");
  if (error.status === 401) return askToken();
  const off = error.code === "FAILED_PRECONDITION";
  $("policies-off").textContent = off
    ? `The policy store is off, so the policies come from the config file: ${error.message}`
    : `Cannot list the policies: ${error.message}`;
  $("policies-off").hidden = false;
  $("policies").replaceChildren();
  $("policies-more").hidden = true;
}

function showPolicies(policies, more) {
  const cards = policies.map((policy) => policyCard(policy));
  if (more) $("policies").append(...cards);
  else $("policies").replaceChildren(...cards);
  if (!more && cards.length === 0) {
    const where = state.prefix ? ` for keys under “${state.prefix}”` : "";
    $("policies").append(el("p", "empty", `No policy${where}.`));
  }
}

/** One policy: its name, revision, set fields, last writer, form, history. */
function policyCard(policy) {
  const card = el("article", "policy");
  card.dataset.name = policy.name;
  card.dataset.revision = policy.revision || "0";
  const head = el("header");
  const when = policy.updateTime ? new Date(policy.updateTime).toLocaleString() : "";
  head.append(
    el("h3", "name", shortName(policy.name)),
    el("span", "revision", `revision ${policy.revision || 0}`),
    el("span", "updated", `by ${policy.updatedBy || "?"} · ${when}`),
  );
  card.append(head, setFields(policy), editForm(policy), historyBox(policy.name));
  return card;
}

function setFields(policy) {
  const list = el("dl", "fields");
  for (const field of FIELDS) {
    if (policy[field.json] === undefined) continue;
    const row = el("div");
    row.dataset.field = field.name;
    const shown = field.show(policy[field.json]) || "none";
    row.append(el("dt", "", field.name), el("dd", "", shown));
    list.append(row);
  }
  if (list.children.length === 0) list.append(el("p", "none", "No field set: the defaults apply."));
  return list;
}

// ---- the edit form ----

/** The edit form of `policy`: its fields as loaded, a reason, its etag. */
function editForm(policy, open, message) {
  const box = el("details", "edit");
  box.open = Boolean(open);
  box.append(el("summary", "", "Edit"));
  const form = el("form", "edit-form");
  form.dataset.etag = policy.etag || "";
  form.policy = policy;
  for (const field of FIELDS) {
    const label = el("label", "", field.name);
    const input = fieldInput(field);
    input.name = field.name;
    input.value = field.show(policy[field.json]);
    label.append(input);
    form.append(label);
  }
  const reason = el("label", "reason", "reason");
  const why = el("input");
  why.name = "reason";
  why.placeholder = "why, for the history";
  reason.append(why);
  const status = el("p", "form-status", message?.text || "");
  if (message?.kind) status.classList.add(message.kind);
  status.setAttribute("role", "status");
  const save = el("button", "", "Save");
  save.type = "submit";
  form.append(reason, save, status);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submitEdit(form);
  });
  box.append(form);
  return box;
}

/** A text box for `field`, or a menu of its names (the first, empty: unset). */
function fieldInput(field) {
  if (!field.choices) {
    const input = el("input");
    input.autocomplete = "off";
    input.spellcheck = false;
    return input;
  }
  const menu = el("select");
  for (const choice of ["", ...field.choices]) {
    const option = el("option", "", choice || "(unset)");
    option.value = choice;
    menu.append(option);
  }
  return menu;
}

/** The changed fields of `form`: the policy's JSON with them, and the mask. */
function changedFields(form) {
  const changes = { policy: {}, mask: [] };
  for (const field of FIELDS) {
    const input = form.elements[field.name];
    input.removeAttribute("aria-invalid");
    let value;
    try {
      value = readField(field, input.value);
    } catch (error) {
      input.setAttribute("aria-invalid", "true");
      throw new Error(`${field.name} ${error.message}`);
    }
    const loaded = readField(field, field.show(form.policy[field.json]));
    if (JSON.stringify(value) === JSON.stringify(loaded)) continue;
    if (value !== undefined) changes.policy[field.json] = value;
    changes.mask.push(field.json);
  }
  return changes;
}

function formStatus(form, text, kind) {
  const status = form.querySelector(".form-status");
  status.textContent = text;
  status.className = `form-status ${kind || ""}`.trim();
}

/** Sends the changed fields with the etag the form loaded. */
async function submitEdit(form) {
  let changes;
  try {
    changes = changedFields(form);
  } catch (error) {
    return formStatus(form, error.message, "error");
  }
  if (changes.mask.length === 0) return formStatus(form, "Nothing changed.", "error");
  const body = {
    policy: { ...changes.policy, etag: form.dataset.etag },
    updateMask: changes.mask.join(","),
    reason: form.elements.reason.value.trim(),
  };
  form.querySelector("button").disabled = true;
  formStatus(form, "Saving…");
  try {
    const saved = await api(policyUrl(form.policy.name), {}, { method: "PATCH", body });
    const text = `Saved as revision ${saved.revision}.`;
    replaceCard(form, saved, { text, kind: "saved" }, true);
  } catch (error) {
    await editFailed(form, error);
  }
}

async function editFailed(form, error) {
  form.querySelector("button").disabled = false;
  if (error.status === 401) return askToken();
  if (error.status !== 409) {
    const bad = error.details.find((d) => d["@type"]?.endsWith("BadRequest"));
    const field = bad?.fieldViolations?.[0]?.field?.replace(/^policy\./, "");
    form.elements[field]?.setAttribute("aria-invalid", "true");
    return formStatus(form, `Not saved: ${error.message}`, "error");
  }
  // Someone else changed it meanwhile: show it as it is now, keep nothing.
  const text =
    "Not saved: this policy was changed by someone else meanwhile. " +
    "The form now shows it as it is; make your change again if it still applies.";
  try {
    const now = await api(policyUrl(form.policy.name), {});
    replaceCard(form, now, { text, kind: "conflict" }, true);
  } catch (reload) {
    formStatus(form, `${text} (Reloading it failed: ${reload.message})`, "conflict");
  }
}

/** Replaces the card of `form` with one of `policy`, its form open or not. */
function replaceCard(form, policy, message, open) {
  const old = form.closest("article.policy");
  const card = policyCard(policy);
  card.querySelector("details.edit").replaceWith(editForm(policy, open, message));
  old.replaceWith(card);
  const history = card.querySelector("details.history");
  if (old.querySelector("details.history").open) {
    history.open = true; // its toggle loads it again
  }
}

// ---- the history ----

function historyBox(name) {
  const box = el("details", "history");
  box.append(el("summary", "", "History"), el("ol", "revisions"));
  const older = el("button", "older", "Older");
  older.type = "button";
  older.hidden = true;
  older.addEventListener("click", () => loadHistory(box, name, older.dataset.next));
  box.append(older);
  box.addEventListener("toggle", () => {
    if (box.open) loadHistory(box, name, "");
  });
  return box;
}

/** Shows the history of `name` (from its newest, or from `pageToken`). */
async function loadHistory(box, name, pageToken) {
  const list = box.querySelector("ol");
  const older = box.querySelector("button.older");
  try {
    const page = await api("api/revisions", { name, page_size: HISTORY_PAGE, page_token: pageToken });
    const entries = (page.revisions || []).map((revision) => historyEntry(revision, name));
    if (pageToken) list.append(...entries);
    else list.replaceChildren(...entries);
    older.dataset.next = page.nextPageToken || "";
    older.hidden = !page.nextPageToken;
    box.dataset.loaded = "true";
  } catch (error) {
    if (error.status === 401) return askToken();
    list.replaceChildren(el("li", "error", `Cannot read the history: ${error.message}`));
  }
}

/** A JSON text of the history ("null", "\"4m\"", "10") for people. */
function showValue(text) {
  try {
    const value = JSON.parse(text);
    if (value === null) return "unset";
    return typeof value === "string" ? value : JSON.stringify(value);
  } catch {
    return text;
  }
}

/** One revision: who, when, why, and each field's old → new value. */
function historyEntry(revision, name) {
  const entry = el("li", "revision-entry");
  entry.dataset.revision = revision.revision;
  const time = el("time", "when", revision.time ? new Date(revision.time).toLocaleString() : "");
  if (revision.time) time.dateTime = revision.time;
  entry.append(
    el("strong", "", `revision ${revision.revision}`),
    time,
    el("span", "who", revision.who || "?"),
    el("q", "reason", revision.reason || "no reason given"),
  );
  const fields = el("ul", "changes");
  for (const change of revision.changes || []) {
    if (change.name !== name) continue;
    if (change.action && change.action !== "UPDATED") fields.append(el("li", "action", change.action.toLowerCase()));
    for (const field of change.fields || []) {
      const line = el("li", "change", `${field.field}: ${showValue(field.oldValue)} → ${showValue(field.newValue)}`);
      line.dataset.field = field.field;
      fields.append(line);
    }
  }
  if (revision.bulkCount) fields.append(el("li", "", `${revision.bulkCount} policies changed at once`));
  entry.append(fields);
  return entry;
}

// ---- the tabs ----

/** Shows the view the location's hash names: #policies, or the live view. */
function showView() {
  const policies = location.hash === "#policies";
  document.querySelector("main").hidden = policies;
  $("policies-view").hidden = !policies;
  $("tab-live").setAttribute("aria-current", policies ? "false" : "page");
  $("tab-policies").setAttribute("aria-current", policies ? "page" : "false");
  if (policies) loadPolicies(false);
}

function initPolicies() {
  window.addEventListener("hashchange", showView);
  $("policies-reload").addEventListener("click", () => loadPolicies(false));
  $("policies-more").addEventListener("click", () => loadPolicies(true));
  const reloadIfShown = () => {
    if (!$("policies-view").hidden) loadPolicies(false);
  };
  $("filter").addEventListener("submit", reloadIfShown);
  $("login").addEventListener("submit", reloadIfShown);
  showView();
}

initPolicies();
