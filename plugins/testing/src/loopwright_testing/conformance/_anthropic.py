"""The Anthropic Messages dialect (``POST {base}/v1/messages``, ``anthropic-version: 2023-06-01``).

Wire facts, from Anthropic's Messages API reference and its tool-use and streaming guides:

- headers: ``x-api-key: KEY`` and ``anthropic-version`` are required;
- request: ``{model, max_tokens, messages, system?, tools?, tool_choice?, stream?, ...}``;
  ``max_tokens`` is required; the system prompt is the top-level ``system`` (a string or an
  array of ``text`` blocks), never a message; ``messages`` hold ``user`` and ``assistant`` turns,
  the first one the user's (consecutive turns of one role are combined into one); ``content``
  is a string or an array of blocks; ``text`` blocks must hold non-whitespace text;
- an assistant turn calls tools with ``tool_use`` blocks ``{id, name, input}``: ``input`` is a
  JSON *object*, ``id`` matches ``^[a-zA-Z0-9_-]+$``; every ``tool_use`` must be answered by a
  ``tool_result`` block ``{tool_use_id, content?, is_error?}`` in the very next (user) turn, where
  the ``tool_result`` blocks come first, before any text; a ``tool_result`` must answer a
  ``tool_use`` of the turn before it;
- ``tools`` entries are ``{name, description?, input_schema}`` (server tools carry a ``type``);
- answer: ``{id, type: "message", role: "assistant", model, content: [blocks], stop_reason,
  stop_sequence, usage: {input_tokens, output_tokens, cache_*?}}``; ``stop_reason`` is
  ``end_turn``, ``max_tokens``, ``stop_sequence``, ``tool_use``, ``pause_turn`` or ``refusal``
  (the safety classifiers stopped the answer: the content filter);
- a non-streamed ``tool_use.input`` is always an object: arguments that are not valid JSON
  reach a client only in a stream (``input_json_delta`` pieces, fine-grained tool streaming);
- stream: named events ``message_start`` (the message with empty ``content``, ``usage`` with
  ``input_tokens``), ``ping``, per block ``content_block_start`` / ``content_block_delta``
  (``text_delta`` or ``input_json_delta`` with ``partial_json``) / ``content_block_stop``, then
  ``message_delta`` (``stop_reason`` and the cumulative ``usage.output_tokens``) and
  ``message_stop``;
- errors: ``{"type": "error", "error": {type, message}, "request_id"}`` with types
  ``invalid_request_error`` (400), ``authentication_error`` (401), ``permission_error`` (403),
  ``not_found_error`` (404), ``rate_limit_error`` (429), ``api_error`` (500) and
  ``overloaded_error`` (529); every answer has a ``request-id`` header.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from loopwright_testing.conformance._dialect import Dialect, list_at, object_at, require, text_at, wire_json
from loopwright_testing.conformance._model import (
    CapturedRequest,
    ScriptedAnswer,
    ScriptedError,
    SSEEvent,
    UnrepresentableError,
    WireMessage,
    WireRequest,
    WireToolCall,
)

__all__ = ["AnthropicMessagesDialect"]

_STOP_REASONS: Mapping[str, str] = {
    "content_filter": "refusal", "length": "max_tokens", "stop": "end_turn", "tool_calls": "tool_use",
}
_ERRORS: Mapping[str, str] = {
    "authentication": "authentication_error",
    "invalid_request": "invalid_request_error",
    "not_found": "not_found_error",
    "overloaded": "overloaded_error",
    "permission": "permission_error",
    "rate_limit": "rate_limit_error",
    "server_error": "api_error",
}
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


class AnthropicMessagesDialect(Dialect):
    """Anthropic's Messages API.

    The provider's ``base_url`` is the server's root; it must post to ``/v1/messages`` and send
    ``x-api-key`` and ``anthropic-version``.
    """

    name: ClassVar[str] = "anthropic-messages"
    path: ClassVar[str] = "/v1/messages"
    # A plain answer's tool_use input is always an object; malformed input exists only in streams.
    raw_arguments_on: ClassVar[frozenset[str]] = frozenset({"stream"})

    def auth_problem(self, request: CapturedRequest, api_key: str) -> str | None:
        """Return a problem unless the request carries ``x-api-key`` and an ``anthropic-version``."""
        got = request.headers.get("x-api-key")
        if got != api_key:
            return f"expected the header 'x-api-key: {api_key}', got {got!r}"
        if not request.headers.get("anthropic-version"):
            return "the required header 'anthropic-version' is missing"
        return None

    def vendor_finish_reason(self, finish_reason: str) -> str:
        """Return the ``stop_reason`` for a normalised finish reason (``content_filter`` is ``refusal``)."""
        return _STOP_REASONS[finish_reason]

    # -- rendering -------------------------------------------------------------------------------

    def render_answer(self, answer: ScriptedAnswer, request: CapturedRequest) -> Any:
        """Return a ``message`` object.

        :raises UnrepresentableError: If a call's arguments are not a JSON object.
        """
        del request
        content: list[dict[str, Any]] = []
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        for call in answer.tool_calls:
            if not call.well_formed:
                raise UnrepresentableError(
                    f"a non-streamed tool_use input is always a JSON object; {call.arguments!r} is not one")
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.parsed})
        return {
            "id": f"msg_{answer.id}", "type": "message", "role": "assistant", "model": answer.model,
            "content": content, "stop_reason": self.vendor_finish_reason(answer.finish_reason),
            "stop_sequence": None,
            "usage": {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens},
        }

    def render_stream(self, answer: ScriptedAnswer, request: CapturedRequest) -> Sequence[SSEEvent]:
        """Return the named events of a Messages stream."""
        del request

        def event(name: str, data: Mapping[str, Any]) -> SSEEvent:
            return SSEEvent(event=name, data=wire_json({"type": name, **data}))

        events = [
            event("message_start", {"message": {
                "id": f"msg_{answer.id}", "type": "message", "role": "assistant", "model": answer.model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": answer.input_tokens, "output_tokens": 1},
            }}),
            event("ping", {}),
        ]
        index = 0
        if answer.text:
            events.append(event("content_block_start",
                                {"index": index, "content_block": {"type": "text", "text": ""}}))
            events.extend(event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": piece}})
                          for piece in answer.stream_text_pieces)
            events.append(event("content_block_stop", {"index": index}))
            index += 1
        for call in answer.tool_calls:
            events.append(event("content_block_start", {"index": index, "content_block": {
                "type": "tool_use", "id": call.id, "name": call.name, "input": {}}}))
            events.extend(event("content_block_delta",
                                {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})
                          for piece in call.argument_pieces)
            events.append(event("content_block_stop", {"index": index}))
            index += 1
        events.append(event("message_delta", {
            "delta": {"stop_reason": self.vendor_finish_reason(answer.finish_reason), "stop_sequence": None},
            "usage": {"output_tokens": answer.output_tokens},
        }))
        events.append(event("message_stop", {}))
        return events

    def render_error(self, error: ScriptedError, request: CapturedRequest) -> Any:
        """Return ``{"type": "error", "error": {type, message}, "request_id"}``."""
        del request
        return {"type": "error", "error": {"type": _ERRORS[error.kind], "message": error.message},
                "request_id": "req_conformance"}

    def error_headers(self, error: ScriptedError) -> Mapping[str, str]:
        """Return the ``request-id`` every Anthropic answer carries."""
        del error
        return {"request-id": "req_conformance"}

    # -- reading ---------------------------------------------------------------------------------

    def read_request(self, request: CapturedRequest) -> WireRequest:
        """Read a Messages request, enforcing the API's structural rules (module docstring)."""
        body = object_at(request.json, "body")
        model = text_at(body.get("model"), "model")
        require(model, "model", "must not be empty")
        max_tokens = body.get("max_tokens")
        require(isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1,
                "max_tokens", f"is required: an integer >= 1, not {max_tokens!r}")
        messages: list[WireMessage] = []
        if body.get("system") is not None:
            system = _text_of(body["system"], "system")
            if system:
                messages.append(WireMessage(role="system", text=system))
        turns = _turns(list_at(body.get("messages"), "messages"))
        require(turns, "messages", "must not be empty")
        require(turns[0][0] == "user", "messages[0].role", f"the first turn must be the user's, not {turns[0][0]!r}")
        open_calls: list[str] = []
        for role, blocks, where in turns:
            if role == "assistant":
                require(not open_calls, where, "an assistant turn cannot follow unanswered tool_use blocks")
                messages.append(_assistant(blocks, where))
                open_calls = [call.id for call in messages[-1].tool_calls]
            else:
                messages.extend(_user(blocks, where, open_calls))
                open_calls = []
        tools: dict[str, Any] = {}
        if body.get("tools") is not None:
            for j, raw_tool in enumerate(list_at(body["tools"], "tools")):
                tool = object_at(raw_tool, f"tools[{j}]")
                if tool.get("type") not in (None, "custom"):
                    continue  # a server tool (web search ...)
                name = text_at(tool.get("name"), f"tools[{j}].name")
                schema = object_at(tool.get("input_schema"), f"tools[{j}].input_schema")
                tools[name] = schema
        return WireRequest(model=model, messages=tuple(messages), tools=tools, stream=body.get("stream") is True,
                           raw=body)


