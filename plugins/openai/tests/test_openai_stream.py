"""OpenAIProvider.stream against a real local HTTP server sending Chat Completions SSE."""

from __future__ import annotations

import json

import anyio
import pytest

import loopwright
import loopwright_openai
from loopwright._types import Message, ModelRequest, StreamDelta, ToolCall, ToolSpec
from loopwright.errors import ProviderError
from loopwright.http import AiohttpTransport, ShardedTransport

pytestmark = pytest.mark.anyio

ADD = ToolSpec(
    name="add", description="Add two integers.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)
TOOLS = (ADD,)
USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13,
         "prompt_tokens_details": {"cached_tokens": 2}}


def request(**kw) -> ModelRequest:
    kw.setdefault("messages", [Message(role="system", content="Be brief."), Message(role="user", content="Hi")])
    return ModelRequest(model="gpt-test", provider="oa", stream=True, **kw)


async def collect(provider, req=None) -> tuple[list[StreamDelta], StreamDelta]:
    with anyio.fail_after(10):
        deltas = [delta async for delta in provider.stream(req or request())]
    *pieces, done = deltas
    assert done.kind == "done"
    assert all(d.kind != "done" for d in pieces)
    return pieces, done


async def drain(stream, into: list[str]) -> None:
    """Read a stream, keeping each delta's text, until it ends or raises."""
    async for delta in stream:
        into.append(delta.text)  # noqa: PERF401 - keep what came before the failure


def call(index: int | None = None, call_id: str | None = None, name: str | None = None, arguments=None) -> dict:
    out: dict = {"type": "function", "function": {}}
    if index is not None:
        out["index"] = index
    if call_id is not None:
        out["id"] = call_id
    if name is not None:
        out["function"]["name"] = name
    if arguments is not None:
        out["function"]["arguments"] = arguments
    return out


def hello_events(fake) -> list:
    return [fake.chunk(""), fake.chunk("Hel"), fake.chunk("lo, "), fake.chunk("world."),
            fake.chunk(finish_reason="stop"), fake.chunk(choices=False, usage=USAGE)]


# -- text ----------------------------------------------------------------------------------------


async def test_text_streams_as_deltas_then_the_whole_answer(fake, make_provider):
    """Text arrives as deltas; the done delta carries the joined text, usage, finish reason and model."""
    fake.enqueue(fake.sse(*hello_events(fake)))
    async with make_provider() as provider:
        pieces, done = await collect(provider)
    assert [(d.kind, d.text) for d in pieces] == [("text", "Hel"), ("text", "lo, "), ("text", "world.")]
    response = done.response
    assert response.message == Message(role="assistant", content="Hello, world.", model="gpt-test-0001")
    assert (response.finish_reason, response.raw_finish_reason, response.model) == ("stop", "stop", "gpt-test-0001")
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.cache_read_tokens) == (9, 4, 13, 2)
    body = fake.bodies[0]
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})


@pytest.mark.parametrize("split", [1, 3, 7, 50])
async def test_chunk_boundaries_inside_lines_do_not_matter(fake, make_provider, split):
    """The same stream cut into pieces of any size, mid-line and mid-UTF-8, gives the same answer."""
    events = [fake.chunk("Grüße, "), fake.chunk("naïve café ☕"), fake.chunk(finish_reason="stop"),
              fake.chunk(choices=False, usage=USAGE)]
    fake.enqueue(fake.sse(*events, split=split, pause=0))
    async with make_provider() as provider:
        pieces, done = await collect(provider)
    assert "".join(d.text for d in pieces) == "Grüße, naïve café ☕"
    assert done.response.message.content == "Grüße, naïve café ☕"
    assert done.response.usage.total_tokens == 13


async def test_sse_framing_variants(fake, make_provider):
    """Comments (OpenRouter keep-alives), CRLF lines, data: without a space, event: fields and
    events without the blank line between them are all read."""
    raw = (
        ": OPENROUTER PROCESSING\r\n\r\n"
        'event: message\r\ndata:{"choices":[{"index":0,"delta":{"content":"a"}}]}\r\n\r\n'
        'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n'
        'data: {"choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"stop"}]}\n'
        "data: [DONE]\n"
    )
    fake.enqueue(fake.sse(raw, done=False))
    async with make_provider() as provider:
        pieces, done = await collect(provider)
    assert [d.text for d in pieces] == ["a", "b", "c"]
    assert done.response.message.content == "abc"


