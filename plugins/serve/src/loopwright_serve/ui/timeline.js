// One instance's run as a timeline: its turns, each with its model call (model, latency, tokens,
// cost), the messages, tool calls (arguments, result status, duration), held calls and their
// decisions, compactions, and the agents it started, which open in place. It is built from the
// instance's event stream: `transcript` events (the entry log's messages, an answer with its
// turn), `record` events (the record log) and, when the server streams them, `text_delta`
// events (the current turn's answer as it arrives, replaced by the whole message). Everything a
// model or a tool wrote goes in as text (textContent through safeText/safeJson), never as HTML.

import { safeJson, safeText } from "./display.js";
import { el, list, shortId } from "./dom.js";
import { formatCost, formatDuration, formatTokens } from "./format.js";

export function item(kind, label, text) {
  const node = el("div", `item ${kind}`);
  node.dataset.kind = kind;
  node.append(el("span", "label", label));
  node.append(document.createTextNode(text));
  return node;
}

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return safeText(content, { multiline: true });
  return safeJson(content);
}

function button(text, className, onClick, title = "") {
  const node = el("button", className, text);
  node.type = "button";
  if (title) node.title = title;
  node.addEventListener("click", onClick);
  return node;
}

/**
 * The timeline of one instance in `box`.
 *
 * options: nested (an agent opened in place: no time travel), onTurnAction(kind, turn) for
 * Fork and Rewind, openInstance(id) to show another instance, follow(id, onEvent) -> {abort()}
 * to follow another instance's events (an agent opened in place), describe(id) -> {name, state}.
 */
export class Timeline {
  constructor(box, instanceId, options = {}) {
    this.box = box;
    this.instanceId = instanceId;
    this.options = options;
    this.groups = new Map(); // turn number -> {section, head, body, records, info}
    this.calls = new Map(); // tool call id -> {turn, node}
    this.held = new Map(); // tool call id -> the "waits for approval" item
    this.children = new Map(); // child id -> {node, open}
    this.latest = 0;
    this.lastRun = { from: null, to: null };
    this.records = [];
    box.replaceChildren();
  }

  /** Stop following everything this timeline opened (the agents opened in place). */
  close() {
    this.history?.stream.abort();
    this.history?.timeline.close();
    for (const child of this.children.values()) child.open?.timeline.close();
    for (const child of this.children.values()) child.open?.stream.abort();
    this.children.clear();
  }

  group(turn) {
    const n = Number.isInteger(turn) && turn >= 0 ? turn : this.latest;
    // A history shown up to a turn (where a fork began): what came later goes nowhere.
    if (this.options.upTo !== undefined && n > this.options.upTo) {
      this.beyond ??= { section: el("section"), head: el("div"), facts: el("span"), body: el("div"), summary: el("summary"),
        records: [], info: {}, n, answered: true };
      return this.beyond;
    }
    let group = this.groups.get(n);
    if (group) return group;
    const section = el("section", "turn");
    section.dataset.turn = String(n);
    const head = el("div", "turn-head");
    const title = el("span", "turn-title", n === 0 ? "start" : `turn ${n}`);
    const facts = el("span", "turn-facts");
    head.append(title, facts);
    const body = el("div", "turn-body");
    group = { section, head, facts, body, records: [], info: {}, n, answered: false };
    const details = el("details", "turn-records");
    const summary = el("summary", "", "records");
    const pre = el("pre", "records-json");
    details.append(summary, pre);
    details.addEventListener("toggle", () => {
      if (details.open) pre.textContent = safeJson(group.records);
    });
    group.details = details;
    group.summary = summary;
    section.append(head, body, details);
    // Sections stay in turn order (a fork's history starts past 0; a rewound turn is new).
    const after = [...this.box.children].find((node) => node.classList.contains("turn") && !node.classList.contains("rewound")
      && Number(node.dataset.turn) > n);
    if (after) this.box.insertBefore(section, after);
    else this.box.append(section);
    this.groups.set(n, group);
    if (n > this.latest) this.latest = n;
    return group;
  }

