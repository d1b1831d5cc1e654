"""The core loop against the seeds: the stop table, tool-result statuses, limits and prompts.

Every test drives a real :class:`~loopwright.Runtime` over a file store in ``tmp_path`` with the
scripted provider of :mod:`helpers`; nothing here depends on another distribution.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest
from helpers import (
    RUNTIME_ID,
    Harness,
    call,
    defn,
    make_runtime,
    raw_call,
    records_of,
    reply,
    result_for,
    run_to_rest,
    runtime_id,
)

import loopwright
from loopwright import (
    InitialPrompt,
    InitialToolCall,
    Limits,
    State,
    StopReason,
    ToolError,
    ToolStatus,
    Usage,
)
from loopwright._definition import AgentRetry, InputSpec
from loopwright.errors import ProviderError, RunCancelledError, RunError

pytestmark = pytest.mark.anyio


def make_note_tool(log: list[object]) -> loopwright.Tool:
    """A parallel-safe tool that appends its argument to ``log``."""

    @loopwright.tool(name="note")
    async def note(x: int) -> str:
        """Write down a number."""
        log.append(x)
        return f"noted {x}"

    return note


# ------------------------------------------------------------------------------------------
# The stop table (seed 000, "The loop", step 4)
# ------------------------------------------------------------------------------------------


async def test_task_complete_stops_completed_after_the_rest_of_the_turn(tmp_path: Path) -> None:
    """task_complete ends the run stopped/completed, and the other calls of its turn still run."""
    log: list[object] = []
    note = make_note_tool(log)
    h = Harness(reply(None, call("note", "n1", x=1), call("task_complete", "tc", result="R", summary="S"),
                      call("note", "n2", x=2)), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note, "task_complete"]))
        assert result.state is State.STOPPED
        assert result.stop_reason is StopReason.COMPLETED
        assert result.text == "R"
        assert result.output == {"result": "R", "summary": "S"}
        assert sorted(log) == [1, 2]
        for cid in ("n1", "tc", "n2"):
            assert result_for(run.inst.transcript, cid).status is ToolStatus.SUCCESS
        assert len(h.requests) == 1
        assert await run.result() == result


async def test_custom_ends_loop_tool_stops_completed_after_the_rest_of_the_turn(tmp_path: Path) -> None:
    """Any ends_loop tool ends the run as completed once the other calls of that turn have run."""
    log: list[object] = []
    note = make_note_tool(log)

    @loopwright.tool(ends_loop=True, parallel_safe=False)
    def finish(answer: str) -> str:
        """Hand in the answer."""
        return f"final: {answer}"

    h = Harness(reply(None, call("finish", "f", answer="42"), call("note", "n", x=7)), tools=[note, finish])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note, finish]))
        assert (result.state, result.stop_reason) == (State.STOPPED, StopReason.COMPLETED)
        assert result.text == "final: 42"
        assert log == [7]
        assert result_for(run.inst.transcript, "n").content == "noted 7"


async def test_answer_without_tool_calls_leaves_the_instance_waiting(tmp_path: Path) -> None:
    """A model answer with no tool call ends the segment in waiting, with the answer as text."""
    h = Harness(reply("hello there"))
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn())
        assert (result.state, result.stop_reason) == (State.WAITING, StopReason.WAITING)
        assert result.text == "hello there"
        assert result.error is None
        assert await run.result() == result


async def test_ask_user_waits_and_the_next_api_message_is_its_answer(tmp_path: Path) -> None:
    """ask_user leaves the instance waiting; the next api message becomes the call's result."""
    h = Harness(reply(None, call("ask_user", "q1", question="Which colour?")), reply("blue it is"))
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=["ask_user"]))
        assert (result.state, result.stop_reason) == (State.WAITING, StopReason.WAITING)
        assert not [m for m in run.inst.transcript if m.role == "tool"]
        await run.message("blue")
        result = await run.result()
        assert result.text == "blue it is"
        answer = result_for(run.inst.transcript, "q1")
        assert (answer.name, answer.content, answer.status) == ("ask_user", "blue", ToolStatus.SUCCESS)
        # The answer is a tool result, not an extra user message.
        assert not [m for m in run.inst.transcript if m.role == "user" and m.content == "blue"]
        last_request = h.sent[-1]
        assert last_request[-1].role == "tool"
        assert last_request[-1].tool_call_id == runtime_id(run.inst.transcript, "q1")
        assert last_request[-1].provider_call_id == "q1"


@pytest.mark.parametrize("source", ["agent", "runtime"])
async def test_agent_or_runtime_message_does_not_answer_ask_user(tmp_path: Path, source: str) -> None:
    """A message from an agent or the runtime joins the history behind the question, not as its answer."""
    h = Harness(reply(None, call("ask_user", "q1", question="Which colour?")), reply("ok"))
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=["ask_user"]))
        await run.message("an alert", source=source)
        with anyio.fail_after(5):
            result = await run.wait()
        assert result.state is State.WAITING
        assert len(h.requests) == 1
        assert not [m for m in run.inst.transcript if m.role == "tool"]
        await run.message("red")
        result = await run.result()
        transcript = list(run.inst.transcript)
        answer = result_for(transcript, "q1")
        assert answer.content == "red"
        alert = next(i for i, m in enumerate(transcript) if m.content == "an alert")
        assert transcript[alert].role == "user"
        assert transcript[alert].source == source
        assert alert > transcript.index(answer)


async def test_call_needing_approval_holds_only_itself(tmp_path: Path) -> None:
    """A call needing approval leaves waiting_for_approval with a full pending entry; the others ran."""
    log: list[object] = []
    note = make_note_tool(log)

    @loopwright.tool(requires_approval=True)
    def danger(x: int) -> str:
        """Do something risky."""
        log.append(("danger", x))
        return "done"

    h = Harness(reply(None, call("danger", "d1", x=1), call("note", "n1", x=2)), tools=[note, danger])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note, danger]))
        assert (result.state, result.stop_reason) == (State.WAITING_FOR_APPROVAL, StopReason.WAITING_FOR_APPROVAL)
        assert log == [2]
        assert result_for(run.inst.transcript, "n1").status is ToolStatus.SUCCESS
        d1 = runtime_id(run.inst.transcript, "d1")
        assert not [m for m in run.inst.transcript if m.tool_call_id == d1]
        assert not [m for m in run.inst.transcript if m.provider_call_id == "d1"]
        (pending,) = result.pending_approvals
        assert (pending.tool_call_id, pending.tool, dict(pending.arguments)) == (d1, "danger", {"x": 1})
        assert "danger" in pending.reason
        assert pending.requested_at.endswith("Z")
        assert pending.decision is None
        header = await rt.store.read_header(run.instance_id)
        (saved,) = header["pendingApprovals"]
        assert {"toolCallId", "tool", "arguments", "reason", "requestedAt"} <= set(saved)
        assert saved["toolCallId"] == d1
        assert header["state"] == "waiting_for_approval"


