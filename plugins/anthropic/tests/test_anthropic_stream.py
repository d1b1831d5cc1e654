"""AnthropicProvider.stream against a real local server sending Messages SSE streams."""

from __future__ import annotations

import json

import pytest

from loopwright._types import Message, ModelRequest, ToolCall, ToolSpec
from loopwright.errors import ProviderError
from loopwright.http import SSEDecoder

pytestmark = pytest.mark.anyio

ADD = ToolSpec(name="add", description="Add.", parameters={"type": "object"})


def request(**kw) -> ModelRequest:
    return ModelRequest(model="claude-test", provider="claude",
                        messages=[Message(role="user", content="Hi")], stream=True, **kw)


async def collect(provider, req=None):
    return [d async for d in provider.stream(req or request())]


async def test_text_stream(fake, make_provider):
    """Text arrives as text deltas and a done delta with the whole answer, stop reason and usage."""
    fake.stream(fake.message("Hello there, how are you?", usage={"input_tokens": 12, "output_tokens": 7}))
    async with make_provider() as provider:
        deltas = await collect(provider)
    assert fake.bodies[0]["stream"] is True
    assert [d.kind for d in deltas] == ["text", "text", "text", "done"]
    assert "".join(d.text for d in deltas[:-1]) == "Hello there, how are you?"
    response = deltas[-1].response
    assert response.message == Message(role="assistant", content="Hello there, how are you?",
                                       model="claude-test-20250101")
    assert (response.finish_reason, response.raw_finish_reason) == ("stop", "end_turn")
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (12, 7, 19)


async def test_chunks_split_mid_line_and_mid_character(fake, make_provider):
    """A stream written in 7-byte pieces (lines and UTF-8 characters cut) decodes the same."""
    answer = fake.message("Grüße — naïve café ✓", fake.tool_use("toolu_1", "add", {"a": "é", "b": 2}),
                          stop_reason="tool_use")
    fake.stream(answer, chunk=7)
    async with make_provider() as provider:
        deltas = await collect(provider, request(tools=(ADD,)))
    response = deltas[-1].response
    assert response.message.content == "Grüße — naïve café ✓"
    assert response.message.tool_calls == (ToolCall(id="toolu_1", name="add", arguments={"a": "é", "b": 2}),)


async def test_tool_use_stream_with_parallel_calls(fake, make_provider):
    """Each tool_use block gives a tool_call delta, then its input pieces as arguments deltas."""
    fake.stream(fake.message("Two calls.", fake.tool_use("toolu_a", "add", {"a": 1, "b": 2}),
                             fake.tool_use("toolu_b", "add", {"a": 3, "b": 4}), stop_reason="tool_use"))
    async with make_provider() as provider:
        deltas = await collect(provider, request(tools=(ADD,)))
    calls = [d for d in deltas if d.kind == "tool_call"]
    assert [(d.tool_call_id, d.name) for d in calls] == [("toolu_a", "add"), ("toolu_b", "add")]
    pieces = [d for d in deltas if d.kind == "arguments"]
    assert "".join(d.text for d in pieces if d.tool_call_id == "toolu_a") == '{"a": 1, "b": 2}'
    response = deltas[-1].response
    assert response.message.tool_calls == (
        ToolCall(id="toolu_a", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="toolu_b", name="add", arguments={"a": 3, "b": 4}),
    )
    assert response.finish_reason == "tool_calls"


async def test_malformed_input_json_pieces_become_raw_arguments(fake, make_provider):
    """input_json_delta pieces that do not join into an object give {} and the joined text."""
    answer = fake.message(fake.tool_use("toolu_bad", "add", {}), fake.tool_use("toolu_none", "add", {}),
                          stop_reason="tool_use")
    fake.stream(answer, json_pieces={"toolu_bad": ['{"a": 1', ', "b": ']})
    fake.enqueue(fake.Reply(sse=[e for e in fake.events(answer) if not (
        e[0] == "content_block_delta" and e[1]["delta"]["type"] == "input_json_delta")]))
    async with make_provider() as provider:
        first = (await collect(provider, request(tools=(ADD,))))[-1].response
        second = (await collect(provider, request(tools=(ADD,))))[-1].response
    bad, none = first.message.tool_calls
    assert (bad.arguments, bad.raw_arguments) == ({}, '{"a": 1, "b": ')
    assert (none.arguments, none.raw_arguments) == ({}, None)
    assert [(c.arguments, c.raw_arguments) for c in second.message.tool_calls] == [({}, None), ({}, None)]


async def test_truncated_stream_is_transient(fake, make_provider):
    """A stream that ends before message_stop raises a transient ProviderError."""
    events = fake.events(fake.message("Hello there"))
    fake.enqueue(fake.Reply(sse=events, cut=len(events) - 2))
    seen = []

    async def consume(provider):
        async for delta in provider.stream(request()):
            seen.append(delta)  # noqa: PERF401 - the deltas before the failure are the point

    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await consume(provider)
    assert info.value.transient is True
    assert "message_stop" in str(info.value)
    assert [d.kind for d in seen] == ["text", "text", "text"]


@pytest.mark.parametrize(("kind", "transient"), [
    ("overloaded_error", True), ("api_error", True), ("invalid_request_error", False)])
