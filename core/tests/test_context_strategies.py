"""The context strategies `compact` and `providerNative` (and what all strategies record)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, entries_path, make_runtime, records_of, reply, run_to_rest, runtime_id

import loopwright
from loopwright import Block, HeaderFields, Message, ModelRequest, PluginSpec, State, ToolStatus, Usage, hookimpl
from loopwright._instance import Instance, message_to_json
from loopwright._replay import rebuild
from loopwright.builtins.context import (
    DEFAULT_COMPACT_PROMPT,
    SUMMARY_PREFIX,
    ClearToolResults,
    Compact,
    ProviderNative,
    estimate_tokens,
)
from loopwright.errors import ConfigError, ProviderError

pytestmark = pytest.mark.anyio


@loopwright.tool
def echo(x: int) -> str:
    """Echo."""
    return f"echo {x} " * 100


BIG = Usage(input_tokens=5000, output_tokens=10, total_tokens=5010, requests=1)
SMALL = Usage(input_tokens=100, output_tokens=10, total_tokens=110, requests=1)
UNCOUNTED = Usage(requests=1, unreported_requests=1)
SUMMARY_USAGE = Usage(input_tokens=300, output_tokens=40, total_tokens=340, requests=1)


def compact(**options: Any) -> PluginSpec:
    return PluginSpec(kind="compact", options={"trigger": "4k", "keepLast": 2, **options})


def agent(strategy: PluginSpec | None, **kwargs: Any) -> loopwright.Definition:
    return defn(tools=[echo], system_prompt="You echo.", context_strategy=strategy, **kwargs)


def two_turns(second: Usage = BIG, *, parallel: bool = False, first: Usage | None = None) -> list[Any]:
    """Two tool turns; the second reports ``second`` as its usage (what the trigger then sees)."""
    calls = (call("echo", "b1", x=2), call("echo", "b2", x=3)) if parallel else (call("echo", "b1", x=2),)
    return [reply(None, call("echo", "a1", x=1), usage=first), reply(None, *calls, usage=second)]


def summary(text: str = "The user asked for echoes; 1 was echoed.") -> Any:
    return reply(text, usage=SUMMARY_USAGE)


def rendered(request_messages: list[Message]) -> str:
    return request_messages[1].content or ""


# ------------------------------------------------------------------------------------------
# compact - the transcript
# ------------------------------------------------------------------------------------------


async def test_compact_summarises_the_middle_and_the_next_call_gets_the_new_transcript(tmp_path: Path) -> None:
    """System prompt first, then one user message with the summary, then the kept tail as it was."""
    h = Harness(*two_turns(), summary(), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, agent(compact()))
    assert (result.state, result.text) == (State.WAITING, "done")
    assert len(h.requests) == 4
    asked = h.sent[2]
    assert [m.role for m in asked] == ["system", "user"]
    assert asked[0].content == DEFAULT_COMPACT_PROMPT
    text = rendered(asked)
    assert "[user]\ngo" in text
    a1 = runtime_id(h.sent[1], "a1")  # compacting took the call out of the transcript
    assert f"calls the tool echo (call {a1})" in text
    assert "echo 1 echo 1" in text
    b1 = runtime_id(run.inst.transcript, "b1")
    assert "b1" not in text  # the kept tail is not summarised
    assert b1 not in text
    assert h.requests[2].tools == ()
    sent = h.sent[3]
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[0].content == "You echo."
    assert sent[1].content == f"{SUMMARY_PREFIX}\n\nThe user asked for echoes; 1 was echoed."
    assert sent[1].source == "runtime"
    assert sent[2].tool_calls[0].id == b1
    assert sent[2].tool_calls[0].provider_id == "b1"
    assert sent[3].tool_call_id == b1
    assert sent[3].provider_call_id == "b1"
    assert list(run.inst.transcript)[:4] == sent


async def test_compact_never_orphans_tool_results(tmp_path: Path) -> None:
    """keepLast 1 would keep only the last result of a parallel turn: the tail grows back to its call."""
    h = Harness(*two_turns(parallel=True), summary(), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, agent(compact(keepLast=1)))
    sent = h.sent[3]
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    ids = [runtime_id(run.inst.transcript, "b1"), runtime_id(run.inst.transcript, "b2")]
    assert [c.id for c in sent[2].tool_calls] == ids
    assert [c.provider_id for c in sent[2].tool_calls] == ["b1", "b2"]
    assert [m.tool_call_id for m in sent[3:]] == ids
    assert [m.provider_call_id for m in sent[3:]] == ["b1", "b2"]
    assert all(m.status is ToolStatus.SUCCESS for m in sent[3:])


async def test_compact_uses_the_given_model_and_prompt(tmp_path: Path) -> None:
    """`model` and `prompt` choose the summarising model and its instruction."""
    h = Harness(*two_turns(), summary(), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, agent(compact(model="s:small", prompt="Summarise in one line.")))
    assert [r.model for r in h.requests] == ["m", "m", "small", "m"]
    assert h.sent[2][0].content == "Summarise in one line."


# ------------------------------------------------------------------------------------------
# compact - the trigger
# ------------------------------------------------------------------------------------------


async def test_compact_trigger_uses_the_real_input_tokens(tmp_path: Path) -> None:
    """The latest call's input tokens decide: 100 stays under 300 though the estimate is over it; 5,000 is not."""
    h = Harness(*two_turns(SMALL), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, agent(compact(trigger="300")))
        records = await rt.records(run.instance_id)
    assert estimate_tokens(h.sent[2]) > 300  # the estimate alone would have compacted
    assert result.text == "done"
    assert len(h.requests) == 3
    assert not records_of(records, "compaction")
    h = Harness(*two_turns(BIG), summary(), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h, store_dir="big") as rt:
        await run_to_rest(rt, agent(compact(trigger="300")))
    assert len(h.requests) == 4


