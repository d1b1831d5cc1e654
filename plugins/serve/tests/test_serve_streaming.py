"""A provider's stream deltas reach every serve consumer as they arrive (issue 27).

End to end: ``loopwright serve`` runs in a subprocess over an ``openai`` provider pointed at a
fake model server in this process (:mod:`_gated_model`), which streams its answer in pieces and
stops at gates. Each test checks, with the protocol's official client, that the client has
received its first pieces while the model still holds the rest (the gate is not open yet), and
only then lets the model go on: checked by events, never by sleeps. The clients: ``openai``
(``/openai/v1``), ``a2a-sdk`` (``/a2a``), ag-ui-protocol's event models (``/agui``), and the
serve API's own SSE stream (``/v1/instances/{id}/events``).

Then, in process: the live channel's bounds (coalescing, dropping a slow follower's deltas with
a ``gap``), and that a follower nobody reads never holds up a real run.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from _gated_model import GUARD, Gate, GatedModel, Piece, Streamed, gated_model
from _protocols_testlib import transcript
from _serve_testlib import Server, serving
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_text_parts, new_text_part
from a2a.types.a2a_pb2 import Message as A2AMessage
from a2a.types.a2a_pb2 import Role, SendMessageRequest, TaskState
from ag_ui.core import (
    Event,
    EventType,
    RunAgentInput,
    TextMessageContentEvent,
    UserMessage,
)
from pydantic import TypeAdapter

import loopwright
from loopwright import ModelRequest, ModelResponse, StreamDelta, Usage, hookimpl
from loopwright.abc import Provider, ProviderSettings
from loopwright_serve._deltas import LiveChannel, LiveEvent, Subscription

TOOLS = '''\
import loopwright


@loopwright.tool(parallel_safe=True)
def echo(text: str) -> str:
    """Return the text."""
    return f"echo: {text}"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(echo)
'''

AG_UI_EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


@pytest.fixture(scope="module")
def model() -> Iterator[GatedModel]:
    with gated_model() as running:
        yield running


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, model: GatedModel) -> Path:
    """Two agents on the gated model: ``talker`` (the surfaces ask it to stream) and ``streamer`` (its
    provider streams whoever starts it, as the serve API does)."""
    root = tmp_path_factory.mktemp("streaming")
    (root / "agents").mkdir()
    (root / "tools.py").write_text(TOOLS)
    (root / "agents" / "talker.yaml").write_text("name: talker\nmodel: gated:gpt-test\ntools: [echo]\n")
    (root / "agents" / "streamer.yaml").write_text("name: streamer\nmodel: live:gpt-test\ntools: [echo]\n")
    assembly = root / "loopwright.yaml"
    assembly.write_text(textwrap.dedent(f"""\
        store: {{kind: file, path: ./store}}
        plugins: [tools.py]
        providers:
          gated: {{kind: openai, baseUrl: "{model.url}", apiKey: test-key}}
          live: {{kind: openai, baseUrl: "{model.url}", apiKey: test-key, stream: true}}
        agentDefinitions: {{talker: agents/talker.yaml, streamer: agents/streamer.yaml}}
        """))
    return assembly


@pytest.fixture(scope="module")
def server(project: Path) -> Iterator[Server]:
    with serving(project) as running:
        yield running


def _openai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key="no-token-here", max_retries=0, timeout=GUARD)


# ---------------------------------------------------------------------------------------------
# /openai/v1
# ---------------------------------------------------------------------------------------------


def test_openai_sends_a_chunk_per_delta_while_the_model_still_streams(server: Server, model: GatedModel) -> None:
    """Two content chunks reach the ``openai`` client while the model holds its last tokens; then the rest."""
    first, second = Gate(), Gate()
    model.enqueue(Streamed(["The answer", first, " is", second, " forty", "-two."]))
    stream = _openai(server).chat.completions.create(
        model="loopwright/talker", messages=[{"role": "user", "content": "what is it?"}], stream=True,
        stream_options={"include_usage": True})
    chunks = iter(stream)
    assert next(chunks).choices[0].delta.role == "assistant"
    assert next(chunks).choices[0].delta.content == "The answer"
    first.wait_reached()
    first.open()
    assert next(chunks).choices[0].delta.content == " is"
    second.wait_reached()  # two chunks are in, and the model has not sent " forty" yet
    assert not second.opened.is_set()
    second.open()
    rest = list(chunks)
    with_choices = [c for c in rest if c.choices]
    assert [c.choices[0].delta.content for c in with_choices if c.choices[0].delta.content] == [" forty", "-two."]
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert rest[-1].choices == []
    assert rest[-1].usage is not None
    assert rest[-1].usage.total_tokens == 18
    assert model.bodies[-1]["stream"] is True  # the surface asked the provider to stream


def test_openai_streams_the_agents_tool_call_as_it_streams(server: Server, model: GatedModel, project: Path,
                                                           ) -> None:
    """The agent's own call streams under ``agent_tool_calls`` (name, then argument pieces), never ``tool_calls``."""
    started, half = Gate(), Gate()
    model.enqueue(
        Streamed([Piece(0, name="echo", id="call_e"), started, Piece(0, '{"text":'), half, Piece(0, ' "hi"}')],
                 finish="tool_calls"),
        Streamed(["it said ", "hi"]))
    raw = _openai(server).chat.completions.with_raw_response.create(
        model="loopwright/talker", messages=[{"role": "user", "content": "echo hi"}], stream=True)
    instance_id = raw.headers["x-loopwright-instance"]
    chunks = iter(raw.parse())

    def agent_calls(chunk: Any) -> list[dict[str, Any]]:
        assert chunk.choices[0].delta.tool_calls is None
        return (chunk.choices[0].delta.model_extra or {}).get("agent_tool_calls", [])

    assert next(chunks).choices[0].delta.role == "assistant"
    (start,) = agent_calls(next(chunks))
    assert (start["index"], start["id"], start["function"]["name"]) == (0, "call_e", "echo")
    started.wait_reached()
    started.open()
    (piece,) = agent_calls(next(chunks))
    assert piece == {"index": 0, "function": {"arguments": '{"text":'}}
    half.wait_reached()  # the start and one piece are in; the model holds the rest of the arguments
    half.open()
    rest = list(chunks)
    pieces = [call["function"]["arguments"] for c in rest if c.choices for call in agent_calls(c)]
    assert pieces == [' "hi"}']
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == "it said hi"
    assert [m["content"] for m in transcript(project, instance_id) if m["role"] == "tool"] == ["echo: hi"]


