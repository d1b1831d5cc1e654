"""The Chat Completions wire format: loopwright values to request bodies, response JSON to values.

Pure code, no I/O, no httpx: request bodies (:func:`build_body`), whole answers
(:func:`decode_response`) and streamed ones (:class:`ChatStream`, fed the data of each SSE event).
The Responses API lives in :mod:`loopwright_openai._responses` and reuses the helpers here.

Compatible servers differ from OpenAI in small ways; :data:`QUIRKS` names the ones a provider can
be told about (``quirks:`` in the assembly). Everything a server may *send* differently (missing
tool-call ids or indexes, arguments as JSON objects, usage left out ...) is tolerated without one.

Performance contract: a request body is built without re-serialising the history. Each message
is turned into JSON text once (cached on the :class:`~loopwright.Transcript` under
:data:`CACHE_KEY`), each tool list once (:class:`loopwright.http.ToolsCache`), and the body is spliced together
from those pieces.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from loopwright import (
    Message,
    ModelRequest,
    ModelResponse,
    StreamDelta,
    ToolCall,
    ToolSpec,
    Transcript,
    Usage,
)
from loopwright.http import parse_tool_arguments

__all__ = [  # noqa: RUF022 - plainly sorted(), as test_all_is_sorted checks
    "APIReportedError",
    "CACHE_KEY",
    "ChatStream",
    "MalformedResponseError",
    "QUIRKS",
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
    "new_call_id",
    "parse_arguments",
    "reported_error",
    "short_call_id",
    "split_tool_calls",
    "usage_from",
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


#: Server quirks a provider can be told about (``quirks: [...]``), each with what it changes.
#: The provider also turns some on by itself when a server's error shows it needs them.
QUIRKS: Mapping[str, str] = {
    "noStreamOptions": "never send stream_options (usage then comes only if the server sends it anyway)",
    "noStreamWithTools": "answer requests that carry tools in one piece, even when streaming",
    "emptyToolCallContent": 'send content "" beside tool calls (the default; it overrides nullToolCallContent)',
    "nullToolCallContent": 'send content null instead of "" beside tool calls',
    "noToolChoiceRequired": "send toolChoice required as the one tool's name, or as auto when there are several",
    "toolChoiceAuto": "send toolChoice auto when the request has tools and the definition sets none",
    "jsonObjectFormat": "ask for structured output as response_format {type: json_object, schema}",
    "shortToolCallIds": "send tool-call ids as 9 letters and digits (Mistral chat templates)",
    "splitParallelToolCalls": "send each tool call of a turn as its own assistant message, followed by its result",
}
# The quirks that change how messages are encoded.
_MESSAGE_QUIRKS = frozenset({"emptyToolCallContent", "nullToolCallContent", "shortToolCallIds",
                             "splitParallelToolCalls"})
_SHORT_ID = re.compile(r"^[A-Za-z0-9]{9}$")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class MalformedResponseError(ValueError):
    """A response body that is JSON but not a usable Chat Completions answer (no choices ...)."""


class APIReportedError(Exception):
    """An error the API reported inside a successful response.

    That is an error event in a stream, or a Responses object whose status is ``failed``.

    Attributes:
        transient: Whether retrying may help (server errors and rate limits).
    """

    def __init__(self, message: str, *, transient: bool) -> None:
        self.transient = transient
        super().__init__(message)


# -- encoding ----------------------------------------------------------------------------------


def encode_message(
    message: Message, *, empty_tool_call_content: bool = True, short_ids: bool = False,
) -> dict[str, Any]:
    """Return the wire form of one message.

    Assistant messages carry their ``tool_calls`` (arguments as a JSON string: the model's own
    ``raw_arguments`` when it wrote unparseable ones, else the parsed arguments re-encoded);
    ``content`` is never ``null`` by default: an assistant turn of tool calls only sends
    ``""``, which every known server accepts, whereas ``null`` fails on llama-cpp-python and
    Mistral's OpenAI endpoint. Tool messages carry ``tool_call_id``.

    :param empty_tool_call_content: Send ``""`` beside tool calls without text; ``False`` sends
        ``null`` (quirk ``nullToolCallContent``, for a server that refuses empty text).
    :param short_ids: Send call ids through :func:`short_call_id` (quirk ``shortToolCallIds``).
    """
    role = message.role
    if role == "assistant":
        if message.tool_calls:
            content = message.content
            return {
                "role": "assistant",
                "content": "" if content is None and empty_tool_call_content else content,
                "tool_calls": [_encode_tool_call(call, short_ids=short_ids) for call in message.tool_calls],
            }
        return {"role": "assistant", "content": message.content or ""}
    if role == "tool":
        call_id = message.provider_call_id or ""  # the provider's id, which pairs with its call's
        return {"role": "tool", "tool_call_id": short_call_id(call_id) if short_ids else call_id,
                "content": message.content or ""}
    return {"role": role, "content": message.content or ""}


def _encode_tool_call(call: ToolCall, *, short_ids: bool = False) -> dict[str, Any]:
    arguments = call.raw_arguments if call.raw_arguments is not None else _dumps(call.arguments)
    wire = call.provider_id
    return {"id": short_call_id(wire) if short_ids else wire, "type": "function",
            "function": {"name": call.name, "arguments": arguments}}


def short_call_id(call_id: str) -> str:
    """Return ``call_id`` as 9 letters and digits, the only ids Mistral's templates accept.

    An id that already has that form is kept; any other maps to one derived from its hash, so a
    call and its result always get the same short id.
    """
    if _SHORT_ID.match(call_id):
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    chars = []
    for _ in range(9):
        number, digit = divmod(number, 62)
        chars.append(_BASE62[digit])
    return "".join(chars)


def split_tool_calls(messages: Sequence[Message]) -> list[Message]:
    """Return ``messages`` with every multi-call assistant message split in one message per call.

    Each call is followed by its result (the tool messages that answered the turn are moved up
    to their call); results that match no call stay after the last one, in order. The text of
    the turn stays on the first call's message. For servers whose chat templates accept one
    tool call per assistant message (quirk ``splitParallelToolCalls``).
    """
    out: list[Message] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        i += 1
        if message.role != "assistant" or len(message.tool_calls) < 2:  # noqa: PLR2004 - one is fine
            out.append(message)
            continue
        results: list[Message] = []
        while i < n and messages[i].role == "tool":
            results.append(messages[i])
            i += 1
        by_id: dict[str, list[Message]] = {}
        for result in results:
            by_id.setdefault(result.provider_call_id or "", []).append(result)
        for k, call in enumerate(message.tool_calls):
            out.append(Message(role="assistant", content=message.content if k == 0 else None,
                               tool_calls=(call,), model=message.model))
            out.extend(by_id.pop(call.provider_id, ()))
        out.extend(r for r in results if (r.provider_call_id or "") in by_id)
    return out


def encode_message_json(message: Message) -> str:
    """Return :func:`encode_message` as compact JSON text (the form cached on a transcript)."""
    return _dumps(encode_message(message))


def encode_messages(messages: Sequence[Message], *, quirks: frozenset[str] = frozenset()) -> list[str]:
    """Return the JSON text of each message, in order.

    A :class:`~loopwright.Transcript` encodes only the messages added since the last
    call (the list returned is its cache: read-only); any other sequence is encoded whole.

    :param quirks: Server quirks (:data:`QUIRKS`); those that change messages are applied, each
        combination cached under its own key.
    """
    used = quirks & _MESSAGE_QUIRKS
    if not used:
        if isinstance(messages, Transcript):
            return messages.encoded(CACHE_KEY, encode_message_json)
        return [encode_message_json(m) for m in messages]
    encode = _quirk_encoder(used)
    if "splitParallelToolCalls" in used:
        return [encode(m) for m in split_tool_calls(messages)]
    if isinstance(messages, Transcript):
        return messages.encoded(f"{CACHE_KEY}:{','.join(sorted(used))}", encode)
    return [encode(m) for m in messages]


@functools.cache
def _quirk_encoder(quirks: frozenset[str]) -> Any:
    empty = "emptyToolCallContent" in quirks or "nullToolCallContent" not in quirks
    short = "shortToolCallIds" in quirks

    def encode(message: Message) -> str:
        return _dumps(encode_message(message, empty_tool_call_content=empty, short_ids=short))

    return encode


def encode_tools(tools: Sequence[ToolSpec]) -> str:
    """Return the JSON text of the ``tools`` array."""
    return _dumps([
        {"type": "function",
         "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ])


def encode_tool_choice(value: Any) -> Any:
    """Return the wire ``tool_choice`` for a ``toolChoice`` setting.

    ``auto``, ``none`` and ``required`` stay as they are; another string names the one tool to
    call; anything else (an explicit object) is sent unchanged.
    """
    if isinstance(value, str) and value not in _TOOL_CHOICE_MODES:
        return {"type": "function", "function": {"name": value}}
    return value


def _tool_choice_quirks(head: dict[str, Any], request: ModelRequest, quirks: frozenset[str]) -> None:
    choice = head.get("tool_choice")
    if choice is None and "toolChoiceAuto" in quirks:
        head["tool_choice"] = "auto"
    elif choice == "required" and "noToolChoiceRequired" in quirks:
        tools = request.tools
        head["tool_choice"] = encode_tool_choice(tools[0].name) if len(tools) == 1 else "auto"


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
    stream: bool = False, stream_options: bool = True, quirks: frozenset[str] = frozenset(),
) -> bytes:
    """Return the JSON body of ``POST /chat/completions`` for ``request``.

    :param request: The request; its ``messages`` are encoded with :func:`encode_messages`.
    :param tools_json: The encoded tools (:class:`loopwright.http.ToolsCache`), or ``None`` for no tools.
    :param max_tokens_field: The wire name of ``maxTokens`` (``max_completion_tokens`` for
        newer models).
    :param stream: Whether to ask for an SSE stream.
    :param stream_options: With ``stream``, whether to ask for usage in the last chunk
        (``stream_options: {include_usage: true}``).
    :param quirks: Server quirks (:data:`QUIRKS`) to apply.
    :return: UTF-8 JSON (ASCII in practice).
    """
    head: dict[str, Any] = {"model": request.model}
    if request.settings:
        head.update(encode_settings(
            request.settings, max_tokens_field=max_tokens_field, has_tools=tools_json is not None,
        ))
    if quirks and tools_json is not None:
        _tool_choice_quirks(head, request, quirks)
    if request.output_schema is not None:
        if "jsonObjectFormat" in quirks:  # llama-cpp-python's form
            head["response_format"] = {"type": "json_object", "schema": request.output_schema}
        else:
            head["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": request.output_schema, "strict": False},
            }
    if stream:
        head["stream"] = True
        if stream_options:
            head["stream_options"] = {"include_usage": True}
    messages = ",".join(encode_messages(request.messages, quirks=quirks))
    parts = [_dumps(head)[:-1], ',"messages":[', messages, "]"]
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
        call_id = new_call_id()
    arguments, raw_arguments = parse_arguments(function.get("arguments"))
    return ToolCall(id=call_id, name=name if isinstance(name, str) else "", arguments=arguments,
                    raw_arguments=raw_arguments)


#: Arguments as the model sent them -> ``(arguments, raw_arguments)``; shared by every provider.
parse_arguments = parse_tool_arguments


def decode_usage(usage: Any) -> Usage:
    """Turn a wire ``usage`` object into a :class:`Usage` for one request.

    ``prompt_tokens_details.cached_tokens`` is ``cache_read_tokens`` and
    ``completion_tokens_details.reasoning_tokens`` is ``reasoning_tokens``; counts the API did
    not send stay ``None`` (0 for the three main counts). An answer without ``usage``, or with
    neither ``prompt_tokens`` nor ``completion_tokens`` (some compatible servers; a stream asked
    without ``include_usage``), counts as one ``unreported_requests``: its cost is unknown.
    """
    return usage_from(usage, inputs="prompt_tokens", outputs="completion_tokens")


def usage_from(usage: Any, *, inputs: str, outputs: str) -> Usage:
    """Decode an OpenAI-style usage object for one request, its counts named ``inputs`` and ``outputs``.

    ``prompt_tokens``/``completion_tokens`` for Chat Completions, ``input_tokens``/``output_tokens``
    for the Responses API; cached and reasoning tokens come from ``INPUTS_details`` and
    ``OUTPUTS_details``. Neither count given means one ``unreported_requests``.
    """
    if not isinstance(usage, dict):
        return Usage(requests=1, unreported_requests=1)
    given_prompt, given_completion = _count(usage.get(inputs)), _count(usage.get(outputs))
    if given_prompt is None and given_completion is None:
        return Usage(requests=1, unreported_requests=1)
    prompt = given_prompt or 0
    completion = given_completion or 0
    total = _count(usage.get("total_tokens"))
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=prompt + completion if total is None else total,
        cache_read_tokens=_detail(usage, f"{inputs}_details", "cached_tokens"),
        reasoning_tokens=_detail(usage, f"{outputs}_details", "reasoning_tokens"),
        requests=1,
    )


def _count(value: Any) -> int | None:
    """Return a token count the API sent, or ``None`` for anything that is not one.

    Not a count: anything but a number, a negative number (it would refund a budget), and NaN or
    infinity (which ``json.loads`` accepts).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if (isinstance(value, float) and not math.isfinite(value)) or value < 0:
        return None
    return int(value)


