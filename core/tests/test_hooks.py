"""Hooks and plugins: order, decisions, failure rules, hook records, and the plugin manager's rules."""

# Hook implementations declare the arguments they take by name, so some go unused: ARG002/ARG005.
# ruff: noqa: ARG005

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from helpers import Harness, call, defn, make_runtime, records_of, reply, result_for, run_to_rest, runtime_id

import loopwright
from loopwright import (
    Block,
    Message,
    ModifyInputs,
    ModifyMessage,
    ModifyRequest,
    ModifyResult,
    RequireApproval,
    Respond,
    State,
    StopReason,
    ToolStatus,
    _plugins,
    hookimpl,
)
from loopwright._definition import PluginSpec
from loopwright._engine import _journal
from loopwright._hooks import intercept
from loopwright.errors import HookBlockedError, PluginError, RegistrationError

pytestmark = pytest.mark.anyio


def make_add() -> loopwright.Tool:
    @loopwright.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return add


async def hook_records(rt: loopwright.Runtime, run: loopwright.AgentRun) -> list[Any]:
    return records_of(await rt.records(run.instance_id), "hook")


# ------------------------------------------------------------------------------------------
# Order and chaining
# ------------------------------------------------------------------------------------------


class Recorder:
    """A before_tool_call hook that notes its name and returns a fixed decision."""

    def __init__(self, name: str, log: list[str], decision: Any = None) -> None:
        self.name = name
        self.log = log
        self.decision = decision

    @hookimpl
    def loopwright_before_tool_call(self, call: loopwright.ToolCall) -> Any:
        self.log.append(self.name)
        return self.decision


class AsyncRecorder(Recorder):
    """The same, as an ``async def`` implementation."""

    @hookimpl
    async def loopwright_before_tool_call(self, call: loopwright.ToolCall) -> Any:
        self.log.append(self.name)
        return self.decision


async def test_hooks_run_in_registration_order(tmp_path: Path) -> None:
    """Hook implementations run in the order their plugins were registered, async ones awaited in place."""
    log: list[str] = []
    add = make_add()
    plugins = [Recorder("first", log), AsyncRecorder("second", log), Recorder("third", log)]
    h = Harness(reply(None, call("add", a=1, b=2)), reply("ok"), tools=[add])
    async with make_runtime(tmp_path, h, *plugins) as rt:
        late = AsyncRecorder("late", log)
        rt.register_plugin(late)
        await run_to_rest(rt, defn(tools=[add]))
    assert log == ["first", "second", "third", "late"]


async def test_modify_request_chains_into_the_next_hook(tmp_path: Path) -> None:
    """A ModifyRequest passes its change on: the second hook sees the first's request, the model gets both."""
    seen: list[Any] = []

    class First:
        @hookimpl
        def loopwright_before_inference(self, request: loopwright.ModelRequest) -> Any:
            return ModifyRequest(attrs.evolve(request, settings={**request.settings, "temperature": 0.1}))

    class Second:
        @hookimpl
        async def loopwright_before_inference(self, request: loopwright.ModelRequest) -> Any:
            seen.append(dict(request.settings))
            return ModifyRequest(attrs.evolve(request, settings={**request.settings, "seed": 7}))

    h = Harness(reply("ok"))
    async with make_runtime(tmp_path, h, First(), Second()) as rt:
        run, _ = await run_to_rest(rt, defn())
        assert seen == [{"temperature": 0.1}]
        assert dict(h.requests[0].settings) == {"temperature": 0.1, "seed": 7}
        decisions = [(r["hook"], r["decision"]) for r in await hook_records(rt, run)]
        assert decisions == [("before_inference", "ModifyRequest")] * 2


@pytest.mark.parametrize("decision", [Block("stop"), Respond("canned"), RequireApproval("check")],
                         ids=["Block", "Respond", "RequireApproval"])
async def test_first_stopping_decision_ends_the_walk(tmp_path: Path, decision: Any) -> None:
    """The first Block, Respond or RequireApproval stops the walk: later hooks are not called."""
    log: list[str] = []
    add = make_add()
    plugins = [Recorder("a", log), Recorder("b", log, decision), Recorder("c", log)]
    h = Harness(reply(None, call("add", a=1, b=2)), reply("ok"), tools=[add])
    async with make_runtime(tmp_path, h, *plugins) as rt:
        await run_to_rest(rt, defn(tools=[add]))
    assert log == ["a", "b"]


# ------------------------------------------------------------------------------------------
# before_inference / after_inference
# ------------------------------------------------------------------------------------------


async def test_before_inference_block_fails_the_run_with_hook_blocked_error(tmp_path: Path) -> None:
    """A before_inference Block ends the run in error and result() raises HookBlockedError with the reason."""

    class Gate:
        @hookimpl
        def loopwright_before_inference(self) -> Any:
            return Block("over budget")

    h = Harness(reply("never"))
    async with make_runtime(tmp_path, h, Gate()) as rt:
        run = await rt.start_agent(defn(), None, "go")
        with pytest.raises(HookBlockedError) as info:
            await run.result()
        assert info.value.reason == "over budget"
        assert "Gate" in info.value.hook
        assert run.state is State.ERROR
        assert h.requests == []
        (record,) = await hook_records(rt, run)
        assert (record["hook"], record["decision"], record["reason"]) == ("before_inference", "Block", "over budget")


async def test_before_inference_respond_answers_without_the_model(tmp_path: Path) -> None:
    """A before_inference Respond becomes the assistant's answer and the model is not called."""

    class Cache:
        @hookimpl
        def loopwright_before_inference(self, turn: int) -> Any:
            return Respond(f"cached answer for turn {turn}")

    h = Harness()
    async with make_runtime(tmp_path, h, Cache()) as rt:
        run, result = await run_to_rest(rt, defn())
        assert h.requests == []
        assert (result.state, result.text) == (State.WAITING, "cached answer for turn 1")
        assert run.inst.transcript[-1].role == "assistant"


