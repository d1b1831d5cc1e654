"""The Chat Completions wire format: loopwright values to request bodies, response JSON to values.

Pure functions, no I/O, no httpx, so the same code serves the plain call today and an SSE stream
later (a stream accumulates its deltas into the same ``message`` object that
:func:`decode_message` reads, and its last chunk carries the usage :func:`decode_usage` reads).

Performance contract: a request body is built without re-serialising the history. Each message
is turned into JSON text once (cached on the :class:`~loopwright._types.Transcript` under
:data:`CACHE_KEY`), each tool list once (:class:`ToolsCache`), and the body is spliced together
from those pieces.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from loopwright._types import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Transcript, Usage

__all__ = [
    "CACHE_KEY",
    "MalformedResponseError",
    "ToolsCache",
    "build_body",
    "decode_message",
    "decode_response",
    "decode_usage",
    "encode_message",
    "encode_message_json",
    "encode_messages",
    "encode_settings",
    "encode_tool_choice",
    "encode_tools",
    "error_message",
    "map_finish_reason",
    "parse_arguments",
]

#: The :meth:`Transcript.encoded` key. The cached entries are JSON *text*, one per message.
CACHE_KEY = "openai-chat-json"

#: ``modelSettings`` keys (camelCase, as in YAML) and their wire names. ``maxTokens`` and
#: ``toolChoice`` are handled separately; any key not listed passes through unchanged.
RENAMED: Mapping[str, str] = {
    "frequencyPenalty": "frequency_penalty",
    "logitBias": "logit_bias",
    "parallelToolCalls": "parallel_tool_calls",
    "presencePenalty": "presence_penalty",
    "reasoningEffort": "reasoning_effort",
    "seed": "seed",
    "serviceTier": "service_tier",
    "stop": "stop",
    "temperature": "temperature",
    "topLogprobs": "top_logprobs",
    "topP": "top_p",
    "user": "user",
}

# Body fields the provider owns; a setting of the same name is ignored.
_RESERVED = frozenset({"messages", "model", "stream", "stream_options", "tools"})
# Fields the API rejects when the request has no tools.
_TOOLS_ONLY = frozenset({"parallel_tool_calls", "tool_choice"})
_TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})

_FINISH_REASONS: Mapping[str, str] = {
    "content_filter": "content_filter",
    "function_call": "tool_calls",
    "length": "length",
    "stop": "stop",
    "tool_calls": "tool_calls",
}


def _default(value: Any) -> Any:
    # Frozen values hold Mappings that are not dicts (mappingproxy, frozendict-likes).
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


_dumps = json.JSONEncoder(separators=(",", ":"), default=_default).encode


class MalformedResponseError(ValueError):
    """A response body that is JSON but not a usable Chat Completions answer (no choices ...)."""


# -- encoding ----------------------------------------------------------------------------------


def encode_message(message: Message) -> dict[str, Any]:
    """Return the wire form of one message.

    Assistant messages carry their ``tool_calls`` (arguments as a JSON string: the model's own
    ``raw_arguments`` when it wrote unparseable ones, else the parsed arguments re-encoded);
    ``content`` is ``null`` only beside tool calls. Tool messages carry ``tool_call_id``.
    """
    role = message.role
    if role == "assistant":
        if message.tool_calls:
            return {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [_encode_tool_call(call) for call in message.tool_calls],
            }
        return {"role": "assistant", "content": message.content or ""}
    if role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content or ""}
    return {"role": role, "content": message.content or ""}


def _encode_tool_call(call: ToolCall) -> dict[str, Any]:
    arguments = call.raw_arguments if call.raw_arguments is not None else _dumps(call.arguments)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def encode_message_json(message: Message) -> str:
    """Return :func:`encode_message` as compact JSON text (the form cached on a transcript)."""
    return _dumps(encode_message(message))


def encode_messages(messages: Sequence[Message]) -> list[str]:
    """Return the JSON text of each message, in order.

    A :class:`~loopwright._types.Transcript` encodes only the messages added since the last
    call (the list returned is its cache: read-only); any other sequence is encoded whole.
    """
    if isinstance(messages, Transcript):
        return messages.encoded(CACHE_KEY, encode_message_json)
    return [encode_message_json(m) for m in messages]


def encode_tools(tools: Sequence[ToolSpec]) -> str:
    """Return the JSON text of the ``tools`` array."""
    return _dumps([
        {"type": "function",
         "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ])


class ToolsCache:
    """Encoded tool lists, keyed by the identity of the tuple that holds the :class:`ToolSpec` s.

    The loop passes the same tuple every turn, so this encodes each definition's tools once.
    Only tuples are cached (a list could change under the cache); an entry keeps its tuple
    alive, so an id is never reused while cached. At most ``size`` entries, oldest dropped first.
    """

    __slots__ = ("_items", "_size")

    def __init__(self, size: int = 32) -> None:
        """Create an empty cache of at most ``size`` tool lists."""
        self._items: dict[int, tuple[Sequence[ToolSpec], str]] = {}
        self._size = size

    def get(self, tools: Sequence[ToolSpec]) -> str:
        """Return :func:`encode_tools` of ``tools``, from the cache when ``tools`` is a cached tuple."""
        if type(tools) is not tuple:
            return encode_tools(tools)
        key = id(tools)
        hit = self._items.get(key)
        if hit is not None and hit[0] is tools:
            return hit[1]
        text = encode_tools(tools)
        if len(self._items) >= self._size:
            del self._items[next(iter(self._items))]
        self._items[key] = (tools, text)
        return text


def encode_tool_choice(value: Any) -> Any:
    """Return the wire ``tool_choice`` for a ``toolChoice`` setting.

    ``auto``, ``none`` and ``required`` stay as they are; another string names the one tool to
    call; anything else (an explicit object) is sent unchanged.
    """
    if isinstance(value, str) and value not in _TOOL_CHOICE_MODES:
        return {"type": "function", "function": {"name": value}}
    return value


def encode_settings(
    settings: Mapping[str, Any], *, max_tokens_field: str = "max_tokens", has_tools: bool = True,
) -> dict[str, Any]:
    """Return the body fields for a definition's ``modelSettings``.

    Known camelCase keys are renamed (:data:`RENAMED`, ``maxTokens`` to ``max_tokens_field``,
    ``toolChoice`` through :func:`encode_tool_choice`) and dropped when ``None``. Every other key
    passes through unchanged, so provider extras reach the API. ``tool_choice`` and
    ``parallel_tool_calls`` are dropped when the request has no tools (the API rejects them
    then), and keys the provider owns (``model``, ``messages``, ``tools``, ``stream``,
    ``stream_options``) are ignored.
    """
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "maxTokens":
            name = max_tokens_field
        elif key == "toolChoice":
            name = "tool_choice"
        elif key in RENAMED:
            name = RENAMED[key]
        else:  # a provider extra: unchanged, None included
            if key not in _RESERVED and (has_tools or key not in _TOOLS_ONLY):
                out[key] = value
            continue
        if value is not None and (has_tools or name not in _TOOLS_ONLY):
            out[name] = encode_tool_choice(value) if name == "tool_choice" else value
    return out


def build_body(
    request: ModelRequest, *, tools_json: str | None = None, max_tokens_field: str = "max_tokens",
    stream: bool = False,
) -> bytes:
    """Return the JSON body of ``POST /chat/completions`` for ``request``.

    :param request: The request; its ``messages`` are encoded with :func:`encode_messages`.
    :param tools_json: The encoded tools (:class:`ToolsCache`), or ``None`` for no tools.
    :param max_tokens_field: The wire name of ``maxTokens`` (``max_completion_tokens`` for
        newer models).
    :param stream: Whether to ask for an SSE stream (with usage in the last chunk).
    :return: UTF-8 JSON (ASCII in practice).
    """
    head: dict[str, Any] = {"model": request.model}
    if request.settings:
        head.update(encode_settings(
            request.settings, max_tokens_field=max_tokens_field, has_tools=tools_json is not None,
        ))
    if request.output_schema is not None:
        head["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": request.output_schema, "strict": False},
        }
    if stream:
        head["stream"] = True
        head["stream_options"] = {"include_usage": True}
    parts = [_dumps(head)[:-1], ',"messages":[', ",".join(encode_messages(request.messages)), "]"]
    if tools_json is not None:
        parts += (',"tools":', tools_json)
    parts.append("}")
    return "".join(parts).encode()


# -- decoding ----------------------------------------------------------------------------------


def decode_response(data: Any, *, model: str) -> ModelResponse:
    """Turn a Chat Completions response object into a :class:`ModelResponse`.

    Reads ``choices[0]`` only. Never raises for what the *model* wrote (see
    :func:`decode_message`), but raises :class:`MalformedResponseError` when the *API* answer is
    unusable: not an object, or no choices.

    :param data: The parsed response JSON.
    :param model: The model asked for; used on the message when the response does not name one.
    """
    if not isinstance(data, dict):
        raise MalformedResponseError(f"the response is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        detail = error_message(data)
        raise MalformedResponseError(
            "the response has no choices" + (f": {detail}" if detail else ""),
        )
    choice = choices[0]
    served = data.get("model")
    served = served if isinstance(served, str) else None
    raw = choice.get("message")
    message = decode_message(raw if isinstance(raw, dict) else {}, model=served or model)
    raw_finish = choice.get("finish_reason")
    raw_finish = raw_finish if isinstance(raw_finish, str) else None
    return ModelResponse(
        message=message,
        usage=decode_usage(data.get("usage")),
        finish_reason=map_finish_reason(raw_finish, has_tool_calls=bool(message.tool_calls)),
        model=served,
        raw_finish_reason=raw_finish,
    )


def decode_message(message: Mapping[str, Any], *, model: str | None = None) -> Message:
    """Turn a wire assistant message into a :class:`Message`.

    Tool calls keep their ids (a missing or repeated one is replaced by a generated
    ``call_...`` id); their arguments go through :func:`parse_arguments`. A legacy
    ``function_call`` becomes one tool call. Without ``content``, a ``refusal`` is the text.
    """
    content = message.get("content")
    if isinstance(content, list):  # content parts, as some compatible servers send them
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict)) or None
    elif content is not None and not isinstance(content, str):
        content = str(content)
    if content is None and isinstance(message.get("refusal"), str):
        content = message["refusal"]
    raw_calls = message.get("tool_calls")
    calls: tuple[ToolCall, ...] = ()
    if isinstance(raw_calls, list) and raw_calls:
        seen: set[str] = set()
        decoded = []
        for raw in raw_calls:
            if isinstance(raw, dict):
                call = _decode_tool_call(raw, seen)
                seen.add(call.id)
                decoded.append(call)
        calls = tuple(decoded)
    elif isinstance(message.get("function_call"), dict):
        calls = (_decode_tool_call({"function": message["function_call"]}, set()),)
    return Message(role="assistant", content=content, tool_calls=calls, model=model)


def _decode_tool_call(raw: Mapping[str, Any], seen: set[str]) -> ToolCall:
    function = raw.get("function")
    function = function if isinstance(function, dict) else {}
    name = function.get("name")
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id or call_id in seen:
        call_id = f"call_{uuid.uuid4().hex[:24]}"
    arguments, raw_arguments = parse_arguments(function.get("arguments"))
    return ToolCall(id=call_id, name=name if isinstance(name, str) else "", arguments=arguments,
                    raw_arguments=raw_arguments)


def parse_arguments(value: Any) -> tuple[dict[str, Any], str | None]:  # noqa: PLR0911 - one per case
    """Return ``(arguments, raw_arguments)`` for a tool call's wire ``arguments``.

    A JSON object string gives the parsed object and ``None``. Anything else the model wrote
    (invalid JSON, or JSON that is not an object) gives ``{}`` and the text as written, so the
    loop can report ``invalid_arguments`` to the model. Absent or blank arguments mean ``{}``.
    """
    if value is None:
        return {}, None
    if isinstance(value, dict):
        return value, None
    if not isinstance(value, str):
        return {}, _dumps(value)
    if not value.strip():
        return {}, None
    try:
        parsed = json.loads(value)
    except ValueError:
        return {}, value
    if isinstance(parsed, dict):
        return parsed, None
    return {}, value


def decode_usage(usage: Any) -> Usage:
    """Turn a wire ``usage`` object into a :class:`Usage` for one request.

    ``prompt_tokens_details.cached_tokens`` is ``cache_read_tokens`` and
    ``completion_tokens_details.reasoning_tokens`` is ``reasoning_tokens``; counts the API did
    not send stay ``None`` (0 for the three main counts).
    """
    if not isinstance(usage, dict):
        return Usage(requests=1)
    prompt = _count(usage.get("prompt_tokens")) or 0
    completion = _count(usage.get("completion_tokens")) or 0
    total = _count(usage.get("total_tokens"))
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=prompt + completion if total is None else total,
        cache_read_tokens=_detail(usage, "prompt_tokens_details", "cached_tokens"),
        reasoning_tokens=_detail(usage, "completion_tokens_details", "reasoning_tokens"),
        requests=1,
    )


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _detail(usage: Mapping[str, Any], group: str, key: str) -> int | None:
    details = usage.get(group)
    return _count(details.get(key)) if isinstance(details, dict) else None


def map_finish_reason(raw: str | None, *, has_tool_calls: bool = False) -> str:
    """Return the normalised finish reason.

    ``stop``, ``length`` and ``content_filter`` map to themselves, ``tool_calls`` and the legacy
    ``function_call`` to ``tool_calls``; other values are kept as the API wrote them. A missing
    reason is ``tool_calls`` when the message has tool calls, else ``stop``.
    """
    if raw is None:
        return "tool_calls" if has_tool_calls else "stop"
    return _FINISH_REASONS.get(raw, raw)


def error_message(data: Any) -> str | None:
    """Return the API's error message from an error body, or ``None``.

    Understands OpenAI's ``{"error": {"message": ..., "code": ...}}`` (the code is appended in
    brackets), ``{"error": "text"}`` and ``{"message": "text"}``.
    """
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, dict):
        message = err.get("message")
        if isinstance(message, str) and message:
            code = err.get("code") or err.get("type")
            return f"{message} [{code}]" if isinstance(code, str) and code else message
        return None
    if isinstance(err, str) and err:
        return err
    message = data.get("message")
    return message if isinstance(message, str) and message else None
