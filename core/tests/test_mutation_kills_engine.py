"""Behaviours of the loop's engine that mutation passes found untested (docs/testing.md, "The loop, session 7").

Each test states a documented behaviour and checks it against the documented values: the
timeout a tool's ``hold`` sees, a result's duration, what a ``ToolOutput`` spends, the ``error``
of a failed call's record, who decided an approval and a decision read back from the store.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, records_of, reply, result_for, run_to_rest, runtime_id

import loopwright
from loopwright import (
    Cost,
    InitialPrompt,
    InitialToolCall,
    Limits,
    State,
    ToolError,
    ToolOutput,
    ToolStatus,
    Usage,
    call_digest,
)
from loopwright._config import definition_to_dict
from loopwright._instance import message_to_json
from loopwright.errors import ToolCallDenied

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------------------------------
# The ToolContext a tool's hold sees
# ------------------------------------------------------------------------------------------

def _note_tool(log: list[int] | None = None) -> loopwright.Tool:
    """Return a ``note(x)`` tool that answers ``noted X`` (and appends ``x`` to ``log``, if given)."""

    @loopwright.tool
    def note(x: int) -> str:
        """Write down a number."""
        if log is not None:
            log.append(x)
        return f"noted {x}"

    return note



@pytest.mark.parametrize(("tool_timeout", "limit", "expected"), [
    (7.0, None, 7.0),     # the tool's own timeout
    (7.0, 3.0, 7.0),      # ... wins over the definition's toolTimeout
    (None, 3.0, 3.0),     # the definition's toolTimeout
    (None, None, 60.0),   # the documented default: 60 s
])
async def test_hold_sees_the_timeout_the_call_would_run_with(
    tmp_path: Path, tool_timeout: float | None, limit: float | None, expected: float,
) -> None:
    """ToolContext.timeout given to ``hold`` is the call's timeout: the tool's, else toolTimeout, else 60 s.

    The tool's own context parameter gets the same timeout when it runs.
    """
    seen: list[tuple[str, float]] = []

    def watch(arguments: Any, context: loopwright.ToolContext) -> None:
        seen.append(("hold", context.timeout))

    @loopwright.tool(hold=watch, timeout=tool_timeout)
    def probe(context: loopwright.ToolContext) -> str:
        """Report the timeout the loop gave the call."""
        seen.append(("run", context.timeout))
        return "ok"

    h = Harness(reply(None, call("probe", "p")), reply("done"), tools=[probe])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[probe], limits=Limits(tool_timeout=limit)))
    assert result.text == "done"
    assert seen == [("hold", expected), ("run", expected)]


# ------------------------------------------------------------------------------------------
# A result's duration
# ------------------------------------------------------------------------------------------


def _sleeper(outcome: str) -> loopwright.Tool:
    @loopwright.tool(name="nap")
    def nap() -> str:
        """Sleep a little, then end as told."""
        time.sleep(0.05)
        if outcome == "tool_error":
            raise ToolError("no")
        if outcome == "denied":
            raise ToolCallDenied("not this one")
        if outcome == "tool_failed":
            raise RuntimeError("boom")
        return "rested"

    return nap


@pytest.mark.parametrize("outcome", ["success", "tool_error", "denied", "tool_failed"])
async def test_a_result_records_how_long_the_tool_ran(tmp_path: Path, outcome: str) -> None:
    """The tool_call record's ``duration`` is the seconds the tool ran, whatever its outcome.

    It is at least the tool's own sleep and at most the whole run around it.
    """
    nap = _sleeper(outcome)
    h = Harness(reply(None, call("nap", "n")), reply("done"), tools=[nap])
    async with make_runtime(tmp_path, h) as rt:
        t0 = time.perf_counter()
        run, _ = await run_to_rest(rt, defn(tools=[nap]))
        whole = time.perf_counter() - t0
        (record,) = records_of(await rt.records(run.instance_id), "tool_call")
    assert record["status"] == outcome
    assert 0.05 <= record["duration"] <= whole


async def test_a_timed_out_call_records_its_timeout_as_its_duration(tmp_path: Path) -> None:
    """A call cut off by its timeout records a duration of at least the timeout (and within the run)."""

    @loopwright.tool(timeout=0.1)
    async def stuck() -> str:
        """Never finish."""
        await anyio.sleep(30)
        return "never"

    h = Harness(reply(None, call("stuck", "s")), reply("done"), tools=[stuck])
    async with make_runtime(tmp_path, h) as rt:
        t0 = time.perf_counter()
        run, _ = await run_to_rest(rt, defn(tools=[stuck]))
        whole = time.perf_counter() - t0
        (record,) = records_of(await rt.records(run.instance_id), "tool_call")
    assert record["status"] == "timeout"
    assert 0.1 <= record["duration"] <= whole


# ------------------------------------------------------------------------------------------
# What a tool spends (ToolOutput)
# ------------------------------------------------------------------------------------------


def _spender(output: ToolOutput) -> loopwright.Tool:
    @loopwright.tool
    async def summarise() -> ToolOutput:
        """Summarise with a paid model."""
        return output

    return summarise


async def test_a_tool_output_with_usage_only_counts_its_tokens(tmp_path: Path) -> None:
    """A ToolOutput's usage is written on its tool_call record and counts toward the instance's usage."""
    tool = _spender(ToolOutput(value="short", usage=Usage(input_tokens=7, output_tokens=3, total_tokens=10,
                                                                requests=1)))
    h = Harness(reply(None, call("summarise", "s")), reply("done"), tools=[tool])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[tool]))
        (record,) = records_of(await rt.records(run.instance_id), "tool_call")
    assert result_for(run.inst.transcript, "s").content == "short"
    assert (record["usage"]["inputTokens"], record["usage"]["outputTokens"]) == (7, 3)
    assert record["cost"] == 0.0
    # two model replies of 1 + 1 tokens each, and the tool's 7 + 3
    assert (result.usage.input_tokens, result.usage.output_tokens) == (9, 5)


async def test_a_tool_output_with_cost_only_counts_its_cost(tmp_path: Path) -> None:
    """A ToolOutput with a cost and no usage still writes the cost and counts it toward the instance's cost."""
    tool = _spender(ToolOutput(value="short", cost=Cost(amount=0.25)))
    h = Harness(reply(None, call("summarise", "s")), reply("done"), tools=[tool])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[tool]))
        (record,) = records_of(await rt.records(run.instance_id), "tool_call")
    assert record["cost"] == 0.25
    assert record["usage"] == {}  # no tokens: the empty usage
    assert result.cost.amount == pytest.approx(0.25)  # the scripted model is free


