"""The values the conformance kit passes around: scripted answers, captured and normalised requests.

Two directions, both vendor-neutral:

* *out* (server to provider): a :class:`ScriptedAnswer` or a :class:`ScriptedError` says what the
  model "answered"; a :class:`~loopwright_testing.conformance.Dialect` renders it as the vendor's
  JSON body or SSE stream (:class:`WireReply`, :class:`SSEEvent`).
* *in* (provider to server): the server records each :class:`CapturedRequest` as it arrived on
  the socket; the dialect reads it into a :class:`WireRequest`, a list of :class:`WireMessage`
  that the scenarios check without knowing the vendor's format.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "CapturedRequest",
    "SSEEvent",
    "ScriptedAnswer",
    "ScriptedCall",
    "ScriptedError",
    "UnrepresentableError",
    "WireFormatError",
    "WireMessage",
    "WireReply",
    "WireRequest",
    "WireToolCall",
    "split_text",
]

#: Normalised finish reasons a scripted answer may carry (those of :class:`loopwright.ModelResponse`).
FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter"})

#: Vendor-neutral error kinds a :class:`ScriptedError` may carry; dialects map them to the vendor's.
ERROR_KINDS = frozenset({
    "authentication", "invalid_request", "not_found", "overloaded", "permission", "rate_limit", "server_error",
})


class WireFormatError(ValueError):
    """A captured request breaks the vendor's wire format (the real API would reject it).

    Raised by :meth:`Dialect.read_request`; the message says which rule, where
    (``messages[3].tool_calls[0]``), as the vendor's API would.
    """


class UnrepresentableError(ValueError):
    """A dialect cannot express a scripted answer in the form asked for.

    For example Anthropic's non-streamed ``tool_use`` input is always a JSON object, so
    arguments that are not valid JSON exist only in a stream. Scenarios avoid asking for such
    forms by reading :attr:`Dialect.raw_arguments_on`; a render that is asked anyway raises this.
    """


def split_text(text: str, pieces: int = 3) -> tuple[str, ...]:
    """Return ``text`` cut into ``pieces`` parts of near-equal length (fewer for short text).

    :param text: The text to cut; ``""`` gives ``("",)``.
    :param pieces: How many parts at most.
    """
    if not text:
        return ("",)
    size = max(1, -(-len(text) // pieces))
    return tuple(text[i:i + size] for i in range(0, len(text), size))


@attrs.frozen(kw_only=True)
class ScriptedCall:
    """One tool call in a scripted answer.

    Attributes:
        id: The call id the server sends (``[A-Za-z0-9_-]`` only, so every vendor accepts it).
        name: The tool's name.
        arguments: The arguments as the model "wrote" them: JSON text, possibly malformed.
        pieces: How a stream splits ``arguments`` (default: three near-equal parts).
    """

    id: str
    name: str
    arguments: str
    pieces: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.pieces and "".join(self.pieces) != self.arguments:
            raise ValueError(f"the pieces of call {self.id!r} do not join into its arguments")

    @property
    def argument_pieces(self) -> tuple[str, ...]:
        """The pieces a stream sends, in order."""
        return self.pieces or split_text(self.arguments)

    @property
    def parsed(self) -> Any:
        """The arguments parsed as JSON, or ``None`` when they are not valid JSON."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return None

    @property
    def well_formed(self) -> bool:
        """Whether the arguments are a JSON object (what every provider must parse)."""
        return isinstance(self.parsed, dict)


@attrs.frozen(kw_only=True)
class ScriptedAnswer:
    """What the scripted model answers, before any vendor's wire format.

    Attributes:
        text: The answer's text, or ``None`` (an answer made only of tool calls).
        text_pieces: How a stream splits ``text`` (default: three near-equal parts).
        tool_calls: The calls, in order.
        finish_reason: Normalised: ``stop``, ``tool_calls``, ``length`` or ``content_filter``.
        input_tokens: Prompt tokens the server reports.
        output_tokens: Completion tokens the server reports.
        model: The model the server says served the call.
        id: The answer's id, for vendors that send one.
    """

    text: str | None = None
    text_pieces: tuple[str, ...] = ()
    tool_calls: tuple[ScriptedCall, ...] = ()
    finish_reason: str = "stop"
    input_tokens: int = 11
    output_tokens: int = 7
    model: str = "conformance-model-0001"
    id: str = "conformance_1"

    def __attrs_post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {sorted(FINISH_REASONS)}, not {self.finish_reason!r}")
        if self.text_pieces and "".join(self.text_pieces) != (self.text or ""):
            raise ValueError("text_pieces do not join into text")

    @property
    def stream_text_pieces(self) -> tuple[str, ...]:
        """The text pieces a stream sends, in order (none without text)."""
        if not self.text:
            return ()
        return self.text_pieces or split_text(self.text)

    @property
    def total_tokens(self) -> int:
        """``input_tokens + output_tokens``."""
        return self.input_tokens + self.output_tokens


