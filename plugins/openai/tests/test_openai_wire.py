"""Unit tests of the wire format module: encoding and decoding without a server."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from loopwright._types import Message, ModelRequest, ToolCall, ToolSpec, Transcript
from loopwright_openai import _wire

SPEC = ToolSpec(name="t", description="d", parameters=MappingProxyType({"type": "object"}))


def test_tools_cache_encodes_a_tuple_once():
    """The same tuple is served from the cache; an equal but different tuple is encoded anew."""
    cache = _wire.ToolsCache()
    tools = (SPEC,)
    first = cache.get(tools)
    assert cache.get(tools) is first
    assert cache.get((SPEC,)) == first
    assert json.loads(first) == [{"type": "function", "function": {
        "name": "t", "description": "d", "parameters": {"type": "object"}}}]


def test_tools_cache_is_bounded():
    """The cache drops its oldest entry beyond its size."""
    cache = _wire.ToolsCache(size=2)
    lists = [(SPEC,) for _ in range(3)]
    for tools in lists:
        cache.get(tools)
    assert len(cache._items) == 2
    assert id(lists[0]) not in cache._items


def test_encode_settings_drops_unset_known_keys_and_reserved_ones():
    """Known keys set to None are dropped, extras pass through even as None, reserved keys are ignored."""
    out = _wire.encode_settings({
        "temperature": None, "maxTokens": None, "toolChoice": None, "custom": None,
        "model": "other", "stream": True, "messages": [], "frequencyPenalty": 0.5,
    })
    assert out == {"custom": None, "frequency_penalty": 0.5}


def test_encode_tool_choice_passes_objects_through():
    """An explicit tool_choice object is sent unchanged."""
    choice = {"type": "function", "function": {"name": "x"}}
    assert _wire.encode_tool_choice(choice) is choice


def test_build_body_stream_flag():
    """stream=True asks for SSE with usage in the last chunk (ready for the streaming path)."""
    request = ModelRequest(model="m", provider="p", messages=[Message(role="user", content="u")])
    body = json.loads(_wire.build_body(request, stream=True))
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})


def test_encoded_messages_are_cached_on_the_transcript():
    """encode_messages returns the transcript's cache, extended only with new messages."""
    transcript = Transcript([Message(role="user", content="a")])
    first = _wire.encode_messages(transcript)
    transcript.append(Message(role="assistant", content=None))
    second = _wire.encode_messages(transcript)
    assert second is first
    assert [json.loads(m) for m in second] == [{"role": "user", "content": "a"},
                                               {"role": "assistant", "content": ""}]


def test_tool_call_arguments_in_frozen_mappings_encode():
    """Arguments held in a read-only mapping are encoded as a JSON object string."""
    message = Message(role="assistant", tool_calls=(
        ToolCall(id="c", name="t", arguments=MappingProxyType({"a": MappingProxyType({"b": 1})})),))
    wire = _wire.encode_message(message)
    assert wire["tool_calls"][0]["function"]["arguments"] == '{"a":{"b":1}}'


@pytest.mark.parametrize(("value", "expected"), [
    (None, ({}, None)),
    ("", ({}, None)),
    ("  ", ({}, None)),
    ('{"a": 1}', ({"a": 1}, None)),
    ({"a": 1}, ({"a": 1}, None)),
    ("null", ({}, "null")),
    ('"text"', ({}, '"text"')),
    ("{oops", ({}, "{oops")),
    ([1], ({}, "[1]")),
])
def test_parse_arguments(value, expected):
    """Only a JSON object gives arguments; anything else the model wrote is kept raw."""
    assert _wire.parse_arguments(value) == expected


def test_decode_message_variants():
    """Refusals become text, content parts join, repeated ids are replaced, function_call works."""
    refusal = _wire.decode_message({"content": None, "refusal": "I can't."})
    assert refusal.content == "I can't."
    parts = _wire.decode_message({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    assert parts.content == "ab"
    dup = _wire.decode_message({"tool_calls": [
        {"id": "c0", "function": {"name": "x", "arguments": "{}"}},
        {"id": "c0", "function": {"name": "y", "arguments": "{}"}},
    ]})
    assert dup.tool_calls[0].id == "c0"
    assert dup.tool_calls[1].id not in ("c0", "")
    legacy = _wire.decode_message({"function_call": {"name": "f", "arguments": '{"q": 1}'}})
    assert (legacy.tool_calls[0].name, legacy.tool_calls[0].arguments) == ("f", {"q": 1})


def test_decode_response_rejects_unusable_answers():
    """Non-objects and bodies without choices raise MalformedResponseError, with any API error message."""
    with pytest.raises(_wire.MalformedResponseError, match="not an object"):
        _wire.decode_response([], model="m")
    with pytest.raises(_wire.MalformedResponseError, match="no choices: overloaded"):
        _wire.decode_response({"error": {"message": "overloaded"}}, model="m")


def test_missing_finish_reason_follows_the_message():
    """A missing finish reason is tool_calls when there are calls, else stop."""
    assert _wire.map_finish_reason(None, has_tool_calls=True) == "tool_calls"
    assert _wire.map_finish_reason(None) == "stop"


@pytest.mark.parametrize(("body", "expected"), [
    ({"error": {"message": "bad", "code": "invalid_api_key"}}, "bad [invalid_api_key]"),
    ({"error": {"message": "bad", "type": "server_error", "code": None}}, "bad [server_error]"),
    ({"error": "plain"}, "plain"),
    ({"message": "flat"}, "flat"),
    ({"detail": "x"}, None),
    ("text", None),
])
def test_error_message(body, expected):
    """The API's error message is found in the common error body shapes."""
    assert _wire.error_message(body) == expected


def test_all_is_sorted():
    """The module's __all__ is sorted."""
    assert sorted(_wire.__all__) == _wire.__all__
