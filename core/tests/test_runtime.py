"""The runtime around the loop: durability across runtimes, approvals, messages, resume and events."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import anyio
import pytest
from helpers import (
    Harness,
    call,
    defn,
    entries_path,
    make_runtime,
    records_of,
    reply,
    result_for,
    run_to_rest,
    runtime_id,
)

import loopwright
from loopwright import State, StopReason, ToolStatus, Usage
from loopwright._config import definition_to_dict
from loopwright._instance import message_to_json
from loopwright.abc import new_post_id
from loopwright.errors import InstanceNotFoundError, LoopwrightError

pytestmark = pytest.mark.anyio


def make_note_tool(log: list[object]) -> loopwright.Tool:
    @loopwright.tool(name="note")
    async def note(x: int) -> str:
        """Write down a number."""
        log.append(x)
        return f"noted {x}"

    return note


def transcript_json(run: loopwright.AgentRun) -> list[dict[str, object]]:
    return [message_to_json(m) for m in run.inst.transcript]


# ------------------------------------------------------------------------------------------
# Durability
# ------------------------------------------------------------------------------------------


async def test_a_new_runtime_sees_the_same_instance(tmp_path: Path) -> None:
    """A new Runtime over the same store gets the instance by id with the same transcript, usage and turns."""
    note = make_note_tool([])
    usage = Usage(input_tokens=5, output_tokens=2, total_tokens=7, requests=1)
    h = Harness(reply(None, call("note", "n1", x=1), call("note", "n2", x=2), usage=usage),
                reply("done", usage=usage), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note], system_prompt="be brief"))
        before = transcript_json(run)
        turns = run.inst.turn
    async with make_runtime(tmp_path, Harness(tools=[note])) as rt2:
        again = await rt2.get_agent(run.instance_id)
        assert transcript_json(again) == before
        assert again.inst.turn == turns == 2
        loaded = again.inst.result()
        assert loaded.usage == result.usage
        assert (loaded.usage.input_tokens, loaded.usage.output_tokens) == (10, 4)
        assert (loaded.state, loaded.stop_reason, loaded.text) == (State.WAITING, StopReason.WAITING, "done")
        assert loaded == result
        header = await rt2.store.read_header(run.instance_id)
        assert header["turns"] == 2
        assert header["usage"]["inputTokens"] == 10


async def test_message_to_a_reloaded_instance_continues_in_the_new_runtime(tmp_path: Path) -> None:
    """After a restart, message() on a saved instance continues it in the new runtime with its history."""
    h = Harness(reply("first answer"))
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(system_prompt="sys"))
        iid = run.instance_id
    h2 = Harness(reply("second answer"))
    async with make_runtime(tmp_path, h2) as rt2:
        run2 = await rt2.message(iid, "and now?")
        result = await run2.result()
        assert (result.state, result.text) == (State.WAITING, "second answer")
        assert [(m.role, m.content) for m in h2.sent[0]] == [
            ("system", "sys"), ("user", "go"), ("assistant", "first answer"), ("user", "and now?")]
        assert run2.inst.turn == 2
    async with make_runtime(tmp_path, Harness()) as rt3:
        run3 = await rt3.get_agent(iid)
        assert [m.content for m in run3.inst.transcript][-2:] == ["and now?", "second answer"]


async def test_entries_are_append_only(tmp_path: Path) -> None:
    """The entry log only grows: the bytes written by earlier turns never change."""
    note = make_note_tool([])
    h = Harness(reply(None, call("note", x=1)), reply("one"), reply(None, call("note", x=2)), reply("two"),
                reply("three"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[note]))
        path = entries_path(rt, run.instance_id)
        snapshots = [path.read_bytes()]
        for text in ("more", "again"):
            await run.message(text)
            await run.result()
            snapshots.append(path.read_bytes())
    for earlier, later in itertools.pairwise(snapshots):
        assert len(later) > len(earlier)
        assert later.startswith(earlier)
    lines = snapshots[-1].decode().splitlines()
    assert all(isinstance(json.loads(line)["t"], str) for line in lines)


async def test_unknown_instance_id_raises_instance_not_found(tmp_path: Path) -> None:
    """get_agent on an id the store does not hold raises InstanceNotFoundError naming it."""
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(InstanceNotFoundError, match="20990101-000000-deadbeef"):
            await rt.get_agent("20990101-000000-deadbeef")


async def write_crashed_instance(rt: loopwright.Runtime, iid: str, definition: loopwright.Definition,
                                 calls: list[loopwright.ToolCall], started: tuple[str, ...] = ()) -> None:
    """Write what a process that died mid-turn leaves: state running, calls without results.

    ``started`` names the calls whose ``start`` entry was written (they had begun running).
    """
    header = {
        "instanceId": iid, "name": definition.name, "version": 1, "definition": definition_to_dict(definition),
        "inputs": {}, "state": "running", "stopReason": None, "cancelled": False, "error": None,
        "pendingApprovals": [], "inbox": [], "spawnerInstanceId": None, "callerInstanceId": None,
        "callerToolCallId": None, "delegationPrompt": None, "createdAt": "2026-01-01T00:00:00.000Z",
        "updatedAt": "2026-01-01T00:00:00.000Z", "model": "s:m",
    }
    await rt.store.create(iid, header)
    user = loopwright.Message(role="user", content="go", source="api")
    assistant = loopwright.Message(role="assistant", tool_calls=tuple(calls), model="s:m")
    await rt.store.append_entries(iid, [
        {"t": "seg", "at": "2026-01-01T00:00:00.000Z"},
        {"t": "msg", "m": message_to_json(user)},
        {"t": "msg", "m": message_to_json(assistant),
         "turn": {"n": 1, "model": "s:m", "usage": {"inputTokens": 1, "outputTokens": 1}, "cost": 0.0}},
        *({"t": "start", "id": cid} for cid in started),
    ])


async def test_resume_after_a_crash_reruns_idempotent_calls_and_flags_the_others(tmp_path: Path) -> None:
    """resume() gives non-idempotent interrupted calls unknown_outcome and runs idempotent ones again."""
    ran: list[str] = []

    @loopwright.tool(idempotent=True)
    def read_it() -> str:
        """Read (safe to repeat)."""
        ran.append("read")
        return "contents"

    @loopwright.tool
    def pay() -> str:
        """Pay (not safe to repeat)."""
        ran.append("pay")
        return "paid"

    definition = defn(tools=[read_it, pay])
    h = Harness(reply("recovered"), tools=[read_it, pay])
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-0badc0de"
        await write_crashed_instance(rt, iid, definition, [call("pay", "p"), call("read_it", "r")],
                                     started=("p", "r"))
        run = await rt.resume(iid)
        result = await run.result()
        assert (result.state, result.text) == (State.WAITING, "recovered")
        assert ran == ["read"]
        paid = result_for(run.inst.transcript, "p")
        assert paid.status is ToolStatus.UNKNOWN_OUTCOME
        assert "unknown" in paid.content
        assert result_for(run.inst.transcript, "r").content == "contents"
        assert [m.tool_call_id for m in h.sent[0] if m.role == "tool"] == ["p", "r"]
        assert run.inst.turn == 2


async def test_resume_runs_calls_that_never_started(tmp_path: Path) -> None:
    """A call the crashed process never started (no start entry) simply runs on resume, idempotent or not."""
    ran: list[str] = []

    @loopwright.tool
    def pay() -> str:
        """Pay (not safe to repeat)."""
        ran.append("pay")
        return "paid"

    definition = defn(tools=[pay])
    h = Harness(reply("recovered"), tools=[pay])
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-00c0ffee"
        await write_crashed_instance(rt, iid, definition, [call("pay", "started"), call("pay", "fresh")],
                                     started=("started",))
        run = await rt.resume(iid)
        await run.result()
        assert ran == ["pay"]
        assert result_for(run.inst.transcript, "started").status is ToolStatus.UNKNOWN_OUTCOME
        assert result_for(run.inst.transcript, "fresh").content == "paid"


@pytest.mark.parametrize("by", ["resume", "message"])
async def test_mail_read_by_a_take_over_whose_turn_completes_starts_the_next_segment(tmp_path: Path, by: str) -> None:
    """A message posted while the runner was dead is read (into the queue) by the process that takes
    the instance over; when the interrupted turn then ends the segment (``task_complete``), the
    message starts the next segment instead of resting unread in the queue."""
    definition = defn(tools=["task_complete"])
    h = Harness(reply("read it"), tools=[])
    async with make_runtime(tmp_path, h) as rt:
        iid = "20260101-000000-0000ma11"
        await write_crashed_instance(rt, iid, definition, [call("task_complete", "tc", result="R", summary="S")])
        if by == "resume":  # posted by another process while the runner was dead
            await rt.store.post(iid, {"id": new_post_id(), "type": "message", "text": "late", "source": "api",
                                      "at": "2026-01-01T00:00:01.000Z"})
            run = await rt.resume(iid)
        else:
            run = await rt.message(iid, "late")
        result = await run.result()
        users = [m.content for m in run.inst.transcript if m.role == "user"]
        assert users == ["go", "late"]
        assert (result.state, result.text) == (State.WAITING, "read it")
        assert [m.content for m in h.sent[0] if m.role == "user"] == ["go", "late"]
        header = await rt.store.read_header(iid)
        assert header["inbox"] == []
        assert header["state"] == "waiting"


async def test_resume_leaves_a_resting_instance_alone(tmp_path: Path) -> None:
    """resume() on an instance that is not running does nothing."""
    h = Harness(reply("hi"))
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn())
        again = await rt.resume(run.instance_id)
        assert again is run
        assert not again.running
        assert len(h.requests) == 1


async def test_closing_the_runtime_mid_run_leaves_it_resumable(tmp_path: Path) -> None:
    """Leaving the runtime while a tool runs keeps the instance running in the store; a new runtime resumes it."""
    started = anyio.Event()

    @loopwright.tool
    async def slow() -> str:
        """Take a long time."""
        started.set()
        await anyio.sleep(30)
        return "never"

    async with make_runtime(tmp_path, Harness(reply(None, call("slow", "s1")), tools=[slow])) as rt:
        run = await rt.start_agent(defn(tools=[slow]), None, "go")
        with anyio.fail_after(5):
            await started.wait()
        iid = run.instance_id
    h2 = Harness(reply("after restart"), tools=[slow])
    async with make_runtime(tmp_path, h2) as rt2:
        assert (await rt2.store.read_header(iid))["state"] == "running"
        run2 = await rt2.resume(iid)
        result = await run2.result()
        assert result.text == "after restart"
        assert result_for(run2.inst.transcript, "s1").status is ToolStatus.UNKNOWN_OUTCOME


# ------------------------------------------------------------------------------------------
# Approvals
# ------------------------------------------------------------------------------------------


def gated_tools(log: list[object]) -> list[loopwright.Tool]:
    @loopwright.tool(requires_approval=True)
    def rm(path: str) -> str:
        """Remove a file."""
        log.append(path)
        return f"removed {path}"

    return [rm, make_note_tool(log)]


async def test_approve_runs_the_held_call_and_continues(tmp_path: Path) -> None:
    """Approving the held call runs it, gives the model its result and goes on with the loop."""
    log: list[object] = []
    tools = gated_tools(log)
    h = Harness(reply(None, call("rm", "r", path="/w/x")), reply("cleaned"), tools=tools)
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=tools))
        assert log == []
        await run.approve(runtime_id(run.inst.transcript, "r"))
        result = await run.result()
        assert (result.state, result.text, result.pending_approvals) == (State.WAITING, "cleaned", ())
        assert log == ["/w/x"]
        assert result_for(run.inst.transcript, "r").content == "removed /w/x"
        approvals = records_of(await rt.records(run.instance_id), "approval")
        assert [a["decision"] for a in approvals] == [None, "approved"]


async def test_deny_gives_the_model_a_denied_result_with_the_reason(tmp_path: Path) -> None:
    """Denying the held call gives the model a denied result with the reason; the tool never runs."""
    log: list[object] = []
    tools = gated_tools(log)
    h = Harness(reply(None, call("rm", "r", path="/")), reply("ok, I won't"), tools=tools)
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=tools))
        await run.deny(reason="too dangerous")
        result = await run.result()
        assert result.text == "ok, I won't"
        denied = result_for(run.inst.transcript, "r")
        assert denied.status is ToolStatus.DENIED
        assert "too dangerous" in denied.content
        assert log == []


async def test_run_goes_on_only_when_every_held_call_is_decided(tmp_path: Path) -> None:
    """With two held calls, one decision leaves the instance waiting; the second continues the run."""
    log: list[object] = []
    tools = gated_tools(log)
    h = Harness(reply(None, call("rm", "a", path="a"), call("rm", "b", path="b")), reply("both decided"),
                tools=tools)
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=tools))
        a, b = runtime_id(run.inst.transcript, "a"), runtime_id(run.inst.transcript, "b")
        assert [p.tool_call_id for p in result.pending_approvals] == [a, b]
        await run.approve(a)
        assert not run.running
        assert run.state is State.WAITING_FOR_APPROVAL
        assert len(h.requests) == 1
        await run.deny(b, reason="no")
        result = await run.result()
        assert result.text == "both decided"
        assert log == ["a"]
        assert [m.tool_call_id for m in h.sent[-1] if m.role == "tool"] == [a, b]
        assert [m.provider_call_id for m in h.sent[-1] if m.role == "tool"] == ["a", "b"]


async def test_approving_without_pending_calls_is_an_error(tmp_path: Path) -> None:
    """approve() on an instance with nothing held raises a LoopwrightError; a wrong call id too."""
    log: list[object] = []
    tools = gated_tools(log)
    h = Harness(reply("nothing to approve"), reply(None, call("rm", "r", path="p")), tools=tools)
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=tools))
        with pytest.raises(LoopwrightError, match="no call waiting"):
            await run.approve()
        await run.message("now delete")
        await run.result()
        with pytest.raises(LoopwrightError, match="nope"):
            await run.approve("nope")


async def test_approval_survives_a_restart(tmp_path: Path) -> None:
    """A new runtime over the same store approves a saved held call and the run goes on there."""
    log: list[object] = []
    tools = gated_tools(log)
    async with make_runtime(tmp_path, Harness(reply(None, call("rm", "r", path="p")), tools=tools)) as rt:
        run, _ = await run_to_rest(rt, defn(tools=tools))
        iid = run.instance_id
    h2 = Harness(reply("approved elsewhere"), tools=tools)
    async with make_runtime(tmp_path, h2) as rt2:
        run2 = await rt2.approve(iid)
        result = await run2.result()
        assert (result.state, result.text) == (State.WAITING, "approved elsewhere")
        assert log == ["p"]


async def test_hold_turn_policy_holds_every_call_of_the_turn(tmp_path: Path) -> None:
    """approvalPolicy holdTurn (seed 002) holds the whole turn: no call runs before the decision."""
    log: list[object] = []
    tools = gated_tools(log)
    h = Harness(reply(None, call("note", "n", x=1), call("rm", "r", path="p")), reply("done"), tools=tools)
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=tools, approval_policy="holdTurn"))
        assert result.state is State.WAITING_FOR_APPROVAL
        assert log == []
        assert {p.tool_call_id for p in result.pending_approvals} == {
            runtime_id(run.inst.transcript, "n"), runtime_id(run.inst.transcript, "r")}
        await run.approve()
        result = await run.result()
        assert sorted(map(str, log)) == ["1", "p"]
        assert result.text == "done"


async def test_definition_requires_approval_by_tool_name(tmp_path: Path) -> None:
    """A tool listed in the definition's requiresApproval is held even though the tool itself does not ask."""
    log: list[object] = []
    note = make_note_tool(log)
    h = Harness(reply(None, call("note", "n", x=1)), reply("done"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[note], requires_approval=("note",)))
        assert result.state is State.WAITING_FOR_APPROVAL
        assert "note" in result.pending_approvals[0].reason
        assert log == []