async def test_after_inference_modify_message_changes_the_transcript(tmp_path: Path) -> None:
    """An after_inference ModifyMessage replaces the answer the transcript keeps and the loop acts on."""

    class Redact:
        @hookimpl
        def loopwright_after_inference(self, response: loopwright.ModelResponse) -> Any:
            text = (response.message.content or "").replace("secret", "[redacted]")
            return ModifyMessage(attrs.evolve(response.message, content=text))

    h = Harness(reply("the secret is 42"))
    async with make_runtime(tmp_path, h, Redact()) as rt:
        run, result = await run_to_rest(rt, defn())
        assert result.text == "the [redacted] is 42"
        assert run.inst.transcript[-1].content == "the [redacted] is 42"
    async with make_runtime(tmp_path, Harness()) as rt2:
        again = await rt2.get_agent(run.instance_id)
        assert again.inst.transcript[-1].content == "the [redacted] is 42"


async def test_after_inference_modify_message_can_add_tool_calls(tmp_path: Path) -> None:
    """Tool calls a ModifyMessage puts in the answer are the ones that run."""
    add = make_add()

    class Inject:
        @hookimpl
        def loopwright_after_inference(self, response: loopwright.ModelResponse, turn: int) -> Any:
            if turn == 1:
                return ModifyMessage(Message(role="assistant", tool_calls=(call("add", "x", a=2, b=3),)))
            return None

    h = Harness(reply("plain"), reply("done"), tools=[add])
    async with make_runtime(tmp_path, h, Inject()) as rt:
        run, result = await run_to_rest(rt, defn(tools=[add]))
        assert result_for(run.inst.transcript, "x").content == "5"
        assert result.text == "done"


async def test_after_inference_block_fails_the_run(tmp_path: Path) -> None:
    """An after_inference Block drops the answer and fails the run with HookBlockedError."""

    class Filter:
        @hookimpl
        def loopwright_after_inference(self) -> Any:
            return Block("unsafe answer")

    h = Harness(reply("bad words"))
    async with make_runtime(tmp_path, h, Filter()) as rt:
        run = await rt.start_agent(defn(), None, "go")
        with pytest.raises(HookBlockedError, match="unsafe answer"):
            await run.result()


# ------------------------------------------------------------------------------------------
# before_tool_call / after_tool_call
# ------------------------------------------------------------------------------------------


class ToolHook:
    """before_tool_call returning a decision computed from the call."""

    def __init__(self, decide: Any) -> None:
        self.decide = decide

    @hookimpl
    def loopwright_before_tool_call(self, call: loopwright.ToolCall, tool: loopwright.Tool) -> Any:
        return self.decide(call, tool)


async def one_add_turn(tmp_path: Path, *plugins: object, arguments: dict[str, Any] | None = None,
                       ) -> tuple[loopwright.AgentRun, loopwright.AgentResult, list[Any], list[int]]:
    ran: list[int] = []

    @loopwright.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append(a + b)
        return a + b

    h = Harness(reply(None, call("add", "c", **(arguments or {"a": 1, "b": 2}))), reply("ok"), tools=[add])
    async with make_runtime(tmp_path, h, *plugins) as rt:
        run, result = await run_to_rest(rt, defn(tools=[add]))
        records = await hook_records(rt, run)
    return run, result, records, ran


async def test_before_tool_call_modify_inputs_changes_the_arguments(tmp_path: Path) -> None:
    """ModifyInputs replaces the arguments the tool runs with."""
    run, _, records, ran = await one_add_turn(tmp_path, ToolHook(lambda c, t: ModifyInputs({"a": 10, "b": 20})))
    assert ran == [30]
    assert result_for(run.inst.transcript, "c").content == "30"
    assert records[0]["decision"] == "ModifyInputs"


async def test_before_tool_call_modify_inputs_is_validated_again(tmp_path: Path) -> None:
    """Arguments from ModifyInputs are validated again; invalid ones give invalid_arguments, the tool does not run."""
    run, result, _, ran = await one_add_turn(tmp_path, ToolHook(lambda c, t: ModifyInputs({"a": "ten"})))
    r = result_for(run.inst.transcript, "c")
    assert r.status is ToolStatus.INVALID_ARGUMENTS
    assert "b: required" in r.content
    assert ran == []
    assert result.state is State.WAITING


async def test_before_tool_call_block_gives_a_blocked_result_with_the_reason(tmp_path: Path) -> None:
    """Block in before_tool_call gives the model a blocked result with the reason; the tool does not run."""
    run, result, records, ran = await one_add_turn(tmp_path, ToolHook(lambda c, t: Block("no adding today")))
    r = result_for(run.inst.transcript, "c")
    assert (r.status, ran) == (ToolStatus.BLOCKED, [])
    assert "no adding today" in r.content
    assert (records[0]["decision"], records[0]["reason"]) == ("Block", "no adding today")
    assert result.state is State.WAITING


async def test_before_tool_call_respond_gives_success_without_running_the_tool(tmp_path: Path) -> None:
    """Respond in before_tool_call becomes a success result and the tool does not run."""
    run, _, records, ran = await one_add_turn(tmp_path, ToolHook(lambda c, t: Respond({"sum": 99})))
    r = result_for(run.inst.transcript, "c")
    assert (r.status, ran) == (ToolStatus.SUCCESS, [])
    assert "99" in r.content
    assert records[0]["decision"] == "Respond"


async def test_before_tool_call_require_approval_holds_the_call(tmp_path: Path) -> None:
    """RequireApproval from a hook holds the call with the hook's reason, like a tool that requires approval."""
    run, result, records, ran = await one_add_turn(tmp_path, ToolHook(lambda *_: RequireApproval("big sum")))
    assert result.state is State.WAITING_FOR_APPROVAL
    (pending,) = result.pending_approvals
    assert (pending.tool_call_id, pending.reason) == (runtime_id(run.inst.transcript, "c"), "big sum")
    assert ran == []
    assert records[0]["decision"] == "RequireApproval"


