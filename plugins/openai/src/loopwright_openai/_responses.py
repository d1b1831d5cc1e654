"""The Responses API wire format (``POST /responses``): request bodies, answers and streams.

Pure code, like :mod:`loopwright_openai._wire`, whose helpers it shares. The mapping:

=====================================  =========================================================
loopwright                             Responses API
=====================================  =========================================================
leading system message                 ``instructions``
other system, user, assistant text     ``{"role": ..., "content": "..."}`` input items
assistant tool call                    ``{"type": "function_call", "call_id", "name", "arguments"}``
tool result                            ``{"type": "function_call_output", "call_id", "output"}``
tools                                  ``{"type": "function", "name", "description", "parameters",
                                       "strict": false}``
``maxTokens``                          ``max_output_tokens``
``toolChoice: NAME``                   ``{"type": "function", "name": NAME}``
``reasoningEffort``                    ``reasoning: {effort}``
output schema                          ``text: {format: {type: json_schema, name: output, ...}}``
``context_management`` (providerNative) ``truncation: auto`` (or the strategy's ``truncation``)
=====================================  =========================================================

Answers: ``message`` items give the text (``output_text`` and ``refusal`` parts), ``function_call``
items the tool calls; ``status`` and ``incomplete_details.reason`` give the finish reason
(``max_output_tokens`` is ``length``, ``content_filter`` stays); a ``failed`` status is an error.
Items the loop has no use for (reasoning, built-in tool calls) are skipped, and no item ids are
sent back, so no request depends on stored state (``store`` is left to the API's default; a
``store: false`` model setting passes through).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from loopwright import Message, ModelRequest, ModelResponse, StreamDelta, ToolCall, ToolSpec, Transcript, Usage
from loopwright_openai._wire import (
    APIReportedError,
    MalformedResponseError,
    _dumps,
    error_message,
    new_call_id,
    parse_arguments,
    usage_from,
)

__all__ = [
    "CACHE_KEY",
    "ResponsesStream",
    "build_body",
    "decode_response",
    "decode_usage",
    "encode_items",
    "encode_settings",
    "encode_tools",
    "failure",
]

#: The :meth:`Transcript.encoded` key: per message, the JSON text of its input items.
CACHE_KEY = "openai-responses-json"

_RENAMED: Mapping[str, str] = {
    "frequencyPenalty": "frequency_penalty",
    "logitBias": "logit_bias",
    "maxTokens": "max_output_tokens",
    "parallelToolCalls": "parallel_tool_calls",
    "presencePenalty": "presence_penalty",
    "serviceTier": "service_tier",
    "topLogprobs": "top_logprobs",
    "topP": "top_p",
}
_RESERVED = frozenset({"model", "input", "instructions", "stream", "tools", "text"})
_TOOLS_ONLY = frozenset({"parallel_tool_calls", "tool_choice"})
_TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})
_TRANSIENT_CODES = frozenset({"server_error", "rate_limit_exceeded"})
_INCOMPLETE: Mapping[str, str] = {"max_output_tokens": "length", "content_filter": "content_filter"}


# -- encoding ----------------------------------------------------------------------------------


def encode_items(message: Message) -> str:
    """Return the input items of one message as JSON text, comma-separated (no brackets)."""
    role = message.role
    if role == "tool":
        return _dumps({"type": "function_call_output", "call_id": message.provider_call_id or "",
                       "output": message.content or ""})
    if role == "assistant" and message.tool_calls:
        items = [{"role": "assistant", "content": message.content}] if message.content else []
        items += [
            {"type": "function_call", "call_id": call.provider_id, "name": call.name,
             "arguments": call.raw_arguments if call.raw_arguments is not None else _dumps(call.arguments)}
            for call in message.tool_calls
        ]
        return ",".join(_dumps(item) for item in items)
    return _dumps({"role": role, "content": message.content or ""})


def _input(messages: Sequence[Message]) -> tuple[str | None, str]:
    """Return the instructions (the leading system message) and the input items' JSON text."""
    if isinstance(messages, Transcript):
        encoded = messages.encoded(CACHE_KEY, encode_items)
    else:
        encoded = [encode_items(m) for m in messages]
    instructions = None
    if messages and messages[0].role == "system":
        instructions = messages[0].content or ""
        encoded = encoded[1:]
    return instructions, ",".join(encoded)


