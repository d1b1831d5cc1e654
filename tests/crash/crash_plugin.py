"""The kill matrix's plugin file: a scripted provider, ledger tools, and SIGKILL points.

The matrix's assembly lists this file in ``plugins:``, so it is imported by every ``loopwright``
process the harness starts (see ``README.md``). It has three parts.

**The provider** ``crash`` plays one of :data:`SCRIPTS`: the model name is the script's name
(``crash:mixed``). Which reply comes next is the number of assistant messages already in the
transcript, so a resumed process goes on where the dead one stopped, with no state of its own.
Call ids are ``c<reply>_<k>``. Past the end of a script it answers :data:`PAST_END` (the
harness treats that as a model call made after the work was over). The ``latency`` option
(seconds) makes each call take that long, so that kills land during model calls.

**The tools** record every execution as one line of ``ledger.jsonl`` in the assembly's folder
(``{"instance", "call", "tool", "pid"}``), written with one ``write()`` to a file opened
``O_APPEND``: once the line is written it survives a SIGKILL of the process. The line is the
tool's side effect: the harness counts executions per (instance, call) from it.

=============  ==========  =============  ========================================
tool           idempotent  parallel safe  body
=============  ==========  =============  ========================================
charge         no          no             sync, fast
send_slow      no          no             async, sleeps around the effect
upload_slow    no          yes            sync (a worker thread), sleeps around it
lookup         yes         yes            sync, fast
fetch_slow     yes         yes            async, sleeps around the effect
wire_slow      no          no             async, sleeps around it; requires approval
probe_slow     yes         yes            async, sleeps around it; requires approval
flaky          no          yes            sync; raises after its effect (tool_failed)
stall          no          yes            async; hangs after its effect (timeout, 0.4 s)
priced         no          yes            sync; reports its own usage and cost
=============  ==========  =============  ========================================

"Slow" is ``LOOPWRIGHT_CRASH_SLOW`` seconds (default 0.3), half before the effect and half after.

**Kill points.** ``LOOPWRIGHT_CRASH_AT`` holds comma-separated points; the process SIGKILLs
itself (``os.kill(os.getpid(), SIGKILL)``) when the first of them is reached, after printing
``crash plugin: SIGKILL at POINT`` to stderr. Counts are per process.

``model:N``
    Halfway through the N-th model call.
``tool:NAME:N:PHASE``
    In the N-th execution of tool NAME (``*``: any tool). PHASE ``before``: the effect has not
    happened; ``after``: the ledger line is written, the result not yet returned.
``entry:KIND:N:PHASE``
    At the N-th append to the entry log holding an entry of KIND: ``seg``, ``prompt`` (a
    system or user message), ``answer`` (an assistant message and its ``turn`` entry),
    ``reset`` (a context strategy's new transcript),
    ``start`` (a tool call's start marker), ``result`` (a tool result), ``spawned`` (a
    ``run_agent_async`` result), ``awaited`` (an ``await_agent`` result) or ``any``.
``header:N:PHASE``
    At the N-th header write (the first one of ``loopwright run`` is the instance's creation).
``record:N:PHASE``
    At the N-th append to the record log.

``spawn:N:PHASE``
    In the N-th ``run_agent_async`` of this process that starts a child (``Agents.start``). In
    the order they come: PHASE ``before``: nothing made; ``linked``: the caller's header lists
    the child's id (saved), the child not yet created; ``created``: the child's header saved (its
    lease held), its first segment not started (its log empty); ``started``: its first segment
    started in the background, the call's result not yet returned.
``await:N:PHASE``
    In the N-th ``await_agent`` wait of this process (``Agents.wait``). ``before``: nothing looked
    at yet; ``after``: the child's report made, the call's result not yet returned.

``held:N``
    Right after the N-th instance of this process rests ``waiting_for_approval`` (its header
    saved, holding its call): in a tree, the child's hold is saved and its parent, awaiting it
    in the same process, is killed with it.

Write PHASEs: ``before`` (nothing written), ``torn`` (the first half of the bytes written, as a
short write would), ``torn-last`` (every line but the last written, and half of the last),
``after`` (all written: the kill comes as the store's call returns, before its caller goes on).
Header rewrites also have ``rename``: the temporary file is complete and fsynced, the kill
comes just before the rename. (The store writes the first header, in ``create``, in place: there
``torn`` tears ``instance.json`` itself and ``rename`` is never reached.)

The write points wrap the file store's own functions (``_write_all`` of ``file_store``,
``_file_header`` and ``_file_create``, ``FileStore._append``, ``FileStore._make_instance`` (one
creation), ``FileStore._replace_header``, and
``Path.replace`` for the header's rename) only when a write point is armed: the kill happens
inside the real code path, between the store's own steps. Which write is in progress is kept per
thread, since the header group commits run in a worker thread beside the loop's writes.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import pathlib
import re
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

import anyio

import loopwright
from loopwright.abc import Provider, ProviderSettings
from loopwright.builtins import _file_create, _file_header, file_store

#: What each script's model answers, by reply number: a list of calls ``(tool, arguments)``, or
#: the final text. Parallel-safe calls of one reply run concurrently, others one after another.
SCRIPTS: dict[str, list[Any]] = {
    # Every kind of tool, sequential and concurrent turns; rests "waiting" on a final text.
    "mixed": [
        [("charge", {"amount": 5})],
        [("fetch_slow", {"key": "a"}), ("lookup", {"key": "b"})],
        [("send_slow", {"to": "x"}), ("charge", {"amount": 7})],
        [("upload_slow", {"name": "p"}), ("upload_slow", {"name": "q"}), ("fetch_slow", {"key": "c"})],
        "done: mixed",
    ],
    # Ends "completed": task_complete comes last in a turn with another call before it.
    "complete": [
        [("lookup", {"key": "k"}), ("charge", {"amount": 1})],
        [("send_slow", {"to": "y"})],
        [("charge", {"amount": 2}), ("task_complete", {"result": "finished", "summary": "all steps ran"})],
    ],
    # Wide concurrent turns: non-idempotent, then idempotent.
    "burst": [
        [("upload_slow", {"name": n}) for n in "abcd"],
        [("fetch_slow", {"key": k}) for k in "xyz"],
        "done: burst",
    ],
    # Held calls, approved (by ``loopwright approve``): a non-idempotent one, then an idempotent
    # one with an unheld sibling.
    "approve": [
        [("wire_slow", {"to": "a"})],
        [("lookup", {"key": "h"}), ("probe_slow", {"key": "p"})],
        "done: approve",
    ],
    # A held call denied (by ``loopwright deny``) in a turn with an unheld call that runs.
    "deny": [
        [("charge", {"amount": 3}), ("wire_slow", {"to": "b"})],
        [("lookup", {"key": "d"})],
        "done: deny",
    ],
    # Tools that fail, time out and report their own cost; an ask_user the harness answers with
    # ``loopwright message``.
    "faults": [
        [("flaky", {}), ("stall", {}), ("priced", {"units": 3})],
        [("ask_user", {"question": "go on?"})],
        [("priced", {"units": 2}), ("lookup", {"key": "f"})],
        "done: faults",
    ],
}
# The mixed script again, with the transcript shrunk before model calls (see STRATEGIES).
SCRIPTS["cleared"] = SCRIPTS["mixed"]
SCRIPTS["compacted"] = SCRIPTS["mixed"]

#: The prompt the tree's parent gives its child.
CHILD_PROMPT = "Do the child's part."
#: The id placeholder in a script's arguments: the provider puts in the child the transcript's
#: ``run_agent_async`` result names (the harness does the same when it checks the script).
CHILD_ID = "$child"
#: The tree scenarios' roles (``tree`` scenarios): a parent that starts a child and awaits it, and
#: the child, whose second call is held (``wire_slow``), decided from the root
#: (``loopwright approve ROOT --call ID``). The child is ``agentDefinitions: {child: ...}``.
TREE: dict[str, list[Any]] = {
    "parent": [
        [("run_agent_async", {"agentSwarmUri": "child", "prompt": CHILD_PROMPT})],
        [("await_agent", {"ids": [CHILD_ID]})],
        "done: parent",
    ],
    "child": [
        [("charge", {"amount": 4})],
        [("wire_slow", {"to": "c"})],
        "done: child",
    ],
}
SCRIPTS.update(TREE)

#: The ``contextStrategy`` of the scripts that have one. ``compact`` summarises with the model
#: ``crash:summary`` (see :meth:`ScriptProvider.complete`) whenever the last call's input tokens
#: (100 + the number of messages) pass 106, keeping the last 2 messages.
STRATEGIES: dict[str, dict[str, Any]] = {
    "cleared": {"kind": "clearToolResults", "keepLast": 1},
    "compacted": {"kind": "compact", "trigger": 106, "keepLast": 2, "model": "crash:summary"},
}

#: The model that writes ``compact``'s summaries, and the marker its summary carries.
SUMMARY_MODEL = "summary"
_REPLIES = re.compile(r"\bc(\d+)_\d+\b|replies so far: (\d+)")

#: The built-in tools scripts call (not in the ledger).
BUILTINS: frozenset[str] = frozenset({"task_complete", "ask_user", "run_agent_async", "await_agent"})

#: What the harness answers an ``ask_user`` with (``loopwright message ID TEXT``).
ANSWER = "yes, go on"

#: The cost ``priced`` reports per unit (USD).
UNIT_COST = 0.25

#: How the harness decides the held calls of each script (``approve`` or ``deny``).
DECISIONS: dict[str, str] = {"approve": "approve", "deny": "deny", "child": "approve"}

#: The tools that hold every call for approval (``requires_approval``).
HELD: frozenset[str] = frozenset({"wire_slow", "probe_slow"})

#: The answer after the end of a script.
PAST_END = "(past the end of the script)"

#: Each tool's durability-relevant flags: (idempotent, parallel_safe).
TOOL_FLAGS: dict[str, tuple[bool, bool]] = {
    "charge": (False, False),
    "send_slow": (False, False),
    "upload_slow": (False, True),
    "lookup": (True, True),
    "fetch_slow": (True, True),
    "wire_slow": (False, False),
    "flaky": (False, True),
    "stall": (False, True),
    "priced": (False, True),
    "ask_user": (True, True),
    "probe_slow": (True, True),
    "task_complete": (True, True),
    "run_agent_async": (False, False),
    "await_agent": (True, True),
}

LEDGER = "ledger.jsonl"
_SLOW = float(os.environ.get("LOOPWRIGHT_CRASH_SLOW", "0.3"))
# Checkpoint the entry log at every rest (the default waits for 256 KiB of new log), so every
# resume of the matrix loads a checkpoint and the log's tail after it. Only in the loopwright
# processes: the harness imports this file too (kill_matrix._plugin), inside pytest.
if __name__ != "loopwright_crash_plugin_for_harness":
    file_store.FileStore.checkpoint_bytes = int(os.environ.get("LOOPWRIGHT_CRASH_CHECKPOINT_BYTES", "1"))


# ---------------------------------------------------------------------------------------------
# Kill points
# ---------------------------------------------------------------------------------------------


def _parse(raw: str) -> list[tuple[str, ...]]:
    return [tuple(p.strip().split(":")) for p in raw.split(",") if p.strip()]


_POINTS = _parse(os.environ.get("LOOPWRIGHT_CRASH_AT", ""))
_counts: Counter[tuple[str, str]] = Counter()
_count_lock = threading.Lock()  # tools in worker threads count too


def die(where: str) -> None:
    """SIGKILL this process now, after saying where on stderr (the harness reads it)."""
    os.write(2, f"crash plugin: SIGKILL at {where}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is delivered before this returns


def _count(*keys: tuple[str, str]) -> list[int]:
    """Count one more event under each key; return the new counts."""
    with _count_lock:
        out = []
        for key in keys:
            _counts[key] += 1
            out.append(_counts[key])
        return out


def _armed(kind: str, name: str, n: int, phase: str | None = None) -> str | None:
    """Return the label of an armed point ``kind[:name]:n[:phase]``, or None."""
    for point in _POINTS:
        if point[0] != kind:
            continue
        nameless = ("model", "header", "record", "spawn", "await", "held")
        rest = point[1:] if kind in nameless else point[2:]
        if kind not in nameless and point[1] != name:
            continue
        if not rest or int(rest[0]) != n:
            continue
        if phase is None or (len(rest) > 1 and rest[1] == phase):
            return ":".join(point)
    return None


def _tool_point(tool: str, n: int, n_any: int, phase: str) -> None:
    """Kill if ``tool:TOOL:n:phase`` or ``tool:*:n_any:phase`` is armed."""
    label = _armed("tool", tool, n, phase) or _armed("tool", "*", n_any, phase)
    if label is not None:
        die(label)


# ---------------------------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------------------------


class ScriptProvider(Provider):
    """Plays :data:`SCRIPTS`; deterministic given the transcript. Free (cost 0)."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.latency = float(settings.options.get("latency", 0))

    async def complete(self, request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        (n,) = _count(("model", ""))
        if self.latency:
            await anyio.sleep(self.latency / 2)
        if (label := _armed("model", "", n)) is not None:
            die(label)
        if self.latency:
            await anyio.sleep(self.latency / 2)
        index = _replies_so_far(request.messages)
        size = len(request.messages)
        if request.model == SUMMARY_MODEL:  # compact's summary: it says how many replies it covers
            return loopwright.ModelResponse(
                message=loopwright.Message(role="assistant", content=f"replies so far: {index}"),
                usage=loopwright.Usage(input_tokens=50 + size, output_tokens=5, total_tokens=55 + size, requests=1),
                finish_reason="stop")
        script = SCRIPTS[request.model]
        reply = script[index] if index < len(script) else PAST_END
        calls: tuple[loopwright.ToolCall, ...] = ()
        text = None
        if isinstance(reply, str):
            text = reply
        else:
            child = _started_child(request.messages)
            calls = tuple(loopwright.ToolCall(id=f"c{index}_{k}", name=name, arguments=_with_child(args, child))
                          for k, (name, args) in enumerate(reply))
        # Usage grows with the transcript, so lost or doubled turns show in the totals.
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=100 + size, output_tokens=10 + index,
                                   total_tokens=110 + size + index, requests=1),
            finish_reason="tool_calls" if calls else "stop")


