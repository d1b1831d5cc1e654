"""``contextStrategy: {kind: providerNative}`` on the OpenAI provider: the Responses API's
``truncation``, and a clear error from Chat Completions, which has nothing like it."""

from __future__ import annotations

import json

import anyio
import pytest

import loopwright
from loopwright._types import Message, ModelRequest
from loopwright.errors import ConfigError

pytestmark = pytest.mark.anyio


def request(**kw) -> ModelRequest:
    messages = [Message(role="system", content="Be brief."), Message(role="user", content="Hi")]
    return ModelRequest(model="gpt-test", provider="oa", messages=messages, **kw)


async def test_responses_api_sends_truncation_auto(fake, make_provider):
    """A request with context_management asks the Responses API for truncation: auto; one without sends none."""
    fake.enqueue(fake.response([fake.message_item("ok")]), fake.response([fake.message_item("ok")]))
    async with make_provider(api="responses") as provider:
        await provider.complete(request(context_management={}))
        await provider.complete(request())
    managed, plain = fake.seen
    assert managed.body["truncation"] == "auto"
    assert "truncation" not in plain.body


async def test_responses_truncation_option_and_model_settings(fake, make_provider):
    """The strategy's truncation option is sent as given, and a modelSettings truncation wins over it."""
    fake.enqueue(fake.response([fake.message_item("ok")]), fake.response([fake.message_item("ok")]))
    async with make_provider(api="responses") as provider:
        await provider.complete(request(context_management={"truncation": "disabled"}))
        await provider.complete(request(context_management={}, settings={"truncation": "disabled"}))
    assert [s.body["truncation"] for s in fake.seen] == ["disabled", "disabled"]


async def collect(provider):
    return [d async for d in provider.stream(request(context_management={}))]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_completions_refuses_context_management(fake, make_provider, stream):
    """Chat Completions has no context management: the request raises ConfigError and nothing is sent."""
    async with make_provider() as provider:
        with pytest.raises(ConfigError, match=r"Chat Completions.*api: responses"):
            await (collect(provider) if stream else provider.complete(request(context_management={})))
    assert fake.seen == []


def write_project(tmp_path, url: str, api: str) -> None:
    provider = {"kind": "openai", "baseUrl": url, "apiKey": "x", "api": api, "retryBaseDelay": 0.001}
    assembly = {"store": {"kind": "file", "path": "store"}, "plugins": ["loopwright_openai"],
                "providers": {"oa": provider}}
    agent = {"name": "a", "model": "oa:gpt-test", "systemPrompt": "Be brief.",
             "contextStrategy": {"kind": "providerNative"}}
    (tmp_path / "loopwright.yaml").write_text(json.dumps(assembly))  # JSON is YAML
    (tmp_path / "a.yaml").write_text(json.dumps(agent))


async def run_agent(tmp_path):
    async with loopwright.Runtime.from_file(tmp_path / "loopwright.yaml", autoload=False) as rt:
        run = await rt.start_agent(tmp_path / "a.yaml", prompt="Hi")
        with anyio.fail_after(10):
            return await run.wait()


async def test_provider_native_agent_reaches_the_wire_as_truncation_auto(tmp_path, fake):
    """An agent whose contextStrategy is providerNative sends truncation: auto on every Responses request."""
    write_project(tmp_path, fake.url, "responses")
    fake.enqueue(fake.response([fake.message_item("hello")]))
    result = await run_agent(tmp_path)
    assert (result.state, result.text) == (loopwright.State.WAITING, "hello")
    [seen] = fake.seen
    assert seen.body["truncation"] == "auto"


async def test_provider_native_agent_on_chat_completions_ends_with_a_clear_error(tmp_path, fake):
    """On Chat Completions the run ends in error with the ConfigError's message, before anything is sent."""
    write_project(tmp_path, fake.url, "chat")
    result = await run_agent(tmp_path)
    assert result.state is loopwright.State.ERROR
    assert "ConfigError" in (result.error or "")
    assert "api: responses" in (result.error or "")
    assert fake.seen == []