def encode_tools(tools: Sequence[ToolSpec]) -> str:
    """Return the JSON text of the ``tools`` array (non-strict function tools)."""
    return _dumps([
        {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
         "strict": False}
        for t in tools
    ])


def _tool_choice(value: Any) -> Any:
    if isinstance(value, str):
        return value if value in _TOOL_CHOICE_MODES else {"type": "function", "name": value}
    if isinstance(value, Mapping) and isinstance(value.get("function"), Mapping):
        return {"type": "function", "name": value["function"].get("name")}  # the Chat form
    return value


def encode_settings(settings: Mapping[str, Any], *, has_tools: bool = True) -> dict[str, Any]:
    """Return the body fields for a definition's ``modelSettings``.

    Renames as in the module table (``temperature``, ``user``, ``seed``, ``stop`` ... keep or
    take their snake_case names); known keys set to ``None`` are dropped; other keys pass
    through unchanged, so options of the Responses API (``store``, ``truncation``, ``include``
    ...) reach it. Keys the API does not know (``stop``, ``seed`` on OpenAI) are sent as they
    are, and the API's error says so.
    """
    out: dict[str, Any] = {}
    name: str
    for key, value in settings.items():
        if key in _RESERVED:
            continue
        if key == "toolChoice":
            name = "tool_choice"
            value = None if value is None else _tool_choice(value)  # noqa: PLW2901 - the wire form
        elif key == "reasoningEffort":
            name, value = "reasoning", None if value is None else {"effort": value}  # noqa: PLW2901
        elif key in _RENAMED:
            name = _RENAMED[key]
        elif key in ("temperature", "user", "seed", "stop"):
            name = key
        else:
            if has_tools or key not in _TOOLS_ONLY:
                out[key] = value
            continue
        if value is not None and (has_tools or name not in _TOOLS_ONLY):
            out[name] = value
    return out


def build_body(request: ModelRequest, *, tools_json: str | None = None, stream: bool = False) -> bytes:
    """Return the JSON body of ``POST /responses`` for ``request``.

    :param request: The request; its messages become ``instructions`` and ``input`` items.
    :param tools_json: The encoded tools (:class:`loopwright.http.ToolsCache`), or ``None`` for no tools.
    :param stream: Whether to ask for an SSE stream of events.
    """
    instructions, items = _input(request.messages)
    head: dict[str, Any] = {"model": request.model}
    if instructions is not None:
        head["instructions"] = instructions
    if request.settings:
        head.update(encode_settings(request.settings, has_tools=tools_json is not None))
    if request.context_management is not None:  # contextStrategy providerNative; modelSettings win
        head.setdefault("truncation", request.context_management.get("truncation") or "auto")
    if request.output_schema is not None:
        head["text"] = {"format": {"type": "json_schema", "name": "output", "schema": request.output_schema,
                                   "strict": False}}
    if stream:
        head["stream"] = True
    parts = [_dumps(head)[:-1], ',"input":[', items, "]"]
    if tools_json is not None:
        parts += (',"tools":', tools_json)
    parts.append("}")
    return "".join(parts).encode()


# -- decoding ----------------------------------------------------------------------------------


def decode_usage(usage: Any) -> Usage:
    """Turn a Responses ``usage`` object into a :class:`Usage` for one request.

    Without ``usage``, or with neither ``input_tokens`` nor ``output_tokens``, the request counts
    as one ``unreported_requests`` (its cost is unknown).
    """
    return usage_from(usage, inputs="input_tokens", outputs="output_tokens")


