"""The loopwright provider contract, kept by AnthropicProvider over an in-process Messages API."""

from __future__ import annotations

import itertools
import json

import httpx

from loopwright.abc import ProviderSettings
from loopwright_anthropic import AnthropicProvider
from loopwright_testing.contract import ProviderContract


def messages_api(request: httpx.Request) -> httpx.Response:
    """Answer like the Messages API: call the first offered tool once, else say hello."""
    body = json.loads(request.content)
    assert request.url.path == "/v1/messages"
    assert body["max_tokens"] > 0
    turns = body["messages"]
    assert turns[0]["role"] == "user"
    assert all(a["role"] != b["role"] for a, b in itertools.pairwise(turns))
    answered = any(block.get("type") == "tool_result" for block in turns[-1]["content"])
    if body.get("tools") and not answered:
        tool = body["tools"][0]["name"]
        content = [{"type": "tool_use", "id": "toolu_c1", "name": tool, "input": {"a": 1, "b": 2}}]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": "hello"}], "end_turn"
    return httpx.Response(200, json={
        "id": "msg_c", "type": "message", "role": "assistant", "model": body["model"], "content": content,
        "stop_reason": stop, "usage": {"input_tokens": 5, "output_tokens": 2}})


class TestAnthropicContract(ProviderContract):
    """AnthropicProvider keeps the provider contract."""

    model = "claude-sonnet-4-5"
    provider_name = "claude"

    def make_provider(self):
        client = httpx.AsyncClient(transport=httpx.MockTransport(messages_api))
        return AnthropicProvider(ProviderSettings(
            name="claude", kind="anthropic", base_url="http://claude.test", api_key="k", http_client=client))