async def test_guardrail_style_policy_sees_the_tool(tmp_path: Path) -> None:
    """A before_tool_call policy receives the Tool object and can decide by its name and arguments."""

    def policy(c: loopwright.ToolCall, t: loopwright.Tool) -> Any:
        assert t.name == "add"
        return Block("negative numbers are not allowed") if c.arguments.get("a", 0) < 0 else None

    run, _, _, ran = await one_add_turn(tmp_path, ToolHook(policy), arguments={"a": -1, "b": 2})
    assert ran == []
    assert result_for(run.inst.transcript, "c").status is ToolStatus.BLOCKED


async def test_after_tool_call_modify_result_changes_what_the_model_sees(tmp_path: Path) -> None:
    """ModifyResult in after_tool_call replaces the result text."""

    class Rewrite:
        @hookimpl
        def loopwright_after_tool_call(self, result: loopwright.ToolResult) -> Any:
            return ModifyResult(f"sum is {result.content}")

    run, _, records, ran = await one_add_turn(tmp_path, Rewrite())
    assert ran == [3]
    r = result_for(run.inst.transcript, "c")
    assert (r.status, r.content) == (ToolStatus.SUCCESS, "sum is 3")
    assert records[0]["hook"] == "after_tool_call"


async def test_after_tool_call_block_hides_the_output(tmp_path: Path) -> None:
    """Block in after_tool_call gives a blocked result instead of the tool's output."""

    class Hide:
        @hookimpl
        def loopwright_after_tool_call(self) -> Any:
            return Block("contains secrets")

    run, _, _, ran = await one_add_turn(tmp_path, Hide())
    assert ran == [3]
    r = result_for(run.inst.transcript, "c")
    assert r.status is ToolStatus.BLOCKED
    assert "contains secrets" in r.content
    assert "3" not in r.content.replace("contains secrets", "")


# ------------------------------------------------------------------------------------------
# before_compaction
# ------------------------------------------------------------------------------------------


async def compaction_run(tmp_path: Path, *plugins: object) -> tuple[loopwright.AgentRun, list[Any]]:
    add = make_add()
    h = Harness(reply(None, call("add", a=1, b=1)), reply(None, call("add", a=2, b=2)), reply("done"),
                tools=[add])
    definition = defn(tools=[add], context_strategy=PluginSpec(kind="clearToolResults", options={"keepLast": 1}))
    async with make_runtime(tmp_path, h, *plugins) as rt:
        run, _ = await run_to_rest(rt, definition)
        records = await rt.records(run.instance_id)
    return run, records


async def test_clear_tool_results_compacts_without_hooks(tmp_path: Path) -> None:
    """clearToolResults with keepLast 1 clears older tool results before the next model call."""
    run, records = await compaction_run(tmp_path)
    contents = [m.content for m in run.inst.transcript if m.role == "tool"]
    assert contents[0] != "2"
    assert contents[1] == "4"
    assert records_of(records, "compaction")


async def test_before_compaction_block_skips_compaction(tmp_path: Path) -> None:
    """A before_compaction Block skips the compaction and is written as a hook record."""

    class Keep:
        @hookimpl
        def loopwright_before_compaction(self, strategy: str) -> Any:
            assert strategy == "clearToolResults"
            return Block("keep everything")

    run, records = await compaction_run(tmp_path, Keep())
    assert [m.content for m in run.inst.transcript if m.role == "tool"] == ["2", "4"]
    assert not records_of(records, "compaction")
    assert records_of(records, "hook")[0]["hook"] == "before_compaction"


# ------------------------------------------------------------------------------------------
# Failure rules and records
# ------------------------------------------------------------------------------------------


async def test_raising_interceptor_fails_closed_and_is_recorded(tmp_path: Path) -> None:
    """An interceptor that raises blocks the step (the tool does not run) and the failure is recorded."""

    class Broken:
        @hookimpl
        def loopwright_before_tool_call(self) -> Any:
            raise RuntimeError("policy server down")

    run, result, records, ran = await one_add_turn(tmp_path, Broken())
    assert ran == []
    r = result_for(run.inst.transcript, "c")
    assert r.status is ToolStatus.BLOCKED
    assert "policy server down" in r.content
    (record,) = records
    assert record["decision"] == "Block"
    assert "RuntimeError: policy server down" in record["error"]
    assert result.state is State.WAITING


async def test_raising_before_inference_fails_the_run_closed(tmp_path: Path) -> None:
    """A before_inference hook that raises blocks the model call: the run fails rather than going on unchecked."""

    class Broken:
        @hookimpl
        async def loopwright_before_inference(self) -> Any:
            raise ValueError("cannot check")

    h = Harness(reply("never"))
    async with make_runtime(tmp_path, h, Broken()) as rt:
        run = await rt.start_agent(defn(), None, "go")
        with pytest.raises(HookBlockedError, match="cannot check"):
            await run.result()
        assert h.requests == []


async def test_raising_observer_fails_open_and_is_recorded(tmp_path: Path) -> None:
    """An observer that raises is recorded as observer_error and the run goes on."""

    class Flaky:
        @hookimpl
        def loopwright_on_message(self, message: Message) -> None:
            raise RuntimeError("log server down")

    add = make_add()
    h = Harness(reply(None, call("add", a=1, b=2)), reply("done"), tools=[add])
    async with make_runtime(tmp_path, h, Flaky()) as rt:
        run, result = await run_to_rest(rt, defn(tools=[add]))
        assert (result.state, result.text) == (State.WAITING, "done")
        errors = records_of(await rt.records(run.instance_id), "observer_error")
        assert errors
        assert "RuntimeError: log server down" in errors[0]["error"]
        assert "Flaky" in errors[0]["plugin"]