async def test_a_tool_output_over_the_cost_limit_ends_the_run(tmp_path: Path) -> None:
    """What a tool spends counts toward the ``cost`` limit: the next turn does not start."""
    tool = _spender(ToolOutput(value="pricey", cost=Cost(amount=2.0)))
    h = Harness(reply(None, call("summarise", "s")), reply("never sent"), tools=[tool])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[tool], limits=Limits(cost=1.5)))
    assert result.state is State.ERROR
    assert "cost limit" in (result.error or "")
    assert len(h.requests) == 1


# ------------------------------------------------------------------------------------------
# The error text of every call that did not succeed
# ------------------------------------------------------------------------------------------


async def test_every_unsuccessful_call_records_its_error(tmp_path: Path) -> None:
    """A tool_call record carries ``error`` for each status but success, whatever the status's name."""

    note = _note_tool()

    @loopwright.tool
    def refuse() -> str:
        """Refuse."""
        raise ToolCallDenied("not allowed")

    h = Harness(reply(None, call("note", "ok", x=1), call("note", "bad", x="one"), call("refuse", "den"),
                      call("ghost", "g")), reply("done"), tools=[note, refuse])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[note, refuse]))
        by_runtime_id = {r["toolCallId"]: r for r in records_of(await rt.records(run.instance_id), "tool_call")}
    # Key the records by the model's ids (the records name the runtime's).
    wire = {runtime_id(run.inst.transcript, cid): cid for cid in ("ok", "bad", "den", "g")}
    assert set(by_runtime_id) == set(wire)
    records = {wire[k]: r for k, r in by_runtime_id.items()}
    assert {k: r["status"] for k, r in records.items()} == {
        "ok": "success", "bad": "invalid_arguments", "den": "denied", "g": "unknown_tool"}
    assert "error" not in records["ok"]
    assert records["bad"]["error"].startswith("invalid arguments")
    assert records["den"]["error"] == "denied: not allowed"
    assert "ghost" in records["g"]["error"]


