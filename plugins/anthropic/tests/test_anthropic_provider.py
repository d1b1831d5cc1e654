"""AnthropicProvider against a real local HTTP server speaking the Messages API (plain calls)."""

from __future__ import annotations

import subprocess
import sys

import anyio
import httpx
import pytest

import loopwright_anthropic
from loopwright._plugins import PluginHost
from loopwright._types import Message, ModelRequest, ToolCall, ToolSpec, ToolStatus, Transcript
from loopwright.abc import ProviderSettings
from loopwright.errors import ConfigError, ProviderError
from loopwright.http import AiohttpTransport, ShardedTransport
from loopwright_anthropic import AnthropicProvider, _wire

pytestmark = pytest.mark.anyio

ADD = ToolSpec(
    name="add", description="Add two integers.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]},
)
MUL = ToolSpec(name="mul", description="Multiply.", parameters={"type": "object"})
TOOLS = (ADD, MUL)


def request(messages=None, **kw) -> ModelRequest:
    if messages is None:
        messages = [Message(role="system", content="Be brief."), Message(role="user", content="Hi")]
    return ModelRequest(model="claude-test", provider="claude", messages=messages, **kw)


# -- answers -------------------------------------------------------------------------------------


async def test_plain_answer_and_required_headers(fake, make_provider):
    """A text answer becomes an assistant message; the request carries the API's headers and body shape."""
    fake.enqueue(fake.message("Hello ", "there."))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert response.message == Message(role="assistant", content="Hello there.", model="claude-test-20250101")
    assert (response.model, response.finish_reason, response.raw_finish_reason) == (
        "claude-test-20250101", "stop", "end_turn")
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.requests) == (3, 1, 4, 1)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (None, None)
    [seen] = fake.seen
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "sk-ant-test"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["content-type"] == "application/json"
    assert "authorization" not in seen.headers
    assert seen.body == {
        "model": "claude-test", "max_tokens": 4096,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    }