async def test_observers_see_messages_state_changes_and_costs(tmp_path: Path) -> None:
    """on_message, on_state_change and on_cost observe the run, async ones included."""
    seen: list[tuple[str, Any]] = []

    class Watch:
        @hookimpl
        def loopwright_on_message(self, message: Message) -> None:
            seen.append(("message", message.role))

        @hookimpl
        async def loopwright_on_state_change(self, old: str | None, new: str, stop_reason: str | None) -> None:
            seen.append(("state", (old, new, stop_reason)))

        @hookimpl
        def loopwright_on_cost(self, turn: int, cost: loopwright.Cost) -> None:
            seen.append(("cost", (turn, cost.amount)))

    async with make_runtime(tmp_path, Harness(reply("hi")), Watch()) as rt:
        await run_to_rest(rt, defn())
    assert ("message", "user") in seen
    assert ("message", "assistant") in seen
    assert ("cost", (1, 0.0)) in seen
    states = [v for k, v in seen if k == "state"]
    assert states[0] == (None, "running", None)
    assert states[-1] == ("running", "waiting", "waiting")


async def test_every_decision_is_written_as_a_hook_record(tmp_path: Path) -> None:
    """Modify, Block, Respond and RequireApproval decisions each leave a hook record with hook, plugin and turn."""

    class Many:
        @hookimpl
        def loopwright_before_tool_call(self, call: loopwright.ToolCall) -> Any:
            return {"m": ModifyInputs({"a": 5, "b": 5}), "b": Block("no"), "r": Respond("r"),
                    "q": RequireApproval("ask")}[call.provider_id]

    add = make_add()
    calls = [call("add", i, a=1, b=1) for i in ("m", "b", "r", "q")]
    h = Harness(reply(None, *calls), tools=[add])
    async with make_runtime(tmp_path, h, Many()) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[add]))
        records = await hook_records(rt, run)
    assert sorted(r["decision"] for r in records) == ["Block", "ModifyInputs", "RequireApproval", "Respond"]
    assert all(r["hook"] == "before_tool_call" and r["turn"] == 1 and "Many" in r["plugin"] for r in records)


async def test_continue_decisions_write_no_records(tmp_path: Path) -> None:
    """A hook returning None (Continue) leaves no hook record."""
    log: list[str] = []
    _, _, records, ran = await one_add_turn(tmp_path, Recorder("quiet", log))
    assert (log, ran, records) == (["quiet"], [3], [])


async def test_hooks_take_any_subset_of_arguments(tmp_path: Path) -> None:
    """Implementations may take any subset of the spec's arguments, none at all included, in any order."""
    got: dict[str, Any] = {}

    class NoArgs:
        @hookimpl
        def loopwright_before_tool_call(self) -> None:
            got["none"] = True

    class Some:
        @hookimpl
        def loopwright_before_tool_call(self, turn: int, call: loopwright.ToolCall) -> None:
            got["some"] = (turn, call.name)

    class All:
        @hookimpl
        def loopwright_before_tool_call(self, call: loopwright.ToolCall, tool: loopwright.Tool,
                                        instance: loopwright.InstanceInfo, turn: int) -> None:
            got["all"] = (tool.name, instance.name, instance.model, instance.depth)

    _, _, _, ran = await one_add_turn(tmp_path, NoArgs(), Some(), All())
    assert ran == [3]
    assert got == {"none": True, "some": (1, "add"), "all": ("add", "t", "s:m", 0)}


async def test_module_level_function_hooks(tmp_path: Path) -> None:
    """A plugin may be a module whose functions implement hooks."""
    log: list[str] = []
    module = type(sys)("loopwright_test_module_plugin")

    @hookimpl
    def loopwright_before_tool_call(call: loopwright.ToolCall) -> Any:
        log.append(call.name)

    module.loopwright_before_tool_call = loopwright_before_tool_call  # type: ignore[attr-defined]
    _, _, _, ran = await one_add_turn(tmp_path, module)
    assert (log, ran) == (["add"], [3])


async def test_decision_the_point_does_not_accept_fails_closed(tmp_path: Path) -> None:
    """A hook returning a decision its point does not accept is treated as a failure: the step is blocked."""

    class Wrong:
        @hookimpl
        def loopwright_after_tool_call(self) -> Any:
            return RequireApproval("after the fact")

    run, _, records, ran = await one_add_turn(tmp_path, Wrong())
    assert ran == [3]
    r = result_for(run.inst.transcript, "c")
    assert r.status is ToolStatus.BLOCKED
    assert "does not accept" in r.content
    assert records[0]["error"] == "invalid decision"


async def test_non_decision_return_value_fails_closed(tmp_path: Path) -> None:
    """A hook returning something that is not a decision at all (a string) blocks the step."""
    run, _, _, ran = await one_add_turn(tmp_path, ToolHook(lambda c, t: "allow"))
    assert ran == []
    assert result_for(run.inst.transcript, "c").status is ToolStatus.BLOCKED


async def test_wrong_decision_before_inference_fails_the_run(tmp_path: Path) -> None:
    """A before_inference hook returning ModifyInputs fails closed: the model call is blocked."""

    class Wrong:
        @hookimpl
        def loopwright_before_inference(self) -> Any:
            return ModifyInputs({})

    h = Harness(reply("never"))
    async with make_runtime(tmp_path, h, Wrong()) as rt:
        run = await rt.start_agent(defn(), None, "go")
        with pytest.raises(HookBlockedError):
            await run.result()
        assert h.requests == []


# ------------------------------------------------------------------------------------------
# The no-hooks proof
# ------------------------------------------------------------------------------------------


class _NoInstanceInfo:
    """Stands in for InstanceInfo: building one means the loop built a hook context."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the loop built an InstanceInfo")


async def multi_turn_run(tmp_path: Path, *plugins: object,
                         ) -> tuple[loopwright.AgentRun, loopwright.AgentResult]:
    add = make_add()
    h = Harness(reply(None, call("add", a=1, b=2), call("add", a=3, b=4)), reply(None, call("add", a=5, b=6)),
                reply(None, call("task_complete", result="11", summary="added")), tools=[add])
    async with make_runtime(tmp_path, h, *plugins) as rt:
        run = await rt.start_agent(defn(tools=[add, "task_complete"], system_prompt="add things"), None, "go")
        kinds = set()
        with anyio.fail_after(10):
            async for event in run.events():  # a live follower, so events are emitted during the run
                kinds.add(event.kind)
            result = await run.wait()
        assert "tool_result" in kinds or result.state is State.ERROR
    return run, result


async def test_no_hooks_means_no_hook_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no hook registered, a full multi-turn run with tools never builds an InstanceInfo."""
    monkeypatch.setattr(_journal, "InstanceInfo", _NoInstanceInfo)
    _, result = await multi_turn_run(tmp_path)
    assert (result.state, result.stop_reason, result.text) == (State.STOPPED, StopReason.COMPLETED, "11")