# ------------------------------------------------------------------------------------------
# Approvals: who decided, and a decision read back from the store
# ------------------------------------------------------------------------------------------


def _gated(log: list[str]) -> loopwright.Tool:
    @loopwright.tool(requires_approval=True)
    def rm(path: str) -> str:
        """Remove a file."""
        log.append(path)
        return f"removed {path}"

    return rm


@pytest.mark.parametrize("by", ["token:ops", None])
async def test_the_approval_record_names_who_decided(tmp_path: Path, by: str | None) -> None:
    """approve(by=NAME): the approval record of the continuation carries ``by``; without a name it has none."""
    log: list[str] = []
    rm = _gated(log)
    h = Harness(reply(None, call("rm", "r", path="p")), reply("done"), tools=[rm])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[rm]))
        await run.approve(by=by)
        await run.result()
        approvals = records_of(await rt.records(run.instance_id), "approval")
    assert log == ["p"]
    decided = [a for a in approvals if a["decision"] == "approved"]
    assert len(decided) == 1
    if by is None:
        assert "by" not in decided[0]
    else:
        assert decided[0]["by"] == by


@pytest.mark.parametrize("decision", ["approved", "denied"])
async def test_a_decision_read_back_from_the_store_is_carried_out(tmp_path: Path, decision: str) -> None:
    """A decision another process saved (then stopped) is carried out by resume: approved runs, denied does not.

    The decision here is a string decoded from the saved JSON header, not the literal the API passes.
    """
    log: list[str] = []
    rm = _gated(log)
    async with make_runtime(tmp_path, Harness(reply(None, call("rm", "r", path="p")), tools=[rm])) as rt:
        run, result = await run_to_rest(rt, defn(tools=[rm]))
        assert result.state is State.WAITING_FOR_APPROVAL
        iid = run.instance_id
        header = await rt.store.read_header(iid)
        header["pendingApprovals"] = [
            {**p, "decision": decision, "decisionReason": "saved elsewhere", "decidedBy": "token:ops",
             "decisionDigest": call_digest(p["tool"], p["arguments"])}
            for p in header["pendingApprovals"]]
        await rt.store.write_header(iid, header)
    async with make_runtime(tmp_path, Harness(reply("done"), tools=[rm])) as rt2:
        run2 = await rt2.resume(iid)
        result2 = await run2.result()
        approvals = records_of(await rt2.records(iid), "approval")
    assert result2.text == "done"
    shown = result_for(run2.inst.transcript, "r")
    if decision == "approved":
        assert (log, shown.status, shown.content) == (["p"], ToolStatus.SUCCESS, "removed p")
    else:
        assert (log, shown.status, shown.content) == ([], ToolStatus.DENIED, "denied: saved elsewhere")
    assert [(a["decision"], a.get("by")) for a in approvals if a["decision"]] == [(decision, "token:ops")]


# ------------------------------------------------------------------------------------------
# Recovery: what a runner that takes over a dead runner's instance does
# ------------------------------------------------------------------------------------------

_AT = "2026-01-01T00:00:00.000Z"


