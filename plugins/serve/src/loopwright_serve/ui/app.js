// The control plane: instances as trees, one instance's transcript as it runs, the approvals
// inbox over all instances, a message box and Cancel. Everything a model or a tool wrote goes
// into the page as text (textContent, through safeText/safeJson), never as HTML.

import { ProblemError, followEvents, getToken, path, request, setToken } from "./api.js";
import { safeJson, safeText } from "./display.js";

const REFRESH_MS = 1500;
const RECONNECT_MS = 1000;
// States in which nothing runs or waits to run: there is nothing to cancel.
const RESTING = new Set(["waiting", "stopped", "error"]);

const $ = (id) => document.getElementById(id);

const state = {
  summaries: new Map(), // instanceId -> summary (as `show --json`)
  nodes: new Map(), // instanceId -> tree node (as `ls --tree --json`)
  parents: new Map(), // instanceId -> the instanceId of the node it hangs under
  selected: null,
  stream: null, // {id, controller, lastEventId, held}: the selected instance's event stream
  soon: null, // a refresh waiting to run
  timer: null,
  generation: 0, // of the latest refresh: an older answer that arrives later is dropped
  signedIn: false,
};

/** Make an element with a class and text (text always through textContent). */
function el(tag, className = "", text = undefined) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function list(value) {
  return Array.isArray(value) ? value : [];
}

function shortId(id) {
  return id.length > 12 ? `…${id.slice(-8)}` : id;
}

function formatCost(cost) {
  if (cost === null || cost === undefined) return "unknown";
  if (cost === 0) return "$0.00";
  return cost < 0.01 ? `$${cost.toPrecision(2)}` : `$${cost.toFixed(2)}`;
}

function tokensOf(summary) {
  const usage = summary?.usage;
  if (!usage) return null;
  return usage.totalTokens ?? (usage.inputTokens ?? 0) + (usage.outputTokens ?? 0);
}

function stateText(item) {
  const shown = item.state ?? "unknown";
  return item.stopReason && item.stopReason !== item.state ? `${shown} (${item.stopReason})` : shown;
}

// ---- errors and status -------------------------------------------------------------------

function showError(error) {
  const problem = error instanceof ProblemError ? error : new ProblemError({ status: 0, title: String(error?.message ?? error) });
  $("error-title").textContent = problem.status ? `${problem.status} ${safeText(problem.title)}` : safeText(problem.title);
  $("error-detail").textContent = problem.detail ? safeText(problem.detail, { multiline: true }) : "";
  $("error").dataset.status = String(problem.status);
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
}

function setStatus(text) {
  $("status").textContent = text;
}

/** Whether a failure may pass by itself: no answer at all (status 0), or a 5xx. */
function transient(error) {
  return error instanceof ProblemError && (error.status === 0 || error.status >= 500);
}

/** Handle a failed request: a 401 sends the person back to sign in; anything else is shown. */
function failed(error) {
  if (error instanceof ProblemError && error.status === 401) {
    signOut(error);
    return;
  }
  showError(error);
}

// ---- sign-in -----------------------------------------------------------------------------

function showSignIn() {
  state.signedIn = false;
  stopStream();
  clearTimeout(state.timer);
  // Nothing seen with the last token stays on the page for whoever signs in next.
  state.selected = null;
  state.summaries = new Map();
  state.nodes = new Map();
  state.parents = new Map();
  for (const id of ["tree", "inbox", "facts", "transcript"]) $(id).replaceChildren();
  $("detail-title").textContent = "Select an instance";
  $("message-form").hidden = true;
  $("transcript").hidden = true;
  $("detail-hint").hidden = false;
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("token-input").focus();
}

function signOut(problem = null) {
  setToken(null);
  showSignIn();
  setStatus("signed out");
  if (problem) showError(problem);
}

async function signIn(token) {
  setToken(token);
  try {
    await refresh({ once: true });
  } catch (error) {
    if (error instanceof ProblemError && error.status === 401) {
      signOut(error);
      return;
    }
    showError(error);
  }
}

function enterApp() {
  if (state.signedIn) return;
  state.signedIn = true;
  clearError();
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = !getToken();
  setStatus(getToken() ? "signed in" : "no token needed (loopback)");
  let wanted = "";
  try {
    wanted = decodeURIComponent(location.hash.slice(1));
  } catch {
    wanted = "";
  }
  if (wanted && !state.selected && state.summaries.has(wanted)) select(wanted);
}