async def test_max_iterations_ends_in_error_without_raising(tmp_path: Path) -> None:
    """maxIterations turns give state error, message 'max iterations (N) reached', and no exception."""
    note = make_note_tool([])
    h = Harness(*(reply(None, call("note", x=i)) for i in range(5)), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[note], max_iterations=2))
        result = await run.result()
        assert (result.state, result.stop_reason) == (State.ERROR, StopReason.MAX_ITERATIONS)
        assert result.error == "max iterations (2) reached"
        assert len(h.requests) == 2


async def test_model_failure_raises_run_error_with_the_provider_error_as_cause(tmp_path: Path) -> None:
    """A model call that fails for good leaves state error and result() raises RunError(cause=ProviderError)."""
    boom = ProviderError("bad request", provider="s", model="m", status=400)
    h = Harness(boom)
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(), None, "go")
        with pytest.raises(RunError) as info:
            await run.result()
        assert info.value.cause is boom
        assert info.value.result is not None
        assert info.value.result.state is State.ERROR
        assert run.state is State.ERROR
        header = await rt.store.read_header(run.instance_id)
        assert header["state"] == "error"
        assert "bad request" in header["error"]


async def test_model_failure_after_agent_retries(tmp_path: Path) -> None:
    """Transient failures are retried agentRetry.maxRetries times; the last one is the RunError's cause."""
    errors = [ProviderError(f"overloaded {i}", provider="s", model="m", status=529, transient=True,
                            retry_after=0) for i in range(3)]
    h = Harness(*errors)
    async with make_runtime(tmp_path, h, agent_retry=AgentRetry(max_retries=2)) as rt:
        run = await rt.start_agent(defn(), None, "go")
        with pytest.raises(RunError) as info:
            await run.result()
        assert info.value.cause is errors[-1]
        assert len(h.requests) == 3


async def test_transient_failure_then_success_goes_on(tmp_path: Path) -> None:
    """A transient failure followed by an answer is invisible to the run apart from the records."""
    h = Harness(ProviderError("slow down", provider="s", model="m", status=429, transient=True, retry_after=0),
                reply("fine"))
    async with make_runtime(tmp_path, h, agent_retry=AgentRetry(max_retries=1)) as rt:
        _run, result = await run_to_rest(rt, defn())
        assert (result.state, result.text) == (State.WAITING, "fine")


async def test_fallback_model_serves_after_the_first_fails(tmp_path: Path) -> None:
    """When the model fails for good, the fallback models are tried in order and the turn records which served."""
    h = Harness(ProviderError("down", provider="s", model="m", status=500), reply("from fallback"))
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(fallback_models=("s:other",)))
        assert result.text == "from fallback"
        assert [r.model for r in h.requests] == ["m", "other"]
        assert run.inst.transcript[-1].model == "s:other"


async def test_cancel_while_a_tool_runs_keeps_the_partial_turn(tmp_path: Path) -> None:
    """Cancelling gives stopped + cancelled, RunCancelledError from result(), and the partial turn is saved."""
    started = anyio.Event()
    finished: list[bool] = []

    @loopwright.tool
    async def slow() -> str:
        """Take a long time."""
        started.set()
        await anyio.sleep(30)
        finished.append(True)
        return "never"

    h = Harness(reply(None, call("slow", "s1")), tools=[slow])
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(tools=[slow]), None, "go")
        with anyio.fail_after(5):
            await started.wait()
        await run.cancel()
        with pytest.raises(RunCancelledError) as info:
            await run.result()
        assert info.value.result is not None
        assert info.value.result.cancelled
        assert (run.state, run.inst.result().stop_reason) == (State.STOPPED, StopReason.CANCELLED)
        iid = run.instance_id
    assert finished == []
    async with make_runtime(tmp_path, Harness(tools=[slow])) as rt2:
        again = await rt2.get_agent(iid)
        result = again.inst.result()
        assert (result.state, result.cancelled, result.stop_reason) == (State.STOPPED, True, StopReason.CANCELLED)
        assistant = [m for m in again.inst.transcript if m.role == "assistant"]
        assert [c.provider_id for c in assistant[-1].tool_calls] == ["s1"]
        assert all(RUNTIME_ID.match(c.id) for c in assistant[-1].tool_calls)
        # The call the cancel cut off has its one result at rest: it started, so its outcome is unknown.
        assert result_for(again.inst.transcript, "s1").status is ToolStatus.UNKNOWN_OUTCOME


async def test_cancel_skips_held_calls_and_an_open_question(tmp_path: Path) -> None:
    """Cancelling an instance that waits (for approval, for an answer) gives each open call one skipped result."""

    @loopwright.tool(requires_approval=True)
    def wire(to: str) -> str:
        """Wire money."""
        return f"wired {to}"

    h = Harness(reply(None, call("wire", "w1", to="x")), tools=[wire])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[wire]))
        assert result.state is State.WAITING_FOR_APPROVAL
        await rt.cancel(run.instance_id)
        assert (run.state, run.inst.pending_approvals) == (State.STOPPED, [])
        held = result_for(run.inst.transcript, "w1")
        assert (held.status, held.content) == (ToolStatus.SKIPPED, "skipped: the instance was cancelled")
        assert not await run.pending_approvals()

    h = Harness(reply(None, call("ask_user", "q1", question="Which colour?")))
    async with make_runtime(tmp_path, h, store_dir="store2") as rt:
        run, result = await run_to_rest(rt, defn(tools=["ask_user"]))
        assert result.state is State.WAITING
        await rt.cancel(run.instance_id)
        assert run.state is State.STOPPED
        assert not run.inst.header.has("awaiting_answer")
        asked = result_for(run.inst.transcript, "q1")
        assert asked.status is ToolStatus.SKIPPED


async def test_message_after_cancel_gives_the_interrupted_call_a_result(tmp_path: Path) -> None:
    """After a cancel mid-call, the next message gives the interrupted call a result before the model runs."""
    started = anyio.Event()

    @loopwright.tool
    async def slow() -> str:
        """Take a long time."""
        started.set()
        await anyio.sleep(30)
        return "never"

    h = Harness(reply(None, call("slow", "s1")), reply("recovered"), tools=[slow])
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(tools=[slow]), None, "go")
        with anyio.fail_after(5):
            await started.wait()
        await run.cancel()
        with pytest.raises(RunCancelledError):
            await run.result()
        await run.message("carry on")
        result = await run.result()
        assert (result.state, result.cancelled, result.text) == (State.WAITING, False, "recovered")
        assert result_for(run.inst.transcript, "s1").status is ToolStatus.UNKNOWN_OUTCOME
        sent = h.sent[-1]
        assert [m.role for m in sent[-3:]] == ["assistant", "tool", "user"]


