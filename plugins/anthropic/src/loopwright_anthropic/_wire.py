"""The Anthropic Messages wire format: loopwright values to request bodies, answers to values.

Pure functions and small caches, no I/O and no httpx, so the plain call and the SSE stream share
them: a stream accumulates its events (:class:`StreamAccumulator`) into the same content blocks
that :func:`decode_response` reads.

Wire facts this module relies on (Anthropic's Messages API reference, version ``2023-06-01``):

- the system prompt is the top-level ``system`` field (a string or a list of ``text`` blocks);
  ``messages`` holds only ``user`` and ``assistant`` turns, which must alternate and start with
  ``user``;
- an assistant turn calls tools with ``tool_use`` blocks ``{id, name, input}`` (``input`` an
  object; ids match ``^[a-zA-Z0-9_-]+$``); the results go back as ``tool_result`` blocks
  ``{tool_use_id, content, is_error}`` in the next *user* turn, before any other block of it;
- ``text`` blocks must not be empty (nor only whitespace);
- ``max_tokens`` is required; ``stop_sequences``, ``top_p``, ``top_k`` are the sampling names;
  ``tool_choice`` is ``{type: auto | any | none | tool (with name)}`` and may carry
  ``disable_parallel_tool_use``;
- ``cache_control: {type: ephemeral}`` on a system block, a tool or a message block marks the
  end of a cacheable prefix (at most four per request);
- the answer is ``{model, content: [blocks], stop_reason, usage}``; ``usage`` has
  ``input_tokens`` (uncached), ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and
  ``output_tokens``; ``stop_reason`` is ``end_turn``, ``stop_sequence``, ``tool_use``,
  ``max_tokens``, ``refusal``, ``pause_turn`` (or ``model_context_window_exceeded``);
- with extended thinking, ``thinking`` / ``redacted_thinking`` blocks precede the text and must
  be sent back unchanged in the assistant turn that called tools;
- context editing (beta ``context-management-2025-06-27``) is the top-level
  ``context_management: {edits: [{type: clear_tool_uses_20250919, trigger?, keep?, clear_at_least?,
  exclude_tools?, clear_tool_inputs?}, ...]}``, applied by the API before the prompt reaches the
  model (the client keeps the whole history).

Performance contract: a request body is built without re-serialising the history. Each message
becomes JSON text once (one text per content block, cached on the
:class:`~loopwright.Transcript` under :data:`CACHE_KEY`), each tool list once
(:class:`loopwright.http.ToolsCache`). Merging consecutive same-role messages happens when the body is spliced
together from those pieces, so a cached block never depends on its neighbours.
"""

from __future__ import annotations

import collections
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from loopwright import Message, ModelRequest, ModelResponse, StreamDelta, ToolCall, ToolSpec, Transcript, Usage
from loopwright.http import ToolsCache, parse_tool_arguments

__all__ = [
    "CACHE_KEY",
    "DEFAULT_CONTEXT_EDITS",
    "OUTPUT_TOOL",
    "START_TEXT",
    "CachePlan",
    "MalformedResponseError",
    "MessageEncoder",
    "OutputTool",
    "StreamAccumulator",
    "StreamError",
    "ThinkingStash",
    "build_body",
    "decode_response",
    "decode_usage",
    "encode_messages",
    "encode_settings",
    "encode_tool_choice",
    "encode_tools",
    "error_detail",
    "map_stop_reason",
    "parse_arguments",
    "wire_id",
]

#: The :meth:`Transcript.encoded` key. Each entry is ``(kind, blocks)``: ``kind`` is ``system``,
#: ``user``, ``assistant`` or ``tool_result``, ``blocks`` the JSON text of each content block.
CACHE_KEY = "anthropic-messages-json"

#: The default name of the tool that carries structured output (see :class:`OutputTool`).
OUTPUT_TOOL = "final_output"