async def test_message_while_approvals_are_pending_waits_for_the_decision(tmp_path: Path) -> None:
    """A message sent while approvals are pending is delivered after they are decided, behind the results."""
    log: list[object] = []
    tools = gated_tools(log)
    h = Harness(reply(None, call("rm", "r", path="p")), reply("done"), tools=tools)
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=tools))
        await run.message("also do this")
        assert run.state is State.WAITING_FOR_APPROVAL
        assert not run.running
        await run.approve()
        await run.result()
        assert [(m.role, m.content) for m in h.sent[-1]][-2:] == [("tool", "removed p"), ("user", "also do this")]


# ------------------------------------------------------------------------------------------
# Messages and events
# ------------------------------------------------------------------------------------------


async def test_message_to_a_running_agent_is_read_at_the_next_turn_boundary(tmp_path: Path) -> None:
    """A message sent while a tool runs joins the transcript after that turn's results."""
    started, release = anyio.Event(), anyio.Event()

    @loopwright.tool
    async def wait_a_bit() -> str:
        """Wait."""
        started.set()
        await release.wait()
        return "waited"

    h = Harness(reply(None, call("wait_a_bit", "w")), reply("saw it"), tools=[wait_a_bit])
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(tools=[wait_a_bit]), None, "go")
        with anyio.fail_after(5):
            await started.wait()
        await run.message("steer left")
        release.set()
        result = await run.result()
        assert result.text == "saw it"
        assert [(m.role, m.content) for m in h.sent[1]][-2:] == [("tool", "waited"), ("user", "steer left")]
        assert h.sent[1][-1].source == "api"