  add(node, turn = undefined) {
    const atEnd = this.box.scrollHeight - this.box.scrollTop - this.box.clientHeight < 60;
    this.group(turn).body.append(node);
    if (atEnd && !this.options.nested) this.box.scrollTop = this.box.scrollHeight;
    return node;
  }

  /** The turn's model answer came: it is a point the run can be forked or rewound from. */
  answered(group) {
    if (group.answered) return;
    group.answered = true;
    if (group.n > 0 && !this.options.nested && this.options.onTurnAction) {
      const n = group.n;
      const actions = el("span", "turn-actions");
      actions.append(
        button("Fork", "fork", () => this.options.onTurnAction("fork", n), `a new instance from the end of turn ${n}`),
        button("Rewind", "rewind", () => this.options.onTurnAction("rewind", n), `go back to the end of turn ${n}`),
      );
      group.head.append(actions);
    }
  }

  /** Where a message without a turn goes: the turn it leads to, once the latest turn has its answer. */
  nextGroup() {
    const latest = this.groups.get(this.latest);
    return latest?.answered && this.latest > 0 ? this.latest + 1 : this.latest;
  }

  facts(group) {
    const info = group.info;
    const parts = [];
    if (info.model) parts.push(safeText(info.model));
    if (info.latency !== undefined) parts.push(formatDuration(info.latency));
    if (info.usage) parts.push(formatTokens(info.usage));
    if (info.usage || info.cost !== undefined) parts.push(formatCost(info.cost ?? null));
    if (info.finishReason) parts.push(safeText(info.finishReason));
    group.facts.textContent = parts.join(" · ");
    group.summary.textContent = `records (${group.records.length})`;
  }

  onEvent(message) {
    if (!message.data || typeof message.data !== "object") return;
    if (message.event === "transcript") this.message(message.data);
    else if (message.event === "record") this.record(message.data);
    else if (message.event === "text_delta") this.delta(message.data);
    else if (message.event === "tool_call_start") this.callStart(message.data);
    else if (message.event === "tool_call_delta") this.callDelta(message.data);
    else if (message.event === "stream_reset") this.streamReset(message.data);
    else if (message.event === "gap") this.gap(message.data);
  }

  /** The group the live events of `turn` go to: the turn the model is answering now. */
  liveGroup(turn) {
    return this.group(Number.isInteger(turn) ? turn : this.latest + 1);
  }

  /** A tool call the model has begun to write: its name now, its arguments as they stream. */
  callStart({ turn, id, name }) {
    const group = this.liveGroup(turn);
    const node = item("tool_call streaming", `call ${safeText(String(id ?? ""))} · turn ${group.n} · writing…`, `${safeText(String(name ?? "?"))} `);
    node.dataset.streamId = String(id ?? "");
    this.add(node, group.n);
  }

  callDelta({ turn, id, delta }) {
    if (typeof delta !== "string") return;
    const group = this.liveGroup(turn);
    const node = [...group.body.querySelectorAll(".item.tool_call.streaming")].find((n) => n.dataset.streamId === String(id ?? ""));
    node?.append(document.createTextNode(safeText(delta)));
  }

  /** The turn's streamed answer starts over (the provider retried): what was shown of it goes. */
  streamReset({ turn }) {
    for (const node of this.liveGroup(turn).body.querySelectorAll(".item.streaming")) node.remove();
  }

  /** This page missed the rest of the turn's pieces (it read too slowly): the whole message follows. */
  gap({ turn }) {
    const node = this.liveGroup(turn).body.querySelector(".item.assistant.streaming");
    if (node) node.querySelector(".label").textContent += " (part missed: the whole answer follows)";
  }

