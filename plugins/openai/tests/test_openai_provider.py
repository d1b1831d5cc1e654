"""OpenAIProvider against a real local HTTP server speaking Chat Completions."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio
import httpx
import pytest

import loopwright_openai
from loopwright._plugins import PluginHost
from loopwright._types import Message, ModelRequest, ToolCall, ToolSpec, ToolStatus, Transcript
from loopwright.abc import ProviderSettings
from loopwright.errors import ConfigError, ProviderError
from loopwright.http import AiohttpTransport, ShardedTransport
from loopwright_openai import OpenAIProvider, _wire

pytestmark = pytest.mark.anyio

ADD = ToolSpec(
    name="add", description="Add two integers.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]},
)
TOOLS = (ADD,)


def request(messages=None, **kw) -> ModelRequest:
    if messages is None:
        messages = [Message(role="system", content="Be brief."), Message(role="user", content="Hi")]
    return ModelRequest(model="gpt-test", provider="oa", messages=messages, **kw)


# -- answers -------------------------------------------------------------------------------------


async def test_plain_answer(fake, make_provider):
    """A text answer becomes an assistant message, with the served model and usage."""
    fake.enqueue(fake.completion("Hello there."))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert response.message == Message(role="assistant", content="Hello there.", model="gpt-test-0001")
    assert response.model == "gpt-test-0001"
    assert (response.finish_reason, response.raw_finish_reason) == ("stop", "stop")
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.requests) == (3, 1, 4, 1)
    [seen] = fake.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["content-type"] == "application/json"
    assert seen.body == {"model": "gpt-test", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}


async def test_tool_call_round_trip_encoding(fake, make_provider):
    """Assistant tool calls and tool results go out in the wire shape, raw arguments verbatim."""
    messages = [
        Message(role="system", content="S"),
        Message(role="user", content="Add"),
        Message(role="assistant", content=None, tool_calls=(
            ToolCall(id="call_1", name="add", arguments={"a": 1, "b": 2}),
            ToolCall(id="call_2", name="add", arguments={}, raw_arguments="{not json"),
        )),
        Message(role="tool", content="3", tool_call_id="call_1", name="add", status=ToolStatus.SUCCESS),
        Message(role="tool", content="bad arguments", tool_call_id="call_2", name="add",
                status=ToolStatus.INVALID_ARGUMENTS),
        Message(role="assistant", content="Done: 3"),
    ]
    async with make_provider() as provider:
        await provider.complete(request(messages, tools=TOOLS))
    body = fake.bodies[0]
    assert body["messages"][2:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{not json"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2", "content": "bad arguments"},
        {"role": "assistant", "content": "Done: 3"},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "add", "description": "Add two integers.", "parameters": dict(ADD.parameters)}}]


async def test_parallel_tool_calls_in_one_reply(fake, make_provider):
    """Several tool calls in one reply come back in order, with ids and parsed arguments."""
    fake.enqueue(fake.completion(None, finish_reason="tool_calls", tool_calls=[
        fake.tool_call("call_a", "add", '{"a": 1, "b": 2}'),
        fake.tool_call("call_b", "add", '{"a": 3, "b": 4}'),
        fake.tool_call("call_c", "mul", "{}"),
    ]))
    async with make_provider() as provider:
        response = await provider.complete(request(tools=TOOLS))
    assert response.message.content is None
    assert response.message.tool_calls == (
        ToolCall(id="call_a", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="call_b", name="add", arguments={"a": 3, "b": 4}),
        ToolCall(id="call_c", name="mul", arguments={}),
    )
    assert response.finish_reason == "tool_calls"


async def test_model_settings_reach_the_wire(fake, make_provider):
    """modelSettings are renamed to wire fields, a tool name becomes a tool_choice object, and
    extras pass through unchanged."""
    settings = {
        "temperature": 0.2, "maxTokens": 50, "topP": 0.9, "stop": ["END"], "seed": 7,
        "toolChoice": "add", "parallelToolCalls": False,
        "reasoning_effort": "low", "metadata": {"k": "v"}, "logprobs": True,
    }
    async with make_provider() as provider:
        await provider.complete(request(tools=TOOLS, settings=settings))
    body = fake.bodies[0]
    assert {k: v for k, v in body.items() if k not in ("messages", "tools")} == {
        "model": "gpt-test", "temperature": 0.2, "max_tokens": 50, "top_p": 0.9, "stop": ["END"],
        "seed": 7, "tool_choice": {"type": "function", "function": {"name": "add"}},
        "parallel_tool_calls": False, "reasoning_effort": "low", "metadata": {"k": "v"}, "logprobs": True,
    }


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
async def test_tool_choice_modes_pass_as_strings(fake, make_provider, choice):
    """toolChoice auto/none/required are sent as the plain strings."""
    async with make_provider() as provider:
        await provider.complete(request(tools=TOOLS, settings={"toolChoice": choice}))
    assert fake.bodies[0]["tool_choice"] == choice


async def test_tool_settings_are_dropped_without_tools(fake, make_provider):
    """tool_choice and parallel_tool_calls are left out when the request has no tools."""
    async with make_provider() as provider:
        await provider.complete(request(settings={"toolChoice": "auto", "parallelToolCalls": True}))
    assert "tool_choice" not in fake.bodies[0]
    assert "parallel_tool_calls" not in fake.bodies[0]
    assert "tools" not in fake.bodies[0]


async def test_max_tokens_field_option(fake, make_provider):
    """maxTokensField: max_completion_tokens renames maxTokens for newer models."""
    async with make_provider(maxTokensField="max_completion_tokens") as provider:
        await provider.complete(request(settings={"maxTokens": 9}))
    assert fake.bodies[0]["max_completion_tokens"] == 9
    assert "max_tokens" not in fake.bodies[0]


async def test_output_schema_becomes_response_format(fake, make_provider):
    """An output schema is sent as a non-strict json_schema response_format named output."""
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    async with make_provider() as provider:
        await provider.complete(request(output_schema=schema))
    assert fake.bodies[0]["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": False}}


async def test_usage_with_cached_and_reasoning_tokens(fake, make_provider):
    """Cached prompt tokens and reasoning tokens are read from the usage details."""
    fake.enqueue(fake.completion("x", usage={
        "prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140,
        "prompt_tokens_details": {"cached_tokens": 64}, "completion_tokens_details": {"reasoning_tokens": 32},
    }))
    async with make_provider() as provider:
        usage = (await provider.complete(request())).usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (100, 40, 140)
    assert (usage.cache_read_tokens, usage.reasoning_tokens, usage.requests) == (64, 32, 1)


async def test_usage_without_details_stays_unknown(fake, make_provider):
    """Counts the API does not send stay None, and a missing total is the sum."""
    fake.enqueue(fake.completion("x", usage={"prompt_tokens": 5, "completion_tokens": 2}))
    async with make_provider() as provider:
        usage = (await provider.complete(request())).usage
    assert (usage.total_tokens, usage.cache_read_tokens, usage.reasoning_tokens) == (7, None, None)


@pytest.mark.parametrize(("raw", "normalised"), [
    ("stop", "stop"), ("length", "length"), ("content_filter", "content_filter"),
    ("tool_calls", "tool_calls"), ("function_call", "tool_calls"), ("insufficient_system_resource",
                                                                    "insufficient_system_resource"),
])
async def test_finish_reasons(fake, make_provider, raw, normalised):
    """Finish reasons are normalised, unknown ones kept, and the raw value is always kept."""
    fake.enqueue(fake.completion("x", finish_reason=raw))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert (response.finish_reason, response.raw_finish_reason) == (normalised, raw)


async def test_malformed_tool_arguments_are_kept_raw(fake, make_provider):
    """Unparseable or non-object arguments give {} plus raw_arguments; missing ids are generated."""
    fake.enqueue(fake.completion(None, finish_reason="tool_calls", tool_calls=[
        fake.tool_call("call_1", "add", '{"a": 1, "b": '),
        fake.tool_call("call_2", "add", "[1, 2]"),
        fake.tool_call(None, "add", '{"a": 1, "b": 2}'),
        fake.tool_call("call_4", "add", ""),
    ]))
    async with make_provider() as provider:
        calls = (await provider.complete(request(tools=TOOLS))).message.tool_calls
    assert (calls[0].arguments, calls[0].raw_arguments) == ({}, '{"a": 1, "b": ')
    assert (calls[1].arguments, calls[1].raw_arguments) == ({}, "[1, 2]")
    assert calls[2].id.startswith("call_")
    assert calls[2].id not in ("call_1", "call_2", "call_4")
    assert (calls[2].arguments, calls[2].raw_arguments) == ({"a": 1, "b": 2}, None)
    assert (calls[3].arguments, calls[3].raw_arguments) == ({}, None)


# -- failures and retries ---------------------------------------------------------------------


async def test_429_with_retry_after_then_success(fake, make_provider):
    """A 429 is retried after the Retry-After seconds the server asked for."""
    fake.enqueue(fake.Reply(status=429, headers={"Retry-After": "0.2"},
                            body={"error": {"message": "Rate limit reached", "type": "requests"}}),
                 fake.completion("after the wait"))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert response.message.content == "after the wait"
    first, second = fake.seen
    assert second.at - first.at >= 0.19


async def test_retry_after_ms_is_honoured(fake, make_provider):
    """retry-after-ms takes precedence over Retry-After."""
    fake.enqueue(fake.Reply(status=429, headers={"retry-after-ms": "150", "Retry-After": "30"}, body={}),
                 fake.completion("ok"))
    async with make_provider() as provider:
        with anyio.fail_after(5):
            await provider.complete(request())
    first, second = fake.seen
    assert 0.14 <= second.at - first.at < 5


async def test_500_then_success(fake, make_provider):
    """A server error is transient: the call is retried and succeeds."""
    fake.enqueue(fake.Reply(status=500, body={"error": {"message": "oops"}}),
                 fake.Reply(status=503, body=b"upstream unavailable"),
                 fake.completion("recovered"))
    async with make_provider() as provider:
        response = await provider.complete(request())
    assert response.message.content == "recovered"
    assert len(fake.seen) == 3


async def test_transient_failures_give_up_after_max_retries(fake, make_provider):
    """After maxRetries retries the last transient error is raised, marked transient."""
    fake.enqueue(*[fake.Reply(status=502, body={"error": {"message": "bad gateway"}})] * 5)
    async with make_provider(maxRetries=1) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    assert (info.value.status, info.value.transient) == (502, True)
    assert len(fake.seen) == 2


async def test_final_400_is_not_retried_and_carries_the_api_message(fake, make_provider):
    """A 400 is final: one attempt, and the error holds the API message, status, body and request."""
    fake.enqueue(fake.Reply(status=400, body={"error": {
        "message": "Invalid value for 'temperature'", "type": "invalid_request_error", "code": None}}))
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request(settings={"temperature": 9}))
    err = info.value
    assert len(fake.seen) == 1
    assert "Invalid value for 'temperature'" in str(err)
    assert "oa:gpt-test" in str(err)
    assert (err.provider, err.model, err.status, err.transient) == ("oa", "gpt-test", 400, False)
    assert "invalid_request_error" in err.body
    assert isinstance(err.request, httpx.Request)


async def test_x_should_retry_header_overrides_the_status(fake, make_provider):
    """x-should-retry: false makes a 500 final; true makes a 400 transient."""
    fake.enqueue(fake.Reply(status=500, headers={"x-should-retry": "false"}, body={}))
    async with make_provider() as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
        assert info.value.transient is False
        fake.enqueue(fake.Reply(status=400, headers={"x-should-retry": "true"}, body={}), fake.completion())
        await provider.complete(request())
    assert len(fake.seen) == 3


async def test_connection_reset_is_transient_after_retries(fake, make_provider):
    """A server that drops the connection gives a transient ProviderError once retries run out."""
    fake.enqueue(*[fake.Reply(close=True)] * 3)
    async with make_provider(maxRetries=2) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    err = info.value
    assert (err.transient, err.status) == (True, None)
    assert "connection failed" in str(err)
    assert len(fake.seen) == 3


async def test_connection_reset_then_success(fake, make_provider):
    """A dropped connection is retried on a new one and the call succeeds."""
    fake.enqueue(fake.Reply(close=True), fake.completion("second try"))
    async with make_provider() as provider:
        assert (await provider.complete(request())).message.content == "second try"


async def test_timeout_is_transient(fake, make_provider):
    """A read timeout is a transient ProviderError."""
    fake.enqueue(fake.Reply(delay=0.3, body=fake.completion()))
    async with make_provider(timeout="50ms", maxRetries=0) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    assert info.value.transient is True
    assert "timed out" in str(info.value)


async def test_connection_refused_is_transient():
    """Nothing listening is a transient connection error."""
    with socket_port() as port:
        pass  # the port is free again: nothing listens on it
    settings = ProviderSettings(name="oa", kind="openai", base_url=f"http://127.0.0.1:{port}/v1",
                                options={"maxRetries": 1, "retryBaseDelay": 0.001})
    async with OpenAIProvider(settings) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request())
    assert info.value.transient is True


async def test_empty_choices_is_a_final_error(fake, make_provider):
    """A response without choices is a final ProviderError that says so."""
    fake.enqueue({"id": "x", "object": "chat.completion", "model": "m", "choices": []})
    async with make_provider() as provider:
        with pytest.raises(ProviderError, match="no choices") as info:
            await provider.complete(request())
    assert (info.value.transient, info.value.status) == (False, 200)
    assert len(fake.seen) == 1


async def test_non_json_body_is_a_final_error(fake, make_provider):
    """A 200 whose body is not JSON is a final ProviderError carrying the body."""
    fake.enqueue(fake.Reply(body=b"<html>proxy page</html>"))
    async with make_provider() as provider:
        with pytest.raises(ProviderError, match="not JSON") as info:
            await provider.complete(request())
    assert info.value.transient is False
    assert "proxy page" in info.value.body


# -- encoding cache, headers, clients ----------------------------------------------------------


async def test_transcript_messages_are_encoded_once(fake, make_provider, monkeypatch):
    """With a Transcript, each message is encoded once across requests; the wire still gets all."""
    encoded: list[Message] = []
    original = _wire.encode_message_json

    def counting(message):
        encoded.append(message)
        return original(message)

    monkeypatch.setattr(_wire, "encode_message_json", counting)
    transcript = Transcript([Message(role="system", content="S"), Message(role="user", content="U")])
    fake.enqueue(fake.completion(None, tool_calls=[fake.tool_call("c1", "add", '{"a":1,"b":2}')]),
                 fake.completion("3"))
    async with make_provider() as provider:
        first = await provider.complete(request(transcript, tools=TOOLS))
        transcript.append(first.message)
        transcript.append(Message(role="tool", content="3", tool_call_id="c1", name="add"))
        await provider.complete(request(transcript, tools=TOOLS))
    assert len(encoded) == 4
    assert [m["role"] for m in fake.bodies[1]["messages"]] == ["system", "user", "assistant", "tool"]
    assert fake.bodies[1]["messages"][2]["tool_calls"][0]["id"] == "c1"


async def test_plain_message_lists_are_encoded_each_time(fake, make_provider):
    """A plain list of messages (for example from a ModifyRequest hook) works without a cache."""
    async with make_provider() as provider:
        await provider.complete(request([Message(role="user", content="a")]))
        await provider.complete(request([Message(role="user", content="b")]))
    assert [b["messages"] for b in fake.bodies] == [[{"role": "user", "content": "a"}],
                                                    [{"role": "user", "content": "b"}]]


async def test_api_key_and_extra_headers(fake, make_provider):
    """The API key goes in a Bearer header, with organization, project and extra headers."""
    async with make_provider(api_key="sk-secret", organization="org-1", project="proj-1",
                             headers={"X-Trace": "t1"}) as provider:
        await provider.complete(request())
    headers = fake.seen[0].headers
    assert headers["authorization"] == "Bearer sk-secret"
    assert (headers["openai-organization"], headers["openai-project"], headers["x-trace"]) == (
        "org-1", "proj-1", "t1")


async def test_no_key_sends_no_authorization_and_never_the_environment_key(fake, make_provider, monkeypatch):
    """Without a key no Authorization header is sent; OPENAI_API_KEY never goes to a custom baseUrl."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    async with make_provider(api_key=None) as provider:
        await provider.complete(request())
    assert "authorization" not in fake.seen[0].headers