async def test_message_to_an_errored_instance_starts_a_new_segment(tmp_path: Path) -> None:
    """A message to an instance in error starts a new run segment, as for any resting instance."""
    note = make_note_tool([])
    h = Harness(reply(None, call("note", x=1)), reply("back"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note], max_iterations=1))
        assert result.state is State.ERROR
        await run.message("try again")
        result = await run.result()
        assert (result.state, result.text, result.error) == (State.WAITING, "back", None)


async def test_events_follow_a_run(tmp_path: Path) -> None:
    """events() yields state, tool_call, tool_result and text events of the segment until it rests."""
    note = make_note_tool([])
    h = Harness(reply(None, call("note", "n", x=1)), reply("done"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(tools=[note]), None, "go")
        kinds = []
        with anyio.fail_after(5):
            async for event in run.events():
                kinds.append(event.kind)
                assert event.instance_id == run.instance_id
        assert kinds[0] == "state"
        assert {"tool_call", "tool_result", "text", "usage"} <= set(kinds)
        assert kinds[-1] == "state"


async def test_state_records_trace_every_transition(tmp_path: Path) -> None:
    """Each state change is written as a state record, from creation to rest."""
    h = Harness(reply("hi"))
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn())
        states = records_of(await rt.records(run.instance_id), "state")
        assert [(s["from"], s["to"]) for s in states] == [(None, "running"), ("running", "waiting")]