async def test_refusal_deltas_are_text(fake, make_provider):
    """A refusal streams as text."""
    fake.enqueue(fake.sse(fake.chunk(refusal="I can't "), fake.chunk(refusal="help with that."),
                          fake.chunk(finish_reason="stop")))
    async with make_provider() as provider:
        pieces, done = await collect(provider)
    assert [d.text for d in pieces] == ["I can't ", "help with that."]
    assert done.response.message.content == "I can't help with that."


async def test_content_filter_finish_reason(fake, make_provider):
    """finish_reason content_filter maps as in complete()."""
    fake.enqueue(fake.sse(fake.chunk("par"), fake.chunk(finish_reason="content_filter")))
    async with make_provider() as provider:
        _, done = await collect(provider)
    assert (done.response.finish_reason, done.response.raw_finish_reason) == ("content_filter", "content_filter")
    assert done.response.message.content == "par"


async def test_a_stream_without_usage_is_one_request_without_counts(fake, make_provider):
    """A server that never sends usage gives one request marked unreported (its cost is unknown)."""
    fake.enqueue(fake.sse(fake.chunk("ok"), fake.chunk(finish_reason="stop")))
    async with make_provider() as provider:
        _, done = await collect(provider)
    usage = done.response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.requests) == (0, 0, 0, 1)
    assert usage.unreported_requests == 1


async def test_usage_in_the_last_choice_chunk_and_no_done_line(fake, make_provider):
    """Usage beside the finish reason is read, and a stream ending without [DONE] after a finish
    reason is whole."""
    fake.enqueue(fake.sse(fake.chunk("ok"), fake.chunk(finish_reason="length", usage=USAGE), done=False))
    async with make_provider() as provider:
        _, done = await collect(provider)
    assert (done.response.finish_reason, done.response.usage.total_tokens) == ("length", 13)


async def test_empty_answer(fake, make_provider):
    """A stream with nothing but [DONE] is an empty answer, not an error."""
    fake.enqueue(fake.sse())
    async with make_provider() as provider:
        pieces, done = await collect(provider)
    assert pieces == []
    assert done.response.message.content is None


# -- tool calls ------------------------------------------------------------------------------------


async def test_tool_calls_are_reassembled_by_index(fake, make_provider):
    """Ids and names come in the first chunk of each call, arguments in pieces; two calls in order."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "call_a", "add", "")]),
        fake.chunk(tool_calls=[call(0, arguments='{"a": ')]),
        fake.chunk(tool_calls=[call(0, arguments='1, "b": 2}')]),
        fake.chunk(tool_calls=[call(1, "call_b", "add", '{"a"')]),
        fake.chunk(tool_calls=[call(1, arguments=': 3, "b": 4}')]),
        fake.chunk(finish_reason="tool_calls"),
        fake.chunk(choices=False, usage=USAGE),
    ))
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS))
    assert [(d.kind, d.tool_call_id, d.name, d.text) for d in pieces] == [
        ("tool_call", "call_a", "add", ""),
        ("arguments", "call_a", None, '{"a": '),
        ("arguments", "call_a", None, '1, "b": 2}'),
        ("tool_call", "call_b", "add", ""),
        ("arguments", "call_b", None, '{"a"'),
        ("arguments", "call_b", None, ': 3, "b": 4}'),
    ]
    assert done.response.message.tool_calls == (
        ToolCall(id="call_a", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="call_b", name="add", arguments={"a": 3, "b": 4}),
    )
    assert done.response.finish_reason == "tool_calls"
    assert done.response.message.content is None


async def test_ids_and_names_repeated_in_every_chunk(fake, make_provider):
    """A server repeating the id and name in every chunk still gives one call per index."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "call_a", "add", '{"a":')]),
        fake.chunk(tool_calls=[call(0, "call_a", "add", "1,")]),
        fake.chunk(tool_calls=[call(0, "call_a", "add", '"b":2}')]),
        fake.chunk(tool_calls=[call(0, "call_a", "add", "")], finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS))
    assert [d.kind for d in pieces].count("tool_call") == 1
    assert done.response.message.tool_calls == (ToolCall(id="call_a", name="add", arguments={"a": 1, "b": 2}),)