async def test_injected_client_is_used_and_left_open(fake, make_provider):
    """An injected httpx client carries the requests (with the provider's headers) and stays open."""
    async with httpx.AsyncClient() as client:
        async with make_provider(http_client=client, api_key="sk-inj") as provider:
            await provider.complete(request())
        assert not client.is_closed
        assert fake.seen[0].headers["authorization"] == "Bearer sk-inj"


def default_transport(anyio_backend: str) -> type:
    """The transport ``transport: auto`` picks: aiohttp's under asyncio, the sharded httpcore pools under trio."""
    return AiohttpTransport if anyio_backend == "asyncio" else ShardedTransport


async def test_burst_of_200_concurrent_requests(fake, make_provider, anyio_backend):
    """200 concurrent requests all complete, over many connections (and, over httpcore, several pools)."""
    results: list[str | None] = []

    async def one(i: int) -> None:
        response = await provider.complete(request([Message(role="user", content=f"#{i}")]))
        results.append(response.message.content)

    async with make_provider() as provider:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(one, i)
        transport = provider._client._transport
        pools = len(transport._pools) if isinstance(transport, ShardedTransport) else None
    assert isinstance(transport, default_transport(anyio_backend))
    assert results == ["ok"] * 200
    assert len(fake.seen) == 200
    assert len({s.peer for s in fake.seen}) > 1
    assert pools is None or pools > 1