#: The text of the user turn put first when a transcript would start with the assistant (the API
#: requires the first turn to be the user's).
START_TEXT = "(The conversation starts here.)"
#: The ``context_management.edits`` sent for ``contextStrategy: {kind: providerNative}`` without ``edits``:
#: clear old tool results with the API's defaults (from 100,000 input tokens, keeping the last 3 tool uses).
DEFAULT_CONTEXT_EDITS: tuple[Mapping[str, Any], ...] = ({"type": "clear_tool_uses_20250919"},)

#: ``modelSettings`` keys (camelCase, as in YAML) and their wire names. ``toolChoice`` and
#: ``parallelToolCalls`` are handled separately; any key not listed passes through unchanged.
RENAMED: Mapping[str, str] = {
    "maxTokens": "max_tokens",
    "stop": "stop_sequences",
    "temperature": "temperature",
    "topK": "top_k",
    "topP": "top_p",
}

# Settings with no Anthropic counterpart: the API rejects unknown fields, so they are dropped.
_DROPPED = frozenset({"seed"})
# Body fields the provider owns; a setting of the same name is ignored.
_RESERVED = frozenset({"messages", "model", "stream", "system", "tools"})
_TOOL_CHOICE_MODES: Mapping[str, str] = {"any": "any", "auto": "auto", "none": "none", "required": "any"}

_STOP_REASONS: Mapping[str, str] = {
    "end_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    # pause_turn: the API paused a long turn (server tools); the loop rests as after any answer.
    "pause_turn": "stop",
    "refusal": "content_filter",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
}

_WIRE_ID = re.compile(r"[^a-zA-Z0-9_-]")
_EPHEMERAL = ',"cache_control":{"type":"ephemeral"}}'


def _default(value: Any) -> Any:
    # Frozen values hold Mappings that are not dicts (mappingproxy, frozendict-likes).
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


_dumps = json.JSONEncoder(separators=(",", ":"), default=_default).encode


class MalformedResponseError(ValueError):
    """A response body that is JSON but not a usable Messages answer (no content list ...)."""


class StreamError(ValueError):
    """An SSE stream that cannot be completed: an ``error`` event, or events out of order.

    Attributes:
        error_type: The API's ``error.type`` (``overloaded_error`` ...), or ``None`` when the
            stream itself was malformed.
    """

    def __init__(self, message: str, *, error_type: str | None = None) -> None:
        self.error_type = error_type
        super().__init__(message)


def wire_id(value: str) -> str:
    """Return ``value`` as a valid ``tool_use`` id: characters outside ``[a-zA-Z0-9_-]`` become ``_``.

    Ids made by other providers (fallback models share the transcript) may hold other
    characters; the same mapping is applied to the call and to its result, so they still match.
    """
    return value if value and not _WIRE_ID.search(value) else (_WIRE_ID.sub("_", value) or "call")


# -- thinking blocks ---------------------------------------------------------------------------


class ThinkingStash:
    """The ``thinking`` blocks of recent tool-calling answers, keyed by their first tool call's id.

    With extended thinking on, the API requires an assistant turn that called tools to be sent
    back with its thinking blocks (signatures included). A :class:`~loopwright.Message` has no
    field for them, so the provider keeps them here, at most ``size`` answers, oldest dropped
    first, for the life of the provider. After a restart they are gone; see the provider docs.
    """

    __slots__ = ("_items", "_size")

    def __init__(self, size: int = 1024) -> None:
        """Create an empty stash of at most ``size`` answers."""
        self._items: collections.OrderedDict[str, tuple[str, ...]] = collections.OrderedDict()
        self._size = size

    def put(self, call_id: str, blocks: Sequence[Mapping[str, Any]]) -> None:
        """Keep the JSON text of ``blocks`` for the answer whose first tool call is ``call_id``."""
        self._items[call_id] = tuple(_dumps(b) for b in blocks)
        self._items.move_to_end(call_id)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def get(self, call_id: str) -> tuple[str, ...]:
        """Return the blocks kept for ``call_id``, or ``()``."""
        return self._items.get(call_id, ())

    def __len__(self) -> int:
        return len(self._items)