async def test_lm_studio_empty_names_in_later_chunks(fake, make_provider):
    """Later chunks with name "" and id "" (LM Studio) continue the call, they do not rename it."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "call_a", "add", "")]),
        fake.chunk(tool_calls=[call(0, "", "", '{"a":1,')]),
        fake.chunk(tool_calls=[call(0, "", "", '"b":2}')]),
        fake.chunk(finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        _, done = await collect(provider, request(tools=TOOLS))
    assert done.response.message.tool_calls == (ToolCall(id="call_a", name="add", arguments={"a": 1, "b": 2}),)


async def test_whole_arguments_in_one_chunk_and_arguments_as_objects(fake, make_provider):
    """Arguments may come whole in one chunk, or as a JSON object instead of a string."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "call_a", "add", '{"a": 1, "b": 2}'),
                               call(1, "call_b", "add", {"a": 3, "b": 4})], finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS))
    assert [(d.kind, d.tool_call_id, d.text) for d in pieces] == [
        ("tool_call", "call_a", ""), ("arguments", "call_a", '{"a": 1, "b": 2}'),
        ("tool_call", "call_b", ""), ("arguments", "call_b", '{"a":3,"b":4}'),
    ]
    assert [c.arguments for c in done.response.message.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]


async def test_missing_ids_are_generated_and_missing_indexes_use_positions(fake, make_provider):
    """Calls without ids get unique generated ones; without index, the position in the list counts."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(None, None, "add", '{"a":1,"b":2}'), call(None, None, "mul", "{}")]),
        fake.chunk(finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS))
    calls = done.response.message.tool_calls
    assert [(c.name, dict(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2}), ("mul", {})]
    assert calls[0].id.startswith("call_")
    assert calls[1].id.startswith("call_")
    assert calls[0].id != calls[1].id
    assert [d.tool_call_id for d in pieces if d.kind == "tool_call"] == [c.id for c in calls]


async def test_ollama_index_zero_for_every_call(fake, make_provider):
    """Several calls all at index 0 (Ollama) are told apart by their new id, or by a new name
    after whole arguments when there are no ids."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "call_x", "add", '{"a":1,"b":2}')]),
        fake.chunk(tool_calls=[call(0, "call_y", "add", '{"a":3,"b":4}')]),
        fake.chunk(finish_reason="tool_calls"),
    ))
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, None, "add", '{"a":1,"b":2}')]),
        fake.chunk(tool_calls=[call(0, None, "add", '{"a":3,"b":4}')]),
        fake.chunk(finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        _, first = await collect(provider, request(tools=TOOLS))
        _, second = await collect(provider, request(tools=TOOLS))
    assert [(c.id, c.arguments["a"]) for c in first.response.message.tool_calls] == [("call_x", 1), ("call_y", 3)]
    assert [c.arguments["a"] for c in second.response.message.tool_calls] == [1, 3]


async def test_duplicate_ids_across_calls_are_replaced(fake, make_provider):
    """Two calls at different indexes with the same id get distinct ids."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "dup", "add", "{}"), call(1, "dup", "add", "{}")], finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        _, done = await collect(provider, request(tools=TOOLS))
    ids = [c.id for c in done.response.message.tool_calls]
    assert ids[0] == "dup"
    assert ids[1] != "dup"


async def test_invalid_reassembled_arguments_are_kept_raw(fake, make_provider):
    """Arguments that do not join into a JSON object land in raw_arguments; the stream does not fail."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "call_a", "add", '{"a": 1, ')]),
        fake.chunk(tool_calls=[call(0, arguments='"b": }')]),
        fake.chunk(finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        _, done = await collect(provider, request(tools=TOOLS))
    [tool_call] = done.response.message.tool_calls
    assert (tool_call.arguments, tool_call.raw_arguments) == ({}, '{"a": 1, "b": }')


async def test_a_name_arriving_after_the_id_delays_the_start(fake, make_provider):
    """A call announced only once its name is known still carries the arguments that came first."""
    fake.enqueue(fake.sse(
        fake.chunk(tool_calls=[call(0, "call_a", None, '{"a":')]),
        fake.chunk(tool_calls=[call(0, None, "add", "1}")]),
        fake.chunk(finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        pieces, _ = await collect(provider, request(tools=TOOLS))
    assert [(d.kind, d.text) for d in pieces] == [("tool_call", ""), ("arguments", '{"a":1}')]


async def test_text_and_tool_calls_together(fake, make_provider):
    """Text before a tool call streams as text and stays on the message."""
    fake.enqueue(fake.sse(
        fake.chunk("Let me add. "), fake.chunk(tool_calls=[call(0, "c1", "add", '{"a":1,"b":1}')]),
        fake.chunk(finish_reason="tool_calls"),
    ))
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS))
    assert [d.kind for d in pieces] == ["text", "tool_call", "arguments"]
    assert done.response.message.content == "Let me add. "
    assert len(done.response.message.tool_calls) == 1


# -- failures ----------------------------------------------------------------------------------


async def test_error_status_before_the_stream_is_retried(fake, make_provider):
    """A 429 before the stream starts is retried (after Retry-After), then the stream is read."""
    fake.enqueue(fake.Reply(status=429, headers={"Retry-After": "0.05"}, body={"error": {"message": "slow down"}}),
                 fake.sse(*hello_events(fake)))
    async with make_provider() as provider:
        _, done = await collect(provider)
    assert done.response.message.content == "Hello, world."
    assert len(fake.seen) == 2


async def test_final_error_status_before_the_stream(fake, make_provider):
    """A 401 before the stream is final: one attempt, the API message, status and body."""
    fake.enqueue(fake.Reply(status=401, body={"error": {"message": "Incorrect API key", "code": "invalid_api_key"}}))
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await collect(provider)
    err = info.value
    assert (err.status, err.transient) == (401, False)
    assert "Incorrect API key [invalid_api_key]" in str(err)
    assert "invalid_api_key" in err.body
    assert len(fake.seen) == 1


async def test_a_stream_cut_after_deltas_is_transient_and_not_retried(fake, make_provider):
    """A connection that breaks off mid-stream raises a transient error after the deltas, once."""
    fake.enqueue(fake.sse(fake.chunk("Hel"), fake.chunk("lo"), done=False, cut=True))
    got: list[str] = []
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await drain(provider.stream(request()), got)
    assert got == ["Hel", "lo"]
    assert info.value.transient is True
    assert "broke off" in str(info.value)
    assert len(fake.seen) == 1


async def test_a_truncated_body_without_done_or_finish_reason(fake, make_provider):
    """A body that ends cleanly but without [DONE] or a finish reason is a transient failure."""
    fake.enqueue(fake.sse(fake.chunk("Hel"), 'data: {"choices":[{"index":0,"delta":{"cont', done=False,
                          framing="close"))
    got: list[str] = []
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await drain(provider.stream(request()), got)
    assert got == ["Hel"]
    assert info.value.transient is True
    assert "ended before the answer was complete" in str(info.value)
    assert len(fake.seen) == 1


async def test_a_stream_cut_before_any_delta_is_retried(fake, make_provider):
    """A stream that breaks off before yielding anything is retried like a failed request."""
    fake.enqueue(fake.sse(fake.chunk(""), done=False, cut=True), fake.sse(*hello_events(fake)))
    async with make_provider() as provider:
        pieces, done = await collect(provider)
    assert done.response.message.content == "Hello, world."
    assert len(pieces) == 3
    assert len(fake.seen) == 2


async def test_malformed_json_in_a_chunk(fake, make_provider):
    """A chunk that is not JSON is a final ProviderError."""
    fake.enqueue(fake.sse(fake.chunk("ok"), "data: {not json}\n\n"))
    async with make_provider() as provider:
        with pytest.raises(ProviderError, match="not JSON") as info:
            await collect(provider)
    assert info.value.transient is False
    assert len(fake.seen) == 1


async def test_an_error_event_mid_stream(fake, make_provider):
    """An error object in the stream (OpenAI, OpenRouter, vLLM shapes) raises with its message."""
    fake.enqueue(fake.sse(fake.chunk("par"), {"error": {"message": "upstream overloaded", "code": 502},
                                              "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]}))
    fake.enqueue(fake.sse({"object": "error", "message": "bad input", "type": "invalid_request_error"}))
    async with make_provider() as provider:
        with pytest.raises(ProviderError, match="upstream overloaded") as first:
            await collect(provider)
        with pytest.raises(ProviderError, match="bad input") as second:
            await collect(provider)
    assert (first.value.transient, second.value.transient) == (True, False)
    assert len(fake.seen) == 2


async def test_an_error_event_before_any_delta_is_retried(fake, make_provider):
    """A transient error event before any delta is retried."""
    fake.enqueue(fake.sse({"error": {"message": "server_error", "type": "server_error"}}),
                 fake.sse(*hello_events(fake)))
    async with make_provider() as provider:
        _, done = await collect(provider)
    assert done.response.message.content == "Hello, world."
    assert len(fake.seen) == 2


# -- compatibility ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "body"), [
    (400, {"error": {"message": "property 'stream_options' is unsupported, did you mean 'stream'?",
                     "type": "invalid_request_error"}}),
    (422, {"object": "error", "message": {"detail": [{"type": "extra_forbidden",
                                                      "loc": ["body", "stream_options", "include_usage"]}]}}),
])
async def test_stream_options_rejected_then_left_out(fake, make_provider, status, body):
    """A 400/422 naming stream_options (Groq, Mistral) makes the provider ask again without them,
    and leave them out from then on."""
    fake.enqueue(fake.Reply(status=status, body=body), fake.sse(*hello_events(fake)), fake.sse(*hello_events(fake)))
    async with make_provider(maxRetries=0) as provider:
        await collect(provider)
        await collect(provider)
    assert ["stream_options" in b for b in fake.bodies] == [True, False, False]


async def test_no_stream_options_quirk(fake, make_provider):
    """quirks: [noStreamOptions] never sends them."""
    fake.enqueue(fake.sse(*hello_events(fake)))
    async with make_provider(quirks=["noStreamOptions"]) as provider:
        await collect(provider)
    assert fake.bodies[0]["stream"] is True
    assert "stream_options" not in fake.bodies[0]


async def test_no_streaming_with_tools_falls_back_to_one_piece(fake, make_provider):
    """A server refusing to stream with tools (llama-server: 500 Cannot use tools with stream) gets
    requests with tools in one piece from then on; requests without tools still stream."""
    refusal = {"error": {"code": 500, "message": "Cannot use tools with stream", "type": "server_error"}}
    fake.enqueue(
        fake.Reply(status=500, body=refusal),
        fake.completion(None, finish_reason="tool_calls", tool_calls=[fake.tool_call("c1", "add", '{"a":1,"b":2}')]),
        fake.completion("plain again"),
        fake.sse(*hello_events(fake)),
    )
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS))
        _, again = await collect(provider, request(tools=TOOLS))
        _, plain = await collect(provider)
    assert [d.kind for d in pieces] == ["tool_call"]
    assert done.response.message.tool_calls == (ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2}),)
    assert again.response.message.content == "plain again"
    assert plain.response.message.content == "Hello, world."
    assert [b.get("stream", False) for b in fake.bodies] == [True, False, False, True]


