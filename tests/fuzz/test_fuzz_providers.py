"""Fuzzing provider replies in both wire formats: every body ends in a ModelResponse or a ProviderError.

The formats: OpenAI Chat Completions and Responses (``loopwright-openai``) and Anthropic Messages
(``loopwright-anthropic``), each as a one-piece JSON body and as a server-sent event stream. The
inputs: valid replies cut at every byte offset; valid replies with parts replaced by random JSON
(the structure kept, the values not); and random bytes. The bulk goes through each provider's own
HTTP path with an ``httpx.MockTransport`` (so the SSE decoder, the stream assemblers and the body
decoders all run); one property serves its bodies from a real HTTP server on 127.0.0.1, chunked in
random pieces or cut off mid-body. ``complete`` must return a well-formed :class:`ModelResponse`
and ``stream`` must end in one ``done`` delta holding one, or either raises :class:`ProviderError`:
never another exception, never a hang.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import attrs
import httpx
import pytest
from fuzzing import HANG_GUARD, fuzz
from hypothesis import given
from hypothesis import strategies as st

from loopwright import Message, ModelRequest, ModelResponse, ToolSpec
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ProviderError
from loopwright_anthropic import AnthropicProvider
from loopwright_openai import OpenAIProvider

FINISH_REASONS = {"stop", "tool_calls", "length", "content_filter", "error"}
TOOLS = (ToolSpec(name="add", description="Add.", parameters={
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),)
REQUEST = ModelRequest(model="m", provider="p", messages=(Message(role="user", content="hi"),), tools=TOOLS)

# -- valid replies of each format -----------------------------------------------------------------------------

CHAT_BODY = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Adding.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}],
    }}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
              "prompt_tokens_details": {"cached_tokens": 1}},
}


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


CHAT_EVENTS: list[tuple[str | None, Any]] = [
    (None, _chunk({"role": "assistant", "content": ""})),
    (None, _chunk({"content": "Add"})),
    (None, _chunk({"content": "ing."})),
    (None, _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "add", "arguments": ""}}]})),
    (None, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1,'}}]})),
    (None, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"b":2}'}}]})),
    (None, _chunk({}, "tool_calls")),
    (None, {"id": "c1", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
    (None, "[DONE]"),
]

_MESSAGE_ITEM = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Adding.", "annotations": []}]}
_CALL_ITEM = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add",
              "arguments": '{"a":1,"b":2}', "status": "completed"}
RESPONSES_BODY = {
    "id": "resp_1", "object": "response", "created_at": 1, "model": "gpt-x", "status": "completed",
    "output": [_MESSAGE_ITEM, _CALL_ITEM], "incomplete_details": None, "error": None,
    "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5,
              "input_tokens_details": {"cached_tokens": 1}, "output_tokens_details": {"reasoning_tokens": 0}},
}
RESPONSES_EVENTS: list[tuple[str | None, Any]] = [(e["type"], e) for e in [
    {"type": "response.created", "sequence_number": 0, "response": {**RESPONSES_BODY, "status": "in_progress",
                                                                    "output": []}},
    {"type": "response.output_item.added", "output_index": 0, "item": {**_MESSAGE_ITEM, "content": []}},
    {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
     "delta": "Add"},
    {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
     "delta": "ing."},
    {"type": "response.output_item.done", "output_index": 0, "item": _MESSAGE_ITEM},
    {"type": "response.output_item.added", "output_index": 1, "item": {**_CALL_ITEM, "arguments": ""}},
    {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": '{"a":1,'},
    {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": '"b":2}'},
    {"type": "response.output_item.done", "output_index": 1, "item": _CALL_ITEM},
    {"type": "response.completed", "response": RESPONSES_BODY},
]]

ANTHROPIC_BODY = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
    "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 1, "cache_creation_input_tokens": 0},
}
ANTHROPIC_EVENTS: list[tuple[str | None, Any]] = [(e["type"], e) for e in [
    {"type": "message_start", "message": {**ANTHROPIC_BODY, "content": [], "stop_reason": None,
                                          "usage": {"input_tokens": 3, "output_tokens": 1}}},
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Adding."}},
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2,
     "content_block": {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"a":1,'}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '"b":2}'}},
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
     "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]]


@attrs.frozen
class Format:
    """One wire format: how to build its provider, and a valid body and stream."""

    name: str
    make: Callable[[ProviderSettings], Provider]
    options: dict[str, Any]
    body: Any
    events: list[tuple[str | None, Any]]


FORMATS = [
    Format("chat", OpenAIProvider, {}, CHAT_BODY, CHAT_EVENTS),
    Format("responses", OpenAIProvider, {"api": "responses"}, RESPONSES_BODY, RESPONSES_EVENTS),
    Format("anthropic", AnthropicProvider, {}, ANTHROPIC_BODY, ANTHROPIC_EVENTS),
]
IDS = [f.name for f in FORMATS]


def sse(events: list[tuple[str | None, Any]]) -> bytes:
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {name}\n" if name is not None else ""
        out.append(head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n")
    return "".join(out).encode()


# -- running one reply through a provider ---------------------------------------------------------------------


@attrs.define
class Served:
    """What the (mock or real) server answers next."""

    body: bytes = b""
    content_type: str = "application/json"
    status: int = 200


def check_response(response: Any) -> None:
    """A decoded answer is well formed: what the loop relies on."""
    assert isinstance(response, ModelResponse), response
    message = response.message
    assert message.role == "assistant"
    assert message.content is None or isinstance(message.content, str), message
    for call in message.tool_calls:
        assert isinstance(call.id, str), call
        assert isinstance(call.name, str), call
        assert isinstance(call.arguments, dict), call
        assert call.raw_arguments is None or isinstance(call.raw_arguments, str), call
    # A reason the API wrote that is none of the known ones is kept as written (the providers' docs).
    assert response.finish_reason in FINISH_REASONS or (
        response.finish_reason and response.finish_reason == response.raw_finish_reason), response
    for field in ("input_tokens", "output_tokens", "total_tokens"):
        value = getattr(response.usage, field)
        assert value is None or (isinstance(value, int) and value >= 0), response.usage


async def outcome(provider: Provider, *, stream: bool) -> str:
    """Run one request; return ``"answer"`` or ``"error"`` (a ProviderError). Anything else propagates."""
    request = attrs.evolve(REQUEST, stream=stream)
    try:
        with anyio.fail_after(HANG_GUARD):
            if not stream:
                check_response(await provider.complete(request))
                return "answer"
            done = [d async for d in provider.stream(request) if d.kind == "done"]
            assert len(done) == 1, done
            check_response(done[0].response)
            return "answer"
    except ProviderError as exc:
        message = str(exc)
    assert message  # an error says what went wrong
    return "error"


def settings(fmt: Format, base_url: str, client: httpx.AsyncClient | None) -> ProviderSettings:
    return ProviderSettings(name="p", kind=fmt.name, base_url=base_url, api_key="k", http_client=client,
                            options={"maxRetries": 0, "timeout": HANG_GUARD, **fmt.options})


def run_mock(fmt: Format, replies: list[Served], *, stream: bool) -> list[str]:
    """Serve each reply in turn through an ``httpx.MockTransport``, to a fresh provider each (so a quirk
    one reply teaches does not change how the next is read); return the outcomes."""
    current = Served()

    def handler(request: httpx.Request) -> httpx.Response:
        # Every request of one outcome gets its reply (a provider may fall back to a second request).
        return httpx.Response(current.status, content=current.body, headers={"content-type": current.content_type})

    async def main() -> list[str]:
        nonlocal current
        out = []
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            for served in replies:
                current = served
                provider = fmt.make(settings(fmt, "http://fuzz.invalid/v1", client))
                try:
                    out.append(await outcome(provider, stream=stream))
                finally:
                    await provider.aclose()
        return out

    return anyio.run(main)


def as_reply(fmt: Format, *, stream: bool, data: Any = None, raw: bytes | None = None) -> Served:
    if raw is not None:
        return Served(raw, "text/event-stream" if stream else "application/json")
    if stream:
        return Served(sse(data), "text/event-stream")
    return Served(json.dumps(data).encode())


# -- cut at every byte ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_a_valid_reply_cut_at_every_byte_ends_in_an_answer_or_a_provider_error(fmt: Format, stream: bool) -> None:
    """Every prefix of a valid reply (each byte offset, 0 to the whole) is an answer or a ProviderError;
    the whole reply is an answer, and a body cut short is never taken for one."""
    whole = as_reply(fmt, stream=stream, data=fmt.events if stream else fmt.body)
    replies = [Served(whole.body[:n], whole.content_type) for n in range(len(whole.body) + 1)]
    outcomes = run_mock(fmt, replies, stream=stream)
    assert outcomes[-1] == "answer"
    if not stream:
        assert set(outcomes[:-1]) == {"error"}  # a JSON body cut anywhere is not JSON


# -- structured random replies --------------------------------------------------------------------------------------

# Floats include NaN and infinity: json.dumps writes them as NaN/Infinity, which json.loads (and so a
# provider) accepts from a server.
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(),
                    st.text(max_size=12), st.sampled_from(["", "add", "call_1", "{", '{"a":', "[DONE]", "tool_use",
                                                           "tool_calls", "function", "stop", "text", "message"]))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


def variant(value: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """``value`` with random parts: each part kept, dropped (in a mapping), or replaced by random JSON."""
    if isinstance(value, dict) and depth < 6:
        same = st.fixed_dictionaries({}, optional={k: variant(v, depth + 1) for k, v in value.items()})
        return st.one_of(same, same, same, JSON)
    if isinstance(value, list) and depth < 6:
        same = st.lists(st.one_of(*[variant(v, depth + 1) for v in value]), max_size=len(value) + 1) \
            if value else st.just([])
        return st.one_of(same, same, same, JSON)
    return st.one_of(st.just(value), st.just(value), JSON)


def event_variants(events: list[tuple[str | None, Any]]) -> st.SearchStrategy[list[tuple[str | None, Any]]]:
    one = st.one_of(*[st.tuples(st.just(name), variant(data)) for name, data in events],
                    st.tuples(st.one_of(st.none(), st.text(max_size=8)), st.text(max_size=20)))
    return st.one_of(st.lists(one, max_size=len(events) + 2),
                     st.tuples(*[st.tuples(st.just(n), variant(d)) for n, d in events]).map(list))


#: The strategies of each format, built once (building one is slower than drawing from it).
BODIES = {f.name: variant(f.body) for f in FORMATS}
STREAMS = {f.name: event_variants(f.events) for f in FORMATS}


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@fuzz(100)
@given(data=st.data())
def test_random_bodies_end_in_an_answer_or_a_provider_error(fmt: Format, data: st.DataObject) -> None:
    body = data.draw(BODIES[fmt.name], label="body")
    run_mock(fmt, [as_reply(fmt, stream=False, data=body)], stream=False)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@fuzz(100)
@given(data=st.data())
def test_random_streams_end_in_an_answer_or_a_provider_error(fmt: Format, data: st.DataObject) -> None:
    events = data.draw(STREAMS[fmt.name], label="events")
    run_mock(fmt, [as_reply(fmt, stream=True, data=events)], stream=True)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@fuzz(100)
@given(raw=st.binary(max_size=300), stream=st.booleans(), status=st.sampled_from([200, 200, 200, 400, 429, 500]))
def test_random_bytes_end_in_an_answer_or_a_provider_error(fmt: Format, raw: bytes, stream: bool,
                                                          status: int) -> None:
    served = attrs.evolve(as_reply(fmt, stream=stream, raw=raw), status=status)
    run_mock(fmt, [served], stream=stream)


# -- through a real HTTP server ---------------------------------------------------------------------------------------


@attrs.define
class Wire:
    """What the real server writes next: a body in chunks, optionally cut off (the socket closed)."""

    served: Served = attrs.field(factory=Served)
    pieces: int = 1
    cut: bool = False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        wire = self.server.next_wire
        body = wire.served.body
        self.send_response(wire.served.status)
        self.send_header("Content-Type", wire.served.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        size = max(1, -(-len(body) // wire.pieces))
        for start in range(0, len(body), size):
            piece = body[start:start + size]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
        if wire.cut:
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    next_wire: Wire = Wire()


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@fuzz(30)
@given(data=st.data())
def test_replies_over_real_http_end_in_an_answer_or_a_provider_error(server: _Server, fmt: Format,
                                                                     data: st.DataObject) -> None:
    """Random and cut replies, in random chunks, over a real socket with the provider's own HTTP client."""
    stream = data.draw(st.booleans(), label="stream")
    kind = data.draw(st.sampled_from(["valid", "variant", "bytes"]), label="kind")
    if kind == "bytes":
        served = as_reply(fmt, stream=stream, raw=data.draw(st.binary(max_size=200), label="raw"))
    elif stream:
        events = fmt.events if kind == "valid" else data.draw(STREAMS[fmt.name], label="events")
        served = as_reply(fmt, stream=True, data=events)
    else:
        body = fmt.body if kind == "valid" else data.draw(BODIES[fmt.name], label="body")
        served = as_reply(fmt, stream=False, data=body)
    wire = Wire(served, pieces=data.draw(st.integers(1, 8), label="pieces"), cut=data.draw(st.booleans(), label="cut"))
    if wire.cut:
        keep = data.draw(st.integers(0, len(served.body)), label="keep")
        wire = attrs.evolve(wire, served=attrs.evolve(served, body=served.body[:keep]))
    server.next_wire = wire
    port = server.server_address[1]

    async def main() -> str:
        provider = fmt.make(settings(fmt, f"http://127.0.0.1:{port}/v1", None))
        try:
            return await outcome(provider, stream=stream)
        finally:
            await provider.aclose()

    result = anyio.run(main)
    if kind == "valid" and not wire.cut:
        assert result == "answer"