# -- encoding ----------------------------------------------------------------------------------


def _text_block(text: str | None) -> tuple[str, ...]:
    if text is None or not text.strip():
        return ()  # the API rejects empty and whitespace-only text blocks
    return (_dumps({"type": "text", "text": text}),)


class MessageEncoder:
    """Turns one message into ``(kind, blocks)``, the form cached on a transcript.

    ``kind`` is ``system``, ``user``, ``assistant`` or ``tool_result``; ``blocks`` is the JSON
    text of each content block (possibly none: an empty message sends nothing). Assistant tool
    calls become ``tool_use`` blocks, with ``input: {}`` when the model's arguments were not valid
    JSON (``raw_arguments`` stays in the transcript, and the tool result already told the model).
    Tool messages become ``tool_result`` blocks, ``is_error`` true for any status but ``success``.

    Attributes:
        thinking: The stash thinking blocks are taken from for assistant turns with tool calls.
    """

    __slots__ = ("thinking",)

    def __init__(self, thinking: ThinkingStash | None = None) -> None:
        """Encode with the thinking blocks of ``thinking`` (a new, empty stash by default)."""
        self.thinking = thinking if thinking is not None else ThinkingStash()

    def __call__(self, message: Message) -> tuple[str, tuple[str, ...]]:
        """Return ``(kind, blocks)`` for ``message``."""
        role = message.role
        if role == "assistant":
            blocks = _text_block(message.content)
            calls = message.tool_calls
            if calls:
                blocks = self.thinking.get(calls[0].provider_id) + blocks + tuple(_encode_tool_use(c) for c in calls)
            return "assistant", blocks
        if role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": wire_id(message.provider_call_id or "")}
            if message.content:
                block["content"] = message.content
            block["is_error"] = message.status is not None and message.status != "success"
            return "tool_result", (_dumps(block),)
        return ("system" if role == "system" else "user"), _text_block(message.content)


def _encode_tool_use(call: ToolCall) -> str:
    arguments: Any = {} if call.raw_arguments is not None else call.arguments
    return _dumps({"type": "tool_use", "id": wire_id(call.provider_id), "name": call.name, "input": arguments})


def encode_messages(messages: Sequence[Message], encoder: MessageEncoder) -> list[tuple[str, tuple[str, ...]]]:
    """Return ``encoder(m)`` for each message, in order.

    A :class:`~loopwright.Transcript` encodes only the messages added since the last
    call (the list returned is its cache: read-only); any other sequence is encoded whole.
    """
    if isinstance(messages, Transcript):
        return messages.encoded(CACHE_KEY, encoder)
    return [encoder(m) for m in messages]


def encode_tools(tools: Sequence[ToolSpec]) -> tuple[str, ...]:
    """Return the JSON text of each tool definition ``{name, description, input_schema}``."""
    return tuple(
        _dumps({"name": t.name, "description": t.description, "input_schema": t.parameters}) for t in tools
    )


@attrs.frozen(kw_only=True)
class CachePlan:
    """Where ``promptCaching`` puts ``cache_control: {type: ephemeral}`` markers.

    Attributes:
        system: On the last system block.
        tools: On the last tool definition.
        messages: On the last block of the last message, when that message is the user's.
    """

    system: bool = False
    tools: bool = False
    messages: bool = False


