"""The OpenAI Chat Completions dialect (``POST {base}/chat/completions``, base ending in ``/v1``).

Wire facts, from OpenAI's API reference for Chat Completions:

- request: ``{model, messages, tools?, tool_choice?, parallel_tool_calls?, stream?, stream_options?}``;
  ``messages`` entries have ``role`` ``system``/``developer``/``user``/``assistant``/``tool``;
  ``content`` is a string or an array of ``{"type": "text", "text"}`` parts (``null`` allowed for
  an assistant message with ``tool_calls``); assistant ``tool_calls`` are
  ``{id, type: "function", function: {name, arguments}}`` with ``arguments`` a JSON *string*;
  tool results are ``{role: "tool", tool_call_id, content}``;
- an assistant message with ``tool_calls`` must be followed by one ``tool`` message per call id
  before any other message (else 400: "An assistant message with 'tool_calls' must be followed
  by tool messages responding to each 'tool_call_id'"), and a ``tool`` message must answer a
  call of the assistant message before it;
- ``tools`` entries are ``{type: "function", function: {name, description?, parameters?}}``;
  ``tool_choice`` and ``parallel_tool_calls`` are only allowed with ``tools``; ``stream_options``
  only with ``stream: true``;
- answer: ``{id, object: "chat.completion", created, model, choices: [{index, message: {role,
  content, refusal, tool_calls?}, logprobs, finish_reason}], usage: {prompt_tokens,
  completion_tokens, total_tokens}}``; ``finish_reason`` is ``stop``, ``length``, ``tool_calls``,
  ``content_filter`` (or the legacy ``function_call``);
- stream: ``data: {chunk}`` events of ``object: "chat.completion.chunk"``, each with
  ``choices[0].delta`` (``role`` first, then ``content`` pieces; a tool call's first delta has
  ``index``, ``id``, ``type``, ``function.name`` and empty ``arguments``, later ones ``index`` and
  ``function.arguments`` pieces), a last choice chunk with an empty delta and the
  ``finish_reason``; with ``stream_options.include_usage`` every chunk has ``usage: null`` and one
  more chunk with ``choices: []`` carries the usage; then ``data: [DONE]``;
- errors: ``{"error": {message, type, param, code}}``; a rate limit is 429 with type
  ``requests`` (or ``tokens``) and code ``rate_limit_exceeded``; bad requests are
  ``invalid_request_error``; every answer has an ``x-request-id`` header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from loopwright_testing.conformance._dialect import (
    Dialect,
    list_at,
    object_at,
    parse_json_text,
    require,
    text_at,
    wire_json,
)
from loopwright_testing.conformance._model import (
    CapturedRequest,
    ScriptedAnswer,
    ScriptedCall,
    ScriptedError,
    SSEEvent,
    WireMessage,
    WireRequest,
    WireToolCall,
)

__all__ = ["OpenAIChatDialect"]

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
#: Error kind to (``type``, ``code``).
_ERRORS: Mapping[str, tuple[str, str | None]] = {
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "invalid_request": ("invalid_request_error", None),
    "not_found": ("invalid_request_error", "model_not_found"),
    "overloaded": ("server_error", None),
    "permission": ("invalid_request_error", "unsupported_country_region_territory"),
    "rate_limit": ("requests", "rate_limit_exceeded"),
    "server_error": ("server_error", None),
}
_CREATED = 1_735_689_600


class OpenAIChatDialect(Dialect):
    """OpenAI Chat Completions, as OpenAI and compatible servers (vLLM, llama.cpp ...) speak it.

    The provider's ``base_url`` is the server's root plus ``/v1``; it must post to
    ``/v1/chat/completions`` and send ``Authorization: Bearer KEY``.
    """

    name: ClassVar[str] = "openai-chat"
    path: ClassVar[str] = "/v1/chat/completions"

    def base_url(self, server_url: str) -> str:
        """Return ``{server_url}/v1``, the form of OpenAI's own base URL."""
        return f"{server_url}/v1"

    def auth_problem(self, request: CapturedRequest, api_key: str) -> str | None:
        """Return a problem unless the request carries ``Authorization: Bearer {api_key}``."""
        got = request.headers.get("authorization")
        if got != f"Bearer {api_key}":
            return f"expected the header 'Authorization: Bearer {api_key}', got {got!r}"
        return None

    # -- rendering -------------------------------------------------------------------------------

    def render_answer(self, answer: ScriptedAnswer, request: CapturedRequest) -> Any:
        """Return a ``chat.completion`` object."""
        del request
        message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None}
        if answer.tool_calls:
            message["tool_calls"] = [_tool_call(call) for call in answer.tool_calls]
        return {
            "id": f"chatcmpl-{answer.id}", "object": "chat.completion", "created": _CREATED, "model": answer.model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": self.vendor_finish_reason(answer.finish_reason)}],
            "usage": _usage(answer), "system_fingerprint": "fp_conformance",
        }

    def render_stream(self, answer: ScriptedAnswer, request: CapturedRequest) -> Sequence[SSEEvent]:
        """Return ``chat.completion.chunk`` events, the usage chunk if asked for, and ``[DONE]``."""
        body = request.json
        options = body.get("stream_options") if isinstance(body, dict) else None
        include_usage = isinstance(options, dict) and options.get("include_usage") is True

        def chunk(delta: Mapping[str, Any], finish: str | None = None) -> SSEEvent:
            data: dict[str, Any] = {
                "id": f"chatcmpl-{answer.id}", "object": "chat.completion.chunk", "created": _CREATED,
                "model": answer.model, "system_fingerprint": "fp_conformance",
                "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                data["usage"] = None
            return SSEEvent(data=wire_json(data))

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events.extend(chunk({"content": piece}) for piece in answer.stream_text_pieces)
        for index, call in enumerate(answer.tool_calls):
            events.append(chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                                 "function": {"name": call.name, "arguments": ""}}]}))
            events.extend(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                          for piece in call.argument_pieces)
        events.append(chunk({}, self.vendor_finish_reason(answer.finish_reason)))
        if include_usage:
            events.append(SSEEvent(data=wire_json({
                "id": f"chatcmpl-{answer.id}", "object": "chat.completion.chunk", "created": _CREATED,
                "model": answer.model, "system_fingerprint": "fp_conformance", "choices": [],
                "usage": _usage(answer),
            })))
        events.append(SSEEvent(data="[DONE]"))
        return events

    def render_error(self, error: ScriptedError, request: CapturedRequest) -> Any:
        """Return ``{"error": {message, type, param, code}}``."""
        del request
        kind, code = _ERRORS[error.kind]
        return {"error": {"message": error.message, "type": kind, "param": None, "code": code}}

    def error_headers(self, error: ScriptedError) -> Mapping[str, str]:
        """Return the ``x-request-id`` every OpenAI answer carries."""
        del error
        return {"x-request-id": "req_conformance"}

    # -- reading ---------------------------------------------------------------------------------

    def read_request(self, request: CapturedRequest) -> WireRequest:
        """Read a Chat Completions request, enforcing the API's structural rules (module docstring)."""
        body = object_at(request.json, "body")
        model = text_at(body.get("model"), "model")
        require(model, "model", "must not be empty")
        raw_messages = list_at(body.get("messages"), "messages")
        require(raw_messages, "messages", "must not be empty")
        messages: list[WireMessage] = []
        pending: list[str] = []  # call ids of the last assistant message not yet answered
        for i, raw in enumerate(raw_messages):
            where = f"messages[{i}]"
            item = object_at(raw, where)
            role = item.get("role")
            require(isinstance(role, str) and role in _ROLES, f"{where}.role",
                    f"must be one of {sorted(_ROLES)}, not {role!r}")
            role = str(role)
            if role != "tool":
                require(not pending, where,
                        "an assistant message with 'tool_calls' must be followed by tool messages responding to "
                        f"each 'tool_call_id'; these have none: {', '.join(pending)}")
            if role == "assistant":
                calls = tuple(_read_call(c, f"{where}.tool_calls[{j}]")
                              for j, c in enumerate(list_at(item.get("tool_calls") or [], f"{where}.tool_calls")))
                ids = [c.id for c in calls]
                require(len(set(ids)) == len(ids), f"{where}.tool_calls", f"repeats a call id: {ids}")
                text = _content(item.get("content"), f"{where}.content", nullable=bool(calls))
                messages.append(WireMessage(role="assistant", text=text, tool_calls=calls))
                pending = ids
            elif role == "tool":
                call_id = text_at(item.get("tool_call_id"), f"{where}.tool_call_id")
                require(call_id in pending, f"{where}.tool_call_id",
                        f"{call_id!r} answers no call of the assistant message before it (open calls: {pending})")
                pending.remove(call_id)
                messages.append(WireMessage(role="tool", tool_call_id=call_id,
                                            text=_content(item.get("content"), f"{where}.content")))
            else:
                messages.append(WireMessage(role=_ROLES[role], text=_content(item.get("content"), f"{where}.content")))
        require(not pending, "messages",
                "an assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'; these have none: {', '.join(pending)}")
        tools: dict[str, Any] = {}
        if "tools" in body and body["tools"] is not None:
            for j, raw_tool in enumerate(list_at(body["tools"], "tools")):
                tool = object_at(raw_tool, f"tools[{j}]")
                require(tool.get("type") == "function", f"tools[{j}].type",
                        f"must be 'function', not {tool.get('type')!r}")
                function = object_at(tool.get("function"), f"tools[{j}].function")
                name = text_at(function.get("name"), f"tools[{j}].function.name")
                tools[name] = function.get("parameters")
        for key in ("tool_choice", "parallel_tool_calls"):
            require(key not in body or tools, key, "is only allowed when 'tools' are specified")
        stream = body.get("stream") is True
        require("stream_options" not in body or body["stream_options"] is None or stream, "stream_options",
                "is only allowed when 'stream' is enabled")
        return WireRequest(model=model, messages=tuple(messages), tools=tools, stream=stream, raw=body)


