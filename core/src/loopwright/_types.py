"""The value objects that cross plugin and hook boundaries.

Everything here is a frozen attrs class with keyword-only fields, so a hook can read it but
never change the run except through a decision, and new fields can be added without breaking
anybody. JSON forms (on disk and under ``--json``) use camelCase; see :mod:`loopwright._convert`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

from loopwright._states import State, StopReason, ToolStatus

__all__ = [
    "AgentResult",
    "Cost",
    "Event",
    "InstanceInfo",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "PendingApproval",
    "Record",
    "Role",
    "State",
    "StopReason",
    "StreamDelta",
    "ToolCall",
    "ToolOutput",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "Transcript",
    "Usage",
    "approval_digest",
    "call_digest",
]

Role = Literal["system", "user", "assistant", "tool"]


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts of one or more model calls. ``None`` means the provider did not say.

    Attributes:
        input_tokens: Prompt tokens, cached ones included.
        output_tokens: Completion tokens, reasoning included.
        total_tokens: Their sum.
        cache_read_tokens: Prompt tokens served from the provider's cache.
        cache_write_tokens: Prompt tokens written to the provider's cache.
        reasoning_tokens: Output tokens spent on hidden reasoning.
        requests: How many model calls this covers.
        unreported_requests: How many of those calls came back without token counts (some
            OpenAI-compatible servers, a stream without its usage chunk). Their tokens are not
            in the counts above, so the counts are a lower bound, and any cost that covers
            them is unknown (``None``), never 0.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    requests: int = 0
    unreported_requests: int = 0

    def __add__(self, other: Usage) -> Usage:
        """Sum two usages; an optional count stays ``None`` only when both are ``None``."""
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cache_read_tokens=_add_opt(self.cache_read_tokens, other.cache_read_tokens),
            cache_write_tokens=_add_opt(self.cache_write_tokens, other.cache_write_tokens),
            reasoning_tokens=_add_opt(self.reasoning_tokens, other.reasoning_tokens),
            requests=self.requests + other.requests,
            unreported_requests=self.unreported_requests + other.unreported_requests,
        )


def _add_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


@attrs.frozen(kw_only=True)
class Cost:
    """A price in a currency. ``amount`` is ``None`` when any part of it is unknown, never 0.

    Attributes:
        amount: The price, or ``None`` when unknown.
        currency: ISO code, ``USD`` unless a pricing override says otherwise.
    """

    amount: float | None = 0.0
    currency: str = "USD"

    def __add__(self, other: Cost) -> Cost:
        """Sum two costs; unknown plus anything is unknown."""
        if self.amount is None or other.amount is None:
            return Cost(amount=None, currency=self.currency)
        return Cost(amount=self.amount + other.amount, currency=self.currency)


UNKNOWN_COST = Cost(amount=None)
ZERO_COST = Cost(amount=0.0)


@attrs.frozen(kw_only=True)
class ToolCall:
    """A call the model asked for (or an injected one from ``initialPrompts``).

    Attributes:
        id: The call's id in the instance. Once a model's answer is saved, this is the
            runtime's own id (``lw-TURN-INDEX``: URL-safe, unique in the instance, so a model
            that repeats an id cannot make two calls share one address); a provider's answer
            carries the provider's id here until the runtime renames it.
        name: The tool name the model used (maybe one that does not exist).
        arguments: The parsed arguments; empty when they could not be parsed.
        raw_arguments: The arguments as the model wrote them, when they were not valid JSON.
        injected: Whether the call came from the definition's ``initialPrompts``.
        wire_id: The provider's id for the call, when the runtime gave it its own ``id``: what
            a provider sends back on the wire (:attr:`provider_id`). ``None`` in data saved
            before runtime ids (issue 25), where ``id`` is the provider's.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict)
    raw_arguments: str | None = None
    injected: bool = False
    wire_id: str | None = None

    @property
    def provider_id(self) -> str:
        """The id a provider puts on the wire for this call: :attr:`wire_id`, else :attr:`id`."""
        return self.wire_id if self.wire_id is not None else self.id