@attrs.frozen(kw_only=True)
class OutputTool:
    """How structured output travels when the API is not asked for JSON directly.

    The request gets one more tool, ``name``, whose input schema is the output schema (wrapped
    as ``{"value": schema}`` when the schema is not an object schema, since tool inputs are
    objects), and a system instruction to call it with the final answer. When the model calls it,
    :func:`decode_response` turns the call's input into the answer's *text* (JSON), which the
    loop then parses and validates like any structured answer.

    Attributes:
        name: The tool's name.
        schema: The output JSON Schema.
        wrapped: Whether the schema is wrapped in ``{"value": ...}``.
    """

    name: str
    schema: Mapping[str, Any]
    wrapped: bool

    @classmethod
    def for_schema(cls, schema: Mapping[str, Any], *, taken: Sequence[ToolSpec] = (),
                   name: str = OUTPUT_TOOL) -> OutputTool:
        """Return the output tool for ``schema``, renamed (``final_output_``) if a tool has its name."""
        names = {t.name for t in taken}
        while name in names:
            name += "_"
        return cls(name=name, schema=schema, wrapped=schema.get("type") != "object")

    def definition(self) -> dict[str, Any]:
        """Return the tool definition sent to the API."""
        schema: Any = self.schema
        if self.wrapped:
            schema = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
        return {
            "name": self.name,
            "description": "Give your final answer. Call this exactly once, when the task is done, "
                           "with the answer as the input.",
            "input_schema": schema,
        }

    def instruction(self) -> str:
        """Return the system instruction that goes with the tool."""
        return (f"When you have the final answer, call the `{self.name}` tool with it instead of writing it "
                "as text. Its input must follow the tool's schema.")

    def answer_text(self, call: ToolCall) -> str:
        """Return the JSON text of the answer carried by a call of this tool."""
        if call.raw_arguments is not None:
            return call.raw_arguments
        if self.wrapped:
            return _dumps(call.arguments.get("value"))
        return _dumps(call.arguments)


def encode_tool_choice(value: Any, *, parallel: bool | None = None) -> Any:
    """Return the wire ``tool_choice`` for a ``toolChoice`` setting.

    ``auto``, ``any`` and ``none`` become ``{type: ...}``; ``required`` (OpenAI's word) is
    ``any``; another string names the one tool to call (``{type: tool, name}``); a mapping is
    sent as given. ``parallel=False`` adds ``disable_parallel_tool_use: true`` (with ``auto``
    when no choice was given); it is not added to ``none``. ``None`` with no parallel setting
    gives ``None`` (leave ``tool_choice`` out).
    """
    if value is None:
        if parallel is not False:
            return None
        choice: dict[str, Any] = {"type": "auto"}
    elif isinstance(value, str):
        mode = _TOOL_CHOICE_MODES.get(value)
        choice = {"type": mode} if mode else {"type": "tool", "name": value}
    elif isinstance(value, Mapping):
        choice = dict(value)
    else:
        return value
    if parallel is False and choice.get("type") != "none":
        choice["disable_parallel_tool_use"] = True
    return choice


def encode_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], Any, bool | None]:
    """Split a definition's ``modelSettings`` into body fields and the tool-choice settings.

    Known camelCase keys are renamed (:data:`RENAMED`; a string ``stop`` becomes a one-item
    ``stop_sequences``) and dropped when ``None``; ``seed`` is dropped (the API has none); keys
    the provider owns (``model``, ``messages``, ``system``, ``tools``, ``stream``) are ignored.
    Every other key passes through unchanged (``thinking``, ``metadata``, ``service_tier`` ...).

    :return: ``(fields, tool_choice, parallel)``: the body fields, the ``toolChoice`` (or wire
        ``tool_choice``) value, and ``parallelToolCalls`` (``None`` when unset).
    """
    fields: dict[str, Any] = {}
    choice: Any = None
    parallel: bool | None = None
    for key, value in settings.items():
        if key in ("toolChoice", "tool_choice"):
            choice = value
        elif key == "parallelToolCalls":
            parallel = None if value is None else bool(value)
        elif key in RENAMED:
            if value is not None:
                fields[RENAMED[key]] = [value] if key == "stop" and isinstance(value, str) else value
        elif key not in _RESERVED and key not in _DROPPED:
            fields[key] = value
    return fields, choice, parallel


