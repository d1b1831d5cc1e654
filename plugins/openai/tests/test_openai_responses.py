"""OpenAIProvider in ``api: responses`` mode, against a real local HTTP server."""

from __future__ import annotations

import json

import anyio
import pytest

from loopwright._types import Message, ModelRequest, ToolCall, ToolSpec, ToolStatus, Transcript
from loopwright.abc import ProviderSettings
from loopwright.errors import ConfigError, ProviderError
from loopwright_openai import OpenAIProvider, _responses

pytestmark = pytest.mark.anyio

ADD = ToolSpec(
    name="add", description="Add two integers.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)
TOOLS = (ADD,)


def request(messages=None, **kw) -> ModelRequest:
    if messages is None:
        messages = [Message(role="system", content="Be brief."), Message(role="user", content="Hi")]
    return ModelRequest(model="gpt-test", provider="oa", messages=messages, **kw)


@pytest.fixture
def make_responses(make_provider):
    def make(**options):
        return make_provider(api="responses", **options)
    return make


async def collect(provider, req):
    with anyio.fail_after(10):
        deltas = [d async for d in provider.stream(req)]
    *pieces, done = deltas
    assert done.kind == "done"
    return pieces, done.response


# -- requests ------------------------------------------------------------------------------------


async def test_request_body(fake, make_responses):
    """The system prompt is instructions; messages, calls and results are input items; tools are
    flat function tools; settings and the output schema take their Responses names."""
    messages = [
        Message(role="system", content="S"),
        Message(role="user", content="Add"),
        Message(role="assistant", content="Adding.", tool_calls=(
            ToolCall(id="call_1", name="add", arguments={"a": 1, "b": 2}),
            ToolCall(id="call_2", name="add", arguments={}, raw_arguments="{oops"),
        )),
        Message(role="tool", content="3", tool_call_id="call_1", name="add", status=ToolStatus.SUCCESS),
        Message(role="tool", content="bad", tool_call_id="call_2", name="add", status=ToolStatus.INVALID_ARGUMENTS),
        Message(role="assistant", content="3"),
        Message(role="system", content="Late note."),
    ]
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fake.enqueue(fake.response([fake.message_item("ok")]))
    async with make_responses() as provider:
        await provider.complete(request(messages, tools=TOOLS, output_schema=schema, settings={
            "maxTokens": 99, "temperature": 0.5, "topP": 0.9, "toolChoice": "add", "parallelToolCalls": False,
            "reasoningEffort": "low", "store": False}))
    [seen] = fake.seen
    assert seen.path == "/v1/responses"
    body = seen.body
    assert body["instructions"] == "S"
    assert body["input"] == [
        {"role": "user", "content": "Add"},
        {"role": "assistant", "content": "Adding."},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a":1,"b":2}'},
        {"type": "function_call", "call_id": "call_2", "name": "add", "arguments": "{oops"},
        {"type": "function_call_output", "call_id": "call_1", "output": "3"},
        {"type": "function_call_output", "call_id": "call_2", "output": "bad"},
        {"role": "assistant", "content": "3"},
        {"role": "system", "content": "Late note."},
    ]
    assert body["tools"] == [{"type": "function", "name": "add", "description": "Add two integers.",
                              "parameters": dict(ADD.parameters), "strict": False}]
    assert body["text"] == {"format": {"type": "json_schema", "name": "output", "schema": schema, "strict": False}}
    assert (body["max_output_tokens"], body["temperature"], body["top_p"]) == (99, 0.5, 0.9)
    assert body["tool_choice"] == {"type": "function", "name": "add"}
    assert (body["parallel_tool_calls"], body["reasoning"], body["store"]) == (False, {"effort": "low"}, False)
    assert "stream" not in body


async def test_tool_settings_dropped_without_tools_and_modes_kept(fake, make_responses):
    """tool_choice modes pass as strings, and tool settings are dropped when there are no tools."""
    async with make_responses() as provider:
        await provider.complete(request(tools=TOOLS, settings={"toolChoice": "required"}))
        await provider.complete(request(settings={"toolChoice": "auto", "parallelToolCalls": True}))
    first, second = fake.bodies
    assert first["tool_choice"] == "required"
    assert not {"tool_choice", "parallel_tool_calls", "tools"} & set(second)


async def test_transcript_items_are_encoded_once(fake, make_responses):
    """With a Transcript, each message's items are encoded once and cached."""
    transcript = Transcript([Message(role="system", content="S"), Message(role="user", content="U")])
    fake.enqueue(fake.response([fake.message_item("a")]), fake.response([fake.message_item("b")]))
    async with make_responses() as provider:
        first = await provider.complete(request(transcript))
        transcript.append(first.message)
        transcript.append(Message(role="user", content="again"))
        await provider.complete(request(transcript))
    assert len(transcript._caches[_responses.CACHE_KEY]) == 4
    assert fake.bodies[1]["input"] == [{"role": "user", "content": "U"}, {"role": "assistant", "content": "a"},
                                       {"role": "user", "content": "again"}]


# -- answers -------------------------------------------------------------------------------------


async def test_text_answer_and_usage(fake, make_responses):
    """Message items give the text; usage details give cached and reasoning tokens."""
    fake.enqueue(fake.response(
        [{"type": "reasoning", "id": "rs_1", "summary": []}, fake.message_item("Hello"), fake.message_item(" there")],
        usage={"input_tokens": 100, "output_tokens": 40, "total_tokens": 140,
               "input_tokens_details": {"cached_tokens": 64}, "output_tokens_details": {"reasoning_tokens": 32}}))
    async with make_responses() as provider:
        response = await provider.complete(request())
    assert response.message == Message(role="assistant", content="Hello there", model="gpt-test-0001")
    assert (response.finish_reason, response.raw_finish_reason) == ("stop", "completed")
    assert response.model == "gpt-test-0001"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (100, 40, 140)
    assert (usage.cache_read_tokens, usage.reasoning_tokens, usage.requests) == (64, 32, 1)


async def test_function_calls_and_refusals(fake, make_responses):
    """function_call items become tool calls (bad arguments kept raw); a refusal part is text."""
    fake.enqueue(fake.response([
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No. "}]},
        fake.function_call_item("call_1", "add", '{"a": 1, "b": 2}', "fc_1"),
        fake.function_call_item("call_2", "add", "{bad", "fc_2"),
    ]))
    async with make_responses() as provider:
        response = await provider.complete(request(tools=TOOLS))
    assert response.message.content == "No. "
    assert response.message.tool_calls == (
        ToolCall(id="call_1", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="call_2", name="add", arguments={}, raw_arguments="{bad"),
    )
    assert response.finish_reason == "tool_calls"


@pytest.mark.parametrize(("reason", "finish"), [
    ("max_output_tokens", "length"), ("content_filter", "content_filter"), (None, "incomplete"),
])
async def test_incomplete_status(fake, make_responses, reason, finish):
    """status incomplete maps its reason: max_output_tokens is length, content_filter stays."""
    fake.enqueue(fake.response([fake.message_item("cut")], status="incomplete", incomplete=reason))
    async with make_responses() as provider:
        response = await provider.complete(request())
    assert response.finish_reason == finish
    assert response.raw_finish_reason == (reason or "incomplete")
    assert response.message.content == "cut"


async def test_failed_status_is_a_provider_error(fake, make_responses):
    """A failed response raises, transient for server errors (retried), final otherwise."""
    fake.enqueue(
        fake.response(status="failed", error={"code": "server_error", "message": "boom"}),
        fake.response([fake.message_item("ok")]),
        fake.response(status="failed", error={"code": "invalid_prompt", "message": "no"}),
    )
    async with make_responses() as provider:
        assert (await provider.complete(request())).message.content == "ok"
        with pytest.raises(ProviderError, match=r"no \[invalid_prompt\]") as info:
            await provider.complete(request())
    assert info.value.transient is False
    assert len(fake.seen) == 3


async def test_http_errors_are_classified_as_in_chat_mode(fake, make_responses):
    """Error statuses behave as in Chat mode: 500 retried, 400 final with the API message."""
    fake.enqueue(fake.Reply(status=500, body={}), fake.response([fake.message_item("ok")]),
                 fake.Reply(status=400, body={"error": {"message": "Unknown parameter: 'stop'."}}))
    async with make_responses() as provider:
        assert (await provider.complete(request())).message.content == "ok"
        with pytest.raises(ProviderError, match="Unknown parameter") as info:
            await provider.complete(request(settings={"stop": ["x"]}))
    assert info.value.status == 400
    assert fake.bodies[2]["stop"] == ["x"]


# -- streaming -----------------------------------------------------------------------------------


def text_events(fake, *, final_output=True):
    item = fake.message_item("Hello!")
    return [
        {"type": "response.created", "sequence_number": 0, "response": fake.response(status="in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
        {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0, "content_index": 0,
         "part": {"type": "output_text", "text": ""}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
         "delta": "Hel"},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
         "delta": "lo!"},
        {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "content_index": 0,
         "text": "Hello!"},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": fake.response([item] if final_output else [],
                                                                 usage={"input_tokens": 5, "output_tokens": 2})},
    ]


