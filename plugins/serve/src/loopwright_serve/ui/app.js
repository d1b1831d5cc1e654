// The control plane: start an agent from a form, find instances (filters, pages, trees), follow
// one instance's run as a timeline with live numbers, fork or rewind it from a turn, and the
// inbox of held calls and open questions over every tree. Everything a model or a tool wrote
// goes into the page as text (textContent, through safeText/safeJson), never as HTML.

import { ProblemError, followEvents, getToken, path, request, requestPage, setToken } from "./api.js";
import { safeJson, safeText } from "./display.js";
import { el, list, shortId } from "./dom.js";
import { formatCost, formatDuration, formatTokens, secondsBetween } from "./format.js";
import { StartForm } from "./start.js";
import { Timeline } from "./timeline.js";

const REFRESH_MS = 1500;
const RECONNECT_MS = 1000;
const PAGE_SIZE = 20;
// States in which nothing runs or waits to run: there is nothing to cancel.
const RESTING = new Set(["waiting", "stopped", "error"]);

const $ = (id) => document.getElementById(id);

const state = {
  summaries: new Map(), // instanceId -> summary (as `show --json`, with live, question, forkedFrom)
  nodes: new Map(), // instanceId -> tree node of the page shown
  parents: new Map(), // instanceId -> the instanceId of the agent that started it
  kids: new Map(), // instanceId -> [the instanceIds it started]
  selected: null,
  stream: null, // the selected instance's event stream
  timeline: null, // the selected instance's Timeline
  soon: null, // a refresh waiting to run
  timer: null,
  generation: 0, // of the latest refresh: an older answer that arrives later is dropped
  signedIn: false,
  find: { text: "", state: "", definition: "", view: "trees", offset: 0 },
  total: 0,
};
const startForm = new StartForm();

function stateText(item) {
  const shown = item.state ?? "unknown";
  return item.stopReason && item.stopReason !== item.state ? `${shown} (${item.stopReason})` : shown;
}

/** The counters of an instance as they stand: live while it runs, else its header's. */
function numbers(id) {
  const summary = state.summaries.get(id) ?? {};
  const live = summary.live ?? state.nodes.get(id)?.live;
  if (live) return { turns: live.turns, usage: live.usage, cost: live.cost, since: live.runningSince };
  return { turns: state.nodes.get(id)?.turns ?? null, usage: summary.usage ?? null, cost: summary.cost ?? null, since: null };
}