async def test_cancel_before_the_model_answers(tmp_path: Path) -> None:
    """Cancelling during a model call stops the run as cancelled and makes no further calls."""
    in_call = anyio.Event()

    async def hang(request: object) -> object:
        in_call.set()
        await anyio.sleep(30)
        return reply("never")

    h = Harness(hang)
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(), None, "go")
        with anyio.fail_after(5):
            await in_call.wait()
        await run.cancel()
        with pytest.raises(RunCancelledError):
            await run.result()
        header = await rt.store.read_header(run.instance_id)
        assert (header["state"], header["cancelled"], header["stopReason"]) == ("stopped", True, "cancelled")


# ------------------------------------------------------------------------------------------
# Tool-result statuses (seed 002, "What a tool call can come back as")
# ------------------------------------------------------------------------------------------


async def run_one_turn(tmp_path: Path, tools: list[loopwright.Tool], *calls: loopwright.ToolCall,
                       **definition: object) -> tuple[loopwright.AgentRun, loopwright.AgentResult, Harness]:
    """Run one turn making ``calls``, then an answer; return the rested run."""
    h = Harness(reply(None, *calls), reply("after"), tools=tools)
    rt = make_runtime(tmp_path, h)
    async with rt:
        run, result = await run_to_rest(rt, defn(tools=tools, **definition))
    return run, result, h


async def test_tool_error_gives_tool_error_and_the_run_goes_on(tmp_path: Path) -> None:
    """A tool raising ToolError gives the model its message with status tool_error; the run goes on."""

    @loopwright.tool
    def picky(n: int) -> str:
        """Refuse."""
        raise ToolError(f"cannot handle {n}")

    run, result, h = await run_one_turn(tmp_path, [picky], call("picky", "p", n=3))
    r = result_for(run.inst.transcript, "p")
    assert (r.status, r.content) == (ToolStatus.TOOL_ERROR, "cannot handle 3")
    assert (result.state, result.text) == (State.WAITING, "after")
    assert h.sent[-1][-1].status is ToolStatus.TOOL_ERROR


async def test_other_exception_gives_tool_failed_with_the_type_name(tmp_path: Path) -> None:
    """A tool raising any other exception gives tool_failed with the exception's type and message."""

    @loopwright.tool
    async def broken() -> str:
        """Crash."""
        raise KeyError("missing")

    run, result, _ = await run_one_turn(tmp_path, [broken], call("broken", "b"))
    r = result_for(run.inst.transcript, "b")
    assert r.status is ToolStatus.TOOL_FAILED
    assert r.content.startswith("KeyError: ")
    assert "missing" in r.content
    assert result.state is State.WAITING


async def test_async_tool_timeout_is_cancelled_and_reported(tmp_path: Path) -> None:
    """An async tool over its timeout is cancelled and the model sees a timeout result; the run goes on."""
    cancelled: list[bool] = []

    @loopwright.tool(timeout=0.2)
    async def sleepy() -> str:
        """Sleep."""
        try:
            await anyio.Event().wait()  # never set: only the timeout ends the call
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise
        return "woke"

    run, result, _ = await run_one_turn(tmp_path, [sleepy], call("sleepy", "z"))
    r = result_for(run.inst.transcript, "z")
    assert r.status is ToolStatus.TIMEOUT
    assert "timeout" in r.content
    assert cancelled == [True]
    assert result.text == "after"


async def test_sync_tool_timeout_from_limits_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    """A plain tool stuck in its thread past Limits.tool_timeout is reported as timeout and the run goes on."""
    release = threading.Event()

    @loopwright.tool
    def stuck() -> str:
        """Block the thread."""
        release.wait(120)  # set once the test is over: the timeout must end the call before the tool does
        return "late"

    try:
        run, result, _ = await run_one_turn(tmp_path, [stuck], call("stuck", "k"),
                                            limits=Limits(tool_timeout=0.2))
        assert result_for(run.inst.transcript, "k").status is ToolStatus.TIMEOUT
        assert (result.state, result.text) == (State.WAITING, "after")
    finally:
        release.set()


async def test_unknown_tool_lists_the_agents_tools(tmp_path: Path) -> None:
    """A call to a tool the agent lacks gives unknown_tool with the names of the tools it has."""
    note = make_note_tool([])
    run, result, _ = await run_one_turn(tmp_path, [note], call("nope", "u"))
    r = result_for(run.inst.transcript, "u")
    assert r.status is ToolStatus.UNKNOWN_TOOL
    assert "nope" in r.content
    assert "note" in r.content
    assert result.state is State.WAITING


async def test_registered_tool_the_definition_does_not_name_is_unknown(tmp_path: Path) -> None:
    """A tool registered in the runtime but not listed by the definition is unknown to the agent."""
    note = make_note_tool([])

    @loopwright.tool
    def other() -> str:
        """Another tool."""
        return "x"

    h = Harness(reply(None, call("other", "o")), reply("after"), tools=[note, other])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[note]))
        r = result_for(run.inst.transcript, "o")
        assert r.status is ToolStatus.UNKNOWN_TOOL
        assert "note" in r.content


async def test_schema_mismatch_gives_invalid_arguments_naming_the_field(tmp_path: Path) -> None:
    """Arguments that do not match the schema give invalid_arguments with 'a: required'-style text."""
    ran: list[int] = []

    @loopwright.tool
    def add(a: int, b: int) -> int:
        """Add."""
        ran.append(1)
        return a + b

    run, _, _ = await run_one_turn(tmp_path, [add], call("add", "m", b=1), call("add", "t", a="x", b=2),
                                   call("add", "e", a=1, b=2, c=3))
    missing = result_for(run.inst.transcript, "m")
    assert missing.status is ToolStatus.INVALID_ARGUMENTS
    assert "a: required" in missing.content
    wrong = result_for(run.inst.transcript, "t")
    assert wrong.status is ToolStatus.INVALID_ARGUMENTS
    assert "a:" in wrong.content
    extra = result_for(run.inst.transcript, "e")
    assert extra.status is ToolStatus.INVALID_ARGUMENTS
    assert "c" in extra.content
    assert ran == []


async def test_arguments_that_are_not_json_give_invalid_arguments(tmp_path: Path) -> None:
    """Raw arguments that are not a JSON object give invalid_arguments quoting them; the tool does not run."""
    ran: list[int] = []

    @loopwright.tool
    def add(a: int, b: int) -> int:
        """Add."""
        ran.append(1)
        return a + b

    run, result, _ = await run_one_turn(tmp_path, [add], raw_call("add", '{"a": 1, "b":', "r"))
    r = result_for(run.inst.transcript, "r")
    assert r.status is ToolStatus.INVALID_ARGUMENTS
    assert '{"a": 1, "b":' in r.content
    assert ran == []
    assert result.state is State.WAITING