// ---- the instance list and the tree ------------------------------------------------------

async function refresh({ once = false } = {}) {
  clearTimeout(state.timer);
  state.generation += 1;
  const generation = state.generation;
  try {
    const [roots, summaries] = await Promise.all([
      request("../v1/instances?tree=true"),
      request("../v1/instances"),
    ]);
    if (generation !== state.generation) return;
    state.summaries = new Map(list(summaries).map((s) => [s.instanceId, s]));
    state.nodes = new Map();
    state.parents = new Map();
    const walk = (node) => {
      state.nodes.set(node.instanceId, node);
      for (const child of list(node.children)) {
        state.parents.set(child.instanceId, node.instanceId);
        walk(child);
      }
    };
    const rootList = list(roots);
    rootList.forEach(walk);
    // The server answers again: a "cannot be reached" (or a 5xx) shown before is over.
    const shown = Number($("error").dataset.status);
    if (!$("error").hidden && (shown === 0 || shown >= 500)) clearError();
    enterApp();
    renderTree(rootList);
    renderInbox();
    renderFacts();
  } catch (error) {
    if (generation !== state.generation) return;
    if (once || (error instanceof ProblemError && error.status === 401)) throw error;
    showError(error);
  } finally {
    // One timer at a time, however many refreshes overlapped (events and clicks start them too).
    if (generation === state.generation && state.signedIn) {
      clearTimeout(state.timer);
      state.timer = setTimeout(() => refresh().catch(failed), REFRESH_MS);
    }
  }
}

function renderTree(roots) {
  const build = (node) => {
    const summary = state.summaries.get(node.instanceId);
    const li = el("li");
    const row = el("button", "node");
    row.type = "button";
    row.dataset.id = node.instanceId;
    if (node.instanceId === state.selected) row.classList.add("selected");
    row.append(el("span", "name", safeText(node.name ?? summary?.name ?? "?")));
    const badge = el("span", `state state-${(node.state ?? "").replace(/[^a-z_]/g, "")}`, stateText(node));
    row.append(badge);
    const tokens = tokensOf(summary);
    const pending = list(node.pendingApprovals).length;
    const meta = [
      shortId(safeText(node.instanceId)),
      `${node.turns ?? "?"} turns`,
      `${tokens ?? "?"} tokens`,
      formatCost(node.subtreeCost ?? node.cost),
    ];
    if (pending) meta.push(`${pending} to approve`);
    const below = (Number(node.waitingOn) || 0) - pending;
    if (below > 0) meta.push(`${below} waiting below`);
    row.append(el("span", "meta", meta.join(" · ")));
    row.addEventListener("click", () => select(node.instanceId));
    li.append(row);
    const children = list(node.children);
    if (children.length) {
      const ul = el("ul");
      children.forEach((child) => ul.append(build(child)));
      li.append(ul);
    }
    return li;
  };
  const focused = document.activeElement?.classList.contains("node") ? document.activeElement.dataset.id : null;
  $("tree").replaceChildren(...roots.map(build));
  $("tree-empty").hidden = roots.length > 0;
  // The rows are new: keep the keyboard where it was.
  if (focused) [...document.querySelectorAll(".node")].find((row) => row.dataset.id === focused)?.focus();
}

// ---- the approvals inbox -----------------------------------------------------------------

function pendingCalls() {
  const calls = [];
  for (const summary of state.summaries.values()) {
    for (const call of list(summary.pendingApprovals)) {
      if (call.decision) continue;
      // The digest is part of the key: a call id whose call changed gets a new card, never the old one.
      calls.push({ holder: summary, call, key: `${summary.instanceId}\u0000${call.toolCallId}\u0000${call.digest}` });
    }
  }
  calls.sort((a, b) => String(a.call.requestedAt ?? "").localeCompare(String(b.call.requestedAt ?? "")));
  return calls;
}