async def test_compact_trigger_as_a_percentage_of_the_context_window(tmp_path: Path) -> None:
    """80% of a 6,000-token window is 4,800: 5,000 input tokens trigger it."""
    h = Harness(*two_turns(BIG), summary(), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, agent(compact(trigger="80%", contextWindow=6000)))
    assert len(h.requests) == 4
    assert h.sent[3][1].content.startswith(SUMMARY_PREFIX)


@pytest.mark.parametrize(("trigger", "compacted"), [("300", True), ("1k", False)])
async def test_compact_trigger_estimates_without_a_token_count(tmp_path: Path, trigger: str,
                                                               compacted: bool) -> None:
    """Without a reported count the trigger estimates four characters a token (about 370 tokens here)."""
    replies = [*two_turns(UNCOUNTED, first=UNCOUNTED), *([summary()] if compacted else []), reply("done")]
    h = Harness(*replies, tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, agent(compact(trigger=trigger)))
    assert result.text == "done"
    assert len(h.requests) == (4 if compacted else 3)


def test_compact_should_apply_needs_something_to_summarise() -> None:
    """Only the system prompt and the kept tail: nothing to summarise, whatever the count."""
    messages = [Message(role="system", content="s"), Message(role="user", content="x" * 100_000),
                Message(role="assistant", content="y")]
    strategy = Compact({"trigger": "10", "keepLast": 1})
    assert not strategy.should_apply(messages, last_usage=None, context_window=None)
    more = [*messages, Message(role="user", content="z")]
    assert strategy.should_apply(more, last_usage=None, context_window=None)
    assert not strategy.should_apply(more, last_usage=Usage(input_tokens=9), context_window=None)


# ------------------------------------------------------------------------------------------
# compact - usage, cost, records
# ------------------------------------------------------------------------------------------


async def test_compact_usage_and_cost_count_and_are_recorded(tmp_path: Path) -> None:
    """The summary call's usage and cost join the instance's totals, its record and the on_cost observers."""
    costs: list[tuple[int, str, float | None]] = []

    class Watch:
        @hookimpl
        def loopwright_on_cost(self, turn: int, cost: loopwright.Cost, model: str) -> None:
            costs.append((turn, model, cost.amount))

    h = Harness(*two_turns(), summary(), reply("done"), tools=[echo], priced=True)
    pricing = {"s:m": {"input": 1.0, "output": 2.0}, "s:small": {"input": 10.0, "output": 20.0}}
    async with make_runtime(tmp_path, h, Watch(), pricing=pricing) as rt:
        run, result = await run_to_rest(rt, agent(compact(model="s:small")))
        records = await rt.records(run.instance_id)
    summary_cost = (300 * 10.0 + 40 * 20.0) / 1_000_000
    turns_cost = ((1 + 5000 + 1) * 1.0 + (1 + 10 + 1) * 2.0) / 1_000_000
    assert result.usage.input_tokens == 1 + 5000 + 300 + 1
    assert result.usage.output_tokens == 1 + 10 + 40 + 1
    assert result.usage.requests == 4
    assert result.cost.amount == pytest.approx(turns_cost + summary_cost)
    assert (2, "s:small", pytest.approx(summary_cost)) in costs
    [record] = records_of(records, "compaction")
    assert record["strategy"] == "compact"
    assert (record["turn"], record["before"], record["after"]) == (2, 6, 4)
    assert (record["summarised"], record["kept"]) == (3, 2)
    assert record["summaryChars"] == len("The user asked for echoes; 1 was echoed.")
    assert record["usage"]["inputTokens"] == 300
    assert record["usage"]["outputTokens"] == 40
    assert record["cost"] == pytest.approx(summary_cost)
    assert record["model"] == "s:small"
    assert "error" not in record


