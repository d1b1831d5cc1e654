"""Behaviours of a model turn that a mutation pass over ``_engine/_turn.py`` found untested.

Each test states a documented behaviour (docs/concepts.md, docs/hooks.md, docs/cli.md) and
checks it: a reply's tool-call ids made unique, arguments that are not plain JSON, the text of a
``Respond`` that is not a string, the context size the header keeps, a turn's latency.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import RUNTIME_ID, Harness, defn, make_runtime, records_of, reply, result_for, run_to_rest

import loopwright
from loopwright import (
    Message,
    ModelRequest,
    ModelResponse,
    Respond,
    StreamDelta,
    ToolCall,
    ToolStatus,
    Usage,
    hookimpl,
)
from loopwright.abc import Provider
from loopwright.errors import ProviderError

pytestmark = pytest.mark.anyio


def _note_tool(log: list[Any]) -> loopwright.Tool:
    """Return a ``note(x)`` tool that appends ``x`` to ``log`` and answers ``noted X``."""

    @loopwright.tool
    def note(x: float) -> str:
        """Write down a number."""
        log.append(x)
        return f"noted {x}"

    return note


def _calls_reply(*calls: ToolCall, model: str | None = None) -> ModelResponse:
    """Return a reply with ``calls``; ``model`` sets the message's own ``model`` as a provider may."""
    return ModelResponse(message=Message(role="assistant", content=None, tool_calls=calls, model=model),
                         usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2, requests=1),
                         finish_reason="tool_calls")


# ------------------------------------------------------------------------------------------
# Tool-call ids: each call of a reply gets exactly one result
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [None, "s:m"], ids=["no-model", "message-names-the-served-model"])
@pytest.mark.parametrize("ids", [("same", "same"), ("", "b")], ids=["repeated", "empty"])
async def test_calls_with_a_repeated_or_an_empty_id_get_unique_ids(
    tmp_path: Path, ids: tuple[str, str], model: str | None,
) -> None:
    """A repeated id alone, or an empty id alone, is made unique: both calls run, each with one result.

    Also when the provider's message already names the model that served it (nothing else of the
    message then needs changing, but the ids still do).
    """
    log: list[Any] = []
    note = _note_tool(log)
    calls = tuple(ToolCall(id=i, name="note", arguments={"x": k}) for k, i in enumerate(ids, 1))
    h = Harness(_calls_reply(*calls, model=model), reply("done"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note]))
    assert result.text == "done"
    assistant = next(m for m in run.inst.transcript if m.role == "assistant")
    kept = [c.id for c in assistant.tool_calls]
    assert len(set(kept)) == 2
    assert all(RUNTIME_ID.match(cid) for cid in kept)
    # On the wire: a fresh model id is kept; the repeat or the empty one sends the runtime's id.
    wire = [c.provider_id for c in assistant.tool_calls]
    expected = ["same", kept[1]] if ids == ("same", "same") else [kept[0], "b"]
    assert wire == expected
    assert len(set(wire)) == 2
    assert all(wire)
    assert assistant.model == "s:m"
    assert sorted(log) == [1, 2]
    for cid, wid in zip(kept, wire, strict=True):
        (answer,) = [m for m in run.inst.transcript if m.role == "tool" and m.tool_call_id == cid]
        assert answer.status is ToolStatus.SUCCESS
        assert result_for(run.inst.transcript, wid) == answer


# ------------------------------------------------------------------------------------------
# Arguments that are not plain JSON
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [None, "s:m"], ids=["no-model", "message-names-the-served-model"])
async def test_a_nan_argument_is_invalid_and_kept_as_text(tmp_path: Path, model: str | None) -> None:
    """A call whose decoded arguments hold NaN gets ``invalid_arguments``; the transcript keeps them as text.

    The call beside it in the same reply, with plain JSON arguments, runs as usual.
    """
    log: list[Any] = []
    note = _note_tool(log)
    bad = ToolCall(id="bad", name="note", arguments={"x": float("nan")})
    good = ToolCall(id="good", name="note", arguments={"x": 2})
    h = Harness(_calls_reply(bad, good, model=model), reply("done"), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note]))
    assert result.text == "done"
    assert log == [2]
    assert result_for(run.inst.transcript, "bad").status is ToolStatus.INVALID_ARGUMENTS
    assert result_for(run.inst.transcript, "good").status is ToolStatus.SUCCESS
    assistant = next(m for m in run.inst.transcript if m.role == "assistant")
    by_id = {c.provider_id: c for c in assistant.tool_calls}
    assert all(RUNTIME_ID.match(c.id) for c in assistant.tool_calls)
    assert by_id["bad"].arguments == {}
    assert "NaN" in (by_id["bad"].raw_arguments or "")
    assert (by_id["good"].arguments, by_id["good"].raw_arguments) == ({"x": 2}, None)


# ------------------------------------------------------------------------------------------
# before_inference Respond
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [{"answer": 42, "sure": True}, [1, 2]], ids=["object", "array"])
async def test_a_respond_with_a_json_value_answers_with_its_json_text(tmp_path: Path, content: Any) -> None:
    """``Respond(content)`` in before_inference makes content the answer, and the model is not called.

    A content that is not a string (any JSON value) becomes the answer's JSON text.
    """

    class Canned:
        @hookimpl
        def loopwright_before_inference(self, request: loopwright.ModelRequest) -> Any:
            return Respond(content)

    h = Harness()
    async with make_runtime(tmp_path, h, Canned()) as rt:
        run, result = await run_to_rest(rt, defn())
    assert h.requests == []
    assert isinstance(result.text, str)
    assert json.loads(result.text) == content
    assert run.inst.transcript[-1].content == result.text