async def test_sequential_requests_reuse_one_pool_and_connection(fake, make_provider, anyio_backend):
    """One request at a time goes over one kept-alive connection (over httpcore, in one pool)."""
    async with make_provider() as provider:
        for _ in range(5):
            await provider.complete(request())
        transport = provider._client._transport
        assert isinstance(transport, default_transport(anyio_backend))
        if isinstance(transport, ShardedTransport):
            assert len(transport._pools) == 1
            assert transport._in_flight == [0]
    assert len(fake.seen) == 5
    assert len({s.peer for s in fake.seen}) == 1


async def test_transport_option_forces_httpcore(fake, make_provider):
    """transport: httpcore uses the sharded httpcore pools under either event loop."""
    async with make_provider(transport="httpcore") as provider:
        assert (await provider.complete(request())).message.content == "ok"
        assert isinstance(provider._client._transport, ShardedTransport)


async def test_aclose_closes_the_built_client(fake, make_provider):
    """aclose closes the client the provider built."""
    provider = make_provider()
    await provider.complete(request())
    client = provider._client
    await provider.aclose()
    assert client.is_closed


# -- options and plugin -------------------------------------------------------------------------


def test_bad_options_raise_one_config_error():
    """Invalid options are all reported in one ConfigError naming their paths."""
    with pytest.raises(ConfigError) as info:
        OpenAIProvider(ProviderSettings(name="oa", kind="openai", options={
            "maxRetries": -1, "timeout": "soon", "maxTokensField": "tokens", "headers": {"X": 1}}))
    paths = {p.path for p in info.value.problems}
    assert paths == {"$.providers.oa.maxRetries", "$.providers.oa.timeout",
                     "$.providers.oa.maxTokensField", "$.providers.oa.headers"}