async def test_an_empty_stream_for_a_request_with_tools_falls_back(fake, make_provider):
    """An empty 200 stream answering a request with tools (llama-cpp-python with tool_choice auto,
    when the model calls a tool) is asked again in one piece, and so are later tool requests."""
    fake.enqueue(fake.sse(done=False),
                 fake.completion(None, finish_reason="tool_calls", tool_calls=[fake.tool_call("c1", "add", "{}")]),
                 fake.completion("again"))
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS, settings={"toolChoice": "auto"}))
        _, again = await collect(provider, request(tools=TOOLS))
        assert "noStreamWithTools" in provider.quirks
    assert [d.kind for d in pieces] == ["tool_call"]
    assert done.response.message.tool_calls[0].id == "c1"
    assert again.response.message.content == "again"
    assert [b.get("stream", False) for b in fake.bodies] == [True, False, False]


async def test_an_empty_stream_without_tools_is_a_transient_failure(fake, make_provider):
    """An empty 200 stream for a request without tools is a cut stream: transient, retried."""
    fake.enqueue(fake.sse(done=False), fake.sse(*hello_events(fake)))
    async with make_provider() as provider:
        _, done = await collect(provider)
    assert done.response.message.content == "Hello, world."
    assert len(fake.seen) == 2


async def test_a_json_answer_to_a_stream_request(fake, make_provider):
    """A server that ignores stream: true and answers with one JSON body is read as a whole answer."""
    fake.enqueue(fake.completion(None, finish_reason="tool_calls", tool_calls=[fake.tool_call("c1", "add", "{}")]))
    async with make_provider() as provider:
        pieces, done = await collect(provider, request(tools=TOOLS))
    assert [(d.kind, d.text) for d in pieces] == [("tool_call", ""), ("arguments", "{}")]
    assert done.response.message.tool_calls[0].id == "c1"