def test_openai_streams_the_answer_of_an_instance_it_continues(server: Server, model: GatedModel) -> None:
    """A request naming a resting instance (``x-loopwright-instance``) streams that instance's next answer too."""
    model.enqueue(Streamed(["first answer"]))
    raw = _openai(server).chat.completions.with_raw_response.create(
        model="loopwright/talker", messages=[{"role": "user", "content": "hello"}], stream=True)
    instance_id = raw.headers["x-loopwright-instance"]
    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices) == "first answer"
    gate = Gate()
    model.enqueue(Streamed(["second", gate, " answer"]))
    stream = _openai(server).chat.completions.create(
        model="loopwright/talker", messages=[{"role": "user", "content": "and then?"}], stream=True,
        extra_headers={"x-loopwright-instance": instance_id})
    chunks = iter(stream)
    assert next(chunks).model_extra["metadata"]["instance_id"] == instance_id
    assert next(chunks).choices[0].delta.content == "second"
    gate.wait_reached()  # the piece is in; the model holds the rest
    gate.open()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " answer"
    assert model.bodies[-1]["stream"] is True


# ---------------------------------------------------------------------------------------------
# The serve API's event stream
# ---------------------------------------------------------------------------------------------


def _sse(response: httpx.Response) -> Iterator[dict[str, str]]:
    """Yield each SSE event's fields as it arrives (``retry`` alone is an event too, here)."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if fields:
            yield fields
        fields = {}


def test_the_serve_event_stream_sends_text_deltas_without_ids(server: Server, model: GatedModel) -> None:
    """``text_delta`` events (``{"turn", "delta"}``, no ``id:``) arrive while the model streams; the durable
    ``transcript`` event, with its id, carries the whole message after them."""
    held, first, second = Gate(), Gate(), Gate()
    model.enqueue(Streamed([held, "Hello", first, " wide", second, " world"]))
    with server.client() as http:
        started = http.post("/v1/instances", json={"definition": "streamer", "prompt": "greet"})
        assert started.status_code == 201, started.text
        instance_id = started.json()["instanceId"]
        held.wait_reached()  # the model got the request and holds its answer
        with http.stream("GET", f"/v1/instances/{instance_id}/events", timeout=GUARD) as response:
            assert response.status_code == 200
            events = _sse(response)
            assert "retry" in next(events)  # subscribed: the stream is open
            held.open()
            deltas: list[dict[str, str]] = []
            for event in events:
                if event.get("event") == "text_delta":
                    deltas.append(event)
                    if len(deltas) == 1:
                        first.wait_reached()
                        first.open()
                    elif len(deltas) == 2:
                        second.wait_reached()  # two deltas are in; the model holds " world"
                        second.open()
                if event.get("event") == "transcript" and json.loads(event["data"])["message"]["role"] == "assistant":
                    final = event
                    break
    assert [json.loads(e["data"]) for e in deltas] == [
        {"turn": 1, "delta": "Hello"}, {"turn": 1, "delta": " wide"}, {"turn": 1, "delta": " world"}]
    assert all("id" not in e for e in deltas)
    assert final["id"]
    assert json.loads(final["data"])["message"]["content"] == "Hello wide world"


def test_the_serve_event_stream_sends_a_tool_call_as_it_streams(server: Server, model: GatedModel) -> None:
    """``tool_call_start`` and ``tool_call_delta`` events (no ids) arrive while the model streams the call."""
    held, half = Gate(), Gate()
    model.enqueue(Streamed([held, Piece(0, name="echo", id="call_s"), Piece(0, '{"text":'), half, Piece(0, ' "x"}')],
                           finish="tool_calls"), Streamed(["done"]))
    with server.client() as http:
        started = http.post("/v1/instances", json={"definition": "streamer", "prompt": "echo x"})
        instance_id = started.json()["instanceId"]
        held.wait_reached()
        live: list[dict[str, str]] = []
        with http.stream("GET", f"/v1/instances/{instance_id}/events", timeout=GUARD) as response:
            events = _sse(response)
            assert "retry" in next(events)
            held.open()
            for event in events:
                if event.get("event") in ("tool_call_start", "tool_call_delta"):
                    live.append(event)
                    if len(live) == 2:  # the start and a piece are in; the model holds the rest
                        half.wait_reached()
                        half.open()
                if event.get("event") == "transcript" and json.loads(event["data"])["message"]["role"] == "tool":
                    break
    assert [(e["event"], json.loads(e["data"])) for e in live] == [
        ("tool_call_start", {"turn": 1, "id": "call_s", "name": "echo"}),
        ("tool_call_delta", {"turn": 1, "id": "call_s", "delta": '{"text":'}),
        ("tool_call_delta", {"turn": 1, "id": "call_s", "delta": ' "x"}'})]
    assert all("id" not in e for e in live)


# ---------------------------------------------------------------------------------------------
# AG-UI
# ---------------------------------------------------------------------------------------------


def test_agui_sends_text_message_content_per_delta(server: Server, model: GatedModel) -> None:
    """``TEXT_MESSAGE_START``, one ``TEXT_MESSAGE_CONTENT`` per piece while the model streams, ``TEXT_MESSAGE_END``."""
    first, second = Gate(), Gate()
    model.enqueue(Streamed(["Sunny", first, " and", second, " warm"]))
    thread = f"t-{uuid.uuid4().hex}"
    body = RunAgentInput(thread_id=thread, run_id="r1", state={}, tools=[], context=[], forwarded_props={},
                         messages=[UserMessage(id="u1", role="user", content="weather?")])
    seen: list[Any] = []
    with server.client() as http, http.stream(
            "POST", "/agui/talker", content=body.model_dump_json(by_alias=True),
            headers={"content-type": "application/json", "accept": "text/event-stream"}, timeout=GUARD) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            event = AG_UI_EVENTS.validate_json(line.removeprefix("data:").strip())
            seen.append(event)
            contents = [e for e in seen if isinstance(e, TextMessageContentEvent)]
            if isinstance(event, TextMessageContentEvent) and len(contents) == 1:
                first.wait_reached()
                first.open()
            elif isinstance(event, TextMessageContentEvent) and len(contents) == 2:
                second.wait_reached()  # two pieces are in; the model holds " warm"
                second.open()
            if event.type in (EventType.RUN_FINISHED, EventType.RUN_ERROR):
                break
    types = [e.type for e in seen]
    assert types[-1] == EventType.RUN_FINISHED
    start = types.index(EventType.TEXT_MESSAGE_START)
    assert types[start:start + 5] == [EventType.TEXT_MESSAGE_START, *[EventType.TEXT_MESSAGE_CONTENT] * 3,
                                      EventType.TEXT_MESSAGE_END]
    assert [e.delta for e in seen if isinstance(e, TextMessageContentEvent)] == ["Sunny", " and", " warm"]


# ---------------------------------------------------------------------------------------------
# A2A
# ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a2a_sends_artifact_updates_while_the_task_works(server: Server, model: GatedModel) -> None:
    """Appended ``answer`` artifact updates while the task works, then the whole answer, then ``completed``."""
    first, second = Gate(), Gate()
    model.enqueue(Streamed(["Paris", first, " is the", second, " capital"]))
    async with httpx.AsyncClient(timeout=GUARD) as http:
        client = await create_client(f"{server.url}/a2a/talker",
                                     client_config=ClientConfig(httpx_client=http, streaming=True))
        message = A2AMessage(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[new_text_part("capital?")])
        responses: list[Any] = []
        pieces = 0
        try:
            async for response in _sent(client, message):
                responses.append(response)
                if response.HasField("artifact_update") and not response.artifact_update.last_chunk:
                    pieces += 1
                    gate = first if pieces == 1 else second
                    await anyio.to_thread.run_sync(gate.wait_reached)
                    if pieces == 2:
                        assert not any(r.HasField("status_update") and r.status_update.status.state
                                       == TaskState.TASK_STATE_COMPLETED for r in responses)
                    gate.open()
        finally:
            await client.close()
    updates = [r.artifact_update for r in responses if r.HasField("artifact_update")]
    assert [(list(get_text_parts(u.artifact.parts)), u.append, u.last_chunk) for u in updates] == [
        (["Paris"], False, False), ([" is the"], True, False), ([" capital"], True, False),
        (["Paris is the capital"], False, True)]
    assert {u.artifact.artifact_id for u in updates} == {"answer"}
    states = [r.status_update.status.state for r in responses if r.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED  # answered, and nothing is open


async def _sent(client: Any, message: A2AMessage) -> AsyncIterator[Any]:
    async for response in client.send_message(SendMessageRequest(message=message)):
        yield response


# ---------------------------------------------------------------------------------------------
# The live channel's bounds
# ---------------------------------------------------------------------------------------------


def _delta(turn: int, text: str) -> LiveEvent:
    return LiveEvent(kind="text_delta", turn=turn, data={"delta": text})


def test_a_full_subscription_coalesces_the_deltas_of_a_turn() -> None:
    """Past ``max_events``, a delta joins the last one held: the follower reads every piece, merged."""
    sub = Subscription("i", max_events=3, max_chars=1000)
    for n in range(10):
        sub.push(_delta(1, str(n)))
    held = sub.drain()
    assert [e.delta for e in held] == ["0", "1", "23456789"]
    assert (sub.coalesced, sub.dropped) == (7, 0)


def test_past_its_characters_a_subscription_drops_the_turn_with_one_gap_then_delivers_the_next() -> None:
    """A slow follower past ``max_chars``: the rest of the turn is dropped, one ``gap`` says so, the next turn
    comes again; memory stays within the bound however much is pushed."""
    sub = Subscription("i", max_events=8, max_chars=10)
    for _ in range(1000):
        sub.push(_delta(1, "abcd"))
    sub.push(LiveEvent(kind="tool_call_start", turn=1, data={"id": "c", "name": "echo"}))
    sub.push(LiveEvent(kind="state", turn=1, data={"state": "running"}))
    sub.push(_delta(2, "nx"))
    held = sub.drain()
    assert [(e.kind, e.turn, e.delta) for e in held] == [
        ("text_delta", 1, "abcd"), ("text_delta", 1, "abcd"), ("gap", 1, ""), ("state", 1, ""),
        ("text_delta", 2, "nx")]
    assert sub.dropped == 999


def test_a_call_start_is_never_merged_a_full_queue_loses_its_turn_and_a_reset_brings_the_turn_back() -> None:
    """A call start does not join a delta (a full queue loses the turn instead); after ``stream_reset`` the
    lost turn's new pieces come again."""
    sub = Subscription("i", max_events=1, max_chars=100)
    sub.push(LiveEvent(kind="tool_call_start", turn=None, data={"id": "a", "name": "echo"}))
    sub.push(LiveEvent(kind="tool_call_start", turn=1, data={"id": "b", "name": "echo"}))
    sub.push(_delta(1, "lost"))
    sub.push(LiveEvent(kind="stream_reset", turn=1))
    assert [(e.kind, e.turn, e.data.get("id")) for e in sub.drain()] == [
        ("tool_call_start", None, "a"), ("gap", 1, None), ("stream_reset", 1, None)]
    sub.push(_delta(1, "again"))
    assert [(e.kind, e.turn, e.delta) for e in sub.drain()] == [("text_delta", 1, "again")]