def test_price_provider_follows_the_host_or_the_option():
    """Costs are looked up as openai only towards api.openai.com, unless priceProvider says otherwise."""
    local = OpenAIProvider(ProviderSettings(name="l", kind="openai", base_url="http://127.0.0.1:9/v1"))
    groq = OpenAIProvider(ProviderSettings(name="g", kind="openai", base_url="https://api.groq.com/openai/v1",
                                           options={"priceProvider": "groq"}))
    assert (local.price_provider_id, groq.price_provider_id) == (None, "groq")


@pytest.mark.parametrize("base_url", ["ftp://example.com/v1", "not a url", "http://"])
def test_bad_base_url_is_a_config_error(base_url):
    """A baseUrl that is not an http(s) URL is reported as a ConfigError at its path."""
    with pytest.raises(ConfigError) as info:
        OpenAIProvider(ProviderSettings(name="oa", kind="openai", base_url=base_url))
    assert info.value.problems[0].path == "$.providers.oa.baseUrl"


async def test_extra_headers_replace_defaults_case_insensitively(fake, make_provider):
    """An extra header overrides a default one whatever its case (one Authorization header)."""
    async with make_provider(api_key="sk-a", headers={"authorization": "Token t"}) as provider:
        await provider.complete(request())
    assert fake.seen[0].headers["authorization"] == "Token t"