def _msg(role: str, content: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"t": "msg", "m": message_to_json(loopwright.Message(role=role, content=content, **fields))}


def _turn(n: int) -> dict[str, Any]:
    return {"n": n, "model": "s:m", "usage": {"inputTokens": 1, "outputTokens": 1}, "cost": 0.0}


async def _write_dead(rt: loopwright.Runtime, iid: str, definition: loopwright.Definition,
                      entries: list[dict[str, Any]], **header: Any) -> None:
    """Write what a runner killed mid-segment leaves: a ``running`` header, ``entries`` and no records."""
    await rt.store.create(iid, {
        "instanceId": iid, "name": definition.name, "version": 1, "definition": definition_to_dict(definition),
        "inputs": {}, "state": "running", "stopReason": None, "cancelled": False, "error": None,
        "pendingApprovals": [], "inbox": [], "spawnerInstanceId": None, "callerInstanceId": None,
        "callerToolCallId": None, "delegationPrompt": None, "createdAt": _AT, "updatedAt": _AT, "model": "s:m",
        **header,
    })
    await rt.store.append_entries(iid, [{"t": "seg", "at": _AT}, *entries])


def _ask(call_id: str) -> loopwright.ToolCall:
    return loopwright.ToolCall(id=call_id, name="ask_user", arguments={"question": "Which colour?"})


async def test_a_failed_task_complete_found_after_a_crash_does_not_complete(tmp_path: Path) -> None:
    """The repaired turn ends as it would have: a task_complete whose result is not a success does not end the loop.

    (docs/crash-safety.md: the turn's end is applied to the saved results; only a *successful*
    loop-ending tool completes the instance.)
    """
    definition = defn(tools=["task_complete"])
    done = loopwright.ToolCall(id="t", name="task_complete", arguments={})
    h = Harness(reply("let me try again"))
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-0000fa11"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(done,), model="s:m"), "turn": _turn(1)},
            _msg("tool", "invalid arguments: 'result' is a required property", tool_call_id="t",
                 name="task_complete", status=ToolStatus.INVALID_ARGUMENTS),
        ])
        run = await rt.resume(iid)
        result = await run.result()
    assert (result.state, result.text) == (State.WAITING, "let me try again")
    assert len(h.requests) == 1


async def test_a_saved_answer_to_a_question_is_not_given_again_after_a_crash(tmp_path: Path) -> None:
    """A runner killed after an ask_user's answer was saved, before the header forgot it, answers it once.

    The header still waits for the answer and still queues the message that answered it; the
    runner that resumes drops both (the log is the truth), so the model reads the answer once.
    """
    definition = defn(tools=["ask_user"])
    h = Harness(reply("blue it is"))
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-00a5ced0"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(_ask("q"),), model="s:m"), "turn": _turn(1)},
            _msg("tool", "blue", tool_call_id="q", name="ask_user", status=ToolStatus.SUCCESS),
        ], awaitingAnswer={"toolCallId": "q", "question": "Which colour?"},
            inbox=[{"id": "p1", "type": "message", "text": "blue", "source": "api", "at": _AT}])
        run = await rt.resume(iid)
        result = await run.result()
        header = await rt.store.read_header(iid)
    assert result.text == "blue it is"
    sent = [(m.role, m.content) for m in h.sent[0]]
    assert sent.count(("tool", "blue")) == 1
    assert ("user", "blue") not in sent
    assert header.get("inbox") in (None, [])
    assert "awaitingAnswer" not in header


async def test_mail_a_dead_runner_already_gave_is_not_given_twice(tmp_path: Path) -> None:
    """A message whose entry (with its post's id) is saved but whose post is still queued is given once on resume."""
    definition = defn()
    h = Harness(reply("hello to you"))
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-0000a11d"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", "first answer", model="s:m"), "turn": _turn(1)},
            {"t": "seg", "at": _AT},
            {**_msg("user", "hello", source="api"), "post": "p1"},
        ], inbox=[{"id": "p1", "type": "message", "text": "hello", "source": "api", "at": _AT}], turns=1)
        run = await rt.resume(iid)
        result = await run.result()
    assert result.text == "hello to you"
    assert [(m.role, m.content) for m in h.sent[0]] == [
        ("user", "go"), ("assistant", "first answer"), ("user", "hello")]