async def test_one_hook_does_build_the_hook_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering one hook makes the loop build an InstanceInfo, so the no-hooks proof can fail."""
    monkeypatch.setattr(_journal, "InstanceInfo", _NoInstanceInfo)

    class One:
        @hookimpl
        def loopwright_after_tool_call(self) -> None:
            return None

    run, result = await multi_turn_run(tmp_path, One())
    assert result.state is State.ERROR
    failure = run.failure
    assert failure is not None
    if isinstance(failure, BaseExceptionGroup):
        failure = failure.exceptions[0]
    assert isinstance(failure, AssertionError)
    assert "the loop built an InstanceInfo" in str(failure)


async def test_hook_implementation_lists_are_cached(tmp_path: Path) -> None:
    """The per-hook implementation tuple is cached and refreshed when a plugin is registered."""
    async with make_runtime(tmp_path, Harness()) as rt:
        first = rt.plugins.impls("loopwright_before_tool_call")
        assert first == ()
        assert rt.plugins.impls("loopwright_before_tool_call") is first
        rt.register_plugin(Recorder("x", []))
        assert len(rt.plugins.impls("loopwright_before_tool_call")) == 1


# ------------------------------------------------------------------------------------------
# Plugins
# ------------------------------------------------------------------------------------------


class DupTool:
    @hookimpl
    def loopwright_register_tools(self, register: Any) -> None:
        @loopwright.tool(name="dup")
        def dup() -> str:
            """A contested name."""
            return "x"

        register(dup)


async def test_a_name_registered_twice_names_both_plugins(tmp_path: Path) -> None:
    """Registering a component name twice raises RegistrationError naming both plugins."""
    rt = make_runtime(tmp_path, DupTool(), Harness())
    rt.plugins.register(DupTool(), "first-plugin")
    with pytest.raises(RegistrationError) as info:
        rt.plugins.register(DupTool(), "second-plugin")
    err = info.value
    assert (err.kind, err.name, err.first, err.second) == ("tool", "dup", "first-plugin", "second-plugin")
    assert "first-plugin" in str(err)
    assert "second-plugin" in str(err)


async def test_duplicate_names_fail_when_the_runtime_opens(tmp_path: Path) -> None:
    """Two plugins given to a Runtime that register the same tool make opening it fail."""
    rt = make_runtime(tmp_path, DupTool(), DupTool())
    with pytest.raises(RegistrationError, match="dup"):
        async with rt:
            pass


async def test_a_builtin_name_cannot_be_taken(tmp_path: Path) -> None:
    """A plugin registering task_complete again collides with the built-in and names it."""

    class Clash:
        @hookimpl
        def loopwright_register_tools(self, register: Any) -> None:
            @loopwright.tool(name="task_complete")
            def mine() -> str:
                """Mine."""
                return "x"

            register(mine)

    with pytest.raises(RegistrationError) as info:
        async with make_runtime(tmp_path, Clash()):
            pass
    assert info.value.first == "loopwright.builtins.tools"


async def test_misspelled_hook_raises_plugin_error(tmp_path: Path) -> None:
    """check_pending rejects a misspelled hook (loopwright_befor_tool_call) with a PluginError naming it."""

    class Typo:
        @hookimpl
        def loopwright_befor_tool_call(self) -> None:
            return None

    with pytest.raises(PluginError, match="loopwright_befor_tool_call") as info:
        async with make_runtime(tmp_path, Typo()):
            pass
    assert info.value.plugin_name
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(PluginError, match="loopwright_befor_tool_call"):
            rt.register_plugin(Typo(), "late-typo")


async def test_async_registration_hook_is_rejected(tmp_path: Path) -> None:
    """An async def registration hook is rejected with a PluginError naming it."""

    class AsyncRegister:
        @hookimpl
        async def loopwright_register_tools(self, register: Any) -> None:
            return None

    with pytest.raises(PluginError, match="loopwright_register_tools must not be async"):
        async with make_runtime(tmp_path, AsyncRegister()):
            pass


PLUGIN_SOURCE = textwrap.dedent('''
    import loopwright

    @loopwright.tool
    def {name}(text: str) -> str:
        """Shout."""
        return text.upper()

    @loopwright.hookimpl
    def loopwright_register_tools(register):
        register({name})
''')


async def test_plugin_from_a_py_file_relative_to_the_assembly(tmp_path: Path) -> None:
    """An assembly's plugins: entry ending in .py loads that file, relative to the assembly's folder."""
    (tmp_path / "plugs").mkdir()
    (tmp_path / "plugs" / "shout.py").write_text(PLUGIN_SOURCE.format(name="shout_file"))
    h = Harness(reply(None, call("shout_file", "s", text="hi")), reply("done"))
    rt = make_runtime(tmp_path, h, plugins=("plugs/shout.py",), path=tmp_path / "loopwright.yaml")
    async with rt:
        assert rt.plugins.tools.plugin_of("shout_file") == "plugs/shout.py"
        run, _ = await run_to_rest(rt, defn(tools=["shout_file"]))
        assert result_for(run.inst.transcript, "s").content == "HI"


async def test_plugin_from_a_dotted_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An assembly's plugins: entry that is a dotted module path imports and registers that module."""
    pkg = tmp_path / "lw_dotted_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "shouting.py").write_text(PLUGIN_SOURCE.format(name="shout_mod"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lw_dotted_pkg", "lw_dotted_pkg.shouting"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    rt = make_runtime(tmp_path, Harness(), plugins=("lw_dotted_pkg.shouting",))
    async with rt:
        assert "shout_mod" in rt.plugins.tools
        assert "lw_dotted_pkg.shouting" in rt.plugins.plugin_names()