  /** A piece of the current turn's answer as the model writes it. */
  delta({ turn, delta }) {
    if (typeof delta !== "string" || !delta) return;
    const group = this.liveGroup(turn);
    let node = group.body.querySelector(".item.assistant.streaming");
    if (!node) {
      node = item("assistant streaming", `assistant · turn ${group.n} · writing…`, "");
      this.add(node, group.n);
    }
    node.append(document.createTextNode(safeText(delta, { multiline: true })));
  }

  /** One message of the transcript (the entry log): {index, message, turn?}. */
  message({ message, turn }) {
    if (!message || typeof message !== "object") return;
    const n = turn && typeof turn === "object" && Number.isInteger(turn.n) ? turn.n : undefined;
    switch (message.role) {
      case "system":
        this.add(item("system", "system prompt", contentText(message.content)), 0);
        return;
      case "user": {
        const source = message.source ? ` · from ${safeText(message.source)}` : "";
        this.add(item("user", `user${source}`, contentText(message.content)), this.nextGroup());
        return;
      }
      case "assistant": {
        const group = this.group(n);
        if (n !== undefined) {
          Object.assign(group.info, { model: turn.model ?? group.info.model, usage: turn.usage, cost: turn.cost });
          this.facts(group);
          this.answered(group);
        }
        // The whole message replaces what was streamed of it.
        for (const node of group.body.querySelectorAll(".item.streaming")) node.remove();
        const at = n !== undefined ? ` · turn ${n}` : "";
        const text = contentText(message.content);
        if (text) this.add(item("assistant", `assistant${at}`, text), group.n);
        for (const call of list(message.toolCalls)) {
          const node = item("tool_call", `call ${safeText(call.id ?? "")}${at}`,
            `${safeText(call.name ?? "?")} ${safeJson(call.arguments ?? {}, 0)}`);
          node.dataset.callId = String(call.id ?? "");
          node.append(el("span", "call-status"));
          this.add(node, group.n);
          this.calls.set(String(call.id ?? ""), { turn: group.n, node });
        }
        return;
      }
      case "tool": {
        const status = message.status ? ` · ${safeText(message.status)}` : "";
        const call = this.calls.get(String(message.toolCallId ?? ""));
        const node = item("tool_result", `result of ${safeText(message.name ?? "?")} ${safeText(message.toolCallId ?? "")}${status}`,
          contentText(message.content));
        node.dataset.callId = String(message.toolCallId ?? "");
        this.add(node, call?.turn);
        this.placeChildren();
        return;
      }
      default:
        this.add(item("other", safeText(message.role ?? "message"), contentText(message.content)));
    }
  }