def build_body(  # noqa: C901, PLR0912, PLR0915 - one pass over the body's parts, in wire order
    request: ModelRequest, *, encoder: MessageEncoder, tools_cache: ToolsCache[tuple[str, ...]] | None = None,
    default_max_tokens: int = 4096, caching: CachePlan | None = None, native_output: bool = False,
    stream: bool = False,
) -> tuple[bytes, OutputTool | None]:
    """Return the JSON body of ``POST /v1/messages`` for ``request``, and its output tool if any.

    - Leading system messages become the ``system`` blocks; a system message later in the
      transcript becomes a user text block where it stands.
    - Consecutive same-role messages are merged into one turn (the API requires alternation);
      within a user turn, ``tool_result`` blocks come first. Messages with nothing to send
      (empty text) are left out. A transcript that would start with the assistant gets a first
      user turn with :data:`START_TEXT`.
    - ``max_tokens`` is ``maxTokens`` or ``default_max_tokens``.
    - ``output_schema`` travels as ``output_config.format`` when ``native_output``, else through
      an :class:`OutputTool` (forced with ``tool_choice`` when the request has no other tools,
      no tool choice and no ``thinking``).
    - ``caching`` places the ``cache_control`` markers (:class:`CachePlan`).

    :return: UTF-8 JSON, and the :class:`OutputTool` the answer must be decoded with (or ``None``).
    """
    caching = caching or CachePlan()
    fields, choice, parallel = encode_settings(request.settings) if request.settings else ({}, None, None)
    head: dict[str, Any] = {"model": request.model, "max_tokens": fields.pop("max_tokens", default_max_tokens)}
    head.update(fields)

    units = encode_messages(request.messages, encoder)
    n = len(units)
    i = 0
    system: list[str] = []
    while i < n and units[i][0] == "system":
        system.extend(units[i][1])
        i += 1

    output: OutputTool | None = None
    tools = list(tools_cache.get(request.tools) if tools_cache is not None else encode_tools(request.tools))
    schema = request.output_schema
    if schema is not None:
        if native_output:
            config = dict(head.get("output_config") or {})
            config["format"] = {"type": "json_schema", "schema": schema}
            head["output_config"] = config
        else:
            output = OutputTool.for_schema(schema, taken=request.tools)
            tools.append(_dumps(output.definition()))
            system.append(_dumps({"type": "text", "text": output.instruction()}))
            if not request.tools and choice is None and "thinking" not in head:
                choice = {"type": "tool", "name": output.name}
    if tools:
        wire_choice = encode_tool_choice(choice, parallel=parallel)
        if wire_choice is not None:
            head["tool_choice"] = wire_choice
    if request.context_management is not None:  # contextStrategy providerNative: server-side context editing
        edits = request.context_management.get("edits") or DEFAULT_CONTEXT_EDITS
        head["context_management"] = {"edits": [dict(e) for e in edits]}
    if stream:
        head["stream"] = True
    if system and caching.system:
        system[-1] = system[-1][:-1] + _EPHEMERAL

    # Merge into turns: [role, tool_result blocks, other blocks].
    turns: list[tuple[str, list[str], list[str]]] = []
    for kind, blocks in units[i:]:
        if not blocks:
            continue
        role = "assistant" if kind == "assistant" else "user"
        if not turns or turns[-1][0] != role:
            turns.append((role, [], []))
        (turns[-1][1] if kind == "tool_result" else turns[-1][2]).extend(blocks)
    if not turns or turns[0][0] != "user":
        turns.insert(0, ("user", [], list(_text_block(START_TEXT))))
    if caching.messages and turns[-1][0] == "user":
        role, results, others = turns[-1]
        last = others or results
        last[-1] = last[-1][:-1] + _EPHEMERAL
    if tools and caching.tools:
        tools[-1] = tools[-1][:-1] + _EPHEMERAL

    parts = [_dumps(head)[:-1]]
    if system:
        parts += (',"system":[', ",".join(system), "]")
    parts.append(',"messages":[')
    parts.append(",".join(
        f'{{"role":"{role}","content":[{",".join(results + others)}]}}' for role, results, others in turns
    ))
    parts.append("]")
    if tools:
        parts += (',"tools":[', ",".join(tools), "]")
    parts.append("}")
    return "".join(parts).encode(), output