def _turns(raw_messages: list[Any]) -> list[tuple[str, list[dict[str, Any]], str]]:
    """Return ``(role, blocks, where)`` per turn, consecutive turns of one role combined as the API does."""
    turns: list[tuple[str, list[dict[str, Any]], str]] = []
    for i, raw in enumerate(raw_messages):
        where = f"messages[{i}]"
        item = object_at(raw, where)
        role = item.get("role")
        require(role in ("user", "assistant"), f"{where}.role", f"must be 'user' or 'assistant', not {role!r}")
        role = str(role)
        content = item.get("content")
        if isinstance(content, str):
            require(content.strip(), f"{where}.content", "text content must be non-empty (not only whitespace)")
            blocks = [{"type": "text", "text": content}]
        else:
            blocks = [object_at(b, f"{where}.content[{k}]") for k, b in enumerate(list_at(content, f"{where}.content"))]
            require(blocks, f"{where}.content", "must not be empty")
        for k, block in enumerate(blocks):
            if block.get("type") == "text":
                text = text_at(block.get("text"), f"{where}.content[{k}].text")
                require(text.strip(), f"{where}.content[{k}]", "text content blocks must contain non-whitespace text")
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, list(blocks), where))
    return turns


def _assistant(blocks: list[dict[str, Any]], where: str) -> WireMessage:
    texts: list[str] = []
    calls: list[WireToolCall] = []
    for k, block in enumerate(blocks):
        kind = block.get("type")
        here = f"{where}.content[{k}]"
        require(kind != "tool_result", here, "tool_result blocks belong in user turns")
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            call_id = text_at(block.get("id"), f"{here}.id")
            require(_TOOL_ID.match(call_id), f"{here}.id", f"must match ^[a-zA-Z0-9_-]+$, not {call_id!r}")
            require(call_id not in {c.id for c in calls}, f"{here}.id", f"repeats the tool_use id {call_id!r}")
            name = text_at(block.get("name"), f"{here}.name")
            arguments = object_at(block.get("input"), f"{here}.input")
            calls.append(WireToolCall(id=call_id, name=name, arguments=arguments))
    return WireMessage(role="assistant", text="".join(texts) or None, tool_calls=tuple(calls))