async def test_long_result_is_cut_with_a_marker(tmp_path: Path) -> None:
    """A result over 100,000 characters is cut there, with a visible marker."""

    @loopwright.tool
    def big() -> str:
        """Return a lot."""
        return "x" * 150_000

    run, _, _ = await run_one_turn(tmp_path, [big], call("big", "g"))
    r = result_for(run.inst.transcript, "g")
    assert r.status is ToolStatus.SUCCESS
    assert r.content.startswith("x" * 100_000)  # the documented 100,000, not the constant
    assert not r.content.startswith("x" * 100_001)
    assert "truncated" in r.content
    assert "150,000" in r.content
    assert len(r.content) < 100_500


async def test_calls_beyond_32_in_one_reply_are_skipped(tmp_path: Path) -> None:
    """Of 40 calls in one reply the first 32 run and calls 33+ get skipped results; every call gets one."""
    log: list[object] = []
    note = make_note_tool(log)
    calls = [call("note", f"k{i}", x=i) for i in range(40)]
    run, result, _ = await run_one_turn(tmp_path, [note], *calls)
    assert sorted(log) == list(range(32))  # the documented 32, not the constant
    results = [result_for(run.inst.transcript, f"k{i}") for i in range(40)]
    assert [r.status for r in results[:32]] == [ToolStatus.SUCCESS] * 32
    assert [r.status for r in results[32:]] == [ToolStatus.SKIPPED] * 8
    assert "32" in results[32].content
    assert result.state is State.WAITING


async def test_results_come_back_in_call_order_not_finishing_order(tmp_path: Path) -> None:
    """Two parallel calls finishing in reverse order reach the model (and the store) in call order."""
    finished: list[str] = []

    @loopwright.tool
    async def nap(name: str, seconds: float) -> str:
        """Sleep, then say who woke."""
        await anyio.sleep(seconds)
        finished.append(name)
        return name

    run, _, h = await run_one_turn(tmp_path, [nap], call("nap", "slow", name="slow", seconds=0.1),
                                   call("nap", "fast", name="fast", seconds=0.0))
    assert finished == ["fast", "slow"]
    sent = h.sent[-1]
    order = [runtime_id(run.inst.transcript, "slow"), runtime_id(run.inst.transcript, "fast")]
    assert [m.tool_call_id for m in sent if m.role == "tool"] == order
    assert [m.provider_call_id for m in sent if m.role == "tool"] == ["slow", "fast"]
    async with make_runtime(tmp_path, Harness(tools=[nap])) as rt2:
        again = await rt2.get_agent(run.instance_id)
        assert [m.tool_call_id for m in again.inst.transcript if m.role == "tool"] == order
        assert [m.provider_call_id for m in again.inst.transcript if m.role == "tool"] == ["slow", "fast"]


class Gauge:
    """Counts tools running at once.

    No timing: each call waits until ``target`` calls have been running at the same time (then
    every call goes on at once). A loop that runs fewer at once never gets there: its calls wait
    until the tool timeout (a hang guard) and get ``timeout`` results, which the tests check.
    """

    def __init__(self, target: int = 1) -> None:
        self.now = 0
        self.peak = 0
        self.starts: list[int] = []
        self.target = target
        self.full = anyio.Event()

    def make(self, *, parallel_safe: bool = True, name: str = "work") -> loopwright.Tool:
        async def work(i: int) -> int:
            """Work a little."""
            self.starts.append(i)
            self.now += 1
            self.peak = max(self.peak, self.now)
            if self.now >= self.target:
                self.full.set()
            try:
                await self.full.wait()
                await anyio.sleep(0)  # let every call that can start now start
            finally:
                self.now -= 1
            return i

        return loopwright.tool(name=name, parallel_safe=parallel_safe)(work)


async def test_parallel_safe_calls_run_concurrently(tmp_path: Path) -> None:
    """When every call of a turn is parallelSafe they run at the same time."""
    g = Gauge(target=3)
    work = g.make()
    run, _, _ = await run_one_turn(tmp_path, [work], *(call("work", i=i) for i in range(3)))
    assert g.peak == 3
    assert [m.content for m in run.inst.transcript if m.role == "tool"] == ["0", "1", "2"]


async def test_one_unsafe_call_makes_the_turn_sequential_in_call_order(tmp_path: Path) -> None:
    """A single parallelSafe=false call makes the whole turn run one call after another, in call order."""
    g = Gauge()
    work = g.make()
    serial = g.make(parallel_safe=False, name="serial")
    calls = [call("work", i=0), call("work", i=1), call("serial", i=2), call("work", i=3)]
    await run_one_turn(tmp_path, [work, serial], *calls)
    assert g.peak == 1
    assert g.starts == [0, 1, 2, 3]


async def test_at_most_eight_calls_run_at_once(tmp_path: Path) -> None:
    """Sixteen parallel-safe calls: 8 run at the same time, never more (the documented 8, not the constant)."""
    g = Gauge(target=8)
    work = g.make()
    run, _, _ = await run_one_turn(tmp_path, [work], *(call("work", i=i) for i in range(16)))
    assert g.peak == 8
    assert sorted(g.starts) == list(range(16))
    assert [m.content for m in run.inst.transcript if m.role == "tool"] == [str(i) for i in range(16)]


async def test_failing_tools_never_end_the_run(tmp_path: Path) -> None:
    """Turns full of failing calls keep the loop going until the model answers."""

    @loopwright.tool
    def bad() -> str:
        """Fail."""
        raise RuntimeError("nope")

    h = Harness(reply(None, call("bad")), reply(None, call("bad"), call("missing")), reply("gave up"),
                tools=[bad])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[bad]))
        assert (result.state, result.text) == (State.WAITING, "gave up")
        assert len(h.requests) == 3
        statuses = [m.status for m in run.inst.transcript if m.role == "tool"]
        assert statuses == [ToolStatus.TOOL_FAILED, ToolStatus.TOOL_FAILED, ToolStatus.UNKNOWN_TOOL]


async def test_tool_call_records_carry_the_status(tmp_path: Path) -> None:
    """Each call is written as a tool_call record with its status (and the error text when it failed)."""

    @loopwright.tool
    def picky() -> str:
        """Refuse."""
        raise ToolError("no")

    run, _, _ = await run_one_turn(tmp_path, [picky], call("picky", "p"), call("ghost", "g"))
    async with make_runtime(tmp_path, Harness(tools=[picky])) as rt:
        records = records_of(await rt.records(run.instance_id), "tool_call")
    by_id = {r["toolCallId"]: r for r in records}
    p, g = runtime_id(run.inst.transcript, "p"), runtime_id(run.inst.transcript, "g")
    assert by_id[p]["status"] == "tool_error"
    assert by_id[p]["error"] == "no"
    assert by_id[g]["status"] == "unknown_tool"