/** The numbers of an instance and every agent below it: how many, tokens, cost (null: unknown). */
function subtree(id) {
  let agents = 0;
  let tokens = 0;
  let cost = 0;
  const seen = new Set();
  const walk = (at) => {
    if (seen.has(at) || seen.size > 10000) return;
    seen.add(at);
    agents += 1;
    const own = numbers(at);
    tokens += Number(own.usage?.totalTokens) || (Number(own.usage?.inputTokens) || 0) + (Number(own.usage?.outputTokens) || 0);
    cost = cost === null || own.cost === null || own.cost === undefined ? null : cost + own.cost;
    for (const child of state.kids.get(at) ?? []) walk(child);
  };
  walk(id);
  return { agents, tokens, cost };
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
  state.kids = new Map();
  for (const id of ["tree", "inbox", "facts", "transcript"]) $(id).replaceChildren();
  $("records-view").hidden = true;
  $("records-view").textContent = "";
  $("detail-title").textContent = "Select an instance";
  $("message-form").hidden = true;
  $("detail-tools").hidden = true;
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

function pageQuery() {
  const query = new URLSearchParams({ live: "true", order: "newest", offset: String(state.find.offset), limit: String(PAGE_SIZE) });
  if (state.find.view === "trees") query.set("tree", "true");
  if (state.find.text) query.set("q", state.find.text);
  if (state.find.state) query.set("state", state.find.state);
  if (state.find.definition) query.set("name", state.find.definition);
  return `../v1/instances?${query}`;
}

async function refresh({ once = false } = {}) {
  clearTimeout(state.timer);
  state.generation += 1;
  const generation = state.generation;
  try {
    const [summaries, page, definitions] = await Promise.all([
      request("../v1/instances?live=true"),
      requestPage(pageQuery()),
      request("../v1/definitions"),
    ]);
    if (generation !== state.generation) return;
    state.summaries = new Map(list(summaries).map((s) => [s.instanceId, s]));
    state.parents = new Map();
    state.kids = new Map();
    for (const s of state.summaries.values()) {
      const parent = s.spawnerInstanceId;
      if (typeof parent === "string" && state.summaries.has(parent)) {
        state.parents.set(s.instanceId, parent);
        state.kids.set(parent, [...(state.kids.get(parent) ?? []), s.instanceId]);
      }
    }
    state.nodes = new Map();
    const walk = (node) => {
      state.nodes.set(node.instanceId, node);
      list(node.children).forEach(walk);
    };
    const shown = list(page.body);
    if (state.find.view === "trees") shown.forEach(walk);
    state.total = page.total;
    // The server answers again: a "cannot be reached" (or a 5xx) shown before is over.
    const status = Number($("error").dataset.status);
    if (!$("error").hidden && (status === 0 || status >= 500)) clearError();
    startForm.load(list(definitions));
    loadDefinitionFilter(list(definitions));
    enterApp();
    renderTree(shown);
    renderInbox();
    renderFacts();
    state.timeline?.setChildren(childrenOf(state.selected));
    state.timeline?.refreshNested();
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

function loadDefinitionFilter(definitions) {
  const picker = $("find-definition");
  const names = [...new Set(definitions.map((d) => d.agentName ?? d.name).filter((n) => typeof n === "string"))].sort();
  const have = [...picker.options].slice(1).map((o) => o.value);
  if (JSON.stringify(have) === JSON.stringify(names)) return;
  const chosen = picker.value;
  picker.replaceChildren(Object.assign(el("option", "", "any agent"), { value: "" }),
    ...names.map((n) => Object.assign(el("option", "", safeText(n)), { value: n })));
  picker.value = names.includes(chosen) ? chosen : "";
}

function childrenOf(id) {
  return (state.kids.get(id) ?? []).map((child) => state.summaries.get(child)).filter(Boolean);
}

function row(id, fallback) {
  const summary = state.summaries.get(id) ?? fallback;
  const node = state.nodes.get(id) ?? fallback;
  const button = el("button", "node");
  button.type = "button";
  button.dataset.id = id;
  if (id === state.selected) button.classList.add("selected");
  button.append(el("span", "name", safeText(node.name ?? summary?.name ?? "?")));
  button.append(el("span", `state state-${(node.state ?? "").replace(/[^a-z_]/g, "")}`, stateText(node)));
  const own = numbers(id);
  const tokens = own.usage ? Number(own.usage.totalTokens) || 0 : null;
  const pending = list(node.pendingApprovals).length;
  const meta = [
    shortId(safeText(id)),
    own.turns === 1 ? "1 turn" : `${own.turns ?? "?"} turns`,
    `${tokens ?? "?"} tokens`,
    formatCost(own.cost),
  ];
  if (node.state === "running" && own.since) meta.push(`running ${formatDuration(secondsBetween(own.since))}`);
  if (pending) meta.push(`${pending} to approve`);
  const below = (Number(node.waitingOn) || 0) - pending;
  if (below > 0) meta.push(`${below} waiting below`);
  if (summary?.question) meta.push("asks a question");
  if (summary?.forkedFrom?.instanceId) meta.push(`fork of ${shortId(safeText(summary.forkedFrom.instanceId))}`);
  button.append(el("span", "meta", meta.join(" · ")));
  if ((state.kids.get(id) ?? []).length) {
    const tree = subtree(id);
    button.append(el("span", "subtree", `tree: ${tree.agents} agents · ${tree.tokens} tokens · ${formatCost(tree.cost)}`));
  }
  button.addEventListener("click", () => select(id));
  return button;
}

function renderTree(shown) {
  const build = (node) => {
    const li = el("li");
    li.append(row(node.instanceId, node));
    const children = list(node.children);
    if (children.length) {
      const ul = el("ul");
      children.forEach((child) => ul.append(build(child)));
      li.append(ul);
    }
    return li;
  };
  const flat = (summary) => {
    const li = el("li");
    li.append(row(summary.instanceId, summary));
    return li;
  };
  const focused = document.activeElement?.classList.contains("node") ? document.activeElement.dataset.id : null;
  $("tree").replaceChildren(...shown.map(state.find.view === "trees" ? build : flat));
  const filtered = state.find.text || state.find.state || state.find.definition;
  $("tree-empty").textContent = filtered ? "Nothing matches." : "No instances yet.";
  $("tree-empty").hidden = shown.length > 0;
  const first = shown.length ? state.find.offset + 1 : 0;
  const what = state.find.view === "trees" ? "trees" : "instances";
  $("page-info").textContent = `${first}–${state.find.offset + shown.length} of ${state.total} ${what}`;
  $("page-prev").disabled = state.find.offset === 0;
  $("page-next").disabled = state.find.offset + shown.length >= state.total;
  // The rows are new: keep the keyboard where it was.
  if (focused) [...document.querySelectorAll(".node")].find((r) => r.dataset.id === focused)?.focus();
}

// ---- the inbox: held calls and open questions ---------------------------------------------

function rootOf(id) {
  let at = id;
  for (let k = 0; k < 64 && state.parents.has(at); k += 1) at = state.parents.get(at);
  return at;
}

function inboxItems() {
  const items = [];
  for (const summary of state.summaries.values()) {
    const root = rootOf(summary.instanceId);
    for (const call of list(summary.pendingApprovals)) {
      if (call.decision) continue;
      // The digest is part of the key: a call id whose call changed gets a new card, never the old one.
      items.push({ kind: "call", holder: summary, call, root, when: String(call.requestedAt ?? ""),
        key: `${summary.instanceId}\u0000${call.toolCallId}\u0000${call.digest}` });
    }
    if (summary.question) {
      items.push({ kind: "question", holder: summary, question: summary.question, root, when: String(summary.updatedAt ?? ""),
        key: `q\u0000${summary.instanceId}\u0000${summary.question.toolCallId}` });
    }
  }
  // Grouped by tree (its root's start), then in the order they came.
  const started = (id) => String(state.summaries.get(id)?.createdAt ?? "");
  items.sort((a, b) => started(a.root).localeCompare(started(b.root)) || a.root.localeCompare(b.root) || a.when.localeCompare(b.when));
  return items;
}

function renderInbox() {
  const inbox = $("inbox");
  const items = inboxItems();
  const wanted = new Set(items.map((c) => c.key));
  // Cards are kept while what they show waits, so a reason being typed is not wiped by a refresh;
  // a card whose call changed under the same id (a new digest) is removed and built anew.
  for (const card of [...inbox.children]) if (!wanted.has(card.dataset.key)) card.remove();
  const have = new Map([...inbox.children].map((card) => [card.dataset.key, card]));
  let previous = null;
  items.forEach((entry, index) => {
    const card = have.get(entry.key) ?? (entry.kind === "call" ? callCard(entry) : questionCard(entry));
    if (inbox.children[index] !== card) inbox.insertBefore(card, inbox.children[index] ?? null);
    // The first card of each tree names the tree (its root), so a tree's calls and questions read together.
    card.querySelector(".tree-label")?.remove();
    if (entry.root !== previous) {
      const root = state.summaries.get(entry.root);
      card.prepend(el("div", "tree-label", `tree ${safeText(root?.name ?? "?")} ${shortId(safeText(entry.root))}`));
    }
    previous = entry.root;
  });
  $("inbox-empty").hidden = items.length > 0;
  $("inbox-count").textContent = String(items.length);
  $("inbox-count").classList.toggle("some", items.length > 0);
}

function where(holder, extra) {
  const node = el("div", "where");
  const open = el("button", "", `${safeText(holder.name ?? "?")} ${shortId(safeText(holder.instanceId))}`);
  open.type = "button";
  open.title = "Show this instance";
  open.addEventListener("click", () => select(holder.instanceId));
  // The agents above the holder, root first: where in which tree it waits.
  const above = [];
  for (let id = state.parents.get(holder.instanceId); id && above.length < 32; id = state.parents.get(id)) {
    above.unshift(safeText(state.summaries.get(id)?.name ?? id));
  }
  node.append("in ", above.length ? `${above.join(" › ")} › ` : "", open, extra);
  return node;
}

function callCard({ holder, call, key, root }) {
  const li = el("li", "card");
  li.dataset.key = key;
  li.dataset.root = root;
  li.dataset.instanceId = holder.instanceId;
  li.dataset.toolCallId = call.toolCallId;
  li.dataset.digest = call.digest ?? "";
  li.append(el("div", "tool", safeText(call.tool ?? "?")));
  li.append(where(holder, ` · call ${safeText(call.toolCallId)}${call.requestedAt ? ` · ${safeText(call.requestedAt)}` : ""}`));
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

function questionCard({ holder, question, key, root }) {
  const li = el("li", "card question");
  li.dataset.key = key;
  li.dataset.root = root;
  li.dataset.instanceId = holder.instanceId;
  li.dataset.toolCallId = String(question.toolCallId ?? "");
  li.append(el("div", "tool", "asks"));
  li.append(where(holder, ` · call ${safeText(String(question.toolCallId ?? ""))}`));
  li.append(el("p", "question-text", safeText(String(question.question ?? ""), { multiline: true })));
  const form = el("form", "answer-form");
  const text = el("textarea", "answer-text");
  text.rows = 2;
  text.placeholder = "your answer";
  text.setAttribute("aria-label", "answer");
  const send = el("button", "primary answer", "Answer");
  send.type = "submit";
  form.append(text, send);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!text.value.trim()) return;
    send.disabled = true;
    try {
      // The answer is the next message: the instance reads it as the question's answer.
      await request(path`../v1/instances/${holder.instanceId}/messages`, { text: text.value });
      clearError();
      li.remove();
      refresh().catch(failed);
    } catch (error) {
      failed(error);
      send.disabled = false;
    }
  });
  li.append(form);
  return li;
}

// ---- one instance ------------------------------------------------------------------------

function select(id) {
  if (state.selected === id && state.stream) return;
  state.selected = id;
  history.replaceState(null, "", `#${encodeURIComponent(id)}`);
  for (const node of document.querySelectorAll(".node")) node.classList.toggle("selected", node.dataset.id === id);
  stopStream();
  $("transcript").hidden = false;
  $("detail-hint").hidden = true;
  $("message-form").hidden = false;
  $("detail-tools").hidden = false;
  $("records-view").hidden = true;
  $("show-records").setAttribute("aria-expanded", "false");
  state.timeline = new Timeline($("transcript"), id, {
    onTurnAction: (kind, turn) => timeTravel(kind, id, turn),
    openInstance: (other) => select(other),
    follow: (other, onEvent, onSettle) => followInstance(other, onEvent, onSettle),
    childrenOf: (other) => childrenOf(other),
    describe: (other) => state.summaries.get(other),
  });
  state.timeline.setChildren(childrenOf(id));
  renderFacts();
  state.stream = followInstance(id, (message) => onEvent(message), () => state.timeline?.settle());
}

function lineage(summary) {
  const from = summary.forkedFrom;
  const forks = [...state.summaries.values()].filter((s) => s.forkedFrom?.instanceId === summary.instanceId);
  const rows = [];
  const link = (id, text) => {
    const button = el("button", "link", text);
    button.type = "button";
    button.dataset.id = id;
    button.addEventListener("click", () => select(id));
    return button;
  };
  if (from?.instanceId) {
    const parent = state.summaries.get(from.instanceId);
    rows.push(["forked from", [link(from.instanceId, `${safeText(parent?.name ?? "")} ${safeText(from.instanceId)}`.trim()), ` at turn ${safeText(String(from.turn ?? "?"))}`]]);
  }
  if (forks.length) {
    const parts = [];
    forks.forEach((fork, k) => {
      if (k) parts.push(", ");
      parts.push(link(fork.instanceId, `${safeText(fork.instanceId)}`), ` (turn ${safeText(String(fork.forkedFrom.turn ?? "?"))})`);
    });
    rows.push(["forks", parts]);
  }
  return rows;
}

function elapsedText(id) {
  const own = numbers(id);
  const summary = state.summaries.get(id) ?? {};
  if (summary.state === "running" && own.since) return `${formatDuration(secondsBetween(own.since))} (running)`;
  const run = state.timeline?.instanceId === id ? state.timeline.lastRun : null;
  if (run?.from) return formatDuration(secondsBetween(run.from, run.to));
  return "—";
}

function renderFacts() {
  const id = state.selected;
  const facts = $("facts");
  if (!id) return;
  const summary = state.summaries.get(id) ?? { instanceId: id };
  const node = state.nodes.get(id) ?? {};
  $("detail-title").textContent = `${safeText(summary.name ?? node.name ?? "instance")} ${safeText(id)}`;
  const own = numbers(id);
  const rows = [
    ["state", stateText(summary.state ? summary : node)],
    ["model", summary.model ? safeText(summary.model) : "—"],
    ["turns", String(own.turns ?? "?")],
    ["tokens", own.usage ? formatTokens(own.usage) : "?"],
    ["cost", formatCost(own.cost)],
    ["elapsed", elapsedText(id)],
  ];
  if ((state.kids.get(id) ?? []).length) {
    const tree = subtree(id);
    rows.push(["subtree", `${tree.agents} agents · ${tree.tokens.toLocaleString("en-US")} tokens · ${formatCost(tree.cost)}`]);
  }
  if (summary.question) rows.push(["asks", safeText(String(summary.question.question ?? ""), { multiline: true })]);
  rows.push(...lineage(summary));
  if (summary.error) rows.push(["error", safeText(summary.error, { multiline: true })]);
  facts.replaceChildren(...rows.flatMap(([key, value]) => {
    const dd = el("dd");
    if (Array.isArray(value)) dd.append(...value);
    else dd.textContent = value;
    dd.dataset.fact = key;
    return [el("dt", "", key), dd];
  }));
  $("cancel").disabled = RESTING.has(summary.state);
}

function tick() {
  const id = state.selected;
  const shown = document.querySelector('#facts dd[data-fact="elapsed"]');
  if (id && shown) shown.textContent = elapsedText(id);
}

function stopStream() {
  state.stream?.abort();
  state.stream = null;
  state.timeline?.close();
  state.timeline = null;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Follow an instance's events until abort() is called. The server keeps the stream open; when
 * it breaks (a restart, the network), this reconnects with Last-Event-ID and gets what it
 * missed. An error answer (401, 403, 404) ends it and is shown. onSettle runs once, a moment
 * after the stream's first events (what was written before it opened) have come.
 */
function followInstance(id, onEvent, onSettle = () => {}) {
  const stream = { id, controller: new AbortController(), lastEventId: null };
  stream.abort = () => stream.controller.abort();
  let settle = setTimeout(() => {
    settle = null;
    onSettle();
  }, 600);
  (async () => {
    let wait = RECONNECT_MS;
    for (;;) {
      const before = stream.lastEventId;
      try {
        await followEvents(path`../v1/instances/${id}/events`, {
          lastEventId: stream.lastEventId,
          signal: stream.controller.signal,
          onEvent: (message) => {
            if (stream.controller.signal.aborted) return;
            if (message.id) stream.lastEventId = message.id;
            onEvent(message);
          },
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
      if (stream.controller.signal.aborted) return;
      wait = stream.lastEventId !== before ? RECONNECT_MS : Math.min(wait * 2, 15000);
      await sleep(wait);
      if (stream.controller.signal.aborted) return;
    }
  })();
  stream.controller.signal.addEventListener("abort", () => {
    if (settle) clearTimeout(settle);
  });
  return stream;
}

/** Refresh the list soon, once for a burst of events (a replay sends many at once). */
function refreshSoon() {
  if (state.soon) return;
  state.soon = setTimeout(() => {
    state.soon = null;
    refresh().catch(failed);
  }, 150);
}

function onEvent(message) {
  if (!state.timeline) return;
  state.timeline.onEvent(message);
  if (!message.data || typeof message.data !== "object") return;
  // A model's answer moves the numbers (its turn's usage and cost are in it); so do these records.
  if (message.event === "transcript" && message.data.turn) refreshSoon();
  if (message.event === "record" && ["state", "approval", "turn", "tool_call", "fork", "rewind"].includes(message.data.kind)) refreshSoon();
}

// ---- time travel -------------------------------------------------------------------------

/** Ask in the page (a dialog of its own, not window.confirm) whether to go on; resolve to true or false. */
function confirmStep(title, text, yes) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  return new Promise((resolve) => {
    const done = (answer) => {
      $("confirm-yes").removeEventListener("click", onYes);
      $("confirm-no").removeEventListener("click", onNo);
      dialog.removeEventListener("cancel", onNo);
      dialog.close();
      resolve(answer);
    };
    const onYes = () => done(true);
    const onNo = () => done(false);
    $("confirm-yes").addEventListener("click", onYes);
    $("confirm-no").addEventListener("click", onNo);
    dialog.addEventListener("cancel", onNo);
    dialog.showModal();
  });
}

async function timeTravel(kind, id, turn) {
  const name = safeText(state.summaries.get(id)?.name ?? "this instance");
  const fork = kind === "fork";
  const title = fork ? `Fork ${name} at turn ${turn}?` : `Rewind ${name} to turn ${turn}?`;
  const text = fork
    ? `This creates a new instance whose history is this one's up to the end of turn ${turn}. It rests waiting for your message, with the same grants and budget; it starts no agent. This instance is not changed.`
    : `This moves this instance back to the end of turn ${turn}: it rests waiting for your message, and its next turn follows turn ${turn}. What came after stays in its logs and records (the timeline keeps it, marked rewound); agents it started after that point keep running or resting as they are.`;
  if (!(await confirmStep(title, text, fork ? `Fork at turn ${turn}` : `Rewind to turn ${turn}`))) return;
  try {
    const answer = await request(path`../v1/instances/${id}/${fork ? "fork" : "rewind"}`, { turn });
    clearError();
    await refresh();
    if (fork && answer?.instanceId) select(answer.instanceId);
  } catch (error) {
    failed(error);
  }
}

// ---- wiring ------------------------------------------------------------------------------

function findChanged() {
  state.find.offset = 0;
  refresh().catch(failed);
}

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
  $("show-records").addEventListener("click", async () => {
    const view = $("records-view");
    const id = state.selected;
    if (!id) return;
    if (!view.hidden) {
      view.hidden = true;
      $("show-records").setAttribute("aria-expanded", "false");
      return;
    }
    try {
      view.textContent = safeJson(await request(path`../v1/instances/${id}/records`));
      view.hidden = false;
      $("show-records").setAttribute("aria-expanded", "true");
    } catch (error) {
      failed(error);
    }
  });
  $("start-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = startForm.body();
    if (!body) return;
    try {
      const started = await request("../v1/instances", body);
      clearError();
      startForm.started();
      await refresh();
      if (started?.instanceId) select(started.instanceId);
    } catch (error) {
      if (error instanceof ProblemError && error.status === 401) failed(error);
      else startForm.showProblem(error instanceof ProblemError ? error : new ProblemError({ status: 0, title: String(error) }));
    }
  });
  let typing = null;
  $("find-form").addEventListener("submit", (event) => {
    event.preventDefault();
    findChanged();
  });
  $("find-text").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.find.text = $("find-text").value.trim();
      findChanged();
    }, 250);
  });
  for (const [id, key] of [["find-state", "state"], ["find-definition", "definition"], ["find-view", "view"]]) {
    $(id).addEventListener("change", () => {
      state.find[key] = $(id).value;
      findChanged();
    });
  }
  $("page-prev").addEventListener("click", () => {
    state.find.offset = Math.max(0, state.find.offset - PAGE_SIZE);
    refresh().catch(failed);
  });
  $("page-next").addEventListener("click", () => {
    state.find.offset += PAGE_SIZE;
    refresh().catch(failed);
  });
  setInterval(tick, 1000);
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
