"""Agents run on the echo provider: through a Runtime, and from YAML with the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import loopwright
from loopwright import Assembly, ProviderConfig, StoreConfig
from loopwright_example_echo.server import EchoServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@loopwright.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Tools:
    """A plugin object that registers the ``add`` tool."""

    @loopwright.hookimpl
    def loopwright_register_tools(self, register):
        register(add)


def assembly(tmp_path: Path, server: EchoServer, **provider_options: object) -> Assembly:
    return Assembly(
        store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}),
        providers={"echo": ProviderConfig(kind="echo", base_url=server.url, options=provider_options)},
    )


def test_the_entry_point_names_the_plugin_module() -> None:
    """The distribution declares the entry point ``echo`` in group ``loopwright``."""
    (found,) = [ep for ep in entry_points(group="loopwright") if ep.name == "echo"]
    assert found.value == "loopwright_example_echo"


@pytest.mark.anyio
async def test_an_agent_calls_a_tool_through_the_echo_provider(tmp_path: Path, echo_server: EchoServer) -> None:
    """The entry point registers ``echo``; a run calls the tool, reads its result and rests waiting."""
    async with loopwright.Runtime(assembly(tmp_path, echo_server), plugins=[Tools()]) as rt:
        assert rt.plugins.registered_by("echo") == {"provider": ["echo"]}
        definition = {"name": "adder", "model": "echo:echo-1", "tools": ["add"]}
        run = await rt.start_agent(definition, prompt='call add {"a": 2, "b": 3}')
        result = await run.result()
        records = await rt.records(result.instance_id)
    assert (result.state, result.stop_reason) == (loopwright.State.WAITING, loopwright.StopReason.WAITING)
    assert result.text == "add returned 5"
    assert result.usage.requests == 2
    assert result.cost.amount is None  # no price known for echo:echo-1
    calls = [r["data"] for r in records if r["kind"] == "tool_call"]
    assert [(c["tool"], c["status"]) for c in calls] == [("add", "success")]


@pytest.mark.anyio
async def test_malformed_arguments_reach_the_model_as_invalid_arguments(
    tmp_path: Path, echo_server: EchoServer,
) -> None:
    """Arguments the model botched give an invalid_arguments result, and the run goes on."""
    async with loopwright.Runtime(assembly(tmp_path, echo_server), plugins=[Tools()]) as rt:
        run = await rt.start_agent({"name": "adder", "model": "echo:echo-1", "tools": ["add"]},
                                   prompt="call add {oops")
        result = await run.result()
        records = await rt.records(result.instance_id)
    assert [r["data"]["status"] for r in records if r["kind"] == "tool_call"] == ["invalid_arguments"]
    assert result.text is not None
    assert result.text.startswith("add returned the arguments are not a valid JSON object: {oops")


@pytest.mark.anyio
@pytest.mark.parametrize(("options", "pricing", "cost"), [
    ({"free": True}, {}, 0.0),
    ({}, {"echo:echo-1": {"input": 1_000_000, "output": 2_000_000}}, 1 * 1 + 2 * 2),
])
async def test_prices(tmp_path: Path, echo_server: EchoServer, options: dict, pricing: dict, cost: float) -> None:
    """``free: true`` prices calls at 0; a pricing override prices them per million tokens."""
    asm = assembly(tmp_path, echo_server, **options)
    asm = Assembly(store=asm.store, providers=asm.providers, pricing=pricing)
    async with loopwright.Runtime(asm) as rt:
        run = await rt.start_agent({"name": "parrot", "model": "echo:echo-1"}, prompt="hi")
        result = await run.result()
    assert (result.usage.input_tokens, result.usage.output_tokens) == (1, 2)  # "hi" in, "echo: hi" out
    assert result.cost.amount == pytest.approx(cost)


@pytest.mark.anyio
async def test_stream_true_gives_text_deltas(tmp_path: Path, echo_server: EchoServer) -> None:
    """With ``stream: true`` the default Provider.stream() is used: the answer comes as one text_delta."""
    async with loopwright.Runtime(assembly(tmp_path, echo_server, stream=True)) as rt:
        run = await rt.start_agent({"name": "parrot", "model": "echo:echo-1"}, prompt="hi")
        kinds = [(event.kind, dict(event.data).get("delta")) async for event in run.events()]
        result = await run.result()
    assert ("text_delta", "echo: hi") in kinds
    assert result.text == "echo: hi"


def test_the_example_assembly_runs_from_the_cli(tmp_path: Path, echo_server: EchoServer) -> None:
    """examples/ runs with ``loopwright run``: a text answer, then a task_complete call."""
    shutil.copytree(EXAMPLES, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "loopwright.yaml"
    config.write_text(config.read_text().replace("http://127.0.0.1:8765", echo_server.url))

    def run(prompt: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "loopwright.cli", "run", "agents/parrot.yaml", "-p", prompt, "--json"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    answer = run("hello")
    assert (answer["state"], answer["text"]) == ("waiting", "echo: hello")
    assert answer["cost"] > 0
    finished = run('call task_complete {"result": "done", "summary": "finished at once"}')
    assert (finished["state"], finished["stopReason"], finished["text"]) == ("stopped", "completed", "done")