function renderInbox() {
  const inbox = $("inbox");
  const calls = pendingCalls();
  const wanted = new Set(calls.map((c) => c.key));
  // Cards are kept while their call waits, so a reason being typed is not wiped by a refresh; a
  // card whose call changed under the same id (a new digest) is removed and built anew.
  for (const card of [...inbox.children]) if (!wanted.has(card.dataset.key)) card.remove();
  const have = new Set([...inbox.children].map((card) => card.dataset.key));
  for (const item of calls) if (!have.has(item.key)) inbox.append(card(item));
  $("inbox-empty").hidden = calls.length > 0;
  $("inbox-count").textContent = String(calls.length);
  $("inbox-count").classList.toggle("some", calls.length > 0);
}

function card({ holder, call, key }) {
  const li = el("li", "card");
  li.dataset.key = key;
  li.dataset.instanceId = holder.instanceId;
  li.dataset.toolCallId = call.toolCallId;
  li.dataset.digest = call.digest ?? "";
  li.append(el("div", "tool", safeText(call.tool ?? "?")));
  const where = el("div", "where");
  const open = el("button", "", `${safeText(holder.name ?? "?")} ${shortId(safeText(holder.instanceId))}`);
  open.type = "button";
  open.title = "Show this instance";
  open.addEventListener("click", () => select(holder.instanceId));
  // The agents above the holder, root first: where in which tree the call waits.
  const above = [];
  for (let id = state.parents.get(holder.instanceId); id && above.length < 32; id = state.parents.get(id)) {
    above.unshift(safeText(state.nodes.get(id)?.name ?? id));
  }
  where.append("in ", above.length ? `${above.join(" › ")} › ` : "", open, ` · call ${safeText(call.toolCallId)}`);
  if (call.requestedAt) where.append(` · ${safeText(call.requestedAt)}`);
  li.append(where);
  // What runs if approved, as a digest (name, canonical arguments, the entry): the decision sends it.
  const digest = el("div", "digest", `digest ${safeText(String(call.digest ?? "")).slice(0, 16)}`);
  digest.title = safeText(String(call.digest ?? ""));
  li.append(digest);
  li.append(el("div", "label", "arguments"));
  li.append(el("pre", "args", safeJson(call.arguments ?? {})));
  if (call.reason) {
    li.append(el("div", "label", "reason"));
    li.append(el("p", "reason", safeText(call.reason, { multiline: true })));
  }

  const decide = el("form", "decide");
  const approve = el("button", "primary approve", "Approve");
  approve.type = "button";
  const reason = el("input", "deny-reason");
  reason.placeholder = "reason (for Deny)";
  reason.setAttribute("aria-label", "reason for denying");
  const deny = el("button", "danger deny", "Deny");
  deny.type = "submit";
  decide.append(approve, reason, deny);
  // The decision carries the digest of the call this card shows: the server refuses it (409) when
  // the call pending under this id is another one, and nothing runs.
  const send = async (decision) => {
    const body = { ...decision, digest: call.digest };
    approve.disabled = true;
    deny.disabled = true;
    try {
      await request(path`../v1/instances/${holder.instanceId}/approvals/${call.toolCallId}`, body);
      clearError();
      li.remove();
      refresh().catch(failed);
    } catch (error) {
      failed(error);
      approve.disabled = false;
      deny.disabled = false;
      // A 409 (decided elsewhere, no longer pending, or another call under this id now) means
      // this list is out of date: the refresh rebuilds the card from what is pending.
      if (error instanceof ProblemError && error.status === 409) refresh().catch(failed);
    }
  };
  approve.addEventListener("click", () => send({ decision: "approve" }));
  decide.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = reason.value.trim();
    send(text ? { decision: "deny", reason: text } : { decision: "deny" });
  });
  li.append(decide);
  return li;
}

// ---- one instance ------------------------------------------------------------------------

function select(id) {
  if (state.selected === id && state.stream) return;
  state.selected = id;
  history.replaceState(null, "", `#${encodeURIComponent(id)}`);
  for (const row of document.querySelectorAll(".node")) row.classList.toggle("selected", row.dataset.id === id);
  stopStream();
  $("transcript").replaceChildren();
  $("transcript").hidden = false;
  $("detail-hint").hidden = true;
  $("message-form").hidden = false;
  renderFacts();
  startStream(id);
}