# ------------------------------------------------------------------------------------------
# The context size (contextTokens) and a turn's latency
# ------------------------------------------------------------------------------------------


async def test_the_header_keeps_the_last_counted_calls_input_tokens_as_the_context_size(tmp_path: Path) -> None:
    """``contextTokens`` is the input tokens of the last model call that reported them.

    A call without token counts (``unreported_requests``) leaves it as it was.
    """
    counted = Usage(input_tokens=40, output_tokens=2, total_tokens=42, requests=1)
    uncounted = Usage(requests=1, unreported_requests=1)
    log: list[Any] = []
    note = _note_tool(log)
    h = Harness(reply(None, ToolCall(id="n", name="note", arguments={"x": 1}), usage=counted),
                reply("done", usage=uncounted), tools=[note])
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[note]))
        header = await rt.store.read_header(run.instance_id)
    assert result.text == "done"
    assert result.usage.unreported_requests == 1
    assert header["contextTokens"] == 40


async def test_a_turn_record_holds_the_model_calls_latency(tmp_path: Path) -> None:
    """The ``turn`` record's ``latency`` is the seconds the model call took: not negative, within the run."""
    h = Harness(reply("done"))
    async with make_runtime(tmp_path, h) as rt:
        t0 = time.perf_counter()
        run, _ = await run_to_rest(rt, defn())
        whole = time.perf_counter() - t0
        (record,) = records_of(await rt.records(run.instance_id), "turn")
    assert 0.0 <= record["latency"] <= whole


# ------------------------------------------------------------------------------------------
# The gateway's streams (a pass over _engine/_gateway.py)
# ------------------------------------------------------------------------------------------


class _Streamer(Provider):
    """Streams each scripted reply as one text delta, its tool-call starts, then ``done``.

    ``done`` is the delta kind as a string built at run time, as a provider decoding it from
    the wire would have it (equal to the literal, not the same object).
    """

    free = True

    def __init__(self, script: list[ModelResponse]) -> None:
        self.script = script

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("complete() called on a streaming request")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamDelta]:
        response = self.script.pop(0)
        if response.message.content:
            yield StreamDelta(kind="text", text=response.message.content)
        for c in response.message.tool_calls:
            yield StreamDelta(kind="tool_call", tool_call_id=c.id, name=c.name)
        kind = json.loads('{"type": "done"}')["type"]  # decoded, as from a wire event
        yield StreamDelta(kind=kind, response=response)


class _StreamPlugin:
    def __init__(self, script: list[ModelResponse], tools: tuple[loopwright.Tool, ...]) -> None:
        self.script = script
        self.tools = tools

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        register("st", lambda _settings: _Streamer(self.script))

    @hookimpl
    def loopwright_register_tools(self, register: Callable[..., None]) -> None:
        register(*self.tools)


async def test_stream_events_carry_their_turn_and_a_decoded_done_ends_the_stream(tmp_path: Path) -> None:
    """Stream events name the turn they belong to (from 1); a ``done`` delta gives the turn its answer.

    Two streamed turns: the first's tool-call start is turn 1, the second's text is turn 2.
    """
    log: list[Any] = []
    note = _note_tool(log)
    script = [reply(None, ToolCall(id="n", name="note", arguments={"x": 1})), reply("all done")]
    async with make_runtime(tmp_path, _StreamPlugin(script, (note,))) as rt:
        run = await rt.start_agent(defn(model="st:m", tools=(note,)), prompt="go", stream=True)
        events = [(e.kind, e.turn, dict(e.data)) async for e in run.events()]
        result = await run.result()
    assert result.text == "all done"
    assert log == [1]
    assert ("tool_call_start", 1, {"id": "n", "name": "note"}) in events
    assert ("text_delta", 2, {"delta": "all done"}) in events
    assert [t for k, t, _ in events if k in ("tool_call_start", "text_delta")] == [1, 2]


# ------------------------------------------------------------------------------------------
# The journal: records before a resting header (a pass over _engine/_journal.py)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "rest", "kind"), [
    (reply("done"), "waiting", "turn"),
    (ProviderError("bad request", provider="s", model="m", status=400), "error", "error"),
], ids=["waiting", "error"])
async def test_the_records_are_on_disk_before_the_header_says_the_instance_rests(
    tmp_path: Path, answer: Any, rest: str, kind: str,
) -> None:
    """What happened before an instance rests is saved before its header says it rests (docs/crash-safety.md).

    At the header write that says ``waiting`` (or ``error``), the turn's record (or the failed
    model call's ``error`` record) is already in the record log.
    """
    seen: list[tuple[str, list[str]]] = []
    h = Harness(answer)
    async with make_runtime(tmp_path, h) as rt:
        store = rt.store
        write = store.write_header

        async def watched(instance_id: str, header: Any) -> None:
            if header.get("state") != "running":
                kinds = [r["kind"] for r in await store.read_records(instance_id)]
                seen.append((str(header.get("state")), kinds))
            await write(instance_id, header)

        store.write_header = watched  # type: ignore[method-assign]
        _run, result = await run_to_rest(rt, defn())
    assert result.state.value == rest
    assert seen
    state, kinds = seen[0]
    assert state == rest
    assert kind in kinds