async def test_duplicate_or_missing_call_ids_are_made_unique(tmp_path: Path) -> None:
    """Calls with a repeated or empty id get unique ids, so each has exactly one result."""
    log: list[object] = []
    note = make_note_tool(log)
    calls = [loopwright.ToolCall(id="same", name="note", arguments={"x": 1}),
             loopwright.ToolCall(id="same", name="note", arguments={"x": 2}),
             loopwright.ToolCall(id="", name="note", arguments={"x": 3})]
    run, _, _ = await run_one_turn(tmp_path, [note], *calls)
    assistant = next(m for m in run.inst.transcript if m.role == "assistant")
    ids = [c.id for c in assistant.tool_calls]
    assert len(set(ids)) == 3
    assert all(RUNTIME_ID.match(cid) for cid in ids)
    # The first "same" keeps its id on the wire; the repeat and the empty one send the runtime's id.
    wire = [c.provider_id for c in assistant.tool_calls]
    assert wire == ["same", ids[1], ids[2]]
    assert len(set(wire)) == 3
    assert sorted(log) == [1, 2, 3]
    for cid, wid in zip(ids, wire, strict=True):
        (answer,) = [m for m in run.inst.transcript if m.role == "tool" and m.tool_call_id == cid]
        assert answer.status is ToolStatus.SUCCESS
        assert result_for(run.inst.transcript, wid) == answer


# ------------------------------------------------------------------------------------------
# Limits (counted per run segment; an approval continues the segment)
# ------------------------------------------------------------------------------------------


async def test_tool_call_limit_gives_limit_exceeded_tool_calls(tmp_path: Path) -> None:
    """Going past Limits.tool_calls skips the extra calls and ends limit_exceeded with limit toolCalls."""
    log: list[object] = []
    note = make_note_tool(log)
    h = Harness(reply(None, call("note", "a", x=1), call("note", "b", x=2)),
                reply(None, call("note", "c", x=3), call("note", "d", x=4)), reply("unreached"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note], limits=Limits(tool_calls=3)))
        assert (result.state, result.stop_reason, result.limit) == (
            State.ERROR, StopReason.LIMIT_EXCEEDED, "toolCalls")
        assert sorted(log) == [1, 2, 3]
        assert result_for(run.inst.transcript, "d").status is ToolStatus.SKIPPED
        assert await run.result() == result
        assert len(h.requests) == 2


async def test_token_limit_is_checked_before_each_model_call(tmp_path: Path) -> None:
    """Once the segment's tokens reach Limits.tokens the next model call is refused with limit tokens."""
    note = make_note_tool([])
    usage = Usage(input_tokens=2, output_tokens=1, total_tokens=3)
    h = Harness(*(reply(None, call("note", x=i), usage=usage) for i in range(5)), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[note], limits=Limits(tokens=5)))
        assert (result.state, result.stop_reason, result.limit) == (State.ERROR, StopReason.LIMIT_EXCEEDED, "tokens")
        assert len(h.requests) == 2
        assert result.usage.input_tokens + result.usage.output_tokens == 6


async def test_cost_limit_with_a_priced_provider(tmp_path: Path) -> None:
    """With a price from the assembly's overrides, reaching Limits.cost ends limit_exceeded with limit cost."""
    note = make_note_tool([])
    usage = Usage(input_tokens=1, output_tokens=0, total_tokens=1)
    h = Harness(*(reply(None, call("note", x=i), usage=usage) for i in range(5)), tools=[note], priced=True)
    pricing = {"s:m": {"input": 1_000_000.0, "output": 0.0}}
    async with make_runtime(tmp_path, h, pricing=pricing) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[note], limits=Limits(cost=1.5)))
        assert (result.state, result.stop_reason, result.limit) == (State.ERROR, StopReason.LIMIT_EXCEEDED, "cost")
        assert len(h.requests) == 2
        assert result.cost.amount == pytest.approx(2.0)


async def test_cost_limit_with_an_unknown_price_fails_closed(tmp_path: Path) -> None:
    """A cost limit on a model whose price is unknown stops the run rather than spending blindly."""
    note = make_note_tool([])
    h = Harness(*(reply(None, call("note", x=i)) for i in range(3)), tools=[note], priced=True)
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[note], limits=Limits(cost=100.0)))
        assert (result.stop_reason, result.limit) == (StopReason.LIMIT_EXCEEDED, "cost")
        assert result.cost.amount is None
        assert len(h.requests) == 1


async def test_elapsed_limit(tmp_path: Path) -> None:
    """Once a segment has run for Limits.elapsed seconds the next model call is refused with limit elapsed."""

    @loopwright.tool
    async def slow() -> str:
        """Take a while."""
        await anyio.sleep(0.15)
        return "ok"

    h = Harness(*(reply(None, call("slow")) for _ in range(3)), tools=[slow])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(tools=[slow], limits=Limits(elapsed=0.1)))
        assert (result.state, result.stop_reason, result.limit) == (State.ERROR, StopReason.LIMIT_EXCEEDED, "elapsed")
        assert len(h.requests) == 1


async def test_elapsed_limit_ends_a_model_call_in_progress(tmp_path: Path) -> None:
    """A model call still running when Limits.elapsed runs out is cut off: the segment ends limit elapsed."""

    async def never(request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        del request
        await anyio.sleep_forever()
        raise AssertionError  # never reached

    h = Harness(never)
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, defn(limits=Limits(elapsed=0.2)))
        assert (result.state, result.stop_reason, result.limit) == (State.ERROR, StopReason.LIMIT_EXCEEDED, "elapsed")
        assert len(h.requests) == 1


async def test_a_sync_tool_that_times_out_is_left_on_a_daemon_thread(tmp_path: Path) -> None:
    """A plain tool past its timeout gets ``timeout``; its abandoned thread is a daemon (it keeps no process alive)."""
    release = threading.Event()
    seen: list[threading.Thread] = []

    @loopwright.tool(timeout=0.1)
    def stuck() -> str:
        """Block until released."""
        seen.append(threading.current_thread())
        release.wait(30)
        return "released"

    h = Harness(reply(None, call("stuck")), reply("done"), tools=[stuck])
    try:
        async with make_runtime(tmp_path, h) as rt:
            run, result = await run_to_rest(rt, defn(tools=[stuck]))
            assert result.text == "done"
            assert [m.status for m in run.inst.transcript if m.role == "tool"] == [ToolStatus.TIMEOUT]
            assert len(seen) == 1
            assert seen[0].daemon
            assert seen[0].is_alive()
    finally:
        release.set()