# -- what the fuzzers found (kept as plain regression tests) ----------------------------------------------------------


def test_a_responses_stream_item_that_is_not_an_object_is_ignored() -> None:
    """``response.output_item.done`` with ``item: true`` raised AttributeError in the stream assembler."""
    fmt = FORMATS[1]
    events = [(n, {**d, "item": True} if n == "response.output_item.done" else d) for n, d in fmt.events]
    assert run_mock(fmt, [as_reply(fmt, stream=True, data=events)], stream=True) == ["answer"]


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("count", [-1, -(10**6), float("inf"), float("-inf"), float("nan")])
def test_a_token_count_that_is_negative_or_not_finite_counts_as_not_sent(fmt: Format, count: float) -> None:
    """A negative count was taken as it was (it would refund a tree's budget); infinity raised OverflowError."""
    captured: list[ModelResponse] = []
    body = json.loads(json.dumps(fmt.body))
    key = "prompt_tokens" if fmt.name == "chat" else "input_tokens"
    body["usage"][key] = count

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(body).encode(), headers={"content-type": "application/json"})

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            provider = fmt.make(settings(fmt, "http://fuzz.invalid/v1", client))
            captured.append(await provider.complete(REQUEST))
            await provider.aclose()

    anyio.run(main)
    (response,) = captured
    check_response(response)
    assert response.usage.input_tokens >= 0
