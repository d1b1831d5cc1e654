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
from helpers import Harness, call, defn, make_runtime, records_of, reply, result_for, run_to_rest

import loopwright
from loopwright import Cost, Limits, State, ToolError, ToolOutput, ToolStatus, Usage, call_digest
from loopwright._config import definition_to_dict
from loopwright._instance import message_to_json
from loopwright.errors import ToolCallDenied

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------------------------------
# The ToolContext a tool's hold sees
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tool_timeout", "limit", "expected"), [
    (7.0, None, 7.0),     # the tool's own timeout
    (7.0, 3.0, 7.0),      # ... wins over the definition's toolTimeout
    (None, 3.0, 3.0),     # the definition's toolTimeout
    (None, None, 60.0),   # the documented default: 60 s
])
async def test_hold_sees_the_timeout_the_call_would_run_with(
    tmp_path: Path, tool_timeout: float | None, limit: float | None, expected: float,
) -> None:
    """ToolContext.timeout given to ``hold`` is the call's timeout: the tool's, else toolTimeout, else 60 s."""
    seen: list[tuple[float, float]] = []

    def watch(arguments: Any, context: loopwright.ToolContext) -> None:
        seen.append((context.timeout, -1.0))

    @loopwright.tool(hold=watch, timeout=tool_timeout)
    def probe(context: loopwright.ToolContext) -> str:
        """Report the timeout the loop gave the call."""
        seen.append((-1.0, context.timeout))
        return "ok"

    h = Harness(reply(None, call("probe", "p")), reply("done"), tools=[probe])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[probe], limits=Limits(tool_timeout=limit)))
    assert result.text == "done"
    assert seen == [(expected, -1.0), (-1.0, expected)]


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

    @loopwright.tool
    def note(x: int) -> str:
        """Write down a number."""
        return f"noted {x}"

    @loopwright.tool
    def refuse() -> str:
        """Refuse."""
        raise ToolCallDenied("not allowed")

    h = Harness(reply(None, call("note", "ok", x=1), call("note", "bad", x="one"), call("refuse", "den"),
                      call("ghost", "g")), reply("done"), tools=[note, refuse])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[note, refuse]))
        records = {r["toolCallId"]: r for r in records_of(await rt.records(run.instance_id), "tool_call")}
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


async def test_a_task_complete_saved_before_a_crash_completes_with_its_result(tmp_path: Path) -> None:
    """A successful task_complete whose result was saved completes the instance on resume, with its ``result``."""
    definition = defn(tools=["task_complete"])
    done = loopwright.ToolCall(id="t", name="task_complete", arguments={"result": "all done", "summary": "s"})
    h = Harness()  # the model is not asked again
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-00d0e0e0"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(done,), model="s:m"), "turn": _turn(1)},
            _msg("tool", '{"result":"all done","summary":"s"}', tool_call_id="t", name="task_complete",
                 status=ToolStatus.SUCCESS),
        ])
        run = await rt.resume(iid)
        result = await run.result()
    assert (result.state, result.stop_reason, result.text) == (State.STOPPED, loopwright.StopReason.COMPLETED,
                                                                "all done")
    assert h.requests == []


async def test_repaired_tool_call_records_carry_the_turn_and_only_failures_an_error(tmp_path: Path) -> None:
    """The tool_call records a take-over writes from the log: the call's turn, and ``error`` only when it failed.

    Here the results were saved in a segment of their own (one that went on after an approval),
    so their turn is the last one of the segment before.
    """

    @loopwright.tool
    def note(x: int) -> str:
        """Write down a number."""
        return f"noted {x}"

    definition = defn(tools=[note])
    a = loopwright.ToolCall(id="a", name="note", arguments={"x": 1})
    b = loopwright.ToolCall(id="b", name="note", arguments={"x": 2})
    async with make_runtime(tmp_path, Harness(reply("done"), tools=[note])) as rt:
        iid = "20260101-000000-00ecc0de"
        await _write_dead(rt, iid, definition, [
            _msg("user", "go", source="api"),
            {**_msg("assistant", None, tool_calls=(a, b), model="s:m"), "turn": _turn(1)},
            {"t": "seg", "at": _AT},
            _msg("tool", "noted 1", tool_call_id="a", name="note", status=ToolStatus.SUCCESS),
            _msg("tool", "no", tool_call_id="b", name="note", status=ToolStatus.TOOL_ERROR),
        ], turns=1)
        run = await rt.resume(iid)
        assert (await run.result()).text == "done"
        records = [r["data"] for r in await rt.records(iid) if r["kind"] == "tool_call"]
    repaired = {r["toolCallId"]: r for r in records if r.get("repaired")}
    assert {k: (r["turn"], r["status"]) for k, r in repaired.items()} == {"a": (1, "success"), "b": (1, "tool_error")}
    assert "error" not in repaired["a"]
    assert repaired["b"]["error"] == "no"