def _user(blocks: list[dict[str, Any]], where: str, open_calls: list[str]) -> list[WireMessage]:
    out: list[WireMessage] = []
    texts: list[str] = []
    answered: list[str] = []
    for k, block in enumerate(blocks):
        kind = block.get("type")
        here = f"{where}.content[{k}]"
        require(kind != "tool_use", here, "tool_use blocks belong in assistant turns")
        if kind == "tool_result":
            require(not texts, here, "in a user turn with tool results, the tool_result blocks must come first, "
                                     "before any text")
            call_id = text_at(block.get("tool_use_id"), f"{here}.tool_use_id")
            require(call_id in open_calls, f"{here}.tool_use_id",
                    f"unexpected tool_use_id {call_id!r}: each tool_result must answer a tool_use of the previous "
                    f"turn (open: {open_calls})")
            require(call_id not in answered, f"{here}.tool_use_id", f"answers {call_id!r} twice")
            answered.append(call_id)
            is_error = block.get("is_error")
            require(is_error is None or isinstance(is_error, bool), f"{here}.is_error", "must be a boolean")
            text = _text_of(block["content"], f"{here}.content") if block.get("content") is not None else ""
            out.append(WireMessage(role="tool", tool_call_id=call_id, text=text, is_error=is_error))
        elif kind == "text":
            texts.append(block["text"])
    missing = [c for c in open_calls if c not in answered]
    require(not missing, where, "tool_use ids were found without tool_result blocks immediately after: "
                                f"{', '.join(missing)}")
    if texts:
        out.append(WireMessage(role="user", text="".join(texts)))
    return out


def _text_of(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    texts = []
    for k, raw in enumerate(list_at(value, where)):
        block = object_at(raw, f"{where}[{k}]")
        if block.get("type") == "text":
            texts.append(text_at(block.get("text"), f"{where}[{k}].text"))
    return "".join(texts)