  /** One record (as `loopwright records` prints it): {kind, instanceId, at, data}. */
  record(record) {
    const data = record.data && typeof record.data === "object" ? record.data : {};
    this.records.push(record);
    const turn = Number.isInteger(data.turn) ? data.turn : undefined;
    const group = this.group(record.kind === "tool_call" || record.kind === "turn" ? turn : this.calls.get(String(data.toolCallId ?? ""))?.turn);
    group.records.push(record);
    this.facts(group);
    switch (record.kind) {
      case "turn":
        Object.assign(group.info, { model: data.model ?? group.info.model, latency: data.latency, finishReason: data.finishReason });
        if (data.usage) group.info.usage = data.usage;
        if ("cost" in data) group.info.cost = data.cost;
        this.facts(group);
        return;
      case "tool_call": {
        const call = this.calls.get(String(data.toolCallId ?? ""));
        if (!call) return;
        const parts = [safeText(data.status ?? "?")];
        if (typeof data.duration === "number") parts.push(formatDuration(data.duration));
        call.node.querySelector(".call-status").textContent = parts.join(" · ");
        call.node.dataset.status = String(data.status ?? "");
        return;
      }
      case "state": {
        if (data.to === "running") {
          this.lastRun = { from: record.at, to: null };
          return;
        }
        if (this.lastRun.from && !this.lastRun.to) this.lastRun.to = record.at;
        if (this.options.upTo !== undefined) return; // where the original rests now is not this history's
        const text = data.to === data.stopReason || !data.stopReason ? `${data.to}` : `${data.to} (${data.stopReason})`;
        const node = item(data.to === "error" ? "error" : "state", "state", safeText(text + (data.cancelled ? ", cancelled" : "")));
        // Where it rests now, at the end (a replay sends the records after all the messages, so
        // an earlier rest would land in a later turn; each one is in the turn's records).
        if (data.to !== "error") {
          this.restItem?.remove();
          this.restItem = node;
        }
        this.add(node);
        return;
      }
      case "approval":
        this.approval(data, group.n);
        return;
      case "error":
        this.add(item("error", "error", safeText(data.message ?? data.error ?? safeJson(data, 0), { multiline: true })));
        return;
      case "fork":
        this.fork(data);
        return;
      case "rewind": {
        this.add(item("rewind", "rewound", `from turn ${safeText(String(data.from ?? "?"))} to the end of turn ${safeText(String(data.to ?? "?"))}`));
        // The turns after the point are kept, marked: the next turns are new ones.
        for (const [n, old] of [...this.groups]) {
          if (n > (Number(data.to) || 0)) {
            old.section.classList.add("rewound");
            old.head.querySelector(".turn-title").textContent = `turn ${n} (rewound)`;
            old.head.querySelector(".turn-actions")?.remove();
            this.groups.delete(n);
          }
        }
        this.latest = Number(data.to) || 0;
        return;
      }
      case "compaction":
        this.add(item("compaction", "compaction", safeJson(data, 0)));
        return;
      case "completion":
      case "monitor":
        this.add(item("other", safeText(record.kind), safeJson(data, 0)));
        return;
      default:
    }
  }

  approval(data, turn) {
    const call = `${safeText(data.tool ?? "?")} (call ${safeText(data.toolCallId ?? "?")})`;
    if (!data.decision) {
      // The digest a decision on it must carry (the inbox card shows it too, and sends it).
      const digest = typeof data.digest === "string" ? ` · digest ${safeText(data.digest).slice(0, 16)}` : "";
      const held = item("approval", "waits for approval", `${call}${digest}${data.reason ? `: ${safeText(data.reason, { multiline: true })}` : ""}`);
      this.held.set(data.toolCallId, held);
      this.add(held, turn);
      return;
    }
    // The decision is shown where the call was held (it happened before what follows it).
    const by = data.by ? ` by ${safeText(data.by)}` : "";
    const why = data.reason ? ` (${safeText(data.reason, { multiline: true })})` : "";
    const decided = item(data.decision === "denied" ? "denied" : "approved", `${safeText(data.decision)}${by}`, `${call}${why}`);
    const held = this.held.get(data.toolCallId);
    if (held) held.replaceWith(decided);
    else this.add(decided, turn);
    this.held.delete(data.toolCallId);
  }

  fork(data) {
    const other = typeof data.to === "string" ? data.to : data.from;
    if (typeof other !== "string") return;
    const text = data.to ? `a fork of this instance from the end of turn ${data.turn}: ` : `forked from the end of turn ${data.turn} of `;
    const node = item("fork", data.to ? "forked" : "fork of", text);
    node.append(this.link(other));
    if (!data.to) {
      // A fork's history is the original's up to the turn: it opens here, from the original's log.
      const toggle = button("▸ the history it starts from", "history-toggle", () => this.toggleHistory(node, other, Number(data.turn) || 0));
      toggle.setAttribute("aria-expanded", "false");
      node.append(" ", toggle);
    }
    this.add(node, data.to ? Number(data.turn) : 0);
  }