def _started_child(messages: Any) -> str | None:
    """Return the instance id the transcript's ``run_agent_async`` result names, if any."""
    for m in messages:
        if m.role == "tool" and m.name == "run_agent_async" and m.status == "success":
            with contextlib.suppress(ValueError, TypeError, KeyError):
                return str(json.loads(m.content or "")["instanceId"])
    return None


def _with_child(args: dict[str, Any], child: str | None) -> dict[str, Any]:
    """Put ``child`` in for :data:`CHILD_ID` in a call's arguments (the tree's ``await_agent``)."""
    if child is None or CHILD_ID not in json.dumps(args):
        return args
    return json.loads(json.dumps(args).replace(json.dumps(CHILD_ID), json.dumps(child)))


def _replies_so_far(messages: Any) -> int:
    """Return how many scripted replies the transcript holds, a compacted part included.

    Without compaction it is the number of assistant messages. A ``compact`` summary replaces
    some of them with a message saying ``replies so far: K``; the model's call ids ``cN_k`` (the
    calls' ``provider_id``: their ``id`` is the runtime's own) show reply N.
    """
    count = sum(1 for m in messages if m.role == "assistant")
    for m in messages:
        texts = [m.content or "", *(c.provider_id for c in m.tool_calls)]
        for text in texts:
            for call, summary in _REPLIES.findall(text):
                count = max(count, int(call) + 1 if call else int(summary))
    return count