def sse_events(events):
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]


async def test_stream_text(fake, make_responses):
    """output_text deltas stream as text; response.completed gives the whole answer and usage."""
    fake.enqueue(fake.sse(*sse_events(text_events(fake)), done=False))
    async with make_responses() as provider:
        pieces, response = await collect(provider, request())
    assert [(d.kind, d.text) for d in pieces] == [("text", "Hel"), ("text", "lo!")]
    assert response.message.content == "Hello!"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (5, 2, 7)
    assert fake.bodies[0]["stream"] is True
    assert "stream_options" not in fake.bodies[0]


async def test_stream_function_calls(fake, make_responses):
    """A function_call item starts a call (its call_id), argument deltas follow by item id, and the
    final response's calls keep the announced ids."""
    done_item = fake.function_call_item("call_9", "add", '{"a":1,"b":2}', "fc_9")
    events = [
        {"type": "response.output_item.added", "output_index": 0,
         "item": {**done_item, "arguments": "", "status": "in_progress"}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_9", "output_index": 0, "delta": '{"a":1,'},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_9", "output_index": 0, "delta": '"b":2}'},
        {"type": "response.function_call_arguments.done", "item_id": "fc_9", "output_index": 0,
         "arguments": '{"a":1,"b":2}'},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": fake.response([done_item])},
    ]
    fake.enqueue(fake.sse(*events, done=False, split=11, pause=0))
    async with make_responses() as provider:
        pieces, response = await collect(provider, request(tools=TOOLS))
    assert [(d.kind, d.tool_call_id, d.name, d.text) for d in pieces] == [
        ("tool_call", "call_9", "add", ""), ("arguments", "call_9", None, '{"a":1,'),
        ("arguments", "call_9", None, '"b":2}'),
    ]
    assert response.message.tool_calls == (ToolCall(id="call_9", name="add", arguments={"a": 1, "b": 2}),)
    assert response.finish_reason == "tool_calls"


