"""The built-in plugins that no other test file covers: the jsonl record sink and clearToolResults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import Harness, call, defn, make_runtime, reply

import loopwright
from loopwright import Message, PluginSpec, ToolStatus
from loopwright.builtins.context import CLEARED, ClearToolResults
from loopwright.errors import ConfigError

pytestmark = pytest.mark.anyio


@loopwright.tool
def echo(x: int) -> str:
    """Echo."""
    return f"echo {x}" * 10


async def test_jsonl_sink_receives_every_record_of_the_run(tmp_path: Path) -> None:
    """A `records: [{kind: jsonl, path}]` sink gets the same records the instance's record log holds."""
    sink_path = tmp_path / "out" / "records.jsonl"
    h = Harness(reply(None, call("echo", x=1)), reply("done"), tools=[echo])
    async with make_runtime(tmp_path, h, records=(PluginSpec(kind="jsonl", options={"path": str(sink_path)}),)) as rt:
        run = await rt.start_agent(defn(tools=[echo]), prompt="go")
        result = await run.result()
        logged = await rt.records(result.instance_id)
    lines = [json.loads(line) for line in sink_path.read_text().splitlines()]
    assert [(r["kind"], r["data"]) for r in lines] == [(r["kind"], r["data"]) for r in logged]
    assert {r["kind"] for r in lines} >= {"state", "turn", "tool_call"}


async def test_clear_tool_results_keeps_only_the_last_results_and_the_calls(tmp_path: Path) -> None:
    """clearToolResults replaces all but the last keepLast results with a placeholder before the model call."""
    h = Harness(reply(None, call("echo", x=1)), reply(None, call("echo", x=2)), reply(None, call("echo", x=3)),
                reply("done"), tools=[echo])
    strategy = PluginSpec(kind="clearToolResults", options={"keepLast": 1})
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(tools=[echo], context_strategy=strategy), prompt="go")
        await run.result()
        records = await rt.records(run.instance_id)
    last = [m for m in h.sent[-1] if m.role == "tool"]
    assert [m.content == CLEARED for m in last] == [True, True, False]
    assert all(m.status is ToolStatus.SUCCESS for m in last)
    assert any(r["kind"] == "compaction" for r in records)


def test_clear_tool_results_trigger_and_options() -> None:
    """A token trigger waits for enough context; a percentage needs contextWindow; unknown options are errors."""
    messages = [Message(role="tool", tool_call_id=str(i), content="x" * 400) for i in range(4)]
    assert not ClearToolResults({"keepLast": 1, "trigger": "10k"}).should_apply(
        messages, last_usage=None, context_window=None)
    assert ClearToolResults({"keepLast": 1, "trigger": "100"}).should_apply(
        messages, last_usage=None, context_window=None)
    with pytest.raises(ConfigError, match="contextWindow"):
        ClearToolResults({"trigger": "80%"})
    with pytest.raises(ConfigError, match="unknown options"):
        ClearToolResults({"keep": 2})