def _item_call_id(item: Mapping[str, Any]) -> str:
    call_id = item.get("call_id") or item.get("id")
    return call_id if isinstance(call_id, str) and call_id else new_call_id()


def _message_text(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict):
            text = part.get("text") if part.get("type") != "refusal" else part.get("refusal")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def failure(data: Mapping[str, Any]) -> APIReportedError:
    """Return the error of a ``failed`` response (or an ``error`` stream event)."""
    err = data.get("error")
    detail = err if isinstance(err, dict) else data
    code = detail.get("code") if isinstance(detail.get("code"), str) else None
    message = detail.get("message") if isinstance(detail.get("message"), str) else None
    message = message or error_message(data) or "the response failed"
    if code:
        message = f"{message} [{code}]"
    return APIReportedError(message, transient=code is None or code in _TRANSIENT_CODES)


def decode_response(data: Any, *, model: str, call_ids: Mapping[str, str] | None = None) -> ModelResponse:
    """Turn a Responses object into a :class:`ModelResponse`.

    :param data: The parsed response JSON.
    :param model: The model asked for; used on the message when the response names none.
    :param call_ids: Ids already given to function-call items (by item id), so that a streamed
        answer keeps the ids its deltas announced.
    :raises MalformedResponseError: If ``data`` is not a response object.
    :raises APIReportedError: If its status is ``failed``.
    """
    if not isinstance(data, dict) or not isinstance(data.get("output", []), list):
        raise MalformedResponseError("the response is not a Responses object (no output list)")
    status = data.get("status")
    if status == "failed":
        raise failure(data)
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in data.get("output") or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message" or (kind is None and item.get("role") == "assistant"):
            texts.append(_message_text(item))
        elif kind == "function_call":
            item_id = item.get("id")
            call_id = (call_ids or {}).get(item_id) if isinstance(item_id, str) else None
            arguments, raw = parse_arguments(item.get("arguments"))
            name = item.get("name")
            calls.append(ToolCall(id=call_id or _item_call_id(item), name=name if isinstance(name, str) else "",
                                  arguments=arguments, raw_arguments=raw))
    if not texts and isinstance(data.get("output_text"), str):  # an SDK-style shortcut some servers send
        texts.append(data["output_text"])
    served = data.get("model") if isinstance(data.get("model"), str) and data.get("model") else None
    text = "".join(texts)
    message = Message(role="assistant", content=text if texts else None, tool_calls=tuple(calls),
                      model=served or model)
    details = data.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    raw_finish: str | None
    if status == "incomplete":
        raw_finish = reason if isinstance(reason, str) and reason else "incomplete"
        finish = _INCOMPLETE.get(raw_finish, raw_finish)
    else:
        raw_finish = status if isinstance(status, str) else None
        finish = "tool_calls" if calls else "stop"
    return ModelResponse(message=message, usage=decode_usage(data.get("usage")), finish_reason=finish,
                         model=served, raw_finish_reason=raw_finish)


