"""Unit tests of the wire format module: encoding and decoding without a server."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwright._types import Message, ModelRequest, ToolCall, ToolSpec, Transcript
from loopwright.http import ToolsCache
from loopwright_openai import _sse, _wire

SPEC = ToolSpec(name="t", description="d", parameters=MappingProxyType({"type": "object"}))


def test_tools_cache_encodes_a_tuple_once():
    """The same tuple is served from the cache; an equal but different tuple is encoded anew."""
    cache = ToolsCache(_wire.encode_tools)
    tools = (SPEC,)
    first = cache.get(tools)
    assert cache.get(tools) is first
    assert cache.get((SPEC,)) == first
    assert json.loads(first) == [{"type": "function", "function": {
        "name": "t", "description": "d", "parameters": {"type": "object"}}}]


def test_tools_cache_is_bounded():
    """The cache drops its oldest entry beyond its size."""
    cache = ToolsCache(_wire.encode_tools, size=2)
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


# -- SSE framing --------------------------------------------------------------------------------


def feed(lines):
    decoder = _sse.Decoder()
    events = [e for e in map(decoder.line, lines) if e is not None]
    last = decoder.flush()
    return events + ([last] if last else [])


def test_sse_events_comments_and_fields():
    """Blank lines end events; comments, id and retry are skipped; event names the type."""
    assert feed([": keep-alive", "", "event: response.created", "id: 7", "retry: 100", 'data: {"a":1}', "",
                 "data: [DONE]", ""]) == [("response.created", '{"a":1}'), ("", "[DONE]")]


def test_sse_multi_line_data_joins_with_newlines():
    """Several data lines of one event join with a newline, as the spec says."""
    assert feed(["data: {", 'data: "a": 1', "data: }", ""]) == [("", '{\n"a": 1\n}')]


def test_sse_data_lines_without_blank_separators():
    """A data line after whole JSON starts a new event (servers that omit the blank lines)."""
    assert feed(['data: {"a":1}', 'data: {"b":2}', "data: [DONE]"]) == [
        ("", '{"a":1}'), ("", '{"b":2}'), ("", "[DONE]")]


def test_sse_cut_event_at_the_end_is_dropped():
    """An unterminated event whose data is cut short is dropped at the end of the body."""
    assert feed(['data: {"a":1}', "", 'data: {"b":']) == [("", '{"a":1}')]


# -- server quirks --------------------------------------------------------------------------------


def _turn():
    return [
        Message(role="user", content="u"),
        Message(role="assistant", content="thinking", tool_calls=(
            ToolCall(id="call_abc", name="t", arguments={"x": 1}), ToolCall(id="call_def", name="t"))),
        Message(role="tool", content="r2", tool_call_id="call_def", name="t"),
        Message(role="tool", content="r1", tool_call_id="call_abc", name="t"),
        Message(role="tool", content="stray", tool_call_id="other", name="t"),
        Message(role="assistant", content="done"),
    ]


def test_split_parallel_tool_calls_interleaves_results():
    """Each call becomes its own assistant message followed by its result; strays come last."""
    out = _wire.split_tool_calls(_turn())
    assert [(m.role, m.content, [c.id for c in m.tool_calls], m.tool_call_id) for m in out] == [
        ("user", "u", [], None),
        ("assistant", "thinking", ["call_abc"], None),
        ("tool", "r1", [], "call_abc"),
        ("assistant", None, ["call_def"], None),
        ("tool", "r2", [], "call_def"),
        ("tool", "stray", [], "other"),
        ("assistant", "done", [], None),
    ]


def test_short_call_ids_are_stable_nine_alphanumerics():
    """Ids map to 9 letters and digits, the same for a call and its result; good ids are kept."""
    short = _wire.short_call_id("call_PTLP8xhu3uwZk4l3nlnrrJha")
    assert len(short) == 9
    assert short.isalnum()
    assert short == _wire.short_call_id("call_PTLP8xhu3uwZk4l3nlnrrJha")
    assert _wire.short_call_id("abcDEF123") == "abcDEF123"
    assert _wire.short_call_id("call_1") != _wire.short_call_id("call_2")


def test_message_quirks_in_the_body():
    """emptyToolCallContent, shortToolCallIds and splitParallelToolCalls change the messages sent."""
    req = ModelRequest(model="m", provider="p", messages=Transcript(_turn()))
    quirks = frozenset({"emptyToolCallContent", "shortToolCallIds"})
    body = json.loads(_wire.build_body(req, quirks=quirks))
    assistant, tool = body["messages"][1], body["messages"][2]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert all(len(i) == 9 and i.isalnum() for i in ids)
    assert tool["tool_call_id"] == ids[1]
    split = json.loads(_wire.build_body(req, quirks=frozenset({"splitParallelToolCalls", "emptyToolCallContent"})))
    assert [m["role"] for m in split["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "tool",
                                                      "assistant"]
    assert split["messages"][3]["content"] == ""
    plain = json.loads(_wire.build_body(req))
    assert plain["messages"][1]["tool_calls"][0]["id"] == "call_abc"


def test_tool_choice_quirks():
    """noToolChoiceRequired sends required as the one tool's name (auto with several); toolChoiceAuto
    fills in auto when tools are given without a choice; a named tool stays."""
    two = (SPEC, ToolSpec(name="u", description="d", parameters={"type": "object"}))

    def choice(settings, tools, quirks):
        req = ModelRequest(model="m", provider="p", messages=[Message(role="user", content="u")], tools=tools,
                           settings=settings)
        return json.loads(_wire.build_body(req, tools_json=_wire.encode_tools(tools), quirks=quirks)).get("tool_choice")

    required = frozenset({"noToolChoiceRequired"})
    assert choice({"toolChoice": "required"}, (SPEC,), required) == {"type": "function", "function": {"name": "t"}}
    assert choice({"toolChoice": "required"}, two, required) == "auto"
    assert choice({"toolChoice": "u"}, two, required) == {"type": "function", "function": {"name": "u"}}
    assert choice({}, two, frozenset({"toolChoiceAuto"})) == "auto"
    assert choice({"toolChoice": "none"}, two, frozenset({"toolChoiceAuto"})) == "none"
    assert choice({}, two, frozenset()) is None


def test_json_object_format_quirk():
    """jsonObjectFormat asks for structured output as llama-cpp-python's json_object with a schema."""
    schema = {"type": "object"}
    req = ModelRequest(model="m", provider="p", messages=[Message(role="user", content="u")], output_schema=schema)
    body = json.loads(_wire.build_body(req, quirks=frozenset({"jsonObjectFormat"})))
    assert body["response_format"] == {"type": "json_object", "schema": schema}