@pytest.mark.parametrize("mail", [False, True])
async def test_a_task_complete_saved_before_a_crash_completes_with_its_result(tmp_path: Path, mail: bool) -> None:
    """A successful task_complete whose result was saved completes the instance on resume, with its ``result``.

    The model is not asked again for that turn. Mail queued in the header is not left unread
    (docs/concepts.md: it starts the next segment as soon as the current one rests): the
    completed segment keeps its result in the transcript, and the model is then asked once, with
    the message.
    """
    definition = defn(tools=["task_complete"])
    done = loopwright.ToolCall(id="t", name="task_complete", arguments={"result": "all done", "summary": "s"})
    h = Harness(reply("read it")) if mail else Harness()  # without mail, the model is not asked again
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-00d0e0e0"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(done,), model="s:m"), "turn": _turn(1)},
            _msg("tool", '{"result":"all done","summary":"s"}', tool_call_id="t", name="task_complete",
                 status=ToolStatus.SUCCESS),
        ], inbox=[{"id": "p1", "type": "message", "text": "more", "source": "api", "at": _AT}] if mail else [])
        run = await rt.resume(iid)
        result = await run.result()
        header = await rt.store.read_header(iid)
    if not mail:
        assert (result.state, result.stop_reason, result.text) == (
            State.STOPPED, loopwright.StopReason.COMPLETED, "all done")
        assert h.requests == []
        return
    assert (result.state, result.text) == (State.WAITING, "read it")
    assert len(h.requests) == 1
    sent = [(m.role, m.content) for m in h.sent[0]]
    assert sent[0] == ("user", "go")
    assert sent[-1] == ("user", "more")
    assert ("tool", '{"result":"all done","summary":"s"}') in sent  # the completed turn stays in the transcript
    assert header["inbox"] == []


async def test_repaired_tool_call_records_carry_the_turn_and_only_failures_an_error(tmp_path: Path) -> None:
    """The tool_call records a take-over writes from the log: the call's turn, and ``error`` only when it failed.

    Here the results were saved in a segment of their own (one that went on after an approval),
    so their turn is the last one of the segment before, which ended with another call's result.
    """

    note = _note_tool()

    definition = defn(tools=[note])
    a, b, c = (loopwright.ToolCall(id=i, name="note", arguments={"x": n}) for n, i in enumerate("abc"))
    async with make_runtime(tmp_path, Harness(reply("done"), tools=[note])) as rt:
        iid = "20260101-000000-00ecc0de"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(a, b, c), model="s:m"), "turn": _turn(1)},
            _msg("tool", "noted 0", tool_call_id="a", name="note", status=ToolStatus.SUCCESS),
            {"t": "seg", "at": _AT},
            {"t": "start", "id": "b"},
            _msg("tool", "noted 1", tool_call_id="b", name="note", status=ToolStatus.SUCCESS),
            {"t": "start", "id": "c"},
            _msg("tool", "no", tool_call_id="c", name="note", status=ToolStatus.TOOL_ERROR),
        ], turns=1)
        run = await rt.resume(iid)
        assert (await run.result()).text == "done"
        records = [r["data"] for r in await rt.records(iid) if r["kind"] == "tool_call"]
    repaired = {r["toolCallId"]: r for r in records if r.get("repaired") and r["toolCallId"] in ("b", "c")}
    assert {k: (r["turn"], r["status"]) for k, r in repaired.items()} == {"b": (1, "success"), "c": (1, "tool_error")}
    assert "error" not in repaired["b"]
    assert repaired["c"]["error"] == "no"