async def test_error_event(fake, make_provider, kind, transient):
    """An error event ends the stream with a ProviderError, transient for overload and API errors."""
    events = fake.events(fake.message("partial answer"))[:4]
    events.append(("error", fake.error_body(kind, "Overloaded" if transient else "bad")))
    fake.enqueue(fake.Reply(sse=events, headers={"request-id": "req_s1"}))
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await collect(provider)
    assert info.value.transient is transient
    assert f"[{kind}]" in str(info.value)
    assert "req_s1" in str(info.value)
    assert len(fake.seen) == 1  # a stream that started is not retried by the provider


async def test_529_before_the_stream_is_retried(fake, make_provider):
    """An overloaded answer before the stream starts is retried after its Retry-After."""
    fake.enqueue(fake.Reply(status=529, headers={"retry-after": "0.1"},
                            body=fake.error_body("overloaded_error", "Overloaded")))
    fake.stream(fake.message("streamed"))
    async with make_provider() as provider:
        deltas = await collect(provider)
    assert deltas[-1].response.message.content == "streamed"
    assert fake.seen[1].at - fake.seen[0].at >= 0.09


async def test_final_400_before_the_stream(fake, make_provider):
    """A 400 instead of a stream is a final error carrying the API's message."""
    fake.enqueue(fake.Reply(status=400, body=fake.error_body("invalid_request_error", "max_tokens: too large")))
    async with make_provider() as provider:
        with pytest.raises(ProviderError, match=r"max_tokens: too large \[invalid_request_error\]") as info:
            await collect(provider)
    assert (info.value.status, info.value.transient) == (400, False)
    assert len(fake.seen) == 1


async def test_refusal_stream(fake, make_provider):
    """A streamed refusal ends with a content_filter answer."""
    fake.stream(fake.message("I can't help with that.", stop_reason="refusal"))
    async with make_provider() as provider:
        response = (await collect(provider))[-1].response
    assert (response.finish_reason, response.raw_finish_reason) == ("content_filter", "refusal")


async def test_stream_usage_with_cache_fields(fake, make_provider):
    """Cache counts from message_start are kept; message_delta's cumulative output count wins."""
    fake.stream(fake.message("x", usage={"input_tokens": 5, "cache_read_input_tokens": 100,
                                         "cache_creation_input_tokens": 20, "output_tokens": 9}))
    async with make_provider() as provider:
        usage = (await collect(provider))[-1].response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (
        125, 9, 100, 20)


async def test_structured_output_streams_as_text(fake, make_provider):
    """A call of the output tool is not announced as a tool call: its input streams as the answer text."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    fake.stream(fake.message(fake.tool_use("toolu_o", "final_output", {"n": 42}), stop_reason="tool_use"))
    fake.stream(fake.message(fake.tool_use("toolu_w", "final_output", {"value": [1, 2]}), stop_reason="tool_use"))
    async with make_provider() as provider:
        deltas = await collect(provider, request(output_schema=schema))
        wrapped = await collect(provider, request(output_schema={"type": "array"}))
    assert {d.kind for d in deltas} == {"text", "done"}
    assert json.loads("".join(d.text for d in deltas if d.kind == "text")) == {"n": 42}
    assert json.loads(deltas[-1].response.message.content) == {"n": 42}
    assert deltas[-1].response.finish_reason == "stop"
    assert [d.text for d in wrapped if d.kind == "text"] == ["[1,2]"]
    assert wrapped[-1].response.message.content == "[1,2]"


async def test_thinking_stream_is_kept_for_the_next_turn(fake, make_provider):
    """Streamed thinking blocks (text and signature deltas) are sent back with their tool call."""
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": "m", "model": "claude-test", "content": [], "usage": {"input_tokens": 1, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "thinking_delta", "thinking": "Hmm, "}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "thinking_delta", "thinking": "add."}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "signature_delta", "signature": "SIG"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_x", "name": "add", "input": {}}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                           "usage": {"output_tokens": 30}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    fake.enqueue(fake.Reply(sse=events))
    async with make_provider() as provider:
        first = (await collect(provider, request(tools=(ADD,))))[-1].response
        followup = ModelRequest(model="claude-test", provider="claude", tools=(ADD,), messages=[
            Message(role="user", content="Hi"), first.message,
            Message(role="tool", content="0", tool_call_id="toolu_x", name="add")])
        await provider.complete(followup)
    assert fake.bodies[1]["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": "Hmm, add.", "signature": "SIG"}


async def test_event_before_message_start_is_a_final_error(fake, make_provider):
    """A stream whose content comes before message_start is rejected as malformed."""
    events = fake.events(fake.message("x"))
    fake.enqueue(fake.Reply(sse=events[2:]))
    async with make_provider() as provider:
        with pytest.raises(ProviderError, match="before message_start") as info:
            await collect(provider)
    assert info.value.transient is False


async def test_plain_json_answer_to_a_stream_request(fake, make_provider):
    """A server that answers a stream request with plain JSON is read as a plain answer."""
    fake.enqueue(fake.message("not streamed", fake.tool_use("toolu_j", "add", {}), stop_reason="tool_use"))
    async with make_provider() as provider:
        deltas = await collect(provider, request(tools=(ADD,)))
    assert [d.kind for d in deltas] == ["text", "tool_call", "done"]
    assert deltas[-1].response.message.content == "not streamed"


def test_sse_decoder_follows_the_event_stream_rules():
    """Comments are skipped, data lines joined, the space after the colon dropped, blank lines dispatch."""
    decoder = SSEDecoder()
    lines = [": keep-alive", "event: a", "data:one", "data: two", "id: 7", "", "", "data: {}", ""]
    assert [e for e in map(decoder.decode, lines) if e is not None] == [("a", "one\ntwo"), (None, "{}")]
