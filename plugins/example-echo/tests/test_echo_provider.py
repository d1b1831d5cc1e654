"""The echo provider against the echo API on a local port: encoding, decoding, errors, clients."""

from __future__ import annotations

import json

import httpx
import pytest

from loopwright import Message, ModelRequest, ProviderSettings, ToolCall, ToolSpec, Transcript
from loopwright.errors import ConfigError, ProviderError
from loopwright_example_echo import make_provider
from loopwright_example_echo._provider import CACHE_KEY, EchoProvider, encode_message
from loopwright_example_echo.server import EchoServer

pytestmark = pytest.mark.anyio

ADD = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)


def provider_for(server: EchoServer, **options: object) -> EchoProvider:
    return make_provider(ProviderSettings(name="echo", kind="echo", base_url=server.url, options=options))


def request(*messages: Message, tools: tuple[ToolSpec, ...] = (), settings: dict | None = None) -> ModelRequest:
    return ModelRequest(model="echo-1", provider="echo", messages=messages, tools=tools, settings=settings or {})


async def test_a_text_answer(echo_server: EchoServer) -> None:
    """A prompt comes back as text, with usage, a normalised finish reason and the model."""
    async with provider_for(echo_server) as provider:
        response = await provider.complete(request(Message(role="user", content="hello there")))
    assert response.message.role == "assistant"
    assert response.message.content == "echo: hello there"
    assert response.message.tool_calls == ()
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (2, 3, 5)
    assert response.usage.requests == 1
    assert (response.finish_reason, response.raw_finish_reason) == ("stop", "done")
    assert response.model == "echo-1"


async def test_the_request_body(echo_server: EchoServer) -> None:
    """Messages, tools and mapped settings reach the API in the echo protocol's form."""
    call = ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2})
    messages = (
        Message(role="system", content="Be brief."),
        Message(role="user", content="add them"),
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", tool_call_id="c1", name="add", content="3"),
    )
    settings = {"temperature": 0.2, "maxTokens": 50, "stop": "END", "toolChoice": "auto", "mood": "calm"}
    async with provider_for(echo_server) as provider:
        response = await provider.complete(request(*messages, tools=(ADD,), settings=settings))
    assert response.message.content == "add returned 3"
    body = echo_server.requests[0]
    assert body["model"] == "echo-1"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "add them"},
        {"role": "assistant", "content": None,
         "toolCalls": [{"id": "c1", "name": "add", "arguments": '{"a":1,"b":2}'}]},
        {"role": "tool", "content": "3", "toolCallId": "c1", "name": "add"},
    ]
    assert body["tools"] == [{"name": "add", "description": "Add two integers.", "parameters": dict(ADD.parameters)}]
    assert body["options"] == {"temperature": 0.2, "maxOutputTokens": 50, "stopSequences": ["END"], "mood": "calm"}


async def test_tool_calls_are_decoded(echo_server: EchoServer) -> None:
    """A tool call comes back with its id, name and parsed arguments."""
    async with provider_for(echo_server) as provider:
        response = await provider.complete(
            request(Message(role="user", content='call add {"a": 2, "b": 3}'), tools=(ADD,)))
    assert response.message.tool_calls == (ToolCall(id="call_1", name="add", arguments={"a": 2, "b": 3}),)
    assert response.message.content is None
    assert response.finish_reason == "tool_calls"


async def test_malformed_arguments_are_kept_raw(echo_server: EchoServer) -> None:
    """Arguments that are not a JSON object stay as written, in raw_arguments; nothing raises."""
    async with provider_for(echo_server) as provider:
        response = await provider.complete(request(Message(role="user", content="call add {oops"), tools=(ADD,)))
    (call,) = response.message.tool_calls
    assert (call.name, call.arguments, call.raw_arguments) == ("add", {}, "{oops")
    # Sent back as the model wrote them, so that the model sees its own mistake.
    encoded = json.loads(encode_message(Message(role="assistant", tool_calls=(call,))))
    assert encoded["toolCalls"][0]["arguments"] == "{oops"


@pytest.mark.parametrize(("wire", "normalised"), [
    ("done", "stop"), ("tool", "tool_calls"), ("max_tokens", "length"), ("filtered", "content_filter"),
    ("something new", "stop"), (None, "stop"),
])
async def test_finish_reasons_are_normalised(echo_server: EchoServer, wire: str | None, normalised: str) -> None:
    """Each finish reason of the protocol maps to loopwright's; unknown ones become stop and stay raw."""
    echo_server.enqueue({"text": "hi", "finish": wire})
    async with provider_for(echo_server) as provider:
        response = await provider.complete(request(Message(role="user", content="hi")))
    assert (response.finish_reason, response.raw_finish_reason) == (normalised, wire)


async def test_transient_failures_are_retried(echo_server: EchoServer) -> None:
    """A 429 with Retry-After and a 503 are retried, and the third attempt's answer is returned."""
    echo_server.enqueue({"error": "slow down"}, status=429, headers={"Retry-After": "0"})
    echo_server.enqueue({"error": "overloaded"}, status=503, headers={"Retry-After": "0"})
    async with provider_for(echo_server) as provider:
        response = await provider.complete(request(Message(role="user", content="again")))
    assert response.message.content == "echo: again"
    assert len(echo_server.requests) == 3


