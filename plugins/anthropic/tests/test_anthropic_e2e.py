"""Agents run through a loopwright Runtime against the local Messages API server."""

from __future__ import annotations

import json
import textwrap
from importlib.metadata import entry_points

import anyio
import pytest

import loopwright

pytestmark = pytest.mark.anyio

TOOLS_PY = '''
import loopwright


@loopwright.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(add)
'''


def write_project(tmp_path, url: str, *, stream: bool = False, output: dict | None = None) -> None:
    provider = {"kind": "anthropic", "baseUrl": url, "apiKey": "x", "retryBaseDelay": 0.001}
    if stream:
        provider["stream"] = True
    assembly = {
        "store": {"kind": "file", "path": "store"},
        "plugins": ["loopwright_anthropic", "tools.py"],
        "providers": {"claude": provider},
    }
    agent = {"name": "adder", "model": "claude:claude-sonnet-4-5", "systemPrompt": "You add numbers.",
             "tools": ["add"], "maxIterations": 5}
    if output is not None:
        agent["output"] = output
    (tmp_path / "loopwright.yaml").write_text(json.dumps(assembly))  # JSON is YAML
    (tmp_path / "adder.yaml").write_text(json.dumps(agent))
    (tmp_path / "tools.py").write_text(textwrap.dedent(TOOLS_PY))


async def run_adder(tmp_path, prompt="What is 2 + 3?"):
    async with loopwright.Runtime.from_file(tmp_path / "loopwright.yaml", autoload=False) as rt:
        run = await rt.start_agent(tmp_path / "adder.yaml", prompt=prompt)
        with anyio.fail_after(10):
            result = await run.result()
        events = [e async for e in run.events()]
        records = await rt.records(result.instance_id)
    return result, events, records


async def test_agent_with_a_tool_round_trip(tmp_path, fake):
    """An agent on claude:claude-sonnet-4-5 calls a tool over the Messages API and answers with its result."""
    write_project(tmp_path, fake.url)
    fake.enqueue(
        fake.message("Adding.", fake.tool_use("toolu_01", "add", {"a": 2, "b": 3}), stop_reason="tool_use",
                     usage={"input_tokens": 20, "output_tokens": 10}),
        fake.message("2 + 3 = 5.", usage={"input_tokens": 40, "cache_read_input_tokens": 15, "output_tokens": 5}),
    )
    result, _, records = await run_adder(tmp_path)
    assert (result.state, result.stop_reason, result.text) == (
        loopwright.State.WAITING, loopwright.StopReason.WAITING, "2 + 3 = 5.")
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.cache_read_tokens) == (75, 15, 15)
    first, second = fake.bodies
    assert first["model"] == "claude-sonnet-4-5"
    assert first["system"] == [{"type": "text", "text": "You add numbers."}]
    assert first["tools"][0]["name"] == "add"
    assert second["messages"][1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}}]}
    assert second["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "5", "is_error": False}]}
    assert fake.seen[0].headers["x-api-key"] == "x"
    assert [r["data"]["status"] for r in records if r["kind"] == "tool_call"] == ["success"]


async def test_streaming_agent_with_a_tool_round_trip(tmp_path, fake):
    """With stream: true the same run streams: text deltas and tool-call starts become events."""
    write_project(tmp_path, fake.url, stream=True)
    fake.stream(fake.message("Adding.", fake.tool_use("toolu_01", "add", {"a": 2, "b": 3}), stop_reason="tool_use"),
                chunk=11)
    fake.stream(fake.message("The sum is 5."))
    result, events, _ = await run_adder(tmp_path)
    assert result.text == "The sum is 5."
    assert all(body["stream"] is True for body in fake.bodies)
    kinds = [e.kind for e in events]
    assert "text_delta" in kinds
    assert "tool_call_start" in kinds
    assert "".join(e.data["delta"] for e in events if e.kind == "text_delta" and e.turn == 2) == "The sum is 5."
    start = next(e for e in events if e.kind == "tool_call_start")
    assert (start.data["id"], start.data["name"]) == ("toolu_01", "add")


async def test_structured_output_through_the_output_tool(tmp_path, fake):
    """A definition with output gets its value parsed from the output tool's input."""
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
    write_project(tmp_path, fake.url, output=schema)
    fake.enqueue(
        fake.message(fake.tool_use("toolu_01", "add", {"a": 2, "b": 3}), stop_reason="tool_use"),
        fake.message(fake.tool_use("toolu_02", "final_output", {"sum": 5}), stop_reason="tool_use"),
    )
    result, _, _ = await run_adder(tmp_path)
    assert result.output == {"sum": 5}
    assert result.stop_reason is loopwright.StopReason.WAITING
    assert [t["name"] for t in fake.bodies[0]["tools"]] == ["add", "final_output"]


async def test_refusal_stops_the_run_with_content_filter(tmp_path, fake):
    """A refusal ends the run segment as content_filter."""
    write_project(tmp_path, fake.url)
    fake.enqueue(fake.message(stop_reason="refusal"))
    result, _, _ = await run_adder(tmp_path)
    assert (result.state, result.stop_reason) == (loopwright.State.STOPPED, loopwright.StopReason.CONTENT_FILTER)


def test_entry_point_names_the_plugin():
    """The distribution registers the entry point anthropic = loopwright_anthropic in group loopwright."""
    [ep] = [e for e in entry_points(group="loopwright") if e.name == "anthropic"]
    assert ep.value == "loopwright_anthropic"