@attrs.frozen(kw_only=True)
class ScriptedError:
    """An API failure the server answers with.

    Attributes:
        status: The HTTP status.
        message: The API's human-readable message; the provider's error must carry it.
        kind: Vendor-neutral kind (``rate_limit``, ``invalid_request``, ``overloaded``,
            ``server_error``, ``authentication``, ``permission``, ``not_found``).
        headers: Extra response headers, for example ``{"Retry-After": "0"}``.
    """

    status: int
    message: str
    kind: str = "invalid_request"
    headers: Mapping[str, str] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.kind not in ERROR_KINDS:
            raise ValueError(f"kind must be one of {sorted(ERROR_KINDS)}, not {self.kind!r}")


@attrs.frozen(kw_only=True)
class SSEEvent:
    """One server-sent event: an optional ``event:`` name and its ``data`` text.

    Attributes:
        data: The data, usually compact JSON; a text with line breaks is sent as several
            ``data:`` lines, as the SSE spec says.
        event: The event name, or ``None`` for unnamed events.
    """

    data: str
    event: str | None = None

    def encode(self) -> bytes:
        """Return the event as it goes on the wire, blank line included."""
        head = f"event: {self.event}\n" if self.event is not None else ""
        lines = "".join(f"data: {line}\n" for line in self.data.split("\n"))
        return f"{head}{lines}\n".encode()


@attrs.frozen(kw_only=True)
class WireReply:
    """An HTTP answer the server writes.

    Attributes:
        status: The HTTP status.
        headers: Response headers (``Content-Type`` is added when absent).
        body: The body of a plain answer.
        events: For a stream: the events, written one HTTP chunk each.
        gate: For a stream: after writing event number ``gate_after``, the server waits for this
            to be set (the scenario sets it when the provider yields the first piece), so a
            provider that waits for the whole body is caught.
        gate_after: The index of the event after which the server waits for ``gate``.
        gate_timeout: How long it waits before it records a problem and goes on.
    """

    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=dict)
    body: bytes = b""
    events: tuple[SSEEvent, ...] | None = None
    gate: threading.Event | None = attrs.field(default=None, eq=False)
    gate_after: int | None = None
    gate_timeout: float = 5.0

    @classmethod
    def json(cls, data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> WireReply:
        """Return a JSON answer (UTF-8, not ASCII-escaped, as the vendors send it)."""
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(status=status, body=body, headers={"Content-Type": "application/json", **(headers or {})})

    @classmethod
    def sse(cls, events: tuple[SSEEvent, ...], *, headers: Mapping[str, str] | None = None) -> WireReply:
        """Return a ``text/event-stream`` answer of ``events``."""
        return cls(events=events, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", **(headers or {})})


@attrs.frozen(kw_only=True)
class CapturedRequest:
    """One HTTP request as the server received it.

    Attributes:
        index: Its position among the requests of the test (0 first).
        method: The HTTP method.
        path: The path, without the query string.
        query: The query string, ``""`` when there is none.
        headers: The headers, names lower-cased.
        body: The raw body.
        at: When it arrived (``time.monotonic()``).
    """

    index: int
    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    at: float

    @property
    def json(self) -> Any:
        """The body parsed as JSON.

        :raises WireFormatError: If it is not JSON.
        """
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise WireFormatError(f"the request body is not JSON: {self.body[:200]!r}") from exc


@attrs.frozen(kw_only=True)
class WireToolCall:
    """A tool call found in a request's transcript.

    Attributes:
        id: Its id as sent.
        name: The tool's name.
        arguments: The arguments as sent: the parsed JSON value when the vendor sends JSON text
            that parses (or an object), else the text itself.
    """

    id: str
    name: str
    arguments: Any


@attrs.frozen(kw_only=True)
class WireMessage:
    """One transcript entry found in a request, normalised to loopwright's roles.

    A vendor turn that holds several things (Anthropic's user turn with ``tool_result`` blocks and
    text) is read as several messages, in order: one ``tool`` message per result, then the text.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        text: The text (parts joined), or ``None``.
        tool_calls: For ``assistant``: the calls it made.
        tool_call_id: For ``tool``: the call answered.
        is_error: For ``tool``: whether the vendor's error flag was set (``None``: no such flag).
    """

    role: str
    text: str | None = None
    tool_calls: tuple[WireToolCall, ...] = ()
    tool_call_id: str | None = None
    is_error: bool | None = None


@attrs.frozen(kw_only=True)
class WireRequest:
    """A request read by a dialect: what the provider asked, in vendor-neutral terms.

    Attributes:
        model: The model asked for.
        messages: The transcript, system prompt first when there is one.
        tools: The tools offered: name to JSON Schema of the arguments.
        stream: Whether the request asks for a streamed answer.
        raw: The parsed body, for checks of your own.
    """

    model: str | None
    messages: tuple[WireMessage, ...]
    tools: Mapping[str, Any] = attrs.field(factory=dict)
    stream: bool = False
    raw: Any = None