async def test_tool_round_trip_encoding(fake, make_provider):
    """Tool calls go out as tool_use blocks, results as tool_result blocks in one user turn, errors flagged."""
    messages = [
        Message(role="system", content="S"),
        Message(role="user", content="Add"),
        Message(role="assistant", content="Let me add.", tool_calls=(
            ToolCall(id="toolu_1", name="add", arguments={"a": 1, "b": 2}),
            ToolCall(id="toolu_2", name="add", arguments={}, raw_arguments='{"a": 1,'),
            ToolCall(id="call.3", name="mul", arguments={}),
        )),
        Message(role="tool", content="3", tool_call_id="toolu_1", name="add", status=ToolStatus.SUCCESS),
        Message(role="tool", content="bad arguments", tool_call_id="toolu_2", name="add",
                status=ToolStatus.INVALID_ARGUMENTS),
        Message(role="tool", content="", tool_call_id="call.3", name="mul", status=ToolStatus.TIMEOUT),
        Message(role="assistant", content="Done: 3"),
        Message(role="user", content="Thanks"),
    ]
    async with make_provider() as provider:
        await provider.complete(request(messages, tools=TOOLS))
    body = fake.bodies[0]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Add"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me add."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
            {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {}},
            {"type": "tool_use", "id": "call_3", "name": "mul", "input": {}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3", "is_error": False},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "bad arguments", "is_error": True},
            {"type": "tool_result", "tool_use_id": "call_3", "is_error": True},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "Done: 3"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    assert body["tools"] == [
        {"name": "add", "description": "Add two integers.", "input_schema": dict(ADD.parameters)},
        {"name": "mul", "description": "Multiply.", "input_schema": {"type": "object"}},
    ]


async def test_consecutive_same_role_messages_are_merged(fake, make_provider):
    """Same-role neighbours merge into one turn (tool results first), empty messages vanish, a
    late system message becomes user text, and a transcript starting with the assistant gets a user turn."""
    messages = [
        Message(role="system", content="one"),
        Message(role="system", content="two"),
        Message(role="assistant", content=None, tool_calls=(ToolCall(id="t1", name="add", arguments={}),)),
        Message(role="user", content="an interjection"),
        Message(role="tool", content="r1", tool_call_id="t1", name="add", status=ToolStatus.SUCCESS),
        Message(role="assistant", content=""),
        Message(role="system", content="a late instruction"),
        Message(role="user", content="   "),
        Message(role="user", content="go on"),
        Message(role="assistant", content="a"),
        Message(role="assistant", content="b"),
    ]
    async with make_provider() as provider:
        await provider.complete(request(messages, tools=TOOLS))
    body = fake.bodies[0]
    assert body["system"] == [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": _wire.START_TEXT}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "r1", "is_error": False},
            {"type": "text", "text": "an interjection"},
            {"type": "text", "text": "a late instruction"},
            {"type": "text", "text": "go on"},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]


async def test_parallel_tool_use_blocks(fake, make_provider):
    """Several tool_use blocks in one answer come back in order, with ids and inputs."""
    fake.enqueue(fake.message(
        "Calling both.", fake.tool_use("toolu_a", "add", {"a": 1, "b": 2}),
        fake.tool_use("toolu_b", "mul", {"x": 3}), stop_reason="tool_use"))
    async with make_provider() as provider:
        response = await provider.complete(request(tools=TOOLS))
    assert response.message.content == "Calling both."
    assert response.message.tool_calls == (
        ToolCall(id="toolu_a", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="toolu_b", name="mul", arguments={"x": 3}),
    )
    assert (response.finish_reason, response.raw_finish_reason) == ("tool_calls", "tool_use")


async def test_model_settings_reach_the_wire(fake, make_provider):
    """modelSettings are renamed to wire fields, a tool name becomes a tool choice, seed is dropped,
    and extras such as thinking and metadata pass through."""
    settings = {
        "temperature": 0.2, "maxTokens": 50, "topP": 0.9, "topK": 5, "stop": "END", "seed": 7,
        "toolChoice": "add", "parallelToolCalls": False,
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u1"},
    }
    async with make_provider() as provider:
        await provider.complete(request(tools=TOOLS, settings=settings))
    body = fake.bodies[0]
    assert {k: v for k, v in body.items() if k not in ("messages", "tools", "system")} == {
        "model": "claude-test", "max_tokens": 50, "temperature": 0.2, "top_p": 0.9, "top_k": 5,
        "stop_sequences": ["END"], "tool_choice": {"type": "tool", "name": "add", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u1"},
    }


@pytest.mark.parametrize(("choice", "parallel", "wire"), [
    ("auto", None, {"type": "auto"}),
    ("any", None, {"type": "any"}),
    ("required", None, {"type": "any"}),
    ("none", False, {"type": "none"}),
    (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
    ({"type": "any"}, None, {"type": "any"}),
])
async def test_tool_choice_modes(fake, make_provider, choice, parallel, wire):
    """toolChoice modes map to tool_choice objects; parallelToolCalls false disables parallel use."""
    settings = {"toolChoice": choice}
    if parallel is not None:
        settings["parallelToolCalls"] = parallel
    async with make_provider() as provider:
        await provider.complete(request(tools=TOOLS, settings=settings))
    assert fake.bodies[0]["tool_choice"] == wire


async def test_tool_choice_is_dropped_without_tools(fake, make_provider):
    """tool_choice is left out when the request has no tools."""
    async with make_provider(defaultMaxTokens=99) as provider:
        await provider.complete(request(settings={"toolChoice": "auto", "parallelToolCalls": False}))
    body = fake.bodies[0]
    assert "tool_choice" not in body
    assert "tools" not in body
    assert body["max_tokens"] == 99


async def test_usage_with_cache_fields(fake, make_provider):
    """Cache reads and writes are added into input_tokens and reported on their own."""
    fake.enqueue(fake.message("x", usage={
        "input_tokens": 10, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200,
        "output_tokens": 40}))
    async with make_provider() as provider:
        usage = (await provider.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (1210, 40, 1250)
    assert (usage.cache_read_tokens, usage.cache_write_tokens, usage.requests) == (1000, 200, 1)


async def test_prompt_caching_markers(fake, make_provider):
    """promptCaching: true marks the last system block, the last tool and the last user block."""
    messages = [
        Message(role="system", content="S1"), Message(role="system", content="S2"),
        Message(role="user", content="U"),
        Message(role="assistant", content=None, tool_calls=(ToolCall(id="t1", name="add", arguments={}),)),
        Message(role="tool", content="r", tool_call_id="t1", name="add", status=ToolStatus.SUCCESS),
    ]
    ephemeral = {"type": "ephemeral"}
    async with make_provider(promptCaching=True) as provider:
        await provider.complete(request(messages, tools=TOOLS))
        await provider.complete(request(messages[:3]))
    body, second = fake.bodies
    assert body["system"] == [{"type": "text", "text": "S1"},
                              {"type": "text", "text": "S2", "cache_control": ephemeral}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == ephemeral
    assert body["messages"][0]["content"] == [{"type": "text", "text": "U"}]
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "r", "is_error": False, "cache_control": ephemeral}]
    assert second["messages"][0]["content"] == [{"type": "text", "text": "U", "cache_control": ephemeral}]


async def test_prompt_caching_parts_can_be_chosen(fake, make_provider):
    """promptCaching as a mapping marks only the parts it enables; without it nothing is marked."""
    async with make_provider(promptCaching={"messages": False}) as provider:
        await provider.complete(request(tools=TOOLS))
    async with make_provider() as provider:
        await provider.complete(request(tools=TOOLS))
    chosen, plain = fake.bodies
    assert chosen["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert chosen["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in chosen["messages"][-1]["content"][-1]
    assert "cache_control" not in str(plain)


@pytest.mark.parametrize(("raw", "normalised"), [
    ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"), ("refusal", "content_filter"),
    ("pause_turn", "stop"), ("model_context_window_exceeded", "length"), ("something_new", "something_new"),
])
async def test_stop_reasons(fake, make_provider, raw, normalised):
    """Stop reasons are normalised, unknown ones kept, and the raw value is always kept."""
    fake.enqueue(fake.message("x", stop_reason=raw))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert (response.finish_reason, response.raw_finish_reason) == (normalised, raw)


async def test_refusal_without_text(fake, make_provider):
    """A refusal with no content is a content_filter answer with no text."""
    fake.enqueue(fake.message(stop_reason="refusal"))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert response.message.content is None
    assert response.finish_reason == "content_filter"


async def test_odd_tool_use_blocks_are_kept_readable(fake, make_provider):
    """A tool_use without id gets one, a repeated id is replaced, and a non-object input is kept raw."""
    fake.enqueue(fake.message(
        {"type": "tool_use", "name": "add", "input": {"a": 1, "b": 2}},
        fake.tool_use("dup", "add", {}), fake.tool_use("dup", "add", {}),
        fake.tool_use("toolu_l", "add", [1, 2]),
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        stop_reason="tool_use"))
    async with make_provider() as provider:
        calls = (await provider.complete(request(tools=TOOLS))).message.tool_calls
    assert len(calls) == 4
    assert calls[0].id.startswith("toolu_")
    assert calls[1].id == "dup"
    assert calls[2].id not in ("dup", calls[0].id)
    assert (calls[3].arguments, calls[3].raw_arguments) == ({}, "[1,2]")


# -- structured output ---------------------------------------------------------------------------


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


async def test_output_schema_travels_as_a_forced_tool(fake, make_provider):
    """With no other tools, the output schema becomes a forced final_output tool plus an instruction,
    and the tool's input comes back as the answer's JSON text."""
    fake.enqueue(fake.message("Here it is.", fake.tool_use("toolu_o", "final_output", {"n": 3}),
                              stop_reason="tool_use"))
    async with make_provider() as provider:
        response = await provider.complete(request(output_schema=SCHEMA))
    body = fake.bodies[0]
    assert body["tools"] == [{"name": "final_output", "description": body["tools"][0]["description"],
                              "input_schema": SCHEMA}]
    assert body["tool_choice"] == {"type": "tool", "name": "final_output"}
    assert "final_output" in body["system"][-1]["text"]
    assert response.message.content == '{"n":3}'
    assert response.message.tool_calls == ()
    assert (response.finish_reason, response.raw_finish_reason) == ("stop", "tool_use")


async def test_output_tool_beside_other_tools_is_not_forced(fake, make_provider):
    """Beside real tools the output tool is offered but not forced; other calls of the answer stay calls."""
    fake.enqueue(fake.message(fake.tool_use("toolu_a", "add", {"a": 1, "b": 1}),
                              fake.tool_use("toolu_o", "final_output", {"n": 2}), stop_reason="tool_use"))
    async with make_provider() as provider:
        response = await provider.complete(request(tools=(ADD,), output_schema=SCHEMA))
    body = fake.bodies[0]
    assert [t["name"] for t in body["tools"]] == ["add", "final_output"]
    assert "tool_choice" not in body
    assert response.message.content == '{"n":2}'
    assert [c.name for c in response.message.tool_calls] == ["add"]
    assert response.finish_reason == "tool_calls"


async def test_non_object_output_schema_is_wrapped(fake, make_provider):
    """A non-object schema is wrapped as {value: schema}; the answer is the unwrapped value."""
    schema = {"type": "array", "items": {"type": "integer"}}
    fake.enqueue(fake.message(fake.tool_use("toolu_o", "final_output", {"value": [1, 2]}), stop_reason="tool_use"))
    async with make_provider() as provider:
        response = await provider.complete(request(output_schema=schema))
    assert fake.bodies[0]["tools"][0]["input_schema"] == {
        "type": "object", "properties": {"value": schema}, "required": ["value"]}
    assert response.message.content == "[1,2]"


async def test_output_tool_name_avoids_a_real_tool(fake, make_provider):
    """A definition tool named final_output keeps its name; the output tool is renamed."""
    real = ToolSpec(name="final_output", description="real", parameters={"type": "object"})
    async with make_provider() as provider:
        await provider.complete(request(tools=(real,), output_schema=SCHEMA))
    assert [t["name"] for t in fake.bodies[0]["tools"]] == ["final_output", "final_output_"]


async def test_native_structured_output(fake, make_provider):
    """structuredOutput: native sends output_config.format and reads the text answer as it is."""
    fake.enqueue(fake.message('{"n": 1}'))
    async with make_provider(structuredOutput="native") as provider:
        response = await provider.complete(request(output_schema=SCHEMA, settings={"output_config": {"effort": "low"}}))
    body = fake.bodies[0]
    assert body["output_config"] == {"effort": "low", "format": {"type": "json_schema", "schema": SCHEMA}}
    assert "tools" not in body
    assert response.message.content == '{"n": 1}'


# -- thinking ------------------------------------------------------------------------------------


async def test_thinking_blocks_are_sent_back_with_their_tool_calls(fake, make_provider):
    """The thinking blocks of an answer with tool calls go back, first, in that assistant turn."""
    thinking = {"type": "thinking", "thinking": "Let me think.", "signature": "sig=="}
    fake.enqueue(fake.message(thinking, {"type": "redacted_thinking", "data": "xyz"},
                              fake.tool_use("toolu_t", "add", {"a": 1, "b": 2}), stop_reason="tool_use"))
    transcript = Transcript([Message(role="user", content="Add")])
    async with make_provider() as provider:
        first = await provider.complete(request(transcript, tools=TOOLS))
        transcript.append(first.message)
        transcript.append(Message(role="tool", content="3", tool_call_id="toolu_t", name="add",
                                  status=ToolStatus.SUCCESS))
        await provider.complete(request(transcript, tools=TOOLS))
    assert first.message.content is None
    assert fake.bodies[1]["messages"][1]["content"] == [
        thinking, {"type": "redacted_thinking", "data": "xyz"},
        {"type": "tool_use", "id": "toolu_t", "name": "add", "input": {"a": 1, "b": 2}}]


# -- failures and retries ---------------------------------------------------------------------


async def test_529_overloaded_then_success_after_retry_after(fake, make_provider):
    """A 529 overloaded_error is retried after the Retry-After the server asked for."""
    fake.enqueue(fake.Reply(status=529, headers={"Retry-After": "0.2"},
                            body=fake.error_body("overloaded_error", "Overloaded")),
                 fake.message("after the wait"))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert response.message.content == "after the wait"
    first, second = fake.seen
    assert second.at - first.at >= 0.19


async def test_retry_after_ms_is_honoured(fake, make_provider):
    """retry-after-ms takes precedence over Retry-After."""
    fake.enqueue(fake.Reply(status=429, headers={"retry-after-ms": "150", "Retry-After": "30"},
                            body=fake.error_body("rate_limit_error", "slow down")),
                 fake.message("ok"))
    async with make_provider() as provider:
        with anyio.fail_after(5):
            await provider.complete(request())
    first, second = fake.seen
    assert 0.14 <= second.at - first.at < 5


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
async def test_transient_statuses_are_retried(fake, make_provider, status):
    """Each transient status is retried, and the call succeeds."""
    fake.enqueue(fake.Reply(status=status, body=fake.error_body("api_error", "try again")), fake.message("ok"))
    async with make_provider() as provider:
        assert (await provider.complete(request())).message.content == "ok"
    assert len(fake.seen) == 2


async def test_transient_failures_give_up_after_max_retries(fake, make_provider):
    """After maxRetries retries the last transient error is raised, marked transient, with the API's type."""
    fake.enqueue(*[fake.Reply(status=529, body=fake.error_body("overloaded_error", "Overloaded"))] * 5)
    async with make_provider(maxRetries=1) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    assert (info.value.status, info.value.transient) == (529, True)
    assert "Overloaded [overloaded_error]" in str(info.value)
    assert len(fake.seen) == 2


async def test_final_400_is_not_retried_and_carries_the_api_message(fake, make_provider):
    """A 400 is final: one attempt, and the error holds the API's type and message, status, body and request."""
    fake.enqueue(fake.Reply(status=400, headers={"request-id": "req_abc"}, body=fake.error_body(
        "invalid_request_error", "messages: text content blocks must be non-empty")))
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    err = info.value
    assert len(fake.seen) == 1
    assert "messages: text content blocks must be non-empty [invalid_request_error] (request req_abc)" in str(err)
    assert "claude:claude-test (HTTP 400)" in str(err)
    assert (err.provider, err.model, err.status, err.transient, err.retry_after) == (
        "claude", "claude-test", 400, False, None)
    assert "invalid_request_error" in err.body
    assert isinstance(err.request, httpx.Request)


async def test_long_error_bodies_are_truncated(fake, make_provider):
    """The error's body is cut to 2,000 characters."""
    fake.enqueue(fake.Reply(status=401, body=b"x" * 5000))
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    assert len(info.value.body) == 2000
    assert info.value.transient is False


async def test_x_should_retry_header_overrides_the_status(fake, make_provider):
    """x-should-retry: false makes a 529 final; true makes a 400 transient."""
    fake.enqueue(fake.Reply(status=529, headers={"x-should-retry": "false"}, body={}))
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
        assert info.value.transient is False
        fake.enqueue(fake.Reply(status=400, headers={"x-should-retry": "true"}, body={}), fake.message())
        await provider.complete(request())
    assert len(fake.seen) == 3


async def test_connection_reset_then_success(fake, make_provider):
    """A dropped connection is retried on a new one and the call succeeds."""
    fake.enqueue(fake.Reply(close=True), fake.message("second try"))
    async with make_provider() as provider:
        assert (await provider.complete(request())).message.content == "second try"


async def test_timeout_is_transient(fake, make_provider):
    """A read timeout is a transient ProviderError."""
    fake.enqueue(fake.Reply(delay=0.3, body=fake.message()))
    async with make_provider(timeout="50ms", maxRetries=0) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    assert info.value.transient is True
    assert "timed out" in str(info.value)


async def test_answer_without_content_is_a_final_error(fake, make_provider):
    """A 200 without a content list, or not JSON, is a final ProviderError that says so."""
    fake.enqueue({"type": "message", "model": "m"}, fake.Reply(body=b"<html>proxy</html>"))
    async with make_provider() as provider:
        with pytest.raises(ProviderError, match="no content list") as info:
            await provider.complete(request())
        assert (info.value.transient, info.value.status) == (False, 200)
        with pytest.raises(ProviderError, match="not JSON"):
            await provider.complete(request())
    assert len(fake.seen) == 2


# -- encoding cache, keys, clients ---------------------------------------------------------------


async def test_transcript_messages_are_encoded_once(fake, make_provider, monkeypatch):
    """With a Transcript, each message is encoded once across requests; the wire still gets all, merged."""
    encoded: list[Message] = []
    original = _wire.MessageEncoder.__call__

    def counting(self, message):
        encoded.append(message)
        return original(self, message)

    monkeypatch.setattr(_wire.MessageEncoder, "__call__", counting)
    transcript = Transcript([Message(role="system", content="S"), Message(role="user", content="U")])
    fake.enqueue(fake.message(fake.tool_use("t1", "add", {"a": 1, "b": 2}), fake.tool_use("t2", "add", {}),
                              stop_reason="tool_use"), fake.message("3"))
    async with make_provider() as provider:
        first = await provider.complete(request(transcript, tools=TOOLS))
        transcript.append(first.message)
        transcript.append(Message(role="tool", content="3", tool_call_id="t1", name="add"))
        transcript.append(Message(role="tool", content="0", tool_call_id="t2", name="add"))
        await provider.complete(request(transcript, tools=TOOLS))
    assert len(encoded) == 5
    assert [m["role"] for m in fake.bodies[1]["messages"]] == ["user", "assistant", "user"]
    assert len(fake.bodies[1]["messages"][2]["content"]) == 2


async def test_environment_key_only_towards_anthropic(fake, make_provider, monkeypatch):
    """ANTHROPIC_API_KEY is used only without a baseUrl; a custom baseUrl never gets it."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    async with make_provider(api_key=None) as provider:
        await provider.complete(request())
    assert "x-api-key" not in fake.seen[0].headers
    default = AnthropicProvider(ProviderSettings(name="claude", kind="anthropic"))
    assert default._headers["x-api-key"] == "sk-from-env"
    assert default.url == "https://api.anthropic.com/v1/messages"


async def test_version_beta_and_extra_headers(fake, make_provider):
    """anthropicVersion, beta features and extra headers reach the request."""
    async with make_provider(anthropicVersion="2099-01-01", beta=["a-1", "b-2"],
                             headers={"X-Trace": "t1", "X-Api-Key": "override"}) as provider:
        await provider.complete(request())
    headers = fake.seen[0].headers
    assert (headers["anthropic-version"], headers["anthropic-beta"], headers["x-trace"], headers["x-api-key"]) == (
        "2099-01-01", "a-1,b-2", "t1", "override")


async def test_injected_client_is_used_and_left_open(fake, make_provider):
    """An injected httpx client carries the requests (with the provider's headers) and stays open."""
    async with httpx.AsyncClient() as client:
        async with make_provider(http_client=client, api_key="sk-inj") as provider:
            await provider.complete(request())
            chunks = [d async for d in provider.stream(request())]
        assert not client.is_closed
    assert [s.headers["x-api-key"] for s in fake.seen] == ["sk-inj", "sk-inj"]
    assert chunks[-1].response.message.content == "ok"


async def test_concurrent_requests_spread_over_pools(fake, make_provider, anyio_backend):
    """50 concurrent requests all complete, over many connections (over httpcore, in several pools)."""
    results: list[str | None] = []

    async def one(i: int) -> None:
        response = await provider.complete(request([Message(role="user", content=f"#{i}")]))
        results.append(response.message.content)

    async with make_provider() as provider:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(one, i)
        transport = provider._client._transport
        pools = len(transport._pools) if isinstance(transport, ShardedTransport) else None
    assert isinstance(transport, AiohttpTransport if anyio_backend == "asyncio" else ShardedTransport)
    assert results == ["ok"] * 50
    assert len({s.peer for s in fake.seen}) > 1
    assert pools is None or pools > 1


# -- options and plugin -------------------------------------------------------------------------


def test_bad_options_raise_one_config_error():
    """Invalid options are all reported in one ConfigError naming their paths."""
    with pytest.raises(ConfigError) as info:
        AnthropicProvider(ProviderSettings(name="c", kind="anthropic", options={
            "maxRetries": -1, "timeout": "soon", "promptCaching": "yes", "structuredOutput": "json",
            "defaultMaxTokens": 0, "beta": [1], "headers": {"X": 1}}))
    paths = {p.path for p in info.value.problems}
    assert paths == {f"$.providers.c.{k}" for k in (
        "maxRetries", "timeout", "promptCaching", "structuredOutput", "defaultMaxTokens", "beta", "headers")}


@pytest.mark.parametrize("base_url", ["ftp://example.com", "not a url", "http://"])
def test_bad_base_url_is_a_config_error(base_url):
    """A baseUrl that is not an http(s) URL is reported as a ConfigError at its path."""
    with pytest.raises(ConfigError) as info:
        AnthropicProvider(ProviderSettings(name="c", kind="anthropic", base_url=base_url))
    assert info.value.problems[0].path == "$.providers.c.baseUrl"


def test_price_provider_follows_the_host_or_the_option():
    """Costs are looked up as anthropic only towards api.anthropic.com, unless priceProvider says otherwise."""
    real = AnthropicProvider(ProviderSettings(name="a", kind="anthropic", api_key="k"))
    local = AnthropicProvider(ProviderSettings(name="l", kind="anthropic", base_url="http://127.0.0.1:9"))
    proxy = AnthropicProvider(ProviderSettings(name="p", kind="anthropic", base_url="https://gw.example.com/",
                                               options={"priceProvider": "anthropic"}))
    assert (real.price_provider_id, local.price_provider_id, proxy.price_provider_id) == (
        "anthropic", None, "anthropic")
    assert proxy.url == "https://gw.example.com/v1/messages"


def test_plugin_registers_the_anthropic_kind():
    """The plugin module registers a factory for kind anthropic that builds an AnthropicProvider."""
    host = PluginHost()
    host.register(loopwright_anthropic, "anthropic")
    provider = host.providers.get("anthropic")(ProviderSettings(name="anthropic", kind="anthropic", api_key="k"))
    assert isinstance(provider, AnthropicProvider)
    assert sorted(loopwright_anthropic.__all__) == loopwright_anthropic.__all__


def test_importing_the_plugin_does_not_import_httpx():
    """Importing loopwright_anthropic stays cheap: httpx and the provider load only when used."""
    code = ("import sys, loopwright_anthropic; "
            "assert 'httpx' not in sys.modules and 'loopwright_anthropic._provider' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("raw", "unreported"), [
    (None, 1), ({}, 1), ({"cache_read_input_tokens": 3}, 1), ({"input_tokens": 4}, 0),
    ({"input_tokens": 4, "output_tokens": 2}, 0),
])
def test_usage_without_token_counts_is_unreported(raw, unreported):
    """No input and no output count means the request was not counted (its cost is unknown)."""
    from loopwright_anthropic import _wire  # noqa: PLC0415

    usage = _wire.decode_usage(raw)
    assert (usage.requests, usage.unreported_requests) == (1, unreported)