def test_durations_accept_units():
    """Duration options take seconds or strings with ms/s/m/h."""
    provider = OpenAIProvider(ProviderSettings(name="oa", kind="openai", api_key="k", options={
        "timeout": "2m", "connectTimeout": "500ms", "retryBaseDelay": 0.25, "keepaliveExpiry": "1h"}))
    options = provider._options
    assert (options.timeout, options.connect_timeout, options.retry_base_delay, options.keepalive_expiry) == (
        120.0, 0.5, 0.25, 3600.0)
    assert options.max_keepalive_connections == options.max_connections == 1000


def test_plugin_registers_the_openai_kind():
    """The plugin module registers a factory for kind openai that builds an OpenAIProvider."""
    host = PluginHost()
    host.register(loopwright_openai, "openai")
    factory = host.providers.get("openai")
    provider = factory(ProviderSettings(name="openai", kind="openai", api_key="k"))
    assert isinstance(provider, OpenAIProvider)
    assert provider.url == "https://api.openai.com/v1/chat/completions"
    assert provider.price_provider_id == "openai"
    assert sorted(loopwright_openai.__all__) == loopwright_openai.__all__


def test_importing_the_plugin_does_not_import_httpx():
    """Importing loopwright_openai stays cheap: httpx and the provider load only when used."""
    code = ("import sys, loopwright_openai; "
            "assert 'httpx' not in sys.modules and 'loopwright_openai._provider' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


class socket_port:  # noqa: N801 - used like a function
    """A context manager yielding a port that was free a moment ago."""

    def __enter__(self) -> int:
        import socket  # noqa: PLC0415

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return self._sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def test_request_body_is_compact_json(fake):
    """The spliced body is valid JSON with the model first."""
    body = _wire.build_body(request(tools=TOOLS), tools_json=_wire.encode_tools(TOOLS))
    assert list(json.loads(body)) == ["model", "messages", "tools"]


def test_quirks_option_is_checked():
    """quirks must name known quirks; an unknown one is reported with the known list."""
    with pytest.raises(ConfigError) as info:
        OpenAIProvider(ProviderSettings(name="oa", kind="openai", options={"quirks": ["noStreamOptions", "bogus"]}))
    [problem] = info.value.problems
    assert problem.path == "$.providers.oa.quirks"
    assert "'bogus'" in problem.message
    assert "splitParallelToolCalls" in problem.message
    provider = OpenAIProvider(ProviderSettings(name="oa", kind="openai", api_key="k",
                                               options={"quirks": "noStreamOptions"}))
    assert provider._options.quirks == frozenset({"noStreamOptions"})


async def test_quirks_apply_to_plain_requests(fake, make_provider):
    """Message and tool-choice quirks shape non-streamed requests too."""
    messages = [Message(role="user", content="u"),
                Message(role="assistant", content=None, tool_calls=(ToolCall(id="call_1", name="add"),)),
                Message(role="tool", content="3", tool_call_id="call_1", name="add")]
    async with make_provider(quirks=["emptyToolCallContent", "noToolChoiceRequired"]) as provider:
        await provider.complete(request(messages, tools=TOOLS, settings={"toolChoice": "required"}))
    body = fake.bodies[0]
    assert body["messages"][1]["content"] == ""
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}