async def test_assembly_limits_apply_and_the_definition_overrides_them(tmp_path: Path) -> None:
    """The assembly's limits apply to every definition; a definition's own limit wins."""
    note = make_note_tool([])
    h = Harness(*(reply(None, call("note", x=i)) for i in range(6)), tools=[note])
    async with make_runtime(tmp_path, h, limits=Limits(max_iterations=1)) as rt:
        _, result = await run_to_rest(rt, defn(tools=[note]))
        assert (result.stop_reason, result.error) == (StopReason.MAX_ITERATIONS, "max iterations (1) reached")
        _, result = await run_to_rest(rt, defn(tools=[note], limits=Limits(max_iterations=3)))
        assert result.error == "max iterations (3) reached"


async def test_a_message_starts_a_new_segment_and_counts_restart(tmp_path: Path) -> None:
    """Limits count per run segment: after a message the counters start again at zero."""
    note = make_note_tool([])
    h = Harness(reply(None, call("note", x=1)), reply("first"), reply(None, call("note", x=2)), reply("second"),
                tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note], max_iterations=2, limits=Limits(tool_calls=1)))
        assert (result.state, result.text) == (State.WAITING, "first")
        await run.message("again")
        result = await run.result()
        assert (result.state, result.text) == (State.WAITING, "second")
        assert run.inst.seg_iterations == 2
        assert run.inst.seg_tool_calls == 1


async def test_an_approval_continues_the_same_segment(tmp_path: Path) -> None:
    """An approval continues the segment it paused, so its counts carry on rather than restart."""
    note = make_note_tool([])

    @loopwright.tool(requires_approval=True)
    def gated() -> str:
        """Needs a yes."""
        return "ran"

    h = Harness(reply(None, call("gated", "g")), reply(None, call("note", x=1)), reply(None, call("note", x=2)),
                reply("unreached"), tools=[note, gated])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note, gated], max_iterations=2))
        assert result.state is State.WAITING_FOR_APPROVAL
        await run.approve()
        result = await run.result()
        assert (result.stop_reason, result.error) == (StopReason.MAX_ITERATIONS, "max iterations (2) reached")
        assert len(h.requests) == 2
        assert result_for(run.inst.transcript, "g").content == "ran"


async def test_segment_counts_survive_a_restart_across_an_approval(tmp_path: Path) -> None:
    """An approval given in a new runtime continues the saved segment's counts (rebuilt from the log)."""
    note = make_note_tool([])

    @loopwright.tool(requires_approval=True)
    def gated() -> str:
        """Needs a yes."""
        return "ran"

    definition = defn(tools=[note, gated], max_iterations=2)
    h = Harness(reply(None, call("gated", "g")), tools=[note, gated])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, definition)
        iid = run.instance_id
    h2 = Harness(reply(None, call("note", x=1)), reply(None, call("note", x=2)), reply("unreached"),
                 tools=[note, gated])
    async with make_runtime(tmp_path, h2) as rt2:
        run = await rt2.approve(iid)
        result = await run.result()
        assert result.stop_reason is StopReason.MAX_ITERATIONS
        assert len(h2.requests) == 1


async def test_approved_calls_respect_the_tool_call_limit(tmp_path: Path) -> None:
    """Approving held calls cannot take a segment past Limits.tool_calls."""
    ran: list[str] = []

    @loopwright.tool(requires_approval=True)
    def gated(name: str) -> str:
        """Needs a yes."""
        ran.append(name)
        return "ran"

    h = Harness(reply(None, call("gated", "a", name="a"), call("gated", "b", name="b")), reply("unreached"),
                tools=[gated])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[gated], limits=Limits(tool_calls=1)))
        await run.approve()
        result = await run.result()
        assert ran == ["a"]
        assert result_for(run.inst.transcript, "b").status is ToolStatus.SKIPPED
        assert (result.stop_reason, result.limit) == (StopReason.LIMIT_EXCEEDED, "toolCalls")


# ------------------------------------------------------------------------------------------
# Prompts and initial tool calls (seed 000, "The loop", step 1)
# ------------------------------------------------------------------------------------------


async def test_system_prompt_and_initial_prompts_are_templated_from_inputs(tmp_path: Path) -> None:
    """systemPrompt and initialPrompts render {{ name }} from inputs and come before the task prompt."""
    h = Harness(reply("hi"))
    definition = defn(
        system_prompt="You help {{ name }}.",
        inputs={"name": InputSpec(type="string"), "n": InputSpec(type="integer", default=3, required=False)},
        initial_prompts=(InitialPrompt(role="user", content="Hello {{name}}, count to {{ n }}."),),
    )
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, definition, "the task", {"name": "Ada"})
        sent = h.sent[0]
        assert [(m.role, m.content) for m in sent] == [
            ("system", "You help Ada."), ("user", "Hello Ada, count to 3."), ("user", "the task")]
        assert sent[1].injected
        assert not sent[2].injected


async def test_missing_required_input_fails_the_start(tmp_path: Path) -> None:
    """Starting without a required input raises ConfigError naming it, and creates nothing."""
    h = Harness(reply("hi"))
    definition = defn(system_prompt="You help {{ name }}.", inputs={"name": InputSpec(type="string")})
    async with make_runtime(tmp_path, h) as rt:
        with pytest.raises(loopwright.errors.ConfigError, match="name"):
            await rt.start_agent(definition, {}, "go")
        assert await rt.list_instances() == []


async def test_initial_tool_calls_run_first_and_are_marked_injected(tmp_path: Path) -> None:
    """initialPrompts toolCalls run before the model speaks, templated, and their records say injected."""
    log: list[object] = []

    @loopwright.tool
    def lookup(key: str) -> str:
        """Look something up."""
        log.append(key)
        return f"value of {key}"

    h = Harness(reply("thanks"), tools=[lookup])
    definition = defn(
        tools=[lookup], inputs={"key": InputSpec(type="string")},
        initial_prompts=(InitialPrompt(role="assistant", tool_calls=(
            InitialToolCall(name="lookup", arguments={"key": "k-{{ key }}"}, id="i1"),)),),
    )
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, definition, "the task", {"key": "abc"})
        assert log == ["k-abc"]
        sent = h.sent[0]
        assert [m.role for m in sent] == ["assistant", "tool", "user"]
        assert sent[0].tool_calls[0].injected
        assert (sent[1].content, sent[1].status, sent[1].injected) == ("value of k-abc", ToolStatus.SUCCESS, True)
        assert sent[2].content == "the task"
        (record,) = records_of(await rt.records(run.instance_id), "tool_call")
        assert record["injected"] is True
        assert record["toolCallId"] == "i1"
        assert result.text == "thanks"