def test_a_drained_subscription_takes_deltas_again_and_a_closed_one_none() -> None:
    """Draining frees the bound; after ``close`` nothing more is held and ``get`` returns at once."""
    sub = Subscription("i", max_events=2, max_chars=100)
    sub.push(_delta(1, "a"))
    sub.push(_delta(1, "b"))
    assert [e.delta for e in sub.drain()] == ["a", "b"]
    sub.push(_delta(1, "c"))
    sub.close()
    sub.push(_delta(1, "d"))
    assert [e.delta for e in anyio.run(sub.get)] == ["c"]
    assert anyio.run(sub.get) == []


class _Chatty(Provider):
    """Streams ``pieces`` deltas of ``size`` characters per answer (a model far faster than its follower)."""

    free = True

    def __init__(self, pieces: int, size: int) -> None:
        self.pieces, self.size = pieces, size

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("the test asks for streaming")

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamDelta]:
        for _ in range(self.pieces):
            yield StreamDelta(kind="text", text="x" * self.size)
        message = loopwright.Message(role="assistant", content="x" * (self.pieces * self.size))
        yield StreamDelta(kind="done", response=ModelResponse(
            message=message, usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2, requests=1),
            finish_reason="stop"))


class _ChattyPlugin:
    @hookimpl
    def loopwright_register_providers(self, register: Any) -> None:
        def factory(settings: ProviderSettings) -> Provider:
            return _Chatty(5000, 100)

        register("chatty", factory)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_follower_nobody_reads_never_holds_up_the_run(tmp_path: Path) -> None:
    """A real run streams 500,000 characters to a subscription nobody drains: the run rests, and the
    subscription holds at most its bounds (the rest was dropped, with a gap)."""
    channel = LiveChannel(max_events=64, max_chars=4096)
    assembly = loopwright.Assembly(store=loopwright.StoreConfig(kind="file", options={"path": str(tmp_path / "s")}))
    async with loopwright.Runtime(assembly, plugins=[_ChattyPlugin(), channel], autoload=False) as rt:
        sub = channel.subscribe("chatty-1")
        run = await rt.start_agent({"name": "c", "model": "chatty:m"}, prompt="talk", stream=True,
                                   instance_id="chatty-1")
        with anyio.fail_after(GUARD):
            result = await run.result()
        held = sub.drain()
    assert result.text is not None
    assert len(result.text) == 500_000
    deltas = [e for e in held if e.kind == "text_delta"]
    assert sum(len(e.delta) for e in deltas) <= 4096
    assert len(held) <= 64 + 3
    assert [e.kind for e in held if e.kind == "gap"] == ["gap"]
    assert sub.dropped > 0
    assert [e.data["state"] for e in held if e.kind == "state"][-1] == "waiting"