def in_use(transport) -> int:
    """The connections (or, over httpcore, the requests) a transport has in flight."""
    if isinstance(transport, ShardedTransport):
        return sum(transport._in_flight)
    assert isinstance(transport, AiohttpTransport)
    return len(transport._session.connector._acquired)


async def test_stream_releases_its_connection(fake, make_provider):
    """A whole stream gives its connection back for reuse; a broken one's is closed; nothing stays in flight."""
    fake.enqueue(fake.sse(*hello_events(fake)), fake.sse(*hello_events(fake)),
                 fake.sse(fake.chunk("x"), done=False, cut=True), fake.sse(*hello_events(fake)))
    async with make_provider(maxRetries=0) as provider:
        await collect(provider)
        await collect(provider)
        with pytest.raises(ProviderError):
            await collect(provider)
        await collect(provider)
        assert in_use(provider._client._transport) == 0
    first, second, broken, after = (s.peer for s in fake.seen)
    assert first == second == broken
    assert after != broken


async def test_stopping_early_closes_the_stream(fake, make_provider):
    """A consumer that stops reading after the first delta leaves no request in flight."""
    fake.enqueue(fake.sse(*hello_events(fake)))
    async with make_provider() as provider:
        agen = provider.stream(request())
        first = await agen.__anext__()
        assert in_use(provider._client._transport) == 1
        await agen.aclose()
        assert first.text == "Hel"
        assert in_use(provider._client._transport) == 0