async def test_list_instances_filters_by_state(tmp_path: Path) -> None:
    """list_instances returns summaries with camelCase keys, filtered by state."""
    tools = gated_tools([])
    h = Harness(reply("hi"), reply(None, call("rm", "r", path="p")), tools=tools)
    async with make_runtime(tmp_path, h) as rt:
        a, _ = await run_to_rest(rt, defn())
        b, _ = await run_to_rest(rt, defn(tools=tools))
        waiting = await rt.list_instances("waiting")
        assert [s["instanceId"] for s in waiting] == [a.instance_id]
        held = await rt.list_instances("waiting_for_approval")
        assert [s["instanceId"] for s in held] == [b.instance_id]
        assert held[0]["pendingApprovals"][0]["toolCallId"] == runtime_id(b.inst.transcript, "r")
        assert len(await rt.list_instances()) == 2


async def test_unknown_tool_name_in_definition_fails_the_start(tmp_path: Path) -> None:
    """A definition naming a tool nobody registered fails at start with a ConfigError naming it."""
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(loopwright.errors.ConfigError, match="no_such_tool"):
            await rt.start_agent(defn(tools=["no_such_tool"]), None, "go")


async def test_tool_paths_resolve_by_their_last_segment(tmp_path: Path) -> None:
    """A tool reference such as /agent-tools/os/note finds the tool by its last path segment."""
    log: list[object] = []
    note = make_note_tool(log)
    h = Harness(reply(None, call("note", x=5)), reply("ok"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, defn(tools=["/agent-tools/os/note"]))
        assert log == [5]
        assert [t.name for t in h.requests[0].tools] == ["note"]


@pytest.mark.anyio
async def test_a_runtime_that_fails_to_open_still_runs_the_close_hooks(tmp_path: Path) -> None:
    """An error while opening (here an unknown store kind) closes what was opened: the
    loopwright_on_runtime_close hooks run once, so plugins release what they started.
    """
    from loopwright._definition import Assembly, StoreConfig  # noqa: PLC0415

    closed: list[object] = []

    class Closer:
        @loopwright.hookimpl
        def loopwright_on_runtime_close(self, runtime: object) -> None:
            closed.append(runtime)

    rt = loopwright.Runtime(Assembly(store=StoreConfig(kind="no-such-store")), plugins=[Closer()], autoload=False)
    with pytest.raises(loopwright.errors.ConfigError, match="unknown store kind"):
        async with rt:
            pass
    assert closed == [rt]
