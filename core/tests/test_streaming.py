"""Streaming through the runtime: deltas become events, the final answer drives the loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Harness, call, defn, make_runtime, reply

import loopwright
from loopwright import ModelRequest, ModelResponse, StreamDelta, hookimpl
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ProviderError, RunError

pytestmark = pytest.mark.anyio


class Streamer(Provider):
    """Streams scripted answers in pieces; ``complete`` must not be used when streaming."""

    free = True

    def __init__(self, script: list[Any], requests: list[ModelRequest]) -> None:
        self.script = script
        self.requests = requests

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("complete() called on a streaming request")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamDelta]:
        self.requests.append(request)
        item = self.script.pop(0)
        if isinstance(item, Exception):
            yield StreamDelta(kind="text", text="partial ")
            raise item
        response: ModelResponse = item
        text = response.message.content or ""
        for k in range(0, len(text), 3):
            yield StreamDelta(kind="text", text=text[k:k + 3])
        for c in response.message.tool_calls:
            yield StreamDelta(kind="tool_call", tool_call_id=c.id, name=c.name)
            yield StreamDelta(kind="arguments", tool_call_id=c.id, text="{}")
        if item is not None and not getattr(self, "drop_done", False):
            yield StreamDelta(kind="done", response=response)


class Plugin:
    def __init__(self, script: list[Any], tools: tuple[Any, ...] = ()) -> None:
        self.script = script
        self.requests: list[ModelRequest] = []
        self.tools = tools
        self.made: list[Streamer] = []

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        def factory(settings: ProviderSettings) -> Provider:
            p = Streamer(self.script, self.requests)
            self.made.append(p)
            return p
        register("st", factory)

    @hookimpl
    def loopwright_register_tools(self, register: Callable[..., None]) -> None:
        if self.tools:
            register(*self.tools)


@loopwright.tool
def ping() -> str:
    """Answer pong."""
    return "pong"


async def test_stream_deltas_become_events_and_the_answer_drives_the_loop(tmp_path: Path) -> None:
    """With stream=True, text deltas and tool-call starts are events, and the turn runs on the final answer."""
    plugin = Plugin([reply(None, call("ping", "p1")), reply("all done here")], tools=(ping,))
    async with make_runtime(tmp_path, plugin) as rt:
        run = await rt.start_agent(defn(model="st:m", tools=(ping,)), prompt="go", stream=True)
        kinds = [(e.kind, dict(e.data)) async for e in run.events()]
        result = await run.result()
    assert result.text == "all done here"
    deltas = "".join(d["delta"] for k, d in kinds if k == "text_delta")
    assert deltas == "all done here"
    assert ("tool_call_start", {"id": "p1", "name": "ping"}) in kinds
    assert all(r.stream for r in plugin.requests)


async def test_provider_stream_option_turns_streaming_on(tmp_path: Path) -> None:
    """`stream: true` on a provider entry makes its calls stream, and the option is not passed on."""
    plugin = Plugin([reply("hi")])
    providers = {"live": loopwright.ProviderConfig(kind="st", options={"stream": True})}
    async with make_runtime(tmp_path, plugin, providers=providers) as rt:
        run = await rt.start_agent(defn(model="live:m"), prompt="go")
        result = await run.result()
    assert result.text == "hi"
    assert plugin.requests[0].stream is True


async def test_default_stream_falls_back_to_complete(tmp_path: Path) -> None:
    """A provider without its own stream() still serves streaming runs through complete()."""
    h = Harness(reply("whole answer"))
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(), prompt="go", stream=True)
        kinds = [e.kind async for e in run.events()]
        result = await run.result()
    assert result.text == "whole answer"
    assert "text_delta" in kinds


async def test_a_broken_stream_is_a_provider_failure_that_falls_back(tmp_path: Path) -> None:
    """A stream that fails mid-way is a model failure: the fallback model serves the turn."""
    plugin = Plugin([ProviderError("connection reset", provider="st", transient=True), reply("from fallback")])
    async with make_runtime(tmp_path, plugin) as rt:
        run = await rt.start_agent(defn(model="st:a", fallback_models=("st:b",)), prompt="go", stream=True)
        result = await run.result()
        records = await rt.records(result.instance_id)
    assert result.text == "from fallback"
    turn = next(r for r in records if r["kind"] == "turn")
    assert turn["data"]["model"] == "st:b"


async def test_a_stream_without_its_final_answer_fails_the_run(tmp_path: Path) -> None:
    """A stream that ends without a done delta fails the model call with a clear error."""
    plugin = Plugin([reply("cut short")])
    async with make_runtime(tmp_path, plugin) as rt:
        run = await rt.start_agent(defn(model="st:m"), prompt="go", stream=True)
        plugin_provider = rt.provider("st")
        plugin_provider.drop_done = True  # type: ignore[attr-defined]
        with pytest.raises(RunError) as info:
            await run.result()
    assert "final answer" in str(info.value)


async def test_a_retried_stream_tells_followers_to_start_over(tmp_path: Path) -> None:
    """When a stream that already showed text is tried again (a fallback), a stream_reset event comes first."""
    plugin = Plugin([ProviderError("cut", provider="st", transient=True), reply("second try")])
    async with make_runtime(tmp_path, plugin) as rt:
        run = await rt.start_agent(defn(model="st:a", fallback_models=("st:b",)), prompt="go", stream=True)
        kinds = [e.kind async for e in run.events()]
        await run.result()
    first_delta = kinds.index("text_delta")
    assert kinds.index("stream_reset") > first_delta
    assert "text_delta" in kinds[kinds.index("stream_reset"):]


async def test_provider_data_is_saved_with_the_message(tmp_path: Path) -> None:
    """A message's provider_data survives a restart, for providers that must send it back."""
    answer = loopwright.ModelResponse(message=loopwright.Message(
        role="assistant", content="hi", provider_data={"st": {"signature": "abc"}}))
    h = Harness(answer)
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(), prompt="go")
        iid = (await run.result()).instance_id
    async with make_runtime(tmp_path, Harness()) as rt2:
        again = await rt2.get_agent(iid)
    assert again.inst.transcript[-1].provider_data == {"st": {"signature": "abc"}}