@attrs.frozen(kw_only=True)
class Message:
    """One transcript entry.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: The text, or ``None`` (an assistant turn made only of tool calls).
        tool_calls: The calls an assistant message asks for.
        tool_call_id: For ``tool`` messages, the call answered.
        name: For ``tool`` messages, the tool's name.
        status: For ``tool`` messages, the :class:`ToolStatus`.
        source: Who sent a ``user`` message: ``api``, ``user``, ``agent``, ``runtime`` or ``definition``.
        injected: Whether the message came from the definition's ``initialPrompts``.
        model: For ``assistant`` messages, the model that served the turn.
        provider_data: Opaque, JSON-ready data a provider must get back with this message on
            later calls (for example signed reasoning blocks), saved with the transcript.
            Providers should key it by their kind (``{"anthropic": {...}}``).
        tool_call_wire_id: For ``tool`` messages, the provider's id of the call answered
            (its :attr:`ToolCall.wire_id`), when the runtime gave the call its own id;
            ``None`` otherwise. See :attr:`provider_call_id`.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    status: ToolStatus | None = None
    source: str | None = None
    injected: bool = False
    model: str | None = None
    provider_data: Mapping[str, Any] | None = None
    tool_call_wire_id: str | None = None

    @property
    def provider_call_id(self) -> str | None:
        """For ``tool`` messages, the call id a provider puts on the wire: the provider's, else ``tool_call_id``."""
        return self.tool_call_wire_id if self.tool_call_wire_id is not None else self.tool_call_id


class Transcript(Sequence[Message]):
    """The messages of an instance: appended to, never copied per turn.

    A provider that turns messages into its wire format asks :meth:`encoded`, which keeps the
    encoded form of every message it has seen and encodes only the new ones. Replacing the
    messages (compaction, a ``ModifyRequest``) starts a new epoch and drops the caches.
    """

    __slots__ = ("_caches", "_epoch", "_messages")

    def __init__(self, messages: Sequence[Message] = ()) -> None:
        """Start a transcript holding ``messages``."""
        self._messages: list[Message] = list(messages)
        self._epoch = 0
        self._caches: dict[str, list[Any]] = {}

    def __getitem__(self, index: Any) -> Any:
        """Return a message, or a list of messages for a slice."""
        return self._messages[index]

    def __len__(self) -> int:
        """Return the number of messages."""
        return len(self._messages)

    def __iter__(self) -> Iterator[Message]:
        """Iterate over the messages in order."""
        return iter(self._messages)

    def __repr__(self) -> str:
        return f"Transcript({len(self._messages)} messages, epoch {self._epoch})"

    @property
    def epoch(self) -> int:
        """How many times the messages were replaced wholesale."""
        return self._epoch

    def append(self, message: Message) -> None:
        """Add one message at the end."""
        self._messages.append(message)

    def extend(self, messages: Sequence[Message]) -> None:
        """Add messages at the end, in order."""
        self._messages.extend(messages)

    def replace_tail(self, start: int, messages: Sequence[Message]) -> None:
        """Replace the messages from index ``start`` on; encoded caches keep what comes before."""
        del self._messages[start:]
        self._messages.extend(messages)
        for cache in self._caches.values():
            del cache[start:]

    def replace(self, messages: Sequence[Message]) -> None:
        """Replace every message (compaction); encoded caches are dropped."""
        self._messages = list(messages)
        self._epoch += 1
        self._caches.clear()

    def encoded(self, key: str, encode: Any) -> list[Any]:
        """Return ``[encode(m) for m in self]``, encoding only messages added since the last call.

        :param key: A name for the encoding (one per wire format), for example ``"openai-chat"``.
        :param encode: A function of one :class:`Message`. It must be pure: its results are cached.
        :return: The cached list itself; treat it as read-only.
        """
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = []
        n = len(cache)
        if n < len(self._messages):
            cache.extend(map(encode, self._messages[n:]))
        return cache