async def test_mail_a_dead_segment_read_but_never_gave_is_given_on_resume(tmp_path: Path) -> None:
    """A segment that died before its first turn boundary gave its queued mail: the resume goes on and gives it."""
    h = Harness(reply("hello to you"))
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-0000b0ed"
        await _write_dead(rt, iid, defn(), [
            _msg("user", "go", source="api"),
            {**_msg("assistant", "first answer", model="s:m"), "turn": _turn(1)},
            {"t": "seg", "at": _AT},
        ], inbox=[{"id": "p1", "type": "message", "text": "hello", "source": "api", "at": _AT}], turns=1)
        run = await rt.resume(iid)
        result = await run.result()
    assert result.text == "hello to you"
    assert [(m.role, m.content) for m in h.sent[0]] == [
        ("user", "go"), ("assistant", "first answer"), ("user", "hello")]


async def test_a_question_the_dead_runner_never_asked_waits_for_its_answer_on_resume(tmp_path: Path) -> None:
    """An ask_user that had not started when the runner died is asked on resume: it waits, with no model call."""
    h = Harness()
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-00a5c0de"
        await _write_dead(rt, iid, defn(tools=["ask_user"]), [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(_ask("q"),), model="s:m"), "turn": _turn(1)},
        ])
        run = await rt.resume(iid)
        result = await run.result()
        header = await rt.store.read_header(iid)
    assert result.state is State.WAITING
    assert header["awaitingAnswer"]["toolCallId"] == "q"
    assert h.requests == []


async def test_a_lost_turn_record_is_written_even_when_other_records_name_its_turn(tmp_path: Path) -> None:
    """A turn without a ``turn`` record gets one on take-over, though a record of another kind carries its number."""

    note = _note_tool()

    definition = defn(tools=[note])
    a = loopwright.ToolCall(id="a", name="note", arguments={"x": 1})
    async with make_runtime(tmp_path, Harness(reply("done"), tools=[note])) as rt:
        iid = "20260101-000000-00ab0de0"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(a,), model="s:m"), "turn": _turn(1)},
            _msg("tool", "noted 1", tool_call_id="a", name="note", status=ToolStatus.SUCCESS),
        ])
        await rt.store.append_records(iid, [{"kind": "tool_call", "instanceId": iid, "at": _AT, "data": {
            "turn": 1, "toolCallId": "a", "tool": "note", "status": "success"}}])
        run = await rt.resume(iid)
        assert (await run.result()).text == "done"
        turns = [r["data"] for r in await rt.records(iid) if r["kind"] == "turn"]
    assert [(t["turn"], t.get("repaired")) for t in turns] == [(1, True), (2, None)]


async def test_resume_carries_out_the_decided_held_calls_and_keeps_the_undecided_ones(tmp_path: Path) -> None:
    """On take-over a decided held call gets its outcome; an undecided one stays pending, without a result."""
    log: list[str] = []
    rm = _gated(log)
    definition = defn(tools=[rm])
    r1 = loopwright.ToolCall(id="r1", name="rm", arguments={"path": "one"})
    r2 = loopwright.ToolCall(id="r2", name="rm", arguments={"path": "two"})

    def pending(c: loopwright.ToolCall, **decision: Any) -> dict[str, Any]:
        return {"toolCallId": c.id, "tool": c.name, "arguments": dict(c.arguments),
                "reason": "tool 'rm' requires approval", "requestedAt": _AT, **decision}

    async with make_runtime(tmp_path, Harness(reply("done"), tools=[rm])) as rt:
        iid = "20260101-000000-00decade"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(r1, r2), model="s:m"), "turn": _turn(1)},
        ], pendingApprovals=[
            pending(r1, decision="approved", decisionDigest=call_digest("rm", {"path": "one"})), pending(r2)])
        run = await rt.resume(iid)
        result = await run.result()
        header = await rt.store.read_header(iid)
    assert log == ["one"]
    assert result_for(run.inst.transcript, "r1").content == "removed one"
    assert [p["toolCallId"] for p in header["pendingApprovals"]] == ["r2"]
    assert not [m for m in run.inst.transcript if m.role == "tool" and m.tool_call_id == "r2"]
    assert [p.tool_call_id for p in result.pending_approvals] == ["r2"]