def test_chat_stream_ignores_other_choices_and_roles():
    """Only choice 0 counts; role-only deltas give nothing."""
    stream = _wire.ChatStream(model="m")
    assert stream.feed(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})) == []
    assert stream.feed(json.dumps({"choices": [{"index": 1, "delta": {"content": "other"}}]})) == []
    parts = {"choices": [{"index": 0, "delta": {"content": [{"type": "text", "text": "p"}]}}]}
    [delta] = stream.feed(json.dumps(parts))
    assert delta.text == "p"
    assert not stream.complete
    stream.feed("[DONE]")
    assert stream.complete
    assert stream.finish().message.content == "p"


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40), arguments=st.dictionaries(st.text(max_size=5), st.integers(), max_size=4),
       cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=30), repeat=st.booleans())
def test_chat_stream_reassembles_any_split(text, arguments, cuts, repeat):
    """However the text and the arguments are cut into chunks, and whether the id and name come
    once or in every chunk (then with trailing whitespace), the answer reassembles to the same."""
    raw = json.dumps(arguments)

    def pieces(value: str) -> list[str]:
        out, i, k = [], 0, 0
        while i < len(value):
            out.append(value[i:i + cuts[k % len(cuts)]])
            i += cuts[k % len(cuts)]
            k += 1
        return out

    stream = _wire.ChatStream(model="m")
    deltas = []
    for piece in pieces(text):
        deltas += stream.feed(json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}))
    for k, piece in enumerate([*pieces(raw), "\n"] if repeat else pieces(raw)):
        call = {"index": 0, "function": {"arguments": piece}}
        if k == 0 or repeat:
            call.update(id="call_1", type="function", function={"name": "t", "arguments": piece})
        deltas += stream.feed(json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
    stream.feed(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}))
    answer = stream.finish()
    assert answer.message.content == (text or None)
    assert answer.message.tool_calls == (ToolCall(id="call_1", name="t", arguments=arguments),)
    assert "".join(d.text for d in deltas if d.kind == "arguments").rstrip("\n") == raw


@pytest.mark.parametrize(("raw", "unreported"), [
    (None, 1), ({}, 1), ({"total_tokens": 7}, 1), ({"prompt_tokens": 0, "completion_tokens": 0}, 0),
    ({"prompt_tokens": 5}, 0), ({"prompt_tokens": 5, "completion_tokens": 2}, 0),
])
def test_usage_without_token_counts_is_unreported(raw, unreported):
    """Chat and Responses usage: no input and no output count means the request was not counted."""
    from loopwright_openai import _responses  # noqa: PLC0415

    assert _wire.decode_usage(raw).unreported_requests == unreported
    assert _wire.decode_usage(raw).requests == 1
    names = {"prompt_tokens": "input_tokens", "completion_tokens": "output_tokens"}
    renamed = None if raw is None else {names.get(k, k): v for k, v in raw.items()}
    assert _responses.decode_usage(renamed).unreported_requests == unreported
