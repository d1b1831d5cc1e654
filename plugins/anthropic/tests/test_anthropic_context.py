"""``contextStrategy: {kind: providerNative}`` on the Anthropic provider: server-side context editing
(``context_management: {edits}`` with the ``context-management-2025-06-27`` beta)."""

from __future__ import annotations

import json

import anyio
import pytest

import loopwright
from loopwright._types import Message, ModelRequest
from loopwright.errors import ConfigError
from loopwright_anthropic._provider import CONTEXT_MANAGEMENT_BETA

pytestmark = pytest.mark.anyio


def request(**kw) -> ModelRequest:
    messages = [Message(role="system", content="Be brief."), Message(role="user", content="Hi")]
    return ModelRequest(model="claude-test", provider="claude", messages=messages, **kw)


async def test_context_management_is_sent_with_default_edits(fake, make_provider):
    """With the beta listed, context_management carries one clear_tool_uses edit; a plain request carries none."""
    fake.enqueue(fake.message("ok"), fake.message("ok"))
    async with make_provider(beta=CONTEXT_MANAGEMENT_BETA) as provider:
        await provider.complete(request(context_management={}))
        await provider.complete(request())
    managed, plain = fake.seen
    assert managed.body["context_management"] == {"edits": [{"type": "clear_tool_uses_20250919"}]}
    assert managed.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert "context_management" not in plain.body


async def test_context_management_edits_pass_through(fake, make_provider):
    """The strategy's edits reach the wire as written."""
    edits = [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 30000},
              "keep": {"type": "tool_uses", "value": 2}}]
    fake.enqueue(fake.message("ok"))
    async with make_provider(beta=["other-1", CONTEXT_MANAGEMENT_BETA]) as provider:
        await provider.complete(request(context_management={"edits": edits}))
    assert fake.seen[0].body["context_management"] == {"edits": edits}


async def collect(provider):
    return [d async for d in provider.stream(request(context_management={}))]


@pytest.mark.parametrize("stream", [False, True])
async def test_context_management_without_the_beta_is_a_config_error(fake, make_provider, stream):
    """Without the beta in the provider's options the request raises a ConfigError naming it; nothing is sent."""
    async with make_provider() as provider:
        with pytest.raises(ConfigError, match="beta: context-management-2025-06-27"):
            await (collect(provider) if stream else provider.complete(request(context_management={})))
    assert fake.seen == []


async def test_provider_native_agent_reaches_the_wire(tmp_path, fake):
    """An agent whose contextStrategy is providerNative sends its edits on each Messages request."""
    provider = {"kind": "anthropic", "baseUrl": fake.url, "apiKey": "x", "retryBaseDelay": 0.001,
                "beta": CONTEXT_MANAGEMENT_BETA}
    assembly = {"store": {"kind": "file", "path": "store"}, "plugins": ["loopwright_anthropic"],
                "providers": {"claude": provider}}
    agent = {"name": "a", "model": "claude:claude-sonnet-4-5", "systemPrompt": "Be brief.",
             "contextStrategy": {"kind": "providerNative", "edits": [{"type": "clear_tool_uses_20250919"}]}}
    (tmp_path / "loopwright.yaml").write_text(json.dumps(assembly))  # JSON is YAML
    (tmp_path / "a.yaml").write_text(json.dumps(agent))
    fake.enqueue(fake.message("hello"))
    async with loopwright.Runtime.from_file(tmp_path / "loopwright.yaml", autoload=False) as rt:
        run = await rt.start_agent(tmp_path / "a.yaml", prompt="Hi")
        with anyio.fail_after(10):
            result = await run.wait()
    assert (result.state, result.text) == (loopwright.State.WAITING, "hello")
    assert fake.seen[0].body["context_management"] == {"edits": [{"type": "clear_tool_uses_20250919"}]}