async def test_retries_run_out(echo_server: EchoServer) -> None:
    """After maxRetries retries the last transient error is raised, with its status and Retry-After."""
    for _ in range(2):
        echo_server.enqueue({"error": "overloaded"}, status=503, headers={"Retry-After": "0"})
    async with provider_for(echo_server, maxRetries=1) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request(Message(role="user", content="hi")))
    error = info.value
    assert (error.status, error.transient, error.retry_after) == (503, True, 0.0)
    assert (error.provider, error.model) == ("echo", "echo-1")
    assert "overloaded" in str(error)
    assert len(echo_server.requests) == 2


async def test_final_failures_are_not_retried(echo_server: EchoServer) -> None:
    """A 400 is raised at once as a non-transient ProviderError carrying the API's message."""
    echo_server.enqueue({"error": "unknown model"}, status=400)
    async with provider_for(echo_server) as provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request(Message(role="user", content="hi")))
    assert (info.value.status, info.value.transient) == (400, False)
    assert "unknown model" in str(info.value)
    assert len(echo_server.requests) == 1


async def test_an_answer_that_is_not_an_object_is_a_provider_error(echo_server: EchoServer) -> None:
    """A 200 whose body is not an answer of the protocol is a non-transient ProviderError."""
    echo_server.enqueue(["not", "an", "answer"])
    async with provider_for(echo_server) as provider:
        with pytest.raises(ProviderError, match="unusable answer") as info:
            await provider.complete(request(Message(role="user", content="hi")))
    assert info.value.transient is False


async def test_a_refused_connection_is_transient() -> None:
    """A connection that cannot be made is a transient ProviderError (after the retries)."""
    with EchoServer() as server:
        url = server.url  # the port is free again once the server stops
    provider = make_provider(ProviderSettings(name="echo", kind="echo", base_url=url, options={"maxRetries": 0}))
    async with provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete(request(Message(role="user", content="hi")))
    assert info.value.transient is True
    assert info.value.status is None


async def test_the_api_key_is_a_bearer_token(echo_server: EchoServer) -> None:
    """settings.api_key is sent as an Authorization: Bearer header."""
    settings = ProviderSettings(name="echo", kind="echo", base_url=echo_server.url, api_key="sk-echo")
    async with make_provider(settings) as provider:
        await provider.complete(request(Message(role="user", content="hi")))
    assert echo_server.headers[0]["authorization"] == "Bearer sk-echo"


async def test_an_injected_client_is_used_and_left_open(echo_server: EchoServer) -> None:
    """settings.http_client carries the requests, and aclose() leaves it open for its owner."""
    sent: list[httpx.Request] = []

    async def remember(request: httpx.Request) -> None:
        sent.append(request)

    async with httpx.AsyncClient(event_hooks={"request": [remember]}) as client:
        settings = ProviderSettings(name="echo", kind="echo", base_url=echo_server.url, http_client=client)
        async with make_provider(settings) as provider:
            await provider.complete(request(Message(role="user", content="hi")))
        assert [str(r.url) for r in sent] == [f"{echo_server.url}/complete"]
        assert not client.is_closed


async def test_a_transcript_caches_the_encoded_messages(echo_server: EchoServer) -> None:
    """With a Transcript, the provider keeps each message's JSON in the transcript's cache."""
    transcript = Transcript([Message(role="user", content="one")])
    async with provider_for(echo_server) as provider:
        await provider.complete(ModelRequest(model="echo-1", provider="echo", messages=transcript))
        transcript.append(Message(role="assistant", content="echo: one"))
        transcript.append(Message(role="user", content="two"))
        response = await provider.complete(ModelRequest(model="echo-1", provider="echo", messages=transcript))
    assert response.message.content == "echo: two"

    def must_not_run(message: Message) -> str:
        raise AssertionError(f"not cached: {message}")

    cached = transcript.encoded(CACHE_KEY, must_not_run)
    assert [json.loads(text) for text in cached] == echo_server.requests[1]["messages"]


async def test_bad_options_are_config_errors(echo_server: EchoServer) -> None:
    """Unknown options and options of the wrong type raise ConfigError naming the provider."""
    with pytest.raises(ConfigError, match="unknown options"):
        provider_for(echo_server, temprature=1)
    with pytest.raises(ConfigError, match="maxRetries"):
        provider_for(echo_server, maxRetries="3")
    with pytest.raises(ConfigError, match="timeout"):
        provider_for(echo_server, timeout=0)


async def test_stream_true_answers_in_one_piece(echo_server: EchoServer) -> None:
    """The runtime's ``stream`` option is accepted; the default stream() yields the answer, then done."""
    async with provider_for(echo_server, stream=True) as provider:
        deltas = [d async for d in provider.stream(request(Message(role="user", content="hi")))]
    assert [d.kind for d in deltas] == ["text", "done"]
    assert deltas[0].text == "echo: hi"
    assert deltas[-1].response is not None
    assert deltas[-1].response.message.content == "echo: hi"