async def test_request_body_of_a_stream_keeps_the_chat_shape(fake, make_provider):
    """A stream request carries the same messages, tools and settings as a plain one."""
    fake.enqueue(fake.sse(*hello_events(fake)))
    async with make_provider() as provider:
        await collect(provider, request(tools=TOOLS, settings={"temperature": 0, "toolChoice": "add"}))
    body = fake.bodies[0]
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert body["tools"][0]["function"]["name"] == "add"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert json.dumps(body).startswith('{"model": "gpt-test"')


# -- through a runtime -------------------------------------------------------------------------------


async def test_streaming_run_through_the_runtime(fake, tmp_path):
    """A run on a provider with stream: true gets text_delta and tool_call_start events from the
    SSE stream, runs the tool on the reassembled arguments and rests on the final answer."""

    @loopwright.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    class Tools:
        @loopwright.hookimpl
        def loopwright_register_tools(self, register):
            register(add)

    fake.enqueue(
        fake.sse(fake.chunk("Adding. "), fake.chunk(tool_calls=[call(0, "call_1", "add", '{"a": 2, ')]),
                 fake.chunk(tool_calls=[call(0, arguments='"b": 3}')]), fake.chunk(finish_reason="tool_calls"),
                 fake.chunk(choices=False, usage=USAGE)),
        fake.sse(fake.chunk("The sum "), fake.chunk("is 5."), fake.chunk(finish_reason="stop"),
                 fake.chunk(choices=False, usage=USAGE)),
    )
    assembly = loopwright.Assembly(
        store=loopwright.StoreConfig(kind="file", options={"path": str(tmp_path / "store")}),
        providers={"fk": loopwright.ProviderConfig(kind="openai", base_url=fake.url, api_key="sk-test",
                                                   options={"stream": True, "retryBaseDelay": 0.001})},
    )
    async with loopwright.Runtime(assembly, plugins=[loopwright_openai, Tools()], autoload=False) as rt:
        run = await rt.start_agent({"name": "adder", "model": "fk:gpt-test", "tools": ["add"],
                                    "systemPrompt": "Use the tool."}, prompt="2+3?")
        with anyio.fail_after(10):
            events = [(e.kind, dict(e.data)) async for e in run.events()]
            result = await run.result()
    assert result.text == "The sum is 5."
    assert str(result.stop_reason) == "waiting"
    assert "".join(d["delta"] for k, d in events if k == "text_delta") == "Adding. The sum is 5."
    assert ("tool_call_start", {"id": "call_1", "name": "add"}) in events
    assert result.usage.input_tokens == 18
    second = fake.bodies[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["arguments"] == '{"a":2,"b":3}'
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    assert all(b["stream"] is True for b in fake.bodies)