# ------------------------------------------------------------------------------------------
# The mailbox
# ------------------------------------------------------------------------------------------


async def test_a_message_posted_to_a_resting_instance_is_picked_up_by_another_runtime(tmp_path: Path) -> None:
    """submit_message to a resting instance: a runner's pick_up finds it (``message``) and the model reads it."""
    async with make_runtime(tmp_path, Harness(reply("first"))) as rt:
        run, _ = await run_to_rest(rt, defn())
        iid = run.instance_id
        await rt.submit_message(iid, "and more")
    h2 = Harness(reply("second"))
    async with make_runtime(tmp_path, h2) as rt2:
        picked = await rt2.pick_up(iid)
        assert picked is not None
        assert picked[1] == "message"
        result = await picked[0].result()
    assert result.text == "second"
    assert [(m.role, m.content) for m in h2.sent[0]][-1] == ("user", "and more")


async def test_a_stale_cancel_request_to_a_resting_instance_is_no_work_and_is_dropped(tmp_path: Path) -> None:
    """A cancel request left for a segment that has ended: pick_up finds nothing to do and reads past it."""
    async with make_runtime(tmp_path, Harness(reply("first"))) as rt:
        run, _ = await run_to_rest(rt, defn())
        iid = run.instance_id
        before = int((await rt.store.read_header(iid)).get("inboxCursor") or 0)
        await rt.store.post(iid, {"id": "x1", "type": "cancel", "at": _AT})
    h2 = Harness()
    async with make_runtime(tmp_path, h2) as rt2:
        assert await rt2.pick_up(iid) is None
        header = await rt2.store.read_header(iid)
        assert int(header.get("inboxCursor") or 0) > before
        assert await rt2.pick_up(iid) is None
        assert header["state"] == "waiting"
    assert h2.requests == []


async def test_a_cancel_request_read_at_a_turn_boundary_cancels_the_run(tmp_path: Path) -> None:
    """A cancel request in a running instance's mailbox (as another process posts it) stops it at the turn boundary."""
    holder: dict[str, loopwright.Runtime] = {}

    @loopwright.tool
    async def stop_me(context: loopwright.ToolContext) -> str:
        """Ask for this very instance to be cancelled, as another process would."""
        await holder["rt"].store.post(context.instance_id, {"id": "k1", "type": "cancel", "at": _AT})
        return "asked"

    h = Harness(reply(None, call("stop_me", "s")), reply("never sent"), tools=[stop_me])
    async with make_runtime(tmp_path, h) as rt:
        holder["rt"] = rt
        _run, result = await run_to_rest(rt, defn(tools=[stop_me]))
    assert (result.state, result.stop_reason, result.cancelled) == (State.STOPPED, loopwright.StopReason.CANCELLED,
                                                                      True)
    assert len(h.requests) == 1


async def test_a_message_posted_during_a_long_tool_call_does_not_cancel_it(tmp_path: Path) -> None:
    """The cancel poll acts on cancel requests only: a message posted while a tool runs is read at the next turn."""
    started, release = anyio.Event(), anyio.Event()

    @loopwright.tool
    async def slow() -> str:
        """Wait until released."""
        started.set()
        await release.wait()
        return "finished"

    h = Harness(reply(None, call("slow", "s")), reply("read it"), tools=[slow])
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(tools=[slow]), prompt="go")
        with anyio.fail_after(10):
            await started.wait()
        await rt.submit_message(run.instance_id, "and this")
        await anyio.sleep(0.8)  # a few of the runtime's cancel polls (every 0.25 s) look at the mailbox meanwhile
        release.set()
        with anyio.fail_after(10):
            result = await run.wait()
    assert (result.state, result.cancelled, result.text) == (State.WAITING, False, "read it")
    assert result_for(run.inst.transcript, "s").content == "finished"
    assert [(m.role, m.content) for m in h.sent[1]][-1] == ("user", "and this")