async def test_whole_placeholder_argument_keeps_the_inputs_json_type(tmp_path: Path) -> None:
    """An initial tool-call argument that is exactly one placeholder takes the input's value with its JSON type."""
    log: list[object] = []

    @loopwright.tool
    def count(n: int, tags: list[str]) -> str:
        """Count."""
        log.append((n, tags))
        return "ok"

    h = Harness(reply("thanks"), tools=[count])
    definition = defn(
        tools=[count], inputs={"n": InputSpec(type="integer"), "tags": InputSpec(type="array")},
        initial_prompts=(InitialPrompt(role="assistant", tool_calls=(
            InitialToolCall(name="count", arguments={"n": "{{ n }}", "tags": "{{tags}}"}, id="i1"),)),),
    )
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, definition, "the task", {"n": 4, "tags": ["a", "b"]})
        assert result_for(run.inst.transcript, "i1").status is ToolStatus.SUCCESS
        assert log == [(4, ["a", "b"])]


async def test_injected_call_needing_approval_holds_and_queues_the_task_prompt(tmp_path: Path) -> None:
    """An injected call needing approval waits; the task prompt comes after the held turn; later prompts never run."""

    @loopwright.tool(requires_approval=True)
    def setup(path: str) -> str:
        """Prepare."""
        return f"prepared {path}"

    h = Harness(reply("working"), tools=[setup])
    definition = defn(tools=[setup], initial_prompts=(
        InitialPrompt(role="assistant", tool_calls=(InitialToolCall(name="setup", arguments={"path": "/w"},
                                                                    id="i1"),)),
        InitialPrompt(role="user", content="SHOULD NOT RUN"),
    ))
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, definition, "the task")
        assert result.state is State.WAITING_FOR_APPROVAL
        assert [p.tool_call_id for p in result.pending_approvals] == ["i1"]
        assert h.requests == []
        assert not [m for m in run.inst.transcript if m.content == "the task"]
        await run.approve()
        result = await run.result()
        assert (result.state, result.text) == (State.WAITING, "working")
        sent = h.sent[0]
        assert [(m.role, m.content) for m in sent] == [
            ("assistant", None), ("tool", "prepared /w"), ("user", "the task")]
        assert all(m.content != "SHOULD NOT RUN" for m in run.inst.transcript)


async def test_injected_ask_user_waits_and_the_task_prompt_follows_the_answer(tmp_path: Path) -> None:
    """An injected ask_user leaves the instance waiting; the answer is its result and the task prompt follows it."""
    h = Harness(reply("got it"))
    definition = defn(tools=["ask_user"], initial_prompts=(
        InitialPrompt(role="assistant", tool_calls=(
            InitialToolCall(name="ask_user", arguments={"question": "Who are you?"}, id="q"),)),
        InitialPrompt(role="user", content="SHOULD NOT RUN"),
    ))
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, definition, "the task")
        assert (result.state, result.stop_reason) == (State.WAITING, StopReason.WAITING)
        assert h.requests == []
        await run.message("Ada")
        result = await run.result()
        assert result.text == "got it"
        sent = h.sent[0]
        assert [(m.role, m.content) for m in sent] == [("assistant", None), ("tool", "Ada"), ("user", "the task")]
        assert sent[1].tool_call_id == "q"


# ------------------------------------------------------------------------------------------
# More endings: content filter, completion gate, mixed waits
# ------------------------------------------------------------------------------------------


async def test_content_filter_stops_the_run(tmp_path: Path) -> None:
    """A refusal by the provider's safety filter ends the run stopped with stop reason content_filter."""
    h = Harness(reply(None, finish_reason="content_filter"))
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn())
        assert (result.state, result.stop_reason) == (State.STOPPED, StopReason.CONTENT_FILTER)
        assert await run.result() == result


def todo(plan: str) -> loopwright.ToolCall:
    """A todowrite call; ``plan`` has one character per item: ``x`` completed, ``-`` open."""
    return call("todowrite", todos=[{"id": str(i), "text": f"item {i}", "completed": c == "x"}
                                    for i, c in enumerate(plan)])


async def test_completion_gate_reprompts_with_the_reason_until_it_passes(tmp_path: Path) -> None:
    """A failing completion check feeds its reason back as the next prompt; a passing one lets the run rest."""
    h = Harness(reply(None, todo("x-")), reply("I am finished"), reply(None, todo("xx")),
                reply("all done"))
    definition = defn(tools=["todowrite"], completion=loopwright.Completion(verify="allTodosDone", max_attempts=3))
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, definition)
        assert (result.state, result.text) == (State.WAITING, "all done")
        reprompt = h.sent[2][-1]
        assert (reprompt.role, reprompt.source) == ("user", "runtime")
        assert "item 1" in (reprompt.content or "")
        checks = records_of(await rt.records(run.instance_id), "completion")
        assert [c["ok"] for c in checks] == [False, True]


async def test_completion_gate_gives_up_after_max_attempts(tmp_path: Path) -> None:
    """Exhausting completion.maxAttempts ends the run limit_exceeded with limit completion and the reason."""
    h = Harness(reply(None, todo("-")), reply("done?"), reply("done!"), reply("unreached"))
    definition = defn(tools=["todowrite"], completion=loopwright.Completion(verify="allTodosDone", max_attempts=2))
    async with make_runtime(tmp_path, h) as rt:
        _, result = await run_to_rest(rt, definition)
        assert (result.state, result.stop_reason, result.limit) == (
            State.ERROR, StopReason.LIMIT_EXCEEDED, "completion")
        assert "item 0" in (result.error or "")
        assert len(h.requests) == 3


async def test_completion_gate_also_checks_task_complete(tmp_path: Path) -> None:
    """task_complete does not end the run while the completion check fails; it is re-prompted instead."""
    h = Harness(reply(None, todo("-"), call("task_complete", result="r", summary="s")),
                reply(None, todo("x"), call("task_complete", result="r2", summary="s2")))
    definition = defn(tools=["todowrite", "task_complete"],
                      completion=loopwright.Completion(verify="allTodosDone", max_attempts=3))
    async with make_runtime(tmp_path, h) as rt:
        _, result = await run_to_rest(rt, definition)
        assert (result.state, result.stop_reason, result.text) == (State.STOPPED, StopReason.COMPLETED, "r2")
        assert len(h.requests) == 2


@pytest.mark.parametrize("source", ["api", "user"])
async def test_user_sourced_message_answers_ask_user(tmp_path: Path, source: str) -> None:
    """Messages from the person (source user) or host (source api) both answer a pending ask_user."""
    h = Harness(reply(None, call("ask_user", "q", question="?")), reply("ok"))
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=["ask_user"]))
        await run.message("the answer", source=source)
        await run.result()
        assert result_for(run.inst.transcript, "q").content == "the answer"