@attrs.frozen(kw_only=True)
class ToolSpec:
    """What the model is told about a tool.

    Attributes:
        name: The tool's name.
        description: What it does, for the model.
        parameters: The JSON Schema of its arguments (an object schema).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class ModelRequest:
    """One call to a model.

    Attributes:
        model: The model id as the provider knows it (after ``PROVIDER:``).
        provider: The provider's name in the assembly, or its kind.
        messages: The transcript, system prompt first. Read-only, and *live*: it is the
            instance's own transcript, which keeps growing after the call, so a provider that
            keeps requests must copy the messages (``list(request.messages)``).
        tools: The tools the model may call.
        settings: The definition's ``modelSettings`` (camelCase keys, extras passed through).
        output_schema: A JSON Schema the answer must follow, when the definition has ``output``.
        stream: Whether to stream the answer.
        context_management: Set when the definition's ``contextStrategy`` is ``providerNative``:
            the provider should manage the context itself (its options, without ``kind``; may
            be empty). A provider that can honour it maps it to its own request fields; one
            that cannot raises :class:`~loopwright.errors.ConfigError` rather than ignore it.
    """

    model: str
    provider: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    output_schema: Mapping[str, Any] | None = None
    stream: bool = False
    context_management: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ModelResponse:
    """What a model answered.

    Attributes:
        message: The assistant message (text and/or tool calls).
        usage: Tokens the call used.
        finish_reason: Normalised: ``stop``, ``tool_calls``, ``length``, ``content_filter`` or ``error``.
        model: The model that served the call, as the provider reported it.
        raw_finish_reason: The provider's own finish reason.
    """

    message: Message
    usage: Usage = attrs.field(factory=Usage)
    finish_reason: str = "stop"
    model: str | None = None
    raw_finish_reason: str | None = None


@attrs.frozen(kw_only=True)
class StreamDelta:
    """One piece of a streamed model answer, as :meth:`Provider.stream` yields it.

    ``kind`` is one of:

    * ``text``: ``text`` is the next piece of the answer's text;
    * ``tool_call``: a tool call starts: ``tool_call_id`` and ``name`` are set;
    * ``arguments``: ``text`` is the next piece of the arguments (JSON) of ``tool_call_id``;
    * ``done``: the last delta; ``response`` is the whole answer, reassembled by the provider.

    Attributes:
        kind: What the delta carries.
        text: A piece of text or of tool-call arguments.
        tool_call_id: The call a ``tool_call`` or ``arguments`` delta belongs to.
        name: The tool's name, on ``tool_call``.
        response: The complete answer, on ``done``.
    """

    kind: Literal["text", "tool_call", "arguments", "done"]
    text: str = ""
    tool_call_id: str | None = None
    name: str | None = None
    response: ModelResponse | None = None


@attrs.frozen(kw_only=True)
class ToolResult:
    """The result of one tool call, as the model will see it.

    Attributes:
        tool_call_id: The call answered.
        name: The tool's name as the model called it.
        status: How the call came back.
        content: The text the model sees (cut at 100,000 characters, with a marker).
        data: The tool's return value before it became text, for ``success``.
        duration: Seconds the tool ran, or ``None`` if it did not run.
        usage: Tokens the tool's own work used, when it returned a :class:`ToolOutput`.
        cost: What the tool's own work cost, when it returned a :class:`ToolOutput`.
    """

    tool_call_id: str
    name: str
    status: ToolStatus
    content: str
    data: Any = None
    duration: float | None = None
    usage: Usage | None = None
    cost: Cost | None = None

    @property
    def is_error(self) -> bool:
        """Whether the status is anything but ``success``."""
        return self.status is not ToolStatus.SUCCESS


@attrs.frozen(kw_only=True)
class ToolOutput:
    """Return this from a tool whose work itself cost something (it called a model, a paid API).

    The model sees ``value`` as it would see a plain return value; ``usage`` and ``cost`` are
    written on the call's ``tool_call`` record and count toward the instance's usage, cost and
    limits.

    Attributes:
        value: What the tool returns.
        usage: Tokens the tool's own work used.
        cost: What the tool's own work cost; ``Cost(amount=None)`` when unknown.
    """

    value: Any = None
    usage: Usage | None = None
    cost: Cost | None = None


@attrs.frozen(kw_only=True)
class PendingApproval:
    """A tool call held until someone approves or denies it.

    Attributes:
        tool_call_id: The held call.
        tool: The tool's name.
        arguments: The call's arguments.
        reason: Why it is held.
        requested_at: When it was held (ISO 8601, UTC).
        decision: ``approved``, ``denied`` or ``None`` while undecided.
        decision_reason: The reason given with a denial.
        decision_digest: :func:`call_digest` of the call as it was decided: the decision
            applies to that exact call (name and arguments) and to no other.
        original_digest: When a ``before_tool_call`` hook changed the call's arguments before it
            was held, :func:`call_digest` of the call as the model made it (as the log holds it);
            ``tool`` and ``arguments`` are the call as it runs once approved. ``None`` otherwise.
        decided_by: Who decided it, as the deciding host names them (``token:NAME`` for a
            ``loopwright serve`` token); ``None`` when the host named nobody.
        instance_id: In a tree's list (``AgentRun.pending_approvals`` of a root), the instance
            that holds the call; ``None`` in the holder's own header.
        path: In a tree's list, the instances from the root down to the holder, each
            ``{"instanceId", "name"}``.
    """

    tool_call_id: str
    tool: str
    arguments: Mapping[str, Any]
    reason: str
    requested_at: str
    decision: Literal["approved", "denied"] | None = None
    decision_reason: str | None = None
    decision_digest: str | None = None
    original_digest: str | None = None
    decided_by: str | None = None
    instance_id: str | None = None
    path: tuple[Mapping[str, Any], ...] = ()


def approval_digest(p: PendingApproval | Mapping[str, Any]) -> str:
    """Return the digest a person's decision on held call ``p`` must carry: what would run, and its entry.

    ``p`` is a :class:`PendingApproval` or a saved ``pendingApprovals`` entry (its camelCase
    JSON). The digest is sha256, in hex, of the canonical JSON ``{"arguments", "name",
    "requestedAt", "toolCallId"}`` (as :func:`call_digest`). The hold's time binds the entry: a
    call held again under the same id is a new entry with a new digest, so a decision taken on
    the old one is refused (:class:`~loopwright.errors.ApprovalDigestMismatchError`). Every
    surface shows it beside the call and every decision over HTTP must carry it.
    """
    import hashlib  # noqa: PLC0415 - only when a call is shown or decided
    import json  # noqa: PLC0415

    if isinstance(p, PendingApproval):
        fields: dict[str, Any] = {"arguments": p.arguments, "name": p.tool, "requestedAt": p.requested_at,
                  "toolCallId": p.tool_call_id}
    else:
        fields = {"arguments": p.get("arguments"), "name": p.get("tool"), "requestedAt": p.get("requestedAt"),
                  "toolCallId": p.get("toolCallId")}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def call_digest(name: str, arguments: Mapping[str, Any]) -> str:
    """Return the digest a decision is bound to: sha256 of the call's canonical JSON, in hex.

    Canonical JSON: ``{"arguments": ..., "name": ...}`` with sorted keys, no spaces, non-ASCII
    kept as is. Two calls with the same name and the same arguments have the same digest.
    """
    import hashlib  # noqa: PLC0415 - only when a call is decided
    import json  # noqa: PLC0415

    text = json.dumps({"arguments": arguments, "name": name}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@attrs.frozen(kw_only=True)
class InstanceInfo:
    """Read-only facts about the instance a hook is called for.

    Attributes:
        instance_id: The instance's id.
        name: The definition's name.
        model: The definition's model reference (``PROVIDER:MODEL``).
        depth: 0 for a top-level agent, 1 for its children, and so on.
        spawner_instance_id: The instance that started this one, if any.
    """

    instance_id: str
    name: str
    model: str
    depth: int = 0
    spawner_instance_id: str | None = None


@attrs.frozen(kw_only=True)
class Event:
    """Something that happened during a run, as :meth:`AgentRun.events` yields it.

    Attributes:
        kind: One of ``state`` (``state``, ``stopReason``), ``text`` (``text``: an answer's
            whole text), ``text_delta`` (``delta``: a streamed piece), ``stream_reset`` (a
            streamed answer starts over), ``tool_call_start`` (``id``, ``name``: streamed),
            ``tool_call_delta`` (``id``, ``delta``: a streamed piece of the call's JSON arguments),
            ``usage`` (``usage``, ``cost``, ``model``), ``tool_call`` (``id``, ``name``,
            ``arguments``: a call starts running), ``tool_result`` (``id``, ``name``, ``status``,
            ``content``), ``approval`` (``toolCallId``, ``tool``, ``reason``) and ``monitor``
            (``instanceId``, ``reason``, ``monitor``: a monitor this instance armed fired).
        instance_id: The instance it concerns.
        turn: The turn number within the instance, when it belongs to one.
        data: The kind's fields, listed above.
    """

    kind: str
    instance_id: str
    turn: int | None = None
    data: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Record:
    """One entry of an instance's record log, as record sinks and ``loopwright records`` see it.

    Attributes:
        kind: ``turn``, ``tool_call``, ``hook``, ``state``, ``message``, ``cost``, ``error`` ...
        instance_id: The instance it concerns.
        at: When (ISO 8601, UTC).
        data: Kind-specific JSON-ready fields (camelCase keys).
    """

    kind: str
    instance_id: str
    at: str
    data: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class AgentResult:
    """Where a run segment left an instance.

    Attributes:
        instance_id: The instance's id.
        state: Its :class:`State`.
        stop_reason: Why the segment ended.
        text: The last assistant text (or the ``task_complete`` result).
        output: The parsed structured output, when the definition asks for one; else the
            ``task_complete`` arguments, when that ended the run.
        usage: Tokens of the whole instance.
        cost: Cost of the instance's own model calls.
        subtree_cost: ``cost`` plus the cost of every descendant.
        pending_approvals: Calls waiting for a decision.
        error: The error message, in the ``error`` state.
        cancelled: Whether the run was cancelled.
        limit: For ``limit_exceeded``, the name of the limit.
        model: The ``PROVIDER:MODEL`` that served the last turn (a fallback model when the
            first failed); every turn's model is in its ``turn`` record.
    """

    instance_id: str
    state: State
    stop_reason: StopReason | None = None
    text: str | None = None
    output: Any = None
    usage: Usage = attrs.field(factory=Usage)
    cost: Cost = attrs.field(factory=Cost)
    subtree_cost: Cost = attrs.field(factory=Cost)
    pending_approvals: tuple[PendingApproval, ...] = ()
    error: str | None = None
    cancelled: bool = False
    limit: str | None = None
    model: str | None = None