# -- quirks learnt from errors ------------------------------------------------------------------

LLAMA_NULL_CONTENT = {"error": {"message": (
    "7 validation errors:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, "
    "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid string', "
    "'input': None}"), "type": "internal_server_error", "param": None, "code": None}}
LLAMA_JSON_SCHEMA = {"error": {"message": (
    "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
    "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}"),
    "type": "internal_server_error", "param": None, "code": None}}


BARE_CALL = [Message(role="user", content="u"),
             Message(role="assistant", content=None, tool_calls=(ToolCall(id="call_1", name="add"),)),
             Message(role="tool", content="3", tool_call_id="call_1", name="add")]
GATEWAY_EMPTY_CONTENT = {"error": {"message": "messages: text content blocks must be non-empty",
                                   "type": "invalid_request_error"}}


async def test_tool_calls_without_text_go_out_with_empty_content_at_once(fake, make_provider):
    """A fresh provider sends content "" beside tool calls, the shape llama-cpp-python (which refuses
    null with a 500), vLLM, Ollama, llama.cpp and OpenAI all accept: one request, nothing learnt."""
    async with make_provider(maxRetries=0) as provider:
        assert (await provider.complete(request(BARE_CALL, tools=TOOLS))).message.content == "ok"
        assert provider.quirks == frozenset()
    assert [b["messages"][1] for b in fake.bodies] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]