async def test_ask_user_in_a_held_turn_still_waits_after_the_approval(tmp_path: Path) -> None:
    """A turn with ask_user and a held call waits for approval, then (once approved) waits for the answer."""

    @loopwright.tool(requires_approval=True)
    def gated() -> str:
        """Needs a yes."""
        return "ran"

    h = Harness(reply(None, call("ask_user", "q", question="?"), call("gated", "g")), reply("should not be asked"),
                tools=[gated])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=["ask_user", gated]))
        assert result.state is State.WAITING_FOR_APPROVAL
        await run.approve()
        result = await run.result()
        assert (result.state, result.stop_reason) == (State.WAITING, StopReason.WAITING)
        assert len(h.requests) == 1
        await run.message("the answer")
        await run.result()
        assert result_for(run.inst.transcript, "q").content == "the answer"
        for sent in h.sent:
            answered = {m.tool_call_id for m in sent if m.role == "tool"}
            asked = {c.id for m in sent if m.role == "assistant" for c in m.tool_calls}
            assert asked <= answered


async def test_every_call_of_every_request_has_a_result(tmp_path: Path) -> None:
    """Whatever happened to the calls (errors, approvals, denials, skips), each request the model gets is valid."""

    @loopwright.tool(requires_approval=True)
    def gated() -> str:
        """Needs a yes."""
        return "ran"

    @loopwright.tool
    def bad() -> str:
        """Fail."""
        raise ValueError("x")

    h = Harness(reply(None, call("gated", "g1"), call("bad"), call("ghost"), raw_call("bad", "{")),
                reply(None, call("gated", "g2"), call("gated", "g3")), reply("end"), tools=[gated, bad])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[gated, bad]))
        await run.approve()
        await run.wait()
        await run.deny(runtime_id(run.inst.transcript, "g2"), reason="no")
        await run.approve(runtime_id(run.inst.transcript, "g3"))
        result = await run.result()
        assert result.text == "end"
    for sent in h.sent:
        answered = [m.tool_call_id for m in sent if m.role == "tool"]
        asked = [c.id for m in sent if m.role == "assistant" for c in m.tool_calls]
        assert sorted(answered) == sorted(asked)
        assert len(set(answered)) == len(answered)
        # What goes on the wire pairs up too: the provider's ids of calls and results.
        answered_wire = [m.provider_call_id for m in sent if m.role == "tool"]
        asked_wire = [c.provider_id for m in sent if m.role == "assistant" for c in m.tool_calls]
        assert sorted(answered_wire) == sorted(asked_wire)
        assert len(set(answered_wire)) == len(answered_wire)


async def test_results_stay_in_call_order_after_an_approval(tmp_path: Path) -> None:
    """A held call's result takes its place in call order, live and after a restart alike."""
    note = make_note_tool([])

    @loopwright.tool(requires_approval=True)
    def gated() -> str:
        """Needs a yes."""
        return "ran"

    h = Harness(reply(None, call("note", "n1", x=1), call("gated", "g"), call("note", "n2", x=2)), reply("end"),
                tools=[note, gated])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[note, gated]))
        await run.approve()
        await run.result()
        live = [m.tool_call_id for m in run.inst.transcript if m.role == "tool"]
        order = [runtime_id(run.inst.transcript, cid) for cid in ("n1", "g", "n2")]
    async with make_runtime(tmp_path, Harness(tools=[note, gated])) as rt2:
        again = await rt2.get_agent(run.instance_id)
        reloaded = [m.tool_call_id for m in again.inst.transcript if m.role == "tool"]
        reloaded_wire = [m.provider_call_id for m in again.inst.transcript if m.role == "tool"]
    assert reloaded == order
    assert reloaded_wire == ["n1", "g", "n2"]
    assert live == reloaded
    assert [m.tool_call_id for m in h.sent[-1] if m.role == "tool"] == order
    assert [m.provider_call_id for m in h.sent[-1] if m.role == "tool"] == ["n1", "g", "n2"]


async def test_tool_call_count_is_the_same_after_a_restart(tmp_path: Path) -> None:
    """An approval given after a restart continues the segment with the same tool-call count as live."""
    log: list[object] = []
    note = make_note_tool(log)

    @loopwright.tool(requires_approval=True)
    def gated() -> str:
        """Needs a yes."""
        return "ran"

    definition = defn(tools=[note, gated], limits=Limits(tool_calls=2))

    def script() -> list[object]:
        return [reply(None, call("ghost", "x"), call("gated", "g")), reply(None, call("note", "n", x=1)),
                reply("done")]

    async with make_runtime(tmp_path, Harness(*script(), tools=[note, gated]), store_dir="live") as rt:
        run, _ = await run_to_rest(rt, definition)
        await run.approve()
        live = await run.result()
    assert (live.state, live.text) == (State.WAITING, "done")
    h = Harness(*script(), tools=[note, gated])
    async with make_runtime(tmp_path, h, store_dir="restarted") as rt:
        run, _ = await run_to_rest(rt, definition)
        iid = run.instance_id
    h.replies = script()[1:]
    async with make_runtime(tmp_path, h, store_dir="restarted") as rt2:
        run2 = await rt2.approve(iid)
        restarted = await run2.result()
    assert (restarted.state, restarted.text) == (live.state, live.text)


# ------------------------------------------------------------------------------------------
# Structured output (definition ``output``; seed 002, "How a run ends")
# ------------------------------------------------------------------------------------------

OUTPUT_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                 "additionalProperties": False}

async def test_output_schema_reaches_the_provider(tmp_path: Path) -> None:
    """A definition's output schema is sent with every model request."""
    h = Harness(reply('{"n": 3}'))
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, defn(output=OUTPUT_SCHEMA))
        assert h.requests[0].output_schema == OUTPUT_SCHEMA


async def test_structured_output_is_parsed_into_the_result(tmp_path: Path) -> None:
    """An answer matching the definition's output schema is parsed into AgentResult.output."""
    h = Harness(reply('{"n": 3}'))
    async with make_runtime(tmp_path, h) as rt:
        _, result = await run_to_rest(rt, defn(output=OUTPUT_SCHEMA))
        assert result.output == {"n": 3}


async def test_invalid_structured_output_ends_output_invalid(tmp_path: Path) -> None:
    """Answers that keep failing the output schema are re-prompted, then end the run with output_invalid."""
    h = Harness(reply("not json"), reply('{"n": "three"}'), reply('{"m": 1}'), reply("unreached"))
    async with make_runtime(tmp_path, h) as rt:
        _, result = await run_to_rest(rt, defn(output=OUTPUT_SCHEMA))
        assert result.stop_reason is StopReason.OUTPUT_INVALID
        assert result.output is None
        assert len(h.requests) <= 3