async def test_unknown_plugin_reference_is_a_plugin_error(tmp_path: Path) -> None:
    """A plugins: entry that is no file, entry point or module raises PluginError naming it."""
    with pytest.raises(PluginError, match="no_such_plugin_anywhere"):
        async with make_runtime(tmp_path, Harness(), plugins=("no_such_plugin_anywhere",)):
            pass


@pytest.fixture
def fake_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Install a module and an entry point ``lwfake`` in group loopwright pointing at it."""
    (tmp_path / "lw_fake_ep.py").write_text(PLUGIN_SOURCE.format(name="shout_ep"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lw_fake_ep", raising=False)
    ep = importlib.metadata.EntryPoint(name="lwfake", value="lw_fake_ep", group="loopwright")
    monkeypatch.setattr(_plugins, "_entry_points", lambda: {"lwfake": ep})
    monkeypatch.delenv("LOOPWRIGHT_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    return "lwfake"


def autoload_runtime(tmp_path: Path, **assembly: Any) -> loopwright.Runtime:
    from loopwright._definition import Assembly, StoreConfig  # noqa: PLC0415

    asm = Assembly(store=StoreConfig(options={"path": str(tmp_path / "store")}), **assembly)
    return loopwright.Runtime(asm, autoload=True)


async def test_entry_points_load_when_autoloading(tmp_path: Path, fake_entry_point: str) -> None:
    """With autoload, entry points of group loopwright are registered under their names."""
    async with autoload_runtime(tmp_path) as rt:
        assert "shout_ep" in rt.plugins.tools
        assert rt.plugins.tools.plugin_of("shout_ep") == fake_entry_point


async def test_an_entry_point_can_be_blocked_by_name(tmp_path: Path, fake_entry_point: str) -> None:
    """An entry point named in the assembly's disablePlugins is not loaded."""
    async with autoload_runtime(tmp_path, disable_plugins=(fake_entry_point,)) as rt:
        assert "shout_ep" not in rt.plugins.tools
        assert fake_entry_point not in rt.plugins.plugin_names()


async def test_an_entry_point_can_be_blocked_from_the_environment(
        tmp_path: Path, fake_entry_point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """LOOPWRIGHT_DISABLE_PLUGINS blocks entry points by name, comma-separated."""
    monkeypatch.setenv("LOOPWRIGHT_DISABLE_PLUGINS", f"other, {fake_entry_point}")
    async with autoload_runtime(tmp_path) as rt:
        assert "shout_ep" not in rt.plugins.tools


async def test_a_blocked_plugin_listed_in_plugins_is_an_error(tmp_path: Path, fake_entry_point: str) -> None:
    """Listing a plugin in plugins: while also blocking it is a PluginError."""
    with pytest.raises(PluginError, match="blocked"):
        async with autoload_runtime(tmp_path, disable_plugins=(fake_entry_point,), plugins=(fake_entry_point,)):
            pass


async def test_builtins_register_first(tmp_path: Path) -> None:
    """Built-in plugins are registered before anything else, through the same registration hooks."""
    async with make_runtime(tmp_path, Harness()) as rt:
        names = rt.plugins.plugin_names()
        assert names[: len(_plugins.BUILTIN_PLUGINS)] == list(_plugins.BUILTIN_PLUGINS)
        assert rt.plugins.tools.plugin_of("task_complete") == "loopwright.builtins.tools"
        assert "file" in rt.plugins.stores
        assert "clearToolResults" in rt.plugins.context_strategies


# ------------------------------------------------------------------------------------------
# More hook behaviour
# ------------------------------------------------------------------------------------------


async def test_modify_request_applies_to_that_call_only(tmp_path: Path) -> None:
    """ModifyRequest changes what one model call sends; the saved transcript is not changed."""

    class Shorten:
        @hookimpl
        def loopwright_before_inference(self, request: loopwright.ModelRequest) -> Any:
            hint = Message(role="system", content="(hint for this call)")
            return ModifyRequest(attrs.evolve(request, messages=[*request.messages, hint]))

    h = Harness(reply("one"))
    async with make_runtime(tmp_path, h, Shorten()) as rt:
        run, _ = await run_to_rest(rt, defn())
        assert h.sent[0][-1].content == "(hint for this call)"
        assert all(m.content != "(hint for this call)" for m in run.inst.transcript)


async def test_observer_error_on_the_final_state_change_is_recorded(tmp_path: Path) -> None:
    """An on_state_change observer failing when the run comes to rest still leaves an observer_error record."""

    class FailsAtRest:
        @hookimpl
        def loopwright_on_state_change(self, new: str) -> None:
            if new != "running":
                raise RuntimeError("alerting down")

    async with make_runtime(tmp_path, Harness(reply("hi")), FailsAtRest()) as rt:
        run, result = await run_to_rest(rt, defn())
        assert result.state is State.WAITING
        errors = records_of(await rt.records(run.instance_id), "observer_error")
        assert errors
        assert "alerting down" in errors[0]["error"]


async def test_stream_event_observers_see_the_events(tmp_path: Path) -> None:
    """on_stream_event receives the run's events (state, usage, tool results) without a follower."""
    kinds: list[str] = []

    class Stream:
        @hookimpl
        async def loopwright_on_stream_event(self, event: loopwright.Event) -> None:
            kinds.append(event.kind)

    add = make_add()
    h = Harness(reply(None, call("add", a=1, b=1)), reply("done"), tools=[add])
    async with make_runtime(tmp_path, h, Stream()) as rt:
        await run_to_rest(rt, defn(tools=[add]))
    assert {"state", "usage", "tool_result", "text"} <= set(kinds)


async def test_on_record_sees_every_record(tmp_path: Path) -> None:
    """on_record observers receive the records written to the instance's log, in order."""
    kinds: list[str] = []

    class Sink:
        @hookimpl
        def loopwright_on_record(self, record: loopwright.Record) -> None:
            kinds.append(record.kind)

    async with make_runtime(tmp_path, Harness(reply("hi")), Sink()) as rt:
        run, _ = await run_to_rest(rt, defn())
        logged = [r["kind"] for r in await rt.records(run.instance_id)]
    assert kinds == logged
    assert kinds[0] == "state"


GUARDRAIL_MODULE = textwrap.dedent("""
    import loopwright

    CALLS = []

    def no_big_numbers(call):
        CALLS.append(call.id)
        if call.arguments.get("a", 0) > 100:
            return "numbers over 100 are not allowed"
        return "allow"

    @loopwright.hookimpl
    def loopwright_before_tool_call(call):
        CALLS.append(("hook", call.id))
        return None

    @loopwright.hookimpl
    def loopwright_after_tool_call(call):
        CALLS.append(("after", call.id))
        return None
""")


@pytest.fixture
def guardrail_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A module ``lw_guard_mod`` with a guardrail function and definition hooks."""
    (tmp_path / "lw_guard_mod.py").write_text(GUARDRAIL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lw_guard_mod", raising=False)
    import lw_guard_mod  # type: ignore[import-not-found]  # noqa: PLC0415

    return lw_guard_mod


class Named:
    """A host plugin registering the module's guardrail and hooks by name (what definitions name)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    @hookimpl
    def loopwright_register_guardrails(self, register: Any) -> None:
        register("no_big_numbers", self.module.no_big_numbers)

    @hookimpl
    def loopwright_register_hooks(self, register: Any) -> None:
        register("guard_hooks", self.module)


async def test_definition_guardrail_blocks_with_its_reason(tmp_path: Path, guardrail_module: Any) -> None:
    """A guardrail named by the definition permits 'allow' and blocks any other string, with it as the reason."""
    add = make_add()
    h = Harness(reply(None, call("add", "ok", a=1, b=2), call("add", "big", a=500, b=1)), reply("done"),
                tools=[add])
    async with make_runtime(tmp_path, h, Named(guardrail_module)) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[add], guardrails=("no_big_numbers",)))
        assert result_for(run.inst.transcript, "ok").content == "3"
        big = result_for(run.inst.transcript, "big")
        assert big.status is ToolStatus.BLOCKED
        assert "numbers over 100 are not allowed" in big.content
        # The guardrail applies to that definition only.
        h.script(reply(None, call("add", "other", a=500, b=1)), reply("done"))
        run2, _ = await run_to_rest(rt, defn(tools=[add]))
        assert result_for(run2.inst.transcript, "other").content == "501"