class ResponsesStream:
    """Reassembles a streamed Responses answer: feed it each event's data, in order.

    Text comes from ``response.output_text.delta`` (and ``response.refusal.delta``), tool calls
    start with ``response.output_item.added`` for a ``function_call`` item and grow with
    ``response.function_call_arguments.delta``. ``response.completed`` (or
    ``response.incomplete``) carries the whole response, which :meth:`finish` decodes, keeping
    the call ids the deltas announced; a stream whose final response lists no output (some
    compatible servers) is assembled from the deltas. ``response.failed`` and ``error`` events
    raise :class:`~loopwright_openai._wire.APIReportedError`.

    Attributes:
        done: Whether the final response arrived.

    """

    def __init__(self, *, model: str) -> None:
        """Start reassembling an answer of ``model`` (the model asked for)."""
        self._model = model
        self._text: list[str] = []
        self._calls: dict[str, list[Any]] = {}  # item id -> [call id, name, argument pieces]
        self._by_index: dict[int, str] = {}
        self._final: dict[str, Any] | None = None
        self.done = False

    @property
    def complete(self) -> bool:
        """Whether the final response arrived."""
        return self.done

    def feed(self, data: str, event: str = "") -> list[StreamDelta]:  # noqa: C901, PLR0912 - one branch per event type
        """Take one SSE event and return the deltas it gives.

        :raises MalformedResponseError: If the data is not a JSON object.
        :raises APIReportedError: If the event reports a failure.
        """
        if self.done:
            return []
        try:
            obj = json.loads(data)
        except ValueError:
            raise MalformedResponseError(f"a stream event is not JSON: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise MalformedResponseError(f"a stream event is a JSON {type(obj).__name__}, not an object")
        kind = obj.get("type") if isinstance(obj.get("type"), str) else event
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                self._text.append(delta)
                return [StreamDelta(kind="text", text=delta)]
        elif kind == "response.output_item.added":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                return self._call_added(item, obj.get("output_index"))
        elif kind == "response.function_call_arguments.delta":
            call = self._call(obj)
            delta = obj.get("delta")
            if call is not None and isinstance(delta, str) and delta:
                call[2].append(delta)
                return [StreamDelta(kind="arguments", tool_call_id=call[0], text=delta)]
        elif kind in ("response.function_call_arguments.done", "response.output_item.done"):
            item = obj.get("item") if kind == "response.output_item.done" else obj
            if not isinstance(item, dict):
                item = {}  # a malformed item settles nothing
            call = self._call(obj if kind.endswith("arguments.done") else {"item_id": item.get("id")})
            arguments = item.get("arguments")
            if call is not None and isinstance(arguments, str):
                call[2][:] = [arguments]  # the whole arguments, as the server settled them
        elif kind in ("response.completed", "response.incomplete"):
            response = obj.get("response")
            self._final = response if isinstance(response, dict) else {}
            self.done = True
        elif kind == "response.failed":
            response = obj.get("response")
            raise failure(response if isinstance(response, dict) else obj)
        elif kind == "error":
            raise failure(obj)
        return []

    def _call_added(self, item: Mapping[str, Any], index: Any) -> list[StreamDelta]:
        raw_id = item.get("id")
        item_id = raw_id if isinstance(raw_id, str) and raw_id else new_call_id()
        call_id = _item_call_id(item)
        raw_name = item.get("name")
        name = raw_name if isinstance(raw_name, str) else ""
        arguments = item.get("arguments")
        call = [call_id, name, [arguments] if isinstance(arguments, str) and arguments else []]
        self._calls[item_id] = call
        if isinstance(index, int):
            self._by_index[index] = item_id
        out = [StreamDelta(kind="tool_call", tool_call_id=call_id, name=name)]
        if call[2]:
            out.append(StreamDelta(kind="arguments", tool_call_id=call_id, text=call[2][0]))
        return out

    def _call(self, obj: Mapping[str, Any]) -> list[Any] | None:
        item_id = obj.get("item_id")
        if isinstance(item_id, str) and item_id in self._calls:
            return self._calls[item_id]
        index = obj.get("output_index")
        return self._calls.get(self._by_index.get(index, "")) if isinstance(index, int) else None

    def finish(self) -> ModelResponse:
        """Return the whole answer.

        :raises APIReportedError: If the final response's status is ``failed``.
        """
        final = self._final or {}
        if final.get("output"):
            ids = {item_id: call[0] for item_id, call in self._calls.items()}
            return decode_response(final, model=self._model, call_ids=ids)
        # No output in the final response: build it from the deltas.
        output: list[dict[str, Any]] = []
        if self._text:
            output.append({"type": "message", "content": [{"type": "output_text", "text": "".join(self._text)}]})
        output += [{"type": "function_call", "id": item_id, "call_id": call[0], "name": call[1],
                    "arguments": "".join(call[2])} for item_id, call in self._calls.items()]
        ids = {item_id: call[0] for item_id, call in self._calls.items()}
        return decode_response({**final, "output": output}, model=self._model, call_ids=ids)