function renderFacts() {
  const id = state.selected;
  const facts = $("facts");
  if (!id) return;
  const summary = state.summaries.get(id) ?? { instanceId: id };
  const node = state.nodes.get(id) ?? {};
  $("detail-title").textContent = `${safeText(summary.name ?? node.name ?? "instance")} ${safeText(id)}`;
  const usage = summary.usage ?? {};
  const rows = [
    ["state", stateText(summary.state ? summary : node)],
    ["model", summary.model ? safeText(summary.model) : "—"],
    ["turns", String(node.turns ?? "?")],
    ["tokens", usage.totalTokens !== undefined ? `${usage.totalTokens} (${usage.inputTokens ?? 0} in, ${usage.outputTokens ?? 0} out)` : "?"],
    ["cost", formatCost(summary.cost)],
    ["subtree cost", formatCost(summary.subtreeCost)],
  ];
  if (summary.error) rows.push(["error", safeText(summary.error, { multiline: true })]);
  facts.replaceChildren(...rows.flatMap(([key, value]) => {
    const dd = el("dd", "", value);
    dd.dataset.fact = key;
    return [el("dt", "", key), dd];
  }));
  $("cancel").disabled = RESTING.has(summary.state);
}

function stopStream() {
  if (state.stream) state.stream.controller.abort();
  state.stream = null;
}

function startStream(id) {
  const stream = { id, controller: new AbortController(), lastEventId: null, held: new Map() };
  state.stream = stream;
  follow(stream);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Follow the selected instance's events until another one is selected. The server keeps the
 * stream open; when it breaks (a restart, the network), this reconnects with Last-Event-ID and
 * gets what it missed. An error answer (401, 403, 404) ends it and is shown.
 */
async function follow(stream) {
  let wait = RECONNECT_MS;
  for (;;) {
    const before = stream.lastEventId;
    try {
      await followEvents(path`../v1/instances/${stream.id}/events`, {
        lastEventId: stream.lastEventId,
        signal: stream.controller.signal,
        onEvent: (message) => onEvent(stream, message),
      });
    } catch (error) {
      if (stream.controller.signal.aborted) return;
      // No answer, or a 5xx (a server shutting down, a proxy without its upstream): try again.
      // A 4xx (401, 403, 404) will not change by itself: show it and stop.
      if (!(error instanceof ProblemError) || !transient(error)) {
        failed(error);
        return;
      }
    }
    if (stream.controller.signal.aborted || state.stream !== stream) return;
    wait = stream.lastEventId !== before ? RECONNECT_MS : Math.min(wait * 2, 15000);
    await sleep(wait);
    if (stream.controller.signal.aborted || state.stream !== stream) return;
  }
}

/** Refresh the list soon, once for a burst of events (a replay sends many at once). */
function refreshSoon() {
  if (state.soon) return;
  state.soon = setTimeout(() => {
    state.soon = null;
    refresh().catch(failed);
  }, 150);
}

function onEvent(stream, message) {
  if (state.stream !== stream) return;
  if (message.id) stream.lastEventId = message.id;
  if (!message.data || typeof message.data !== "object") return;
  if (message.event === "transcript") renderMessage(message.data);
  else if (message.event === "record") {
    renderRecord(stream, message.data);
    if (["state", "approval", "turn", "tool_call"].includes(message.data.kind)) refreshSoon();
  }
}

function item(kind, label, text) {
  const node = el("div", `item ${kind}`);
  node.dataset.kind = kind;
  node.append(el("span", "label", label));
  node.append(document.createTextNode(text));
  return node;
}

function addItem(node) {
  const box = $("transcript");
  const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 60;
  box.append(node);
  if (atEnd) box.scrollTop = box.scrollHeight;
}

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return safeText(content, { multiline: true });
  return safeJson(content);
}

/** One message of the transcript (the instance's entry log): {index, message, turn?}. */
function renderMessage({ message, turn }) {
  if (!message || typeof message !== "object") return;
  const at = turn && typeof turn === "object" && turn.n !== undefined ? ` · turn ${turn.n}` : "";
  switch (message.role) {
    case "system":
      addItem(item("system", "system prompt", contentText(message.content)));
      return;
    case "user": {
      const source = message.source ? ` · from ${safeText(message.source)}` : "";
      addItem(item("user", `user${source}`, contentText(message.content)));
      return;
    }
    case "assistant": {
      const text = contentText(message.content);
      if (text) addItem(item("assistant", `assistant${at}`, text));
      for (const call of list(message.toolCalls)) {
        addItem(item("tool_call", `call ${safeText(call.id ?? "")}${at}`,
          `${safeText(call.name ?? "?")} ${safeJson(call.arguments ?? {}, 0)}`));
      }
      return;
    }
    case "tool": {
      const status = message.status ? ` · ${safeText(message.status)}` : "";
      addItem(item("tool_result", `result of ${safeText(message.name ?? "?")} ${safeText(message.toolCallId ?? "")}${status}`,
        contentText(message.content)));
      return;
    }
    default:
      addItem(item("other", safeText(message.role ?? "message"), contentText(message.content)));
  }
}