async def test_guardrail_still_applies_after_a_restart(tmp_path: Path, guardrail_module: Any) -> None:
    """A saved instance resumed by a new runtime keeps its definition's guardrails."""
    add = make_add()
    definition = defn(tools=[add], guardrails=("no_big_numbers",))
    async with make_runtime(tmp_path, Harness(reply("first"), tools=[add]), Named(guardrail_module)) as rt:
        run, _ = await run_to_rest(rt, definition)
    h2 = Harness(reply(None, call("add", "big", a=500, b=1)), reply("done"), tools=[add])
    async with make_runtime(tmp_path, h2, Named(guardrail_module)) as rt2:
        run2 = await rt2.message(run.instance_id, "add big numbers")
        await run2.result()
        assert result_for(run2.inst.transcript, "big").status is ToolStatus.BLOCKED


async def test_host_hooks_wrap_definition_hooks(tmp_path: Path, guardrail_module: Any) -> None:
    """Host before_* hooks run before the definition's hooks and host after_* hooks run after them."""
    log = guardrail_module.CALLS

    class Host:
        @hookimpl
        def loopwright_before_tool_call(self, call: loopwright.ToolCall) -> None:
            log.append(("host-before", call.id))

        @hookimpl
        def loopwright_after_tool_call(self, call: loopwright.ToolCall) -> None:
            log.append(("host-after", call.id))

    add = make_add()
    h = Harness(reply(None, call("add", "c", a=1, b=1)), reply("done"), tools=[add])
    async with make_runtime(tmp_path, h, Host(), Named(guardrail_module)) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[add], hooks=("guard_hooks",)))
    c = runtime_id(run.inst.transcript, "c")
    assert log == [("host-before", c), ("hook", c), ("after", c), ("host-after", c)]


async def test_definition_hooks_may_not_name_files(tmp_path: Path) -> None:
    """A definition (which a model may write) cannot load hooks or guardrails from a .py file."""
    (tmp_path / "evil.py").write_text("")
    async with make_runtime(tmp_path, Harness()) as rt:
        for bad in (defn(hooks=(str(tmp_path / "evil.py"),)), defn(guardrails=(f"{tmp_path}/evil.py:f",))):
            with pytest.raises(loopwright.errors.ConfigError):
                await rt.start_agent(bad, None, "go")


async def test_definition_hooks_import_nothing_from_sys_path(tmp_path: Path, guardrail_module: Any) -> None:
    """An importable module that no plugin registers is never used by a definition, even a host's."""
    async with make_runtime(tmp_path, Harness()) as rt:
        for bad in (defn(hooks=("lw_guard_mod",)), defn(guardrails=("lw_guard_mod:no_big_numbers",))):
            with pytest.raises(loopwright.errors.ConfigError, match="lw_guard_mod"):
                await rt.start_agent(bad, None, "go")


_BAD_HOOK_SETS = {
    "argument": ("@loopwright.hookimpl\ndef loopwright_before_tool_call(nonsense):\n    return None\n",
                 "loopwright_before_tool_call", "nonsense"),
    "misspelt": ("@loopwright.hookimpl\ndef loopwright_on_mesage(message):\n    pass\n",
                 "loopwright_on_mesage", "unknown hook"),
    "wrapper": ("@loopwright.hookimpl(wrapper=True)\ndef loopwright_after_tool_call(result):\n    return (yield)\n",
                "loopwright_after_tool_call", "wrapper=True"),
}