# ---------------------------------------------------------------------------------------------
# The tools
# ---------------------------------------------------------------------------------------------


def _effect(ctx: loopwright.ToolContext, tool: str) -> str:
    """The side effect: one ledger line, written with a single O_APPEND write."""
    n, n_any = _count(("tool", tool), ("tool", "*"))
    _tool_point(tool, n, n_any, "before")
    line = json.dumps({"instance": ctx.instance_id, "call": ctx.tool_call_id, "tool": tool,
                       "pid": os.getpid()}) + "\n"
    fd = os.open(pathlib.Path(ctx.base_dir) / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    _tool_point(tool, n, n_any, "after")
    return f"{tool} ok ({ctx.tool_call_id})"


@loopwright.tool(parallel_safe=False)
def charge(amount: int, ctx: loopwright.ToolContext) -> str:
    """Charge an amount (not idempotent).

    Args:
        amount: How much.
    """
    del amount
    return _effect(ctx, "charge")


@loopwright.tool(parallel_safe=False)
async def send_slow(to: str, ctx: loopwright.ToolContext) -> str:
    """Send a message, slowly (not idempotent).

    Args:
        to: The recipient.
    """
    del to
    await anyio.sleep(_SLOW / 2)
    out = _effect(ctx, "send_slow")
    await anyio.sleep(_SLOW / 2)
    return out


@loopwright.tool(parallel_safe=True)
def upload_slow(name: str, ctx: loopwright.ToolContext) -> str:
    """Upload a file, slowly, in a worker thread (not idempotent).

    Args:
        name: The file.
    """
    del name
    time.sleep(_SLOW / 2)
    out = _effect(ctx, "upload_slow")
    time.sleep(_SLOW / 2)
    return out


@loopwright.tool(parallel_safe=True, idempotent=True)
def lookup(key: str, ctx: loopwright.ToolContext) -> str:
    """Look a key up (idempotent).

    Args:
        key: The key.
    """
    del key
    return _effect(ctx, "lookup")


@loopwright.tool(parallel_safe=True, idempotent=True)
async def fetch_slow(key: str, ctx: loopwright.ToolContext) -> str:
    """Fetch a key, slowly (idempotent).

    Args:
        key: The key.
    """
    del key
    await anyio.sleep(_SLOW / 2)
    out = _effect(ctx, "fetch_slow")
    await anyio.sleep(_SLOW / 2)
    return out


@loopwright.tool(parallel_safe=False, requires_approval=True)
async def wire_slow(to: str, ctx: loopwright.ToolContext) -> str:
    """Wire money, slowly, once a person approved it (not idempotent).

    Args:
        to: The recipient.
    """
    del to
    await anyio.sleep(_SLOW / 2)
    out = _effect(ctx, "wire_slow")
    await anyio.sleep(_SLOW / 2)
    return out


@loopwright.tool(parallel_safe=True, idempotent=True, requires_approval=True)
async def probe_slow(key: str, ctx: loopwright.ToolContext) -> str:
    """Probe a key, slowly, once a person approved it (idempotent).

    Args:
        key: The key.
    """
    del key
    await anyio.sleep(_SLOW / 2)
    out = _effect(ctx, "probe_slow")
    await anyio.sleep(_SLOW / 2)
    return out


@loopwright.tool(parallel_safe=True)
def flaky(ctx: loopwright.ToolContext) -> str:
    """Do something that fails after its effect (not idempotent): the result is ``tool_failed``."""
    _effect(ctx, "flaky")
    raise RuntimeError("the flaky tool failed after its effect")


#: ``stall``'s timeout (seconds); it sleeps far longer, so only the timeout ends it.
STALL_TIMEOUT = 0.4


@loopwright.tool(parallel_safe=True, timeout=STALL_TIMEOUT)
async def stall(ctx: loopwright.ToolContext) -> str:
    """Do something, then hang (not idempotent): the result is ``timeout``."""
    _effect(ctx, "stall")
    await anyio.sleep(600)
    return "never"


@loopwright.tool(parallel_safe=True)
def priced(units: int, ctx: loopwright.ToolContext) -> loopwright.ToolOutput:
    """Do paid work (not idempotent); reports its own usage and cost (a ``spend`` entry).

    Args:
        units: How much work (UNIT_COST each).
    """
    out = _effect(ctx, "priced")
    return loopwright.ToolOutput(value=out, usage=loopwright.Usage(input_tokens=units, total_tokens=units),
                                 cost=loopwright.Cost(amount=units * UNIT_COST))


# ---------------------------------------------------------------------------------------------
# Write points inside the file store
# ---------------------------------------------------------------------------------------------

class _Writes(threading.local):
    """What each thread's store write in progress is: the store's writes never await, so one thread
    never has two in progress, but the header group commits run in a worker thread beside the
    loop's appends, creations and inline header writes."""

    #: The write in progress: ``(phase, label)`` of the armed point it reaches, or None.
    writing: tuple[str, str] | None = None
    #: Whether ``_make_instance`` (behind ``create``, ``create_leased``) is in progress.
    creating: bool = False


_w = _Writes()
#: The store functions wrapped below, as they were.
_original: dict[str, Any] = {}


#: The extra entry KINDs of the agent tools' results: ``spawned`` (a ``run_agent_async`` result)
#: and ``awaited`` (an ``await_agent`` result).
_AGENT_RESULTS = {"run_agent_async": ("spawned",), "await_agent": ("awaited",)}


def _entry_kinds(items: Any) -> list[str]:
    """Return the KINDs an entry-log append holds (see the module docstring)."""
    kinds = {"any"}
    for item in items:
        t = item.get("t")
        if t in ("seg", "start", "reset"):
            kinds.add(t)
        elif t == "msg":
            role = item["m"].get("role")
            kinds.add({"assistant": "answer", "tool": "result"}.get(role, "prompt"))
            kinds.update(_AGENT_RESULTS.get(item["m"].get("name"), ()) if role == "tool" else ())
    return sorted(kinds)


def _armed_write(kind: str, n: int, name: str = "") -> tuple[str, str] | None:
    label = _armed(kind, name, n)
    return None if label is None else (label.rsplit(":", 1)[1], label)


def _write_all(fd: int, data: bytes) -> None:
    """The store's ``_write_all``, killing before, halfway through, or in the last line."""
    if _w.writing is not None:
        phase, label = _w.writing
        if phase == "before":
            die(label)
        if phase in ("torn", "torn-last"):
            start = 0
            if phase == "torn-last":
                start = data.rstrip(b"\n").rfind(b"\n") + 1
            os.write(fd, data[: start + (len(data) - start) // 2])
            die(label)
    _original["write_all"](fd, data)


def _append(self: Any, instance_id: str, name: str, items: Any) -> None:
    """``FileStore._append``, counting entry-log and record-log appends."""
    found = None
    if name == file_store.ENTRIES_FILE:
        kinds = _entry_kinds(items)
        counts = _count(*(("entry", k) for k in kinds))
        found = next((f for k, n in zip(kinds, counts, strict=True)
                      if (f := _armed_write("entry", n, k)) is not None), None)
    elif name == file_store.RECORDS_FILE:
        (n,) = _count(("record", ""))
        found = _armed_write("record", n)
    _w.writing = found
    try:
        _original["append"](self, instance_id, name, items)
    finally:
        _w.writing = None
    if found is not None and found[0] == "after":
        die(found[1])


def _replace_header(self: Any, instance_id: str, folder: Any, data: bytes) -> None:
    """``FileStore._replace_header``, counting header writes (and holding at the gate, if one is set)."""
    if _w.creating:  # counted by _make_instance
        _original["replace_header"](self, instance_id, folder, data)
        return
    (n,) = _count(("header", ""))
    found = _w.writing = _armed_write("header", n)
    try:
        _original["replace_header"](self, instance_id, folder, data)
    finally:
        _w.writing = None
    if found is not None and found[0] == "after":
        die(found[1])
    if _GATE and n == 1 and json.loads(data).get("state") == "running":
        _wait_at_gate()


#: ``LOOPWRIGHT_CRASH_GATE``: a file; a process that starts running an instance (its first
#: header write says ``running``: it holds the lease) waits there until the file exists (at most
#: 60 s). The harness's double resume uses it so that the runner still holds the lease when the
#: other resume asks for it, however slowly that one starts.
_GATE = os.environ.get("LOOPWRIGHT_CRASH_GATE", "")


def _wait_at_gate() -> None:
    """Block (the whole process: it holds the lease meanwhile) until the gate file exists."""
    deadline = time.monotonic() + 60.0  # a hang guard only: the harness opens the gate
    while not os.path.exists(_GATE) and time.monotonic() < deadline:  # noqa: PTH110
        time.sleep(0.01)


def _make_instance(self: Any, instance_id: str, folder: str, data: bytes, *, locked: bool) -> Any:
    """``FileStore._make_instance`` (behind ``create`` and ``create_leased``), counting its header write."""
    (n,) = _count(("header", ""))
    found = _w.writing = _armed_write("header", n)
    _w.creating = True
    try:
        # Synchronous, in one thread: no other write of this thread meanwhile.
        made = _original["make_instance"](self, instance_id, folder, data, locked=locked)
    finally:
        _w.writing, _w.creating = None, False
    if found is not None and found[0] == "after":
        die(found[1])
    return made


def _path_replace(self: pathlib.Path, target: Any) -> Any:
    """``Path.replace`` (the header's rename), killing just before it for ``rename`` points."""
    if _w.writing is not None and _w.writing[0] == "rename":
        die(_w.writing[1])
    return _original["path_replace"](self, target)


def _install_store_points() -> None:
    """Wrap the file store's write steps so that armed write points kill inside them."""
    for owner, name in ((file_store, "_write_all"), (_file_header, "_write_all"), (_file_create, "_write_all"),
                        (file_store.FileStore, "_append"), (file_store.FileStore, "_replace_header"),
                        (file_store.FileStore, "_make_instance")):
        if not hasattr(owner, name):
            msg = f"the file store has no {name} any more: update the write points of {__file__}"
            raise RuntimeError(msg)
    _original.update(write_all=file_store._write_all, append=file_store.FileStore._append,
                     replace_header=file_store.FileStore._replace_header, path_replace=pathlib.Path.replace,
                     make_instance=file_store.FileStore._make_instance)
    file_store._write_all = _write_all
    _file_header._write_all = _write_all  # header rewrites (the group commit's module)
    _file_create._write_all = _write_all  # new instances' headers
    file_store.FileStore._append = _append  # type: ignore[method-assign]
    file_store.FileStore._replace_header = _replace_header  # type: ignore[method-assign]
    pathlib.Path.replace = _path_replace  # type: ignore[method-assign]
    file_store.FileStore._make_instance = _make_instance  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------------
# Write points around the SQL stores' calls
# ---------------------------------------------------------------------------------------------

#: The Store methods wrapped on the SQL stores (``sqlite``, and ``postgres`` when it is loaded).
_SQL_METHODS = ("create", "create_leased", "write_header", "append_entries", "append_records")
#: Whether a ``create``/``create_leased`` of this process is in progress (its header is counted once).
_sql_creating: contextvars.ContextVar[bool] = contextvars.ContextVar("crash_sql_creating", default=False)


def _sql_point(found: tuple[str, str] | None, phase: str) -> None:
    if found is not None and found[0] == phase:
        die(found[1])


def _wrap_sql_store(cls: Any) -> None:
    """Wrap a SQL store's write calls with the write points: ``before`` the call, ``after`` it returned.

    A statement commits whole or not at all, so there is no ``torn`` or ``rename`` phase: the
    SQL stores' write points are ``before`` (nothing written) and ``after`` (committed, the caller
    not yet told). Counting is the file store's: ``header`` counts ``create``/``create_leased``
    and ``write_header``; ``entry:KIND`` counts each ``append_entries`` holding KIND; ``record``
    counts ``append_records``. The double resume's gate waits after the first header saying
    ``running`` (the lease is held: the store's keeper thread keeps it alive meanwhile).
    """
    original = {name: getattr(cls, name) for name in _SQL_METHODS}

    async def create(self: Any, instance_id: str, header: Any, *rest: Any) -> Any:
        if _sql_creating.get():
            return await original["create"](self, instance_id, header, *rest)
        (n,) = _count(("header", ""))
        found = _armed_write("header", n)
        _sql_point(found, "before")
        token = _sql_creating.set(True)
        try:
            out = await original["create"](self, instance_id, header, *rest)
        finally:
            _sql_creating.reset(token)
        _sql_point(found, "after")
        return out

    async def create_leased(self: Any, instance_id: str, header: Any, owner: str) -> Any:
        (n,) = _count(("header", ""))
        found = _armed_write("header", n)
        _sql_point(found, "before")
        token = _sql_creating.set(True)
        try:
            out = await original["create_leased"](self, instance_id, header, owner)
        finally:
            _sql_creating.reset(token)
        _sql_point(found, "after")
        return out

    async def write_header(self: Any, instance_id: str, header: Any) -> None:
        if _sql_creating.get():
            await original["write_header"](self, instance_id, header)
            return
        (n,) = _count(("header", ""))
        found = _armed_write("header", n)
        _sql_point(found, "before")
        await original["write_header"](self, instance_id, header)
        _sql_point(found, "after")
        if _GATE and n == 1 and header.get("state") == "running":
            _wait_at_gate()

    async def append_entries(self: Any, instance_id: str, entries: Any) -> None:
        kinds = _entry_kinds(entries)
        counts = _count(*(("entry", k) for k in kinds))
        found = next((f for k, n in zip(kinds, counts, strict=True)
                      if (f := _armed_write("entry", n, k)) is not None), None)
        _sql_point(found, "before")
        await original["append_entries"](self, instance_id, entries)
        _sql_point(found, "after")

    async def append_records(self: Any, instance_id: str, records: Any) -> None:
        (n,) = _count(("record", ""))
        found = _armed_write("record", n)
        _sql_point(found, "before")
        await original["append_records"](self, instance_id, records)
        _sql_point(found, "after")

    for name, fn in (("create", create), ("create_leased", create_leased), ("write_header", write_header),
                     ("append_entries", append_entries), ("append_records", append_records)):
        fn.__doc__ = f"``{cls.__name__}.{name}`` with the kill matrix's write points around it."
        setattr(cls, name, fn)


def _install_sql_points() -> None:
    """Wrap the sqlite store, and the postgres store if its plugin is loaded (listed before this file)."""
    from loopwright.builtins import sqlite_store  # noqa: PLC0415 - only with a write point armed

    _wrap_sql_store(sqlite_store.SqliteStore)
    if "loopwright_postgres" in sys.modules:
        from loopwright_postgres import _store as postgres_store  # noqa: PLC0415

        _wrap_sql_store(postgres_store.PostgresStore)


# ---------------------------------------------------------------------------------------------
# Kill points inside the agent tools (run_agent_async, await_agent)
# ---------------------------------------------------------------------------------------------

#: The caller whose ``run_agent_async`` is in progress with an armed ``spawn`` point: ``(phase, label)``.
_spawning: dict[str, tuple[str, str]] = {}


def _install_agent_points() -> None:  # noqa: C901 - one wrapper per step
    """Wrap ``Agents.start``/``wait`` and the steps of a child's start so that ``spawn``/``await`` points kill there."""
    from loopwright import _agents, _driver, _records  # noqa: PLC0415 - only with an agent point armed

    start, wait = _agents.Agents.start, _agents.Agents.wait
    first_segment, write_header = _driver.Driver.start_first_segment, _records.Recorder.write_header

    async def agents_start(self: Any, *args: Any, **kwargs: Any) -> Any:  # Agents.start's own arguments
        (n,) = _count(("spawn", ""))
        label = next((lb for ph in ("before", "created", "started", "linked")
                      if (lb := _armed("spawn", "", n, ph)) is not None), None)
        if label is None:
            return await start(self, *args, **kwargs)
        phase = label.rsplit(":", 1)[1]
        if phase == "before":
            die(label)
        _spawning[self.caller.id] = (phase, label)
        try:
            return await start(self, *args, **kwargs)
        finally:
            _spawning.pop(self.caller.id, None)

    async def start_first_segment(self: Any, run: Any, held: Any) -> None:
        armed = _spawning.get(str(run.inst.header.spawner_instance_id))
        if armed is not None and armed[0] == "created":
            die(armed[1])
        await first_segment(self, run, held)
        if armed is not None and armed[0] == "started":
            die(armed[1])

    async def recorder_write_header(self: Any, inst: Any) -> None:
        armed = _spawning.get(inst.id)
        await write_header(self, inst)
        if armed is not None and armed[0] == "linked":
            die(armed[1])

    async def agents_wait(self: Any, ids: Any, *, all_: bool = False) -> Any:
        (n,) = _count(("await", ""))
        if (label := _armed("await", "", n, "before")) is not None:
            die(label)
        out = await wait(self, ids, all_=all_)
        if (label := _armed("await", "", n, "after")) is not None:
            die(label)
        return out

    _agents.Agents.start = agents_start  # type: ignore[method-assign]
    _agents.Agents.wait = agents_wait  # type: ignore[method-assign]
    _driver.Driver.start_first_segment = start_first_segment  # type: ignore[method-assign]
    _records.Recorder.write_header = recorder_write_header  # type: ignore[method-assign]


if any(p[0] in ("spawn", "await") for p in _POINTS):
    _install_agent_points()

if any(p[0] == "held" for p in _POINTS):

    @loopwright.hookimpl
    def loopwright_on_state_change(instance: Any, old: Any, new: str, stop_reason: Any) -> None:
        """``held:N``: kill once the N-th instance of this process rests waiting for approval (its header saved)."""
        del instance, old, stop_reason
        if new == "waiting_for_approval":
            (n,) = _count(("held", ""))
            if (label := _armed("held", "", n)) is not None:
                die(label)

if _GATE or any(p[0] in ("entry", "header", "record") for p in _POINTS):
    _install_store_points()
    _install_sql_points()


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------


@loopwright.hookimpl
def loopwright_register_providers(register: Any) -> None:
    register("crash", ScriptProvider)


@loopwright.hookimpl
def loopwright_register_tools(register: Any) -> None:
    register(charge, send_slow, upload_slow, lookup, fetch_slow, wire_slow, probe_slow, flaky, stall, priced)


if __name__ == "__main__":  # pragma: no cover - a plugin file, not a script
    sys.exit("this is a loopwright plugin file; list it in an assembly's plugins:")