async def test_null_content_refused_is_learnt(fake, make_provider):
    """Configured to send null, a 500 saying content must be a string (llama-cpp-python) makes the
    provider resend at once with content "", and keep doing so."""
    fake.enqueue(fake.Reply(status=500, body=LLAMA_NULL_CONTENT), fake.completion("ok"), fake.completion("ok"))
    async with make_provider(maxRetries=0, quirks=["nullToolCallContent"]) as provider:
        assert (await provider.complete(request(BARE_CALL, tools=TOOLS))).message.content == "ok"
        await provider.complete(request(BARE_CALL, tools=TOOLS))
        assert "emptyToolCallContent" in provider.quirks
    assert [b["messages"][1]["content"] for b in fake.bodies] == [None, "", ""]


async def test_empty_content_refused_is_learnt(fake, make_provider):
    """A 400 saying text content must be non-empty (gateways to Anthropic) makes the provider resend
    with content null, and keep doing so."""
    fake.enqueue(fake.Reply(status=400, body=GATEWAY_EMPTY_CONTENT), fake.completion("ok"), fake.completion("ok"))
    async with make_provider(maxRetries=0) as provider:
        assert (await provider.complete(request(BARE_CALL, tools=TOOLS))).message.content == "ok"
        await provider.complete(request(BARE_CALL, tools=TOOLS))
        assert "nullToolCallContent" in provider.quirks
    assert [b["messages"][1]["content"] for b in fake.bodies] == ["", None, None]


async def test_null_content_error_without_null_content_is_not_learnt(fake, make_provider):
    """The same error for a request without null contents is an ordinary failure."""
    fake.enqueue(fake.Reply(status=500, body=LLAMA_NULL_CONTENT))
    async with make_provider(maxRetries=0) as provider:
        with pytest.raises(ProviderError):
            await provider.complete(request())
        assert provider.quirks == frozenset()


async def test_json_schema_refused_is_learnt(fake, make_provider):
    """A refusal of response_format json_schema (llama-cpp-python) switches to json_object + schema."""
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fake.enqueue(fake.Reply(status=500, body=LLAMA_JSON_SCHEMA), fake.completion('{"x": 1}'))
    async with make_provider(maxRetries=0) as provider:
        response = await provider.complete(request(output_schema=schema))
    assert response.message.content == '{"x": 1}'
    assert [b["response_format"]["type"] for b in fake.bodies] == ["json_schema", "json_object"]
    assert fake.bodies[1]["response_format"]["schema"] == schema


async def test_tool_choice_required_refused_is_learnt(fake, make_provider):
    """A 400 about tool_choice required (older vLLM) makes the provider name the one tool instead."""
    fake.enqueue(fake.Reply(status=400, body={"object": "error", "message": (
        'The tool_choice option "required" is not yet supported')}), fake.completion("ok"))
    async with make_provider(maxRetries=0) as provider:
        await provider.complete(request(tools=TOOLS, settings={"toolChoice": "required"}))
    assert [b["tool_choice"] for b in fake.bodies] == ["required", {"type": "function", "function": {"name": "add"}}]