@pytest.mark.parametrize("kind", sorted(_BAD_HOOK_SETS))
async def test_an_entry_point_a_definition_names_is_checked_before_the_instance_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
) -> None:
    """An entry point named in ``hooks:`` is checked by pluggy as host plugins are: a bad one fails the start."""
    source, hook, why = _BAD_HOOK_SETS[kind]
    (tmp_path / "lw_bad_hooks.py").write_text(f"import loopwright\n\n{source}")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lw_bad_hooks", raising=False)
    ep = importlib.metadata.EntryPoint(name="lwbad", value="lw_bad_hooks", group="loopwright")
    monkeypatch.setattr(_plugins, "_entry_points", lambda: {"lwbad": ep})
    h = Harness(reply("never"))
    async with make_runtime(tmp_path, h) as rt:
        definition = defn(hooks=("lwbad",))
        with pytest.raises(PluginError) as info:
            rt.check_definition(definition)
        for part in ("lwbad", hook, why):
            assert part in str(info.value), info.value
        with pytest.raises(PluginError):
            await rt.start_agent(definition, None, "go")
        assert not h.requests
        assert await rt.store.list_headers() == []


# ------------------------------------------------------------------------------------------
# Plugin settings and the runtime's close
# ------------------------------------------------------------------------------------------


class SettingsReader:
    """Registers a tool named after its ``pluginSettings`` entry, and notes what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, Any]] = []

    @hookimpl
    def loopwright_register_tools(self, register: Any, settings: Any, runtime: Any) -> None:
        self.seen.append((settings, runtime))
        name = settings.get("reader", {}).get("toolName")
        if name:
            @loopwright.tool(name=name)
            def configured() -> str:
                """Named by the assembly."""
                return "configured"

            register(configured)

    @hookimpl
    def loopwright_register_providers(self, settings: Any) -> None:
        self.seen.append((settings, "providers"))


async def test_plugin_settings_reach_registration_hooks(tmp_path: Path) -> None:
    """The assembly's pluginSettings and the runtime reach every registration hook that takes them."""
    reader = SettingsReader()
    settings = {"reader": {"toolName": "from_yaml"}, "other": {"x": 1}}
    h = Harness(reply(None, call("from_yaml", "c")), reply("done"))
    async with make_runtime(tmp_path, reader, h, plugin_settings=settings) as rt:
        assert "from_yaml" in rt.plugins.tools
        run, _ = await run_to_rest(rt, defn(tools=["from_yaml"]))
        assert result_for(run.inst.transcript, "c").content == "configured"
    assert reader.seen == [(settings, "providers"), (settings, rt)]


async def test_registration_hooks_without_settings_still_work(tmp_path: Path) -> None:
    """A registration hook taking only register (or nothing) is called as before; a runtime with no
    pluginSettings gives an empty mapping."""
    reader = SettingsReader()
    calls: list[str] = []

    class Bare:
        @hookimpl
        def loopwright_register_tools(self, register: Any) -> None:
            calls.append("register")
            register(make_add())

        @hookimpl
        def loopwright_register_stores(self) -> None:
            calls.append("nothing")

    h = Harness(reply(None, call("add", "c", a=2, b=3)), reply("done"))
    async with make_runtime(tmp_path, Bare(), reader, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=["add"]))
        assert result_for(run.inst.transcript, "c").content == "5"
    assert sorted(calls) == ["nothing", "register"]
    assert reader.seen == [({}, "providers"), ({}, rt)]


def test_a_plugin_host_without_a_runtime_passes_none() -> None:
    """A PluginHost used on its own passes runtime=None and the settings it was given."""
    from loopwright._plugins import PluginHost  # noqa: PLC0415

    reader = SettingsReader()
    host = PluginHost(settings={"reader": {"toolName": "alone"}})
    host.register(reader, "reader")
    assert "alone" in host.tools
    assert reader.seen[-1] == ({"reader": {"toolName": "alone"}}, None)


class CloseRecorder:
    def __init__(self, log: list[Any], *, fail: bool = False) -> None:
        self.log = log
        self.fail = fail

    @hookimpl
    async def loopwright_on_runtime_close(self, runtime: Any) -> None:
        await anyio.sleep(0)
        self.log.append(("closed", runtime, runtime.store is not None))
        if self.fail:
            raise RuntimeError("cannot let go")


async def test_runtime_close_hook_is_called_once_per_close(tmp_path: Path) -> None:
    """on_runtime_close runs once when async with ends (awaited, with the store still there), never before."""
    log: list[Any] = []
    rt = make_runtime(tmp_path, CloseRecorder(log), Harness(reply("done")))
    async with rt:
        await run_to_rest(rt, defn())
        assert log == []
    assert log == [("closed", rt, True)]


async def test_a_failing_close_hook_does_not_stop_the_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception in on_runtime_close is logged; later implementations and the store's close still run."""
    log: list[Any] = []
    closed: list[str] = []
    rt = make_runtime(tmp_path, CloseRecorder(log, fail=True), CloseRecorder(log), Harness())

    with caplog.at_level("WARNING", logger="loopwright"):
        async with rt:
            original = rt.store.aclose

            async def aclose() -> None:
                closed.append("store")
                await original()

            rt.store.aclose = aclose  # type: ignore[method-assign]
    assert [entry[0] for entry in log] == ["closed", "closed"]
    assert closed == ["store"]
    failures = [r for r in caplog.records if "loopwright_on_runtime_close" in r.getMessage()]
    assert len(failures) == 1
    assert "cannot let go" in failures[0].getMessage()


async def test_add_verifier_checks_the_signature(tmp_path: Path) -> None:
    """A host's verifier that cannot take the messages is refused when it is added, not when it runs."""
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(loopwright.errors.PluginError, match="verifier 'bad'"):
            rt.add_verifier("bad", lambda: (True, ""))  # type: ignore[arg-type, return-value]
        rt.add_verifier("good", lambda messages: (True, ""))
        assert rt.verifier("good")([]) == (True, "")


@pytest.mark.parametrize("hook", ["on_message", "no_such_hook"])
async def test_intercept_walks_interceptor_hooks_only(hook: str) -> None:
    """``_hooks.intercept``'s contract: an observer's name, or a name no hookspec has, is a ValueError, not a walk."""
    with pytest.raises(ValueError, match="is not an interceptor hook"):
        await intercept([], {}, hook=hook, modify={})