def _detail(usage: Mapping[str, Any], group: str, key: str) -> int | None:
    details = usage.get(group)
    return _count(details.get(key)) if isinstance(details, dict) else None


def map_finish_reason(raw: str | None, *, has_tool_calls: bool = False) -> str:
    """Return the normalised finish reason.

    ``stop``, ``length`` and ``content_filter`` map to themselves, ``tool_calls`` and the legacy
    ``function_call`` to ``tool_calls``; other values are kept as the API wrote them. A missing
    (or empty) reason is ``tool_calls`` when the message has tool calls, else ``stop``.
    """
    if not raw:  # missing, or an empty string: the same
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


def new_call_id() -> str:
    """Return a fresh tool-call id, for calls the server sent without one."""
    return f"call_{uuid.uuid4().hex[:24]}"


def reported_error(data: Mapping[str, Any]) -> APIReportedError | None:
    """Return the error an SSE event or body object reports, or ``None`` when it reports none.

    Understands OpenAI's and OpenRouter's ``{"error": {...}}`` and vLLM's
    ``{"object": "error", "message": ...}``. An error is transient unless its type or code says
    the request itself was at fault (``invalid_...``, ``content_policy...``).
    """
    if data.get("error") is None and data.get("object") != "error":
        return None
    err = data.get("error")
    detail = err if isinstance(err, dict) else data
    kind = " ".join(str(detail.get(k) or "") for k in ("type", "code")).lower()
    message = error_message(data) or "the server reported an error"
    return APIReportedError(message, transient=not ("invalid" in kind or "content_policy" in kind))