def _tool_call(call: ScriptedCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _usage(answer: ScriptedAnswer) -> dict[str, Any]:
    return {"prompt_tokens": answer.input_tokens, "completion_tokens": answer.output_tokens,
            "total_tokens": answer.total_tokens}


def _read_call(raw: Any, where: str) -> WireToolCall:
    call = object_at(raw, where)
    call_id = text_at(call.get("id"), f"{where}.id")
    require(call_id, f"{where}.id", "must not be empty")
    require(call.get("type") == "function", f"{where}.type", f"must be 'function', not {call.get('type')!r}")
    function = object_at(call.get("function"), f"{where}.function")
    name = text_at(function.get("name"), f"{where}.function.name")
    arguments = text_at(function.get("arguments"), f"{where}.function.arguments")
    return WireToolCall(id=call_id, name=name, arguments=parse_json_text(arguments))


def _content(value: Any, where: str, *, nullable: bool = False) -> str | None:
    if value is None:
        require(nullable, where, "must not be null (only an assistant message with tool_calls may omit content)")
        return None
    if isinstance(value, str):
        return value
    parts = list_at(value, where)
    texts = []
    for k, raw in enumerate(parts):
        part = object_at(raw, f"{where}[{k}]")
        if part.get("type") == "text":
            texts.append(text_at(part.get("text"), f"{where}[{k}].text"))
    return "".join(texts)