  toggleHistory(node, original, turn) {
    const toggle = node.querySelector(".history-toggle");
    if (this.history) {
      this.history.stream.abort();
      this.history.timeline.close();
      this.history.box.remove();
      this.history = null;
      toggle.setAttribute("aria-expanded", "false");
      toggle.textContent = "▸ the history it starts from";
      return;
    }
    const box = el("div", "timeline-nested history");
    box.dataset.instanceId = original;
    node.append(box);
    const timeline = new Timeline(box, original, { ...this.options, nested: true, onTurnAction: null, upTo: turn });
    const stream = this.options.follow(original, (message) => timeline.onEvent(message), () => timeline.settle());
    this.history = { box, timeline, stream };
    toggle.setAttribute("aria-expanded", "true");
    toggle.textContent = `▾ the history it starts from (up to turn ${turn})`;
  }

  link(id) {
    const known = this.options.describe?.(id);
    const node = button(`${known?.name ? `${safeText(known.name)} ` : ""}${safeText(id)}`, "link", () => this.options.openInstance?.(id),
      "show this instance");
    node.dataset.id = id;
    return node;
  }

  /** The agents this instance started ({instanceId, name, state}), each placed after the result that names it. */
  setChildren(children) {
    this.known = children;
    this.placeChildren();
  }

  placeChildren() {
    for (const child of this.known ?? []) {
      const id = child.instanceId;
      const seen = this.children.get(id);
      if (seen) {
        seen.node.querySelector(".child-state").textContent = safeText(child.state ?? "?");
        continue;
      }
      const results = [...this.box.querySelectorAll(".item.tool_result")].filter((node) => node.closest(".timeline-nested") === this.nestedRoot());
      const result = results.find((node) => node.textContent.includes(id));
      if (!result && !this.finished) continue;
      const node = this.childItem(child);
      if (result) result.after(node);
      else this.add(node);
    }
  }

  nestedRoot() {
    return this.box.closest(".timeline-nested");
  }

  /** After the stream's first burst: agents no result names are shown at the end. */
  settle() {
    this.finished = true;
    this.placeChildren();
  }

  childItem(child) {
    const id = child.instanceId;
    const node = el("div", "item child");
    node.dataset.childId = id;
    node.append(el("span", "label", "agent started"));
    const toggle = button("", "child-toggle", () => this.toggleChild(id));
    toggle.append(el("span", "arrow", "▸ "), el("span", "child-name", safeText(child.name ?? "?")), ` ${shortId(safeText(id))} `,
      el("span", "child-state", safeText(child.state ?? "?")));
    toggle.setAttribute("aria-expanded", "false");
    node.append(toggle, button("open", "child-open", () => this.options.openInstance?.(id), "show this instance on its own"));
    this.children.set(id, { node, open: null });
    return node;
  }

  toggleChild(id) {
    const child = this.children.get(id);
    if (!child) return;
    const toggle = child.node.querySelector(".child-toggle");
    if (child.open) {
      child.open.stream.abort();
      child.open.timeline.close();
      child.open.box.remove();
      child.open = null;
      toggle.setAttribute("aria-expanded", "false");
      toggle.querySelector(".arrow").textContent = "▸ ";
      return;
    }
    const box = el("div", "timeline-nested");
    box.dataset.instanceId = id;
    child.node.append(box);
    const timeline = new Timeline(box, id, { ...this.options, nested: true, onTurnAction: null });
    timeline.setChildren(this.options.childrenOf?.(id) ?? []);
    const stream = this.options.follow(id, (message) => timeline.onEvent(message), () => timeline.settle());
    child.open = { box, timeline, stream };
    toggle.setAttribute("aria-expanded", "true");
    toggle.querySelector(".arrow").textContent = "▾ ";
  }

  /** Refresh the states and children of the agents opened in place. */
  refreshNested() {
    for (const child of this.children.values()) {
      if (!child.open) continue;
      child.open.timeline.setChildren(this.options.childrenOf?.(child.open.timeline.instanceId) ?? []);
      child.open.timeline.refreshNested();
    }
  }
}