# -- streaming ---------------------------------------------------------------------------------


class _StreamedCall:
    """One tool call being reassembled from a stream."""

    __slots__ = ("announced", "arguments", "id", "name", "wire_id")

    def __init__(self, call_id: str, wire_id: str | None) -> None:
        self.id = call_id  #: the id the call will have (the server's, or a generated one)
        self.wire_id = wire_id  #: the id the server gave, if any
        self.name: str | None = None
        self.arguments: list[str] = []
        self.announced = False


class ChatStream:
    """Reassembles a streamed Chat Completions answer: feed it each event's data, in order.

    :meth:`feed` returns the :class:`~loopwright.StreamDelta` s each chunk gives (text,
    tool-call starts, argument pieces) and :meth:`finish` the whole answer. Reads ``choices[0]``
    only. Tolerates what compatible servers do differently:

    * a tool call's ``id`` and ``function.name`` in its first chunk only, in every chunk, or
      (LM Studio) as ``""`` in later chunks; a missing id gets a generated one;
    * a missing ``index`` (older Ollama): the position in the chunk's list stands in;
    * one ``index`` for several calls (Ollama): a chunk at a known index that brings a new id,
      or a name while the call so far already holds whole JSON arguments, starts a new call;
    * arguments whole in one chunk, or as a JSON object rather than a string;
    * ``refusal`` deltas (they are text) and content as a list of parts;
    * usage in the last chunk, in a chunk with choices, or not at all (then zero);
    * no ``[DONE]`` after a ``finish_reason``.

    Attributes:
        done: Whether ``[DONE]`` arrived.

    """

    def __init__(self, *, model: str) -> None:
        """Start reassembling an answer of ``model`` (the model asked for)."""
        self._model = model
        self._text: list[str] = []
        self._calls: list[_StreamedCall] = []
        self._slots: dict[int, _StreamedCall] = {}
        self._ids: set[str] = set()
        self._finish: str | None = None
        self._usage: Any = None
        self._served: str | None = None
        self.done = False

    @property
    def complete(self) -> bool:
        """Whether the stream got far enough to be a whole answer (``[DONE]`` or a finish reason)."""
        return self.done or self._finish is not None

    def feed(self, data: str, event: str = "") -> list[StreamDelta]:  # noqa: ARG002, C901 - Chat events are untyped
        """Take the data of one SSE event and return the deltas it gives (``event`` is unused).

        :raises MalformedResponseError: If the data is not a JSON object.
        :raises APIReportedError: If it reports an error (the stream failed on the server).
        """
        if self.done:
            return []
        if data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            chunk = json.loads(data)
        except ValueError:
            raise MalformedResponseError(f"a stream chunk is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise MalformedResponseError(f"a stream chunk is a JSON {type(chunk).__name__}, not an object")
        error = reported_error(chunk)
        if error is not None:
            raise error
        if self._served is None and isinstance(chunk.get("model"), str) and chunk["model"]:
            self._served = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        out: list[StreamDelta] = []
        if not isinstance(choices, list):
            return out
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, out)
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                self._finish = finish
        return out

    def _delta(self, delta: Mapping[str, Any], out: list[StreamDelta]) -> None:
        content = delta.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
        if not content and isinstance(delta.get("refusal"), str):
            content = delta["refusal"]
        if isinstance(content, str) and content:
            self._text.append(content)
            out.append(StreamDelta(kind="text", text=content))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for position, raw in enumerate(calls):
                if isinstance(raw, dict):
                    self._tool_call(raw, position, out)
        elif isinstance(delta.get("function_call"), dict):  # the legacy single call
            self._tool_call({"index": 0, "function": delta["function_call"]}, 0, out)

    def _tool_call(self, raw: Mapping[str, Any], position: int, out: list[StreamDelta]) -> None:  # noqa: C901
        index = raw.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            index = position
        function = raw.get("function")
        function = function if isinstance(function, dict) else {}
        wire_id = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else None
        name = function.get("name") if isinstance(function.get("name"), str) and function.get("name") else None
        arguments = function.get("arguments")
        if isinstance(arguments, (dict, list)):  # an object, not a string (some servers)
            arguments = _dumps(arguments)
        elif not isinstance(arguments, str):
            arguments = ""
        call = self._slots.get(index)
        if call is None or self._starts_another(call, wire_id, name, arguments):
            call_id = wire_id if wire_id and wire_id not in self._ids else new_call_id()
            self._ids.add(call_id)
            call = self._slots[index] = _StreamedCall(call_id, wire_id)
            self._calls.append(call)
        elif call.wire_id is None and wire_id:
            call.wire_id = wire_id
        if call.name is None and name:
            call.name = name
        if arguments:
            call.arguments.append(arguments)
        if not call.announced and call.name is not None:
            call.announced = True
            out.append(StreamDelta(kind="tool_call", tool_call_id=call.id, name=call.name))
            if call.arguments:
                out.append(StreamDelta(kind="arguments", tool_call_id=call.id, text="".join(call.arguments)))
        elif call.announced and arguments:
            out.append(StreamDelta(kind="arguments", tool_call_id=call.id, text=arguments))

    @staticmethod
    def _starts_another(call: _StreamedCall, wire_id: str | None, name: str | None, arguments: str) -> bool:
        if wire_id is not None and call.wire_id is not None and wire_id != call.wire_id:
            return True
        if name is None or call.name is None or not call.arguments or not arguments.lstrip().startswith("{"):
            return False
        try:  # a name repeated beside new arguments after whole ones: Ollama's calls all at index 0
            json.loads("".join(call.arguments))
        except ValueError:
            return False
        return True

    def finish(self) -> ModelResponse:
        """Return the whole answer: text joined, tool-call arguments joined and parsed.

        Unparseable arguments land in ``raw_arguments``, never raise.
        """
        calls = []
        for call in self._calls:
            arguments, raw = parse_arguments("".join(call.arguments))
            calls.append(ToolCall(id=call.id, name=call.name or "", arguments=arguments, raw_arguments=raw))
        served = self._served
        message = Message(role="assistant", content="".join(self._text) if self._text else None,
                          tool_calls=tuple(calls), model=served or self._model)
        return ModelResponse(
            message=message,
            usage=decode_usage(self._usage),
            finish_reason=map_finish_reason(self._finish, has_tool_calls=bool(calls)),
            model=served,
            raw_finish_reason=self._finish,
        )