/** One record (as `loopwright records` prints it): {kind, instanceId, at, data}. */
function renderRecord(stream, record) {
  const data = record.data && typeof record.data === "object" ? record.data : {};
  switch (record.kind) {
    case "state": {
      // "running" is left out: the messages show the work, and it would land after them (a
      // batch of the stream has the new messages first, then the new records).
      if (data.to === "running") return;
      const text = data.to === data.stopReason || !data.stopReason ? `${data.to}` : `${data.to} (${data.stopReason})`;
      addItem(item(data.to === "error" ? "error" : "state", "state", safeText(text + (data.cancelled ? ", cancelled" : ""))));
      return;
    }
    case "approval": {
      const call = `${safeText(data.tool ?? "?")} (call ${safeText(data.toolCallId ?? "?")})`;
      if (!data.decision) {
        // The digest a decision on it must carry (the inbox card shows it too, and sends it).
        const digest = typeof data.digest === "string" ? ` · digest ${safeText(data.digest).slice(0, 16)}` : "";
        const held = item("approval", "waits for approval", `${call}${digest}${data.reason ? `: ${safeText(data.reason, { multiline: true })}` : ""}`);
        stream.held.set(data.toolCallId, held);
        addItem(held);
        return;
      }
      // The decision is shown where the call was held (it happened before what follows it).
      const by = data.by ? ` by ${safeText(data.by)}` : "";
      const why = data.reason ? ` (${safeText(data.reason, { multiline: true })})` : "";
      const decided = item(data.decision === "denied" ? "denied" : "approved", `${safeText(data.decision)}${by}`, `${call}${why}`);
      const held = stream.held.get(data.toolCallId);
      if (held) held.replaceWith(decided);
      else addItem(decided);
      stream.held.delete(data.toolCallId);
      return;
    }
    case "error":
      addItem(item("error", "error", safeText(data.message ?? data.error ?? safeJson(data, 0), { multiline: true })));
      return;
    case "compaction":
    case "completion":
    case "monitor":
      addItem(item("other", safeText(record.kind), safeJson(data, 0)));
      return;
    default:
      // turn, tool_call, message, cost, hook ...: their facts show in the transcript and the header.
  }
}

// ---- wiring ------------------------------------------------------------------------------

function wire() {
  $("error-close").addEventListener("click", clearError);
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    $("token-input").value = "";
    if (token) signIn(token);
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("message-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = state.selected;
    const text = $("message-text").value;
    if (!id || !text.trim()) return;
    try {
      await request(path`../v1/instances/${id}/messages`, { text });
      $("message-text").value = "";
      clearError();
      refresh().catch(failed);
    } catch (error) {
      failed(error);
    }
  });
  $("message-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      $("message-form").requestSubmit();
    }
  });
  $("cancel").addEventListener("click", async () => {
    const id = state.selected;
    if (!id) return;
    try {
      await request(path`../v1/instances/${id}/cancel`, {});
      clearError();
      refresh().catch(failed);
    } catch (error) {
      failed(error);
    }
  });
  $("start-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { definition: $("start-definition").value.trim() };
    const prompt = $("start-prompt").value;
    if (prompt) body.prompt = prompt;
    try {
      const started = await request("../v1/instances", body);
      clearError();
      $("start-prompt").value = "";
      await refresh();
      if (started?.instanceId) select(started.instanceId);
    } catch (error) {
      failed(error);
    }
  });
}

wire();
refresh({ once: true }).catch((error) => {
  if (error instanceof ProblemError && error.status === 401) {
    showSignIn();
    if (getToken()) signOut(error);
    else setStatus("sign in with a token");
  } else {
    showError(error);
    showSignIn();
  }
});