# -- decoding ----------------------------------------------------------------------------------


#: Arguments as the model sent them -> ``(arguments, raw_arguments)``; shared by every provider.
parse_arguments = parse_tool_arguments


def decode_usage(usage: Any) -> Usage:
    """Turn a wire ``usage`` object into a :class:`Usage` for one request.

    ``input_tokens`` counts only uncached prompt tokens on the wire; here it is their sum with
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, which are also reported as
    ``cache_read_tokens`` and ``cache_write_tokens`` (``None`` when the API did not send them).
    Without ``usage``, or with neither ``input_tokens`` nor ``output_tokens``, the request counts
    as one ``unreported_requests`` (its cost is unknown).
    """
    if not isinstance(usage, Mapping) or (_count(usage.get("input_tokens")) is None
                                          and _count(usage.get("output_tokens")) is None):
        return Usage(requests=1, unreported_requests=1)
    uncached = _count(usage.get("input_tokens")) or 0
    read = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    output = _count(usage.get("output_tokens")) or 0
    prompt = uncached + (read or 0) + (written or 0)
    return Usage(input_tokens=prompt, output_tokens=output, total_tokens=prompt + output,
                 cache_read_tokens=read, cache_write_tokens=written, requests=1)


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


def map_stop_reason(raw: str | None, *, has_tool_calls: bool = False) -> str:
    """Return the normalised finish reason for a ``stop_reason``.

    ``end_turn``, ``stop_sequence`` and ``pause_turn`` are ``stop``; ``tool_use`` is
    ``tool_calls``; ``max_tokens`` and ``model_context_window_exceeded`` are ``length``;
    ``refusal`` is ``content_filter``. Other values are kept as the API wrote them. A missing
    (or empty) reason is ``tool_calls`` when the message has tool calls, else ``stop``.
    """
    if not raw:  # missing, or an empty string: the same
        return "tool_calls" if has_tool_calls else "stop"
    return _STOP_REASONS.get(raw, raw)


def decode_response(  # noqa: C901 - one branch per block type
    data: Any, *, model: str, output: OutputTool | None = None, thinking: ThinkingStash | None = None,
) -> ModelResponse:
    """Turn a Messages answer into a :class:`ModelResponse`.

    ``text`` blocks are joined into the content; ``tool_use`` blocks become tool calls (a
    missing or repeated id is replaced by a generated ``toolu_...`` one; unparseable input lands
    in ``raw_arguments``); other blocks (server tools, citations' extras) are skipped. A call of
    the ``output`` tool is removed from the calls and its input becomes the content (JSON text),
    replacing any other text. The thinking blocks of an answer with tool calls go to
    ``thinking``. Never raises for what the *model* wrote, but raises
    :class:`MalformedResponseError` when the *API* answer is unusable (not an object, no
    ``content`` list).

    :param data: The parsed answer JSON (or a stream's reassembled message).
    :param model: The model asked for; used on the message when the answer does not name one.
    :param output: The request's output tool, if it had one.
    :param thinking: Where to keep thinking blocks for the next request.
    """
    if not isinstance(data, dict):
        raise MalformedResponseError(f"the response is a JSON {type(data).__name__}, not an object")
    content = data.get("content")
    if not isinstance(content, list):
        detail = error_detail(data)
        raise MalformedResponseError(
            "the response has no content list" + (f": {detail[0]}" if detail else ""))
    served = data.get("model")
    served = served if isinstance(served, str) else None
    texts: list[str] = []
    calls: list[ToolCall] = []
    kept: list[dict[str, Any]] = []
    answer: str | None = None
    seen: set[str] = set()
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
        elif kind == "tool_use":
            call = _decode_tool_use(block, seen)
            seen.add(call.id)
            if output is not None and call.name == output.name:
                answer = output.answer_text(call)
            else:
                calls.append(call)
        elif kind in ("thinking", "redacted_thinking"):
            kept.append({k: v for k, v in block.items() if not k.startswith("_")})
    if thinking is not None and kept and calls:
        thinking.put(calls[0].id, kept)
    text = answer if answer is not None else ("".join(texts) or None)
    raw_stop = data.get("stop_reason")
    raw_stop = raw_stop if isinstance(raw_stop, str) else None
    finish = map_stop_reason(raw_stop, has_tool_calls=bool(calls))
    if answer is not None and finish == "tool_calls" and not calls:
        finish = "stop"  # the only call was the answer
    return ModelResponse(
        message=Message(role="assistant", content=text, tool_calls=tuple(calls), model=served or model),
        usage=decode_usage(data.get("usage")),
        finish_reason=finish,
        model=served,
        raw_finish_reason=raw_stop,
    )