async def test_only_the_task_prompt_is_marked_as_the_task_in_the_log(tmp_path: Path) -> None:
    """The entry of the task prompt carries ``task: true``; a later message's entry does not."""
    h = Harness(reply("one"), reply("two"))
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn())
        await run.message("more")
        await run.result()
        entries = await rt.store.read_entries(run.instance_id)
    users = [(e["m"]["content"], e.get("task")) for e in entries if e.get("t") == "msg" and e["m"]["role"] == "user"]
    assert users == [("go", True), ("more", None)]


async def test_a_task_prompt_that_waited_behind_a_held_injected_turn_is_marked_as_the_task(tmp_path: Path) -> None:
    """Behind a held injected call the task prompt waits in the queue; once given, its entry is marked ``task``."""
    log: list[str] = []
    rm = _gated(log)
    definition = defn(tools=[rm], initial_prompts=(InitialPrompt(role="assistant", tool_calls=(
        InitialToolCall(name="rm", arguments={"path": "x"}, id="i1"),)),))
    h = Harness(reply("done"), tools=[rm])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, definition, "the task")
        assert result.state is State.WAITING_FOR_APPROVAL
        await run.approve()
        assert (await run.result()).text == "done"
        entries = await rt.store.read_entries(run.instance_id)
    assert log == ["x"]
    users = [(e["m"]["content"], e.get("task")) for e in entries if e.get("t") == "msg" and e["m"]["role"] == "user"]
    assert users == [("the task", True)]


# ------------------------------------------------------------------------------------------
# Limits
# ------------------------------------------------------------------------------------------


async def test_the_elapsed_limit_cuts_a_model_call_and_names_the_instances_own_limit(tmp_path: Path) -> None:
    """A model call still running when the segment's ``elapsed`` runs out is cut off; the error names the limit.

    The limit is the instance's own, so the message names no other agent.
    """

    async def hang(request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        await anyio.sleep(30)
        return reply("never")

    h = Harness(hang)
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(limits=Limits(elapsed=0.3)))
    assert (result.state, result.stop_reason, result.limit) == (State.ERROR, loopwright.StopReason.LIMIT_EXCEEDED,
                                                                "elapsed")
    assert result.error == "elapsed-time limit (0.3 s) reached"


async def test_the_tool_call_limit_names_the_instances_own_limit(tmp_path: Path) -> None:
    """Calls beyond the instance's own ``toolCalls`` limit are skipped; the messages name the limit, no other agent."""
    log: list[int] = []

    note = _note_tool(log)

    h = Harness(reply(None, call("note", "a", x=1), call("note", "b", x=2)), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note], limits=Limits(tool_calls=1)))
    assert log == [1]
    skipped = result_for(run.inst.transcript, "b")
    assert (skipped.status, skipped.content) == (ToolStatus.SKIPPED, "skipped: the tool-call limit (1) was reached")
    assert (result.state, result.limit, result.error) == (State.ERROR, "toolCalls", "the tool-call limit (1) reached")


async def test_a_generous_elapsed_limit_does_not_end_a_short_run(tmp_path: Path) -> None:
    """A run well within its ``elapsed`` limit (60 s) ends as it would without one."""
    note_log: list[int] = []

    note = _note_tool(note_log)

    async def thinking(request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        await anyio.sleep(0.01)  # a model call that waits, as a real one does (a cancel point)
        return reply("done")

    h = Harness(reply(None, call("note", "n", x=1)), thinking, tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[note], limits=Limits(elapsed=60.0)))
    assert (result.state, result.text, result.error) == (State.WAITING, "done", None)
    assert note_log == [1]