def _chunks_of(frames: list[str]) -> list[dict[str, Any]]:
    return [json.loads(frame.removeprefix("data: ")) for frame in frames]


def test_a_streamed_answer_sends_what_its_client_missed_and_numbers_calls_per_stream() -> None:
    """After a gap, the chunk after the rest carries what the last turn's pieces missed; a call id the model
    repeats in a later turn is another call, with its own index."""
    from loopwright_serve._openai_compat import _Chunks, _Streamed  # noqa: PLC0415 - the surface's own parts

    streamed = _Streamed(_Chunks("chatcmpl-x", 1, "loopwright/talker"))
    sent = [*streamed.frames(LiveEvent(kind="tool_call_start", turn=1, data={"id": "call_0", "name": "echo"})),
            *streamed.frames(LiveEvent(kind="tool_call_start", turn=2, data={"id": "call_0", "name": "echo"})),
            *streamed.frames(LiveEvent(kind="tool_call_delta", turn=2, data={"id": "call_0", "delta": "{}"})),
            *streamed.frames(_delta(3, "The answer")), *streamed.frames(LiveEvent(kind="gap", turn=3)),
            *streamed.frames(_delta(3, " is lost"))]
    calls = [c["choices"][0]["delta"].get("agent_tool_calls") for c in _chunks_of(sent)]
    assert [call[0]["index"] for call in calls if call] == [0, 1, 1]
    assert [c["choices"][0]["delta"].get("content") for c in _chunks_of(sent)][-1] == "The answer"
    assert streamed.rest_of("The answer is 42.") == " is 42."
    assert streamed.rest_of("The answer") == ""
    assert streamed.rest_of("Something else") == "\n\nSomething else"