def _decode_tool_use(block: Mapping[str, Any], seen: set[str]) -> ToolCall:
    call_id = block.get("id")
    if not isinstance(call_id, str) or not call_id or call_id in seen:
        call_id = f"toolu_{uuid.uuid4().hex[:24]}"
    name = block.get("name")
    arguments, raw = parse_arguments(block.get("_json", block.get("input")))
    return ToolCall(id=call_id, name=name if isinstance(name, str) else "", arguments=arguments,
                    raw_arguments=raw)


def error_detail(data: Any) -> tuple[str, str | None] | None:
    """Return ``(message, type)`` from an error body, or ``None``.

    Understands Anthropic's ``{"type": "error", "error": {"type": ..., "message": ...}}`` (also
    the ``data`` of a stream's ``error`` event), ``{"error": "text"}`` and ``{"message": "text"}``.
    """
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, dict):
        message = err.get("message")
        kind = err.get("type")
        kind = kind if isinstance(kind, str) and kind else None
        if isinstance(message, str) and message:
            return message, kind
        return (kind, kind) if kind else None
    if isinstance(err, str) and err:
        return err, None
    message = data.get("message")
    return (message, None) if isinstance(message, str) and message else None


# -- streaming ---------------------------------------------------------------------------------


class StreamAccumulator:
    """Rebuilds a Messages answer from SSE events and says what to yield for each.

    Feed each event (its name and parsed ``data``) to :meth:`feed`, which returns the
    :class:`~loopwright.StreamDelta` s it gives: ``text`` for ``text_delta``, ``tool_call`` when
    a ``tool_use`` block starts, ``arguments`` for each ``input_json_delta`` piece. A call of the
    output tool is not announced as a tool call: its input pieces are yielded as text (an object
    schema), or its whole unwrapped answer once the block ends (a wrapped schema).
    :meth:`response` returns the answer once ``message_stop`` was seen.

    ``message_delta`` carries the ``stop_reason`` and the *cumulative* ``output_tokens`` (and
    may repeat the input counts, which then replace those of ``message_start``). ``ping`` and
    unknown events are ignored. An ``error`` event raises :class:`StreamError` with the API's
    error type.
    """

    __slots__ = ("_blocks", "_message", "_model", "_output", "_thinking", "finished")

    def __init__(self, *, model: str, output: OutputTool | None = None,
                 thinking: ThinkingStash | None = None) -> None:
        """Start an empty answer for a request of ``model``."""
        self._model = model
        self._output = output
        self._thinking = thinking
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        #: Whether ``message_stop`` was seen.
        self.finished = False

    def feed(self, event: str | None, data: Any) -> list[StreamDelta]:  # noqa: C901, PLR0911, PLR0912, PLR0915 - per event
        """Take one event; return the deltas to yield for it."""
        kind = event or (data.get("type") if isinstance(data, dict) else None)
        if kind == "ping":
            return []
        if kind == "error":
            detail = error_detail(data)
            message, error_type = detail or ("the stream reported an error", None)
            raise StreamError(message, error_type=error_type)
        if not isinstance(data, dict):
            raise StreamError(f"the {kind or 'unnamed'} event's data is not a JSON object")
        if kind == "message_start":
            start = data.get("message")
            self._message = dict(start) if isinstance(start, dict) else {}
            self._message["content"] = []
            usage = self._message.get("usage")
            self._message["usage"] = dict(usage) if isinstance(usage, dict) else {}
            return []
        if self._message is None:
            if kind in ("content_block_start", "content_block_delta", "content_block_stop",
                        "message_delta", "message_stop"):
                raise StreamError(f"the stream sent {kind} before message_start")
            return []
        index = data.get("index")
        if kind == "content_block_start":
            block = data.get("content_block")
            block = dict(block) if isinstance(block, dict) else {}
            if isinstance(index, int):
                self._blocks[index] = block
            self._message["content"].append(block)
            if block.get("type") == "tool_use":
                block["_parts"] = []
                name = block.get("name")
                if self._output is None or name != self._output.name:
                    return [StreamDelta(kind="tool_call", tool_call_id=block.get("id"),
                                        name=name if isinstance(name, str) else "")]
            return []
        if kind == "content_block_delta":
            block = self._blocks.get(index) if isinstance(index, int) else None
            delta = data.get("delta")
            if block is None or not isinstance(delta, dict):
                return []
            return self._delta(block, delta)
        if kind == "content_block_stop":
            block = self._blocks.get(index) if isinstance(index, int) else None
            if block is not None and block.get("type") == "tool_use":
                block["_json"] = "".join(block.pop("_parts", ()))
                if not block["_json"]:
                    del block["_json"]  # no pieces: the start's input stands
                elif (out := self._output) is not None and block.get("name") == out.name and out.wrapped:
                    call = _decode_tool_use(block, set())
                    return [StreamDelta(kind="text", text=out.answer_text(call))]
            return []
        if kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict):
                for key in ("stop_reason", "stop_sequence"):
                    if key in delta:
                        self._message[key] = delta[key]
            usage = data.get("usage")
            if isinstance(usage, dict):
                self._message["usage"].update({k: v for k, v in usage.items() if v is not None})
            return []
        if kind == "message_stop":
            self.finished = True
        return []

    def _delta(self, block: dict[str, Any], delta: Mapping[str, Any]) -> list[StreamDelta]:
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if isinstance(text, str) and text:
                block["text"] = (block.get("text") or "") + text
                return [StreamDelta(kind="text", text=text)]
        elif kind == "input_json_delta":
            piece = delta.get("partial_json")
            if isinstance(piece, str) and piece and "_parts" in block:
                block["_parts"].append(piece)
                out = self._output
                if out is not None and block.get("name") == out.name:
                    return [] if out.wrapped else [StreamDelta(kind="text", text=piece)]
                return [StreamDelta(kind="arguments", text=piece, tool_call_id=block.get("id"))]
        elif kind == "thinking_delta":
            block["thinking"] = (block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        return []

    def response(self) -> ModelResponse:
        """Return the reassembled answer.

        :raises StreamError: If ``message_stop`` was not seen (the stream was cut).
        """
        if not self.finished or self._message is None:
            raise StreamError("the stream ended before message_stop")
        for block in self._message["content"]:
            block.pop("_parts", None)
        return decode_response(self._message, model=self._model, output=self._output, thinking=self._thinking)