async def test_compact_spending_counts_toward_the_token_limit(tmp_path: Path) -> None:
    """A summary that uses the segment's last tokens ends it before the next model call."""
    h = Harness(*two_turns(), summary(), reply("never"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        _run, result = await run_to_rest(rt, agent(compact(), limits=loopwright.Limits(tokens=5200)))
    assert (result.state, result.limit) == (State.ERROR, "tokens")
    assert len(h.requests) == 3


async def test_clear_tool_results_record_says_what_it_cleared(tmp_path: Path) -> None:
    """Every strategy run writes a compaction record: strategy, turn, messages before and after, and its details."""
    h = Harness(*two_turns(), reply(None, call("echo", x=4)), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, agent(PluginSpec(kind="clearToolResults", options={"keepLast": 1})))
        records = await rt.records(run.instance_id)
    first, second = records_of(records, "compaction")
    assert first == {"strategy": "clearToolResults", "turn": 2, "before": 6, "after": 6, "cleared": 1}
    assert (second["turn"], second["cleared"]) == (3, 1)


# ------------------------------------------------------------------------------------------
# compact - hooks and failures
# ------------------------------------------------------------------------------------------


async def test_before_compaction_block_skips_the_summary(tmp_path: Path) -> None:
    """A Block from before_compaction skips the summary call: the next model call gets the whole transcript."""
    seen: list[str] = []

    class Keep:
        @hookimpl
        def loopwright_before_compaction(self, strategy: str, messages: Any) -> Any:
            seen.append(f"{strategy}:{len(messages)}")
            return Block("keep everything")

    h = Harness(*two_turns(), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h, Keep()) as rt:
        run, result = await run_to_rest(rt, agent(compact()))
        records = await rt.records(run.instance_id)
    assert result.text == "done"
    assert seen == ["compact:6"]
    assert len(h.requests) == 3
    assert len(h.sent[2]) == 6
    assert not records_of(records, "compaction")
    assert records_of(records, "hook")[0]["hook"] == "before_compaction"


async def test_a_failing_summary_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    """A summary call that fails for good leaves the transcript whole, writes the error, and the turn runs."""
    failure = ProviderError("overloaded", provider="s", model="m", status=400)
    h = Harness(*two_turns(), failure, reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, agent(compact()))
        records = await rt.records(run.instance_id)
    assert (result.state, result.text) == (State.WAITING, "done")
    assert len(h.sent[3]) == 6
    assert not any(m.content and m.content.startswith(SUMMARY_PREFIX) for m in run.inst.transcript)
    [record] = records_of(records, "compaction")
    assert (record["before"], record["after"]) == (6, 6)
    assert "overloaded" in record["error"]
    assert "usage" not in record
    assert any(e.get("compaction") for e in records_of(records, "error"))
    assert result.usage.requests == 3
    assert '"t": "reset"' not in entries_path(rt, run.instance_id).read_text()


async def test_a_summary_model_naming_no_provider_refuses_the_start(tmp_path: Path) -> None:
    """A `model` naming no provider is a ConfigError before the instance exists (issue 10: every
    model reference resolves when the run starts, as ``validate -c`` checks); it used to fail
    each compaction at run time instead."""
    h = Harness(*two_turns(), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        with pytest.raises(ConfigError, match="unknown provider 'nope'"):
            await rt.start_agent(agent(compact(model="nope:x")), None, "go")
        assert await rt.list_instances() == []


async def test_an_empty_summary_is_a_failure(tmp_path: Path) -> None:
    """A summary call that answers with no text replaces nothing."""
    h = Harness(*two_turns(), reply("  "), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, agent(compact()))
        records = await rt.records(run.instance_id)
    assert len(h.sent[3]) == 6
    [record] = records_of(records, "compaction")
    assert "no text" in record["error"]
    assert record["usage"]["inputTokens"] == 1  # the call was made, and counts


# ------------------------------------------------------------------------------------------
# compact - durability
# ------------------------------------------------------------------------------------------


async def test_a_rebuild_replays_the_compacted_transcript_and_its_spending(tmp_path: Path) -> None:
    """A new runtime reads the reset entry: the compacted transcript, and usage and cost with the summary's."""
    h = Harness(*two_turns(), summary(), reply("done"), tools=[echo], priced=True)
    pricing = {"s:m": {"input": 1.0, "output": 2.0}}
    async with make_runtime(tmp_path, h, pricing=pricing) as rt:
        run, result = await run_to_rest(rt, agent(compact()))
        live = list(run.inst.transcript)
    lines = [json.loads(line) for line in entries_path(rt, run.instance_id).read_text().splitlines()]
    [reset] = [e for e in lines if e["t"] == "reset"]
    assert reset["spend"]["usage"]["inputTokens"] == 300
    async with make_runtime(tmp_path, Harness(tools=[echo]), pricing=pricing) as rt2:
        again = await rt2.get_agent(run.instance_id)
    assert list(again.inst.transcript) == live
    assert again.inst.usage == result.usage
    assert again.inst.cost.amount == pytest.approx(result.cost.amount)


def test_rebuild_with_a_reset_and_spend_entries() -> None:
    """rebuild takes a reset's messages, counts its spend and spend entries, and forgets the context size."""
    system = Message(role="system", content="s")
    note = Message(role="user", content=f"{SUMMARY_PREFIX}\n\nearlier", source="runtime")
    answer = Message(role="assistant", content="a", model="s:m")
    usage = {"inputTokens": 50, "outputTokens": 5, "totalTokens": 55, "requests": 1}
    entries = [
        {"t": "seg", "at": "x"},
        {"t": "msg", "m": message_to_json(system)},
        {"t": "msg", "m": message_to_json(Message(role="user", content="go")), "task": True},
        {"t": "msg", "m": message_to_json(answer), "turn": {"n": 1, "model": "s:m", "usage": usage, "cost": 0.5}},
        {"t": "reset", "messages": [message_to_json(system), message_to_json(note)],
         "spend": {"usage": {"inputTokens": 30, "outputTokens": 3, "requests": 1}, "cost": 0.25, "model": "s:m"}},
    ]
    inst = Instance(id="i", definition=defn(), header=HeaderFields({}))
    rebuild(inst, entries)
    assert list(inst.transcript) == [system, note]
    assert (inst.usage.input_tokens, inst.usage.output_tokens, inst.usage.requests) == (80, 8, 2)
    assert inst.cost.amount == pytest.approx(0.75)
    assert (inst.seg_tokens, inst.seg_cost, inst.turn, inst.seg_iterations) == (88, pytest.approx(0.75), 1, 1)
    assert inst.context_tokens is None
    rebuild(inst, [*entries, {"t": "spend", "usage": {"inputTokens": 7, "requests": 1}, "cost": None},
                   {"t": "msg", "m": message_to_json(answer),
                    "turn": {"n": 2, "model": "s:m", "usage": usage, "cost": 0.5}}])
    assert inst.usage.input_tokens == 137
    assert inst.cost.amount is None
    assert inst.context_tokens == 50
    assert list(inst.transcript) == [system, note, answer]


async def test_a_crash_before_the_reset_is_saved_loses_only_the_summary_call(tmp_path: Path) -> None:
    """A crash right after the summary call leaves the old transcript; a resume compacts again and goes on."""
    crashed = tmp_path / "crashed"

    def crash_after_this_call(request: ModelRequest) -> Any:
        # What is on disk while the summary call is answered is all a crash right after it leaves.
        shutil.copytree(tmp_path / "store", crashed)
        return summary("lost")

    h = Harness(*two_turns(), crash_after_this_call, reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, agent(compact()))
    iid = run.instance_id
    assert '"t": "reset"' not in (crashed / iid / "entries.jsonl").read_text()
    h2 = Harness(summary("again"), reply("recovered"), tools=[echo])
    async with make_runtime(tmp_path, h2, store_dir="crashed") as rt2:
        resumed = await rt2.resume(iid)
        with anyio.fail_after(10):
            result = await resumed.wait()
    assert (result.state, result.text) == (State.WAITING, "recovered")
    assert len(h2.sent[0]) == 2  # the summary call again, over the old transcript
    assert "echo 1" in rendered(h2.sent[0])
    assert h2.sent[1][1].content == f"{SUMMARY_PREFIX}\n\nagain"
    assert result.usage.requests == 4  # two turns, the new summary, the last turn: the lost call is not counted


# ------------------------------------------------------------------------------------------
# options
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({}, "trigger is required"),
    ({"trigger": "80%"}, "needs contextWindow"),
    ({"trigger": "lots"}, "trigger 'lots'"),
    ({"trigger": "150%", "contextWindow": 1000}, "at most 100"),
    ({"trigger": "1k", "contextWindow": "big"}, "contextWindow must be"),
    ({"trigger": "1k", "keepLast": -1}, "keepLast must be"),
    ({"trigger": "1k", "keepLast": "6"}, "keepLast must be"),
    ({"trigger": "1k", "model": "gpt-4o"}, "model 'gpt-4o'"),
    ({"trigger": "1k", "prompt": " "}, "prompt must be"),
    ({"trigger": "1k", "keep": 2}, r"unknown options \['keep'\]"),
])
def test_compact_option_errors(options: dict[str, Any], message: str) -> None:
    """Bad compact options are ConfigErrors that name the option."""
    with pytest.raises(ConfigError, match=message):
        Compact(options)


@pytest.mark.parametrize(("options", "message"), [
    ({"truncation": "sometimes"}, "truncation must be"),
    ({"edits": {"type": "clear_tool_uses_20250919"}}, "edits must be"),
    ({"edits": [{"keep": 1}]}, "edits must be"),
    ({"trim": True}, r"unknown options \['trim'\]"),
])
def test_provider_native_option_errors(options: dict[str, Any], message: str) -> None:
    """Bad providerNative options are ConfigErrors that name the option."""
    with pytest.raises(ConfigError, match=message):
        ProviderNative(options)


def test_clear_tool_results_option_errors() -> None:
    """clearToolResults checks keepLast and contextWindow as compact does."""
    with pytest.raises(ConfigError, match="keepLast must be"):
        ClearToolResults({"keepLast": True})
    with pytest.raises(ConfigError, match="contextWindow must be"):
        ClearToolResults({"trigger": "50%", "contextWindow": 0})


async def test_a_definition_with_bad_strategy_options_does_not_start(tmp_path: Path) -> None:
    """start_agent raises the strategy's ConfigError before anything runs."""
    h = Harness(tools=[echo])
    async with make_runtime(tmp_path, h) as rt:
        with pytest.raises(ConfigError, match="compact: trigger is required"):
            await rt.start_agent(agent(PluginSpec(kind="compact", options={})), prompt="go")
    assert h.requests == []


# ------------------------------------------------------------------------------------------
# providerNative
# ------------------------------------------------------------------------------------------


async def test_provider_native_puts_its_options_on_every_request(tmp_path: Path) -> None:
    """providerNative leaves the transcript alone and asks every request for context management."""
    h = Harness(*two_turns(), reply("done"), tools=[echo])
    native = PluginSpec(kind="providerNative", options={"truncation": "auto"})
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, agent(native))
        records = await rt.records(run.instance_id)
    assert result.text == "done"
    assert [r.context_management for r in h.requests] == [{"truncation": "auto"}] * 3
    assert len(h.sent[2]) == 6
    assert not records_of(records, "compaction")


async def test_provider_native_without_options_and_no_strategy(tmp_path: Path) -> None:
    """providerNative without options asks with an empty mapping; without a strategy nothing is asked."""
    h = Harness(reply("plain"), reply("native"))
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, defn())
        await run_to_rest(rt, defn(context_strategy=PluginSpec(kind="providerNative")))
    assert [r.context_management for r in h.requests] == [None, {}]


async def test_provider_native_never_triggers() -> None:
    """providerNative's trigger never holds and apply changes nothing."""
    strategy = ProviderNative({})
    messages = [Message(role="user", content="x" * 1_000_000)]
    assert not strategy.should_apply(messages, last_usage=Usage(input_tokens=10**9), context_window=1)
    assert strategy.context_management == {}
    assert await strategy.apply(messages) is messages