async def test_stream_assembled_from_deltas_when_the_final_response_is_bare(fake, make_responses):
    """A server whose response.completed lists no output gets its answer from the deltas."""
    events = [
        *text_events(fake, final_output=False)[:-1],
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{}"},
        text_events(fake, final_output=False)[-1],
    ]
    fake.enqueue(fake.sse(*events, done=False))
    async with make_responses() as provider:
        _, response = await collect(provider, request(tools=TOOLS))
    assert response.message.content == "Hello!"
    assert response.message.tool_calls == (ToolCall(id="call_1", name="add", arguments={}),)


async def test_stream_incomplete(fake, make_responses):
    """response.incomplete ends the stream with the mapped finish reason."""
    final = fake.response([fake.message_item("Hello!")], status="incomplete", incomplete="content_filter")
    events = [*text_events(fake)[:-1], {"type": "response.incomplete", "response": final}]
    fake.enqueue(fake.sse(*events, done=False))
    async with make_responses() as provider:
        _, response = await collect(provider, request())
    assert response.finish_reason == "content_filter"


async def test_stream_failures(fake, make_responses):
    """response.failed and error events raise; a stream without response.completed is transient."""
    fake.enqueue(
        fake.sse(text_events(fake)[3], {"type": "response.failed", "response": fake.response(
            status="failed", error={"code": "invalid_prompt", "message": "refused"})}, done=False),
        fake.sse(text_events(fake)[3], {"type": "error", "code": "server_error", "message": "oops"}, done=False),
        fake.sse(*text_events(fake)[:-1], done=False),
    )
    async with make_responses() as provider:
        with pytest.raises(ProviderError, match="refused") as failed:
            await collect(provider, request())
        with pytest.raises(ProviderError, match="oops") as error:
            await collect(provider, request())
        with pytest.raises(ProviderError, match="ended before") as cut:
            await collect(provider, request())
    assert (failed.value.transient, error.value.transient, cut.value.transient) == (False, True, True)
    assert len(fake.seen) == 3


async def test_stream_error_status_before_the_stream_is_retried(fake, make_responses):
    """A 503 before a Responses stream is retried."""
    fake.enqueue(fake.Reply(status=503, body={}), fake.sse(*text_events(fake), done=False))
    async with make_responses() as provider:
        _, response = await collect(provider, request())
    assert response.message.content == "Hello!"
    assert len(fake.seen) == 2


# -- options ---------------------------------------------------------------------------------------


def test_api_option_is_checked():
    """api must be chat or responses."""
    with pytest.raises(ConfigError) as info:
        OpenAIProvider(ProviderSettings(name="oa", kind="openai", options={"api": "assistants"}))
    assert info.value.problems[0].path == "$.providers.oa.api"


def test_responses_url():
    """api: responses posts to {baseUrl}/responses."""
    provider = OpenAIProvider(ProviderSettings(name="oa", kind="openai", api_key="k", options={"api": "responses"}))
    assert provider.url == "https://api.openai.com/v1/responses"
