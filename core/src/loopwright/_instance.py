"""The in-memory state of one instance (:class:`Instance`), and the helpers every layer above it shares.

An instance is saved as a header (rewritten at state changes; :class:`Instance` holds it as
:class:`~loopwright._header_fields.HeaderFields`) and an append-only entry log, replayed into an
instance by :mod:`loopwright._replay`. Here also: the message JSON codec (with its fast path for
the shapes loopwright writes), instance ids and timestamps, and the tail of a transcript a
resume looks at (:func:`unanswered_calls`, :func:`shown_call`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, cast

import attrs

from loopwright._convert import converter
from loopwright._definition import Capabilities, Definition
from loopwright._header_fields import HeaderFields
from loopwright._types import (
    AgentResult,
    Cost,
    InstanceInfo,
    Message,
    PendingApproval,
    State,
    StopReason,
    ToolCall,
    ToolStatus,
    Transcript,
    Usage,
    call_digest,
)

__all__ = [
    "Instance",
    "LazyTranscript",
    "message_from_json",
    "message_to_json",
    "new_id",
    "now_iso",
    "shown_call",
    "unanswered_calls",
]


_message_unstructure = converter.get_unstructure_hook(Message)
_message_structure = converter.get_structure_hook(Message)
_usage_unstructure = converter.get_unstructure_hook(Usage)


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text up to the seconds


def now_iso() -> str:
    """Return the current UTC time as ISO 8601 with milliseconds, like ``2026-11-30T02:17:55.307Z``.

    Called several times a turn, so the part up to the seconds is formatted once per second.
    """
    global _second  # noqa: PLW0603 - one tuple, replaced whole: safe across threads
    now = time.time()
    whole = int(now)
    second, text = _second
    if second != whole:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    return f"{text}.{int((now - whole) * 1000):03d}Z"


def new_id() -> str:
    """Return a new instance id: the UTC time, then 8 random hex digits.

    Below every layer that creates instances, so an id can be chosen before its instance
    exists: a caller lists its child's id in its header before creating the child (issue 17).
    """
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def message_to_json(message: Message) -> dict[str, Any]:
    """Return the JSON form of a message."""
    return _message_unstructure(message)  # type: ignore[no-any-return]


def message_from_json(data: Mapping[str, Any]) -> Message:
    """Parse the JSON form of a message.

    Loading an instance parses every message of its transcript, so the shapes loopwright
    writes (every value of its JSON type) are built directly, several times faster than the
    converter; anything else goes through the converter, which converts or raises as it does.
    """
    try:
        shaped = _SHAPES.get(tuple(data)) if type(data) is dict else None
        if shaped is not None:
            message = shaped(cast("dict[str, Any]", data))  # a dict: its type was checked just now
            if message is not None:
                return message
        return _fast_message(data)
    except _NotFast:
        return _message_structure(data, Message)  # type: ignore[no-any-return]


class _NotFast(Exception):  # noqa: N818 - a signal, not an error
    """A message's JSON is not of the plain shape :func:`_fast_message` builds."""


_ROLES: Final = frozenset(("system", "user", "assistant", "tool"))
_STATUSES: Final = {s.value: s for s in ToolStatus}
_MESSAGE_KEYS: Final = frozenset(("role", "content", "toolCalls", "toolCallId", "name", "status", "source",
                                  "injected", "model", "providerData", "toolCallWireId"))
_CALL_KEYS: Final = frozenset(("id", "name", "arguments", "rawArguments", "injected", "wireId"))


_PLAIN: Final = frozenset((str, type(None)))


def _fast_call(data: Any) -> ToolCall:
    if type(data) is not dict or not _CALL_KEYS.issuperset(data):
        raise _NotFast
    get = data.get
    call_id, name, arguments, raw = get("id"), get("name"), get("arguments", {}), get("rawArguments")
    injected, wire = get("injected", False), get("wireId")
    if (type(call_id) is not str or type(name) is not str or type(arguments) is not dict
            or type(injected) is not bool or type(raw) not in _PLAIN or type(wire) not in _PLAIN):
        raise _NotFast
    return ToolCall(id=call_id, name=name, arguments=dict(arguments), raw_arguments=raw, injected=injected,
                    wire_id=wire)


def _fast_message(data: Any) -> Message:
    """Build a message from JSON whose every key is known and every value of its JSON type."""
    if type(data) is not dict or not _MESSAGE_KEYS.issuperset(data):
        raise _NotFast
    get = data.get
    role, content, call_id, name, source, model, wire = (get("role"), get("content"), get("toolCallId"),
                                                         get("name"), get("source"), get("model"),
                                                         get("toolCallWireId"))
    if role not in _ROLES or not _PLAIN.issuperset((type(content), type(call_id), type(name), type(source),
                                                    type(model), type(wire))):
        raise _NotFast
    calls = get("toolCalls")
    if calls is None:
        tool_calls: tuple[ToolCall, ...] = ()
    elif type(calls) is list:
        tool_calls = tuple([_fast_call(c) for c in calls])
    else:
        raise _NotFast
    status = get("status")
    if status is not None:
        status = _STATUSES.get(status) if type(status) is str else None
        if status is None:
            raise _NotFast
    provider_data = get("providerData")
    if provider_data is not None:
        if type(provider_data) is not dict:
            raise _NotFast
        provider_data = dict(provider_data)
    injected = get("injected", False)
    if type(injected) is not bool:
        raise _NotFast
    return Message(role=role, content=content, tool_calls=tool_calls, tool_call_id=call_id, name=name,
                   status=status, source=source, injected=injected, model=model, provider_data=provider_data,
                   tool_call_wire_id=wire)


def _tool_result(data: dict[str, Any]) -> Message | None:
    """Return the tool result loopwright wrote as ``data`` (``None`` if it is not one).

    ``{"role": "tool", "content", "toolCallId", "name", "status"[, "toolCallWireId"]}``.
    """
    content, call_id, name = data["content"], data["toolCallId"], data["name"]
    status = _STATUSES.get(data["status"]) if type(data["status"]) is str else None
    wire = data.get("toolCallWireId")
    if (data["role"] != "tool" or status is None or type(content) is not str or type(call_id) is not str
            or type(name) is not str or type(wire) not in _PLAIN):
        return None
    return Message(role="tool", content=content, tool_call_id=call_id, name=name, status=status,
                   tool_call_wire_id=wire)


def _call_request(data: dict[str, Any]) -> Message | None:
    """``{"role": "assistant", "toolCalls": [...], "model"}`` as loopwright writes an answer made only of calls."""
    calls, model = data["toolCalls"], data["model"]
    if data["role"] != "assistant" or type(calls) is not list or type(model) not in _PLAIN:
        return None
    built = []
    for c in calls:
        if type(c) is not dict or tuple(c) not in _CALL_SHAPES:
            return None
        call_id, name, arguments, wire = c["id"], c["name"], c["arguments"], c.get("wireId")
        if type(call_id) is not str or type(name) is not str or type(arguments) is not dict or type(wire) not in _PLAIN:
            return None
        built.append(ToolCall(id=call_id, name=name, arguments=dict(arguments), wire_id=wire))
    return Message(role="assistant", tool_calls=tuple(built), model=model)


#: The key orders of ToolCall's JSON as loopwright writes it, for a call without raw arguments
#: (with the provider's id since issue 25, without it before).
_CALL_SHAPES: Final = frozenset((("id", "name", "arguments"), ("id", "name", "arguments", "wireId")))
#: Builders for the commonest messages, by the exact key order loopwright writes them in; each
#: checks every value's type and returns ``None`` (the general path decides) for anything else.
_SHAPES: Final = {
    ("role", "content", "toolCallId", "name", "status"): _tool_result,
    ("role", "content", "toolCallId", "name", "status", "toolCallWireId"): _tool_result,
    ("role", "toolCalls", "model"): _call_request,
}


class LazyTranscript(Transcript):
    """A transcript loaded from a checked checkpoint: messages kept as JSON until first read (issue 30).

    Loading a 10,000-turn instance built its 20,000 messages up front (two thirds of the
    load), though resuming it reads only the tail (:func:`unanswered_calls`) and showing it none.
    Here a message is any :class:`Message`, or the JSON object of one that a checkpoint's fold
    built already (so building it cannot fail: see :mod:`loopwright._replay`); each is built at
    its first read by index (the tail a resume looks at) and kept, and all of them at once, in
    one pass, at the first iteration or :meth:`encoded` (a model request reads them all: that
    cost moves from the load to the first model call). Lengths, appends and replacements build
    none. It is a :class:`Transcript` in every other way.
    """

    __slots__ = ("_unbuilt",)

    def __init__(self, messages: Sequence[Message | dict[str, Any]] = (), *, unbuilt: int | None = None) -> None:
        """Hold ``messages``: messages, or JSON objects of messages a fold built (``unbuilt`` of them, if known)."""
        super().__init__(messages)  # type: ignore[arg-type]
        #: How many of the held messages are still JSON (0: a plain transcript from here on).
        held: list[Any] = self._messages
        self._unbuilt = sum(type(m) is dict for m in held) if unbuilt is None else unbuilt

    def _build(self, i: int) -> Message:
        held: Any = self._messages[i]
        if isinstance(held, dict):
            held = self._messages[i] = message_from_json(held)
            self._unbuilt -= 1
        return held  # type: ignore[no-any-return]

    def _build_all(self) -> None:
        if self._unbuilt:  # in one pass, in place (the list stays the one iterators walk)
            held: list[Any] = self._messages
            self._messages[:] = [message_from_json(m) if type(m) is dict else m for m in held]
            self._unbuilt = 0

    def __getitem__(self, index: Any) -> Any:
        """Return a message (built now if it is still JSON), or a list of them for a slice."""
        if not self._unbuilt:
            return self._messages[index]
        if isinstance(index, slice):
            return [self._build(i) for i in range(*index.indices(len(self._messages)))]
        return self._build(index if index >= 0 else index + len(self._messages))

    def __iter__(self) -> Iterator[Message]:
        """Iterate over the messages in order (a whole reading: every message still JSON is built first)."""
        self._build_all()
        return iter(self._messages)

    def replace_tail(self, start: int, messages: Sequence[Message]) -> None:
        """Replace the messages from index ``start`` on (see :meth:`Transcript.replace_tail`)."""
        super().replace_tail(start, messages)
        held: list[Any] = self._messages
        self._unbuilt = sum(type(m) is dict for m in held) if self._unbuilt else 0

    def replace(self, messages: Sequence[Message]) -> None:
        """Replace every message (see :meth:`Transcript.replace`)."""
        super().replace(messages)
        self._unbuilt = 0

    def encoded(self, key: str, encode: Any) -> list[Any]:
        """Return the encoded messages (see :meth:`Transcript.encoded`), building any still held as JSON."""
        self._build_all()
        return super().encoded(key, encode)


@attrs.define(kw_only=True)
class Instance:
    """One instance's live state. Owned by the runtime; never handed to plugins.

    Attributes:
        id: The instance id.
        definition: The definition it runs.
        header: The header, typed fields over its JSON object as last saved (extra keys kept as
            they are). A plain attribute, no converter: a converter on any field would make attrs
            run its setattr hooks on every counter the loop bumps (4 calls each, 40 a turn).
        transcript: Its messages.
        grants: The capabilities it runs with.
        turn: Model calls made over its whole life.
        usage: Tokens over its whole life.
        cost: Cost of its own model calls.
        children_cost: Cost rolled up from descendants.
        seg_iterations: Model calls in the current run segment.
        seg_tool_calls: Tool calls in the current run segment.
        tool_calls: Tool calls started over its whole life.
        seg_tokens: Tokens in the current run segment.
        seg_cost: Cost in the current run segment (``None`` once unknown).
        spawner: The live instance that started it, in this runtime (``None`` for a top-level
            agent, or while its spawner is not loaded): what it spends is charged to it and its
            ancestors, whose limits it is held to (the tree's one budget).
        tree_tokens: Tokens its descendants spent since its current segment started.
        tree_cost: Their cost in that time (``None`` once unknown).
        tree_tool_calls: Tool calls they started in that time.
        descendants: Agents started in its tree over its whole life, finished ones included
            (bounded by ``agents.maxAgents``).
        tree_counted: Whether the ``tree_*`` counters and ``descendants`` are known (it was created
            here, or they were read from its descendants' saved headers).
    """

    id: str
    definition: Definition
    header: HeaderFields
    transcript: Transcript = attrs.field(factory=Transcript)
    grants: Capabilities = attrs.field(factory=Capabilities)
    turn: int = 0
    #: Input tokens of its latest model call: how full its context is (``None`` before any).
    context_tokens: int | None = None
    usage: Usage = attrs.field(factory=Usage)
    cost: Cost = attrs.field(factory=Cost)
    children_cost: Cost = attrs.field(factory=Cost)
    seg_iterations: int = 0
    seg_tool_calls: int = 0
    tool_calls: int = 0
    seg_tokens: int = 0
    seg_cost: float | None = 0.0
    completion_attempts: int = 0
    output_attempts: int = 0
    #: The hook context, built on first use only (never when no hook is registered).
    info: InstanceInfo | None = None
    #: Ids of the calls of the last assistant message that started running (``start`` entries).
    started_calls: set[str] = attrs.Factory(set)
    #: Whether its first segment started (a ``seg`` entry is saved).
    begun: bool = True
    #: Whether its task prompt is in the transcript (an entry marked ``task``).
    task_given: bool = True
    #: The index of the last initial prompt saved (``ip`` marks), -1 for none.
    last_initial: int = -1
    spawner: Instance | None = attrs.field(default=None, repr=False, eq=False)
    tree_tokens: int = 0
    tree_cost: float | None = 0.0
    tree_tool_calls: int = 0
    descendants: int = 0
    tree_counted: bool = False

    # -- the tree's budget -----------------------------------------------------------------

    def ancestors(self) -> list[Instance]:
        """Return the live chain of spawners, nearest first (cut where a tampered link loops)."""
        out: list[Instance] = []
        seen = {id(self)}
        current = self.spawner
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            out.append(current)
            current = current.spawner
        return out

    def spend(self, usage: Usage, cost: Cost) -> None:
        """Count a spending toward its totals and segment, and toward every ancestor's tree."""
        tokens, amount = usage.input_tokens + usage.output_tokens, cost.amount
        self.usage += usage
        self.cost += cost
        self.seg_tokens += tokens
        self.seg_cost = None if self.seg_cost is None or amount is None else self.seg_cost + amount
        if self.spawner is None:
            return
        for above in self.ancestors():
            above.tree_tokens += tokens
            above.tree_cost = None if above.tree_cost is None or amount is None else above.tree_cost + amount

    def spent(self) -> tuple[int, float | None, int]:
        """Return the tokens, cost and tool calls of its current segment, its descendants' included."""
        cost = None if self.seg_cost is None or self.tree_cost is None else self.seg_cost + self.tree_cost
        return self.seg_tokens + self.tree_tokens, cost, self.seg_tool_calls + self.tree_tool_calls

    # -- header fields ---------------------------------------------------------------------

    @property
    def state(self) -> State:
        """The instance's state."""
        state = self.header.state
        if isinstance(state, State):
            return state
        raise ValueError(f"{state!r} is not a valid State")  # a newer version's, or a tampered header

    @property
    def pending_approvals(self) -> list[PendingApproval]:
        """The held calls, decided or not."""
        return [converter.structure(p, PendingApproval) for p in self.header.pending_approvals]

    def set_pending(self, pending: Sequence[PendingApproval]) -> None:
        """Replace the pending approvals (saved with the next header write)."""
        self.header.pending_approvals = [converter.unstructure(p) for p in pending]

    def result(self) -> AgentResult:
        """Return the instance's :class:`AgentResult` as it stands."""
        h = self.header
        stop = h.stop_reason
        return AgentResult(
            instance_id=self.id,
            state=self.state,
            stop_reason=StopReason(stop) if stop else None,
            text=h.text,
            output=h.output,
            usage=self.usage,
            cost=self.cost,
            subtree_cost=self.cost + self.children_cost,
            pending_approvals=tuple(self.pending_approvals),
            error=h.error,
            cancelled=bool(h.cancelled),
            limit=h.limit,
            model=h.served_by,
        )

    def totals_to_header(self) -> None:
        """Copy the usage and cost totals into the header, for listings that do not replay logs."""
        h = self.header
        h.usage = _usage_unstructure(self.usage)
        h.cost = self.cost.amount
        h.turns = self.turn
        h.tool_calls_started = self.tool_calls
        if self.context_tokens is not None:
            h.context_tokens = self.context_tokens


def shown_call(call: ToolCall, p: PendingApproval) -> ToolCall:
    """Return the held ``call`` (as the log holds it) as it was shown for approval in ``p``, and runs once approved.

    A call a ``before_tool_call`` hook changed before it was held keeps the model's arguments
    in the log; ``p`` has the changed ones, and ``p.original_digest`` names the logged call they
    replace. Any other call (or a logged call that changed since) is returned as it is.
    """
    if p.original_digest is not None and call_digest(call.name, call.arguments) == p.original_digest:
        return attrs.evolve(call, arguments=dict(p.arguments))
    return call


def unanswered_calls(transcript: Sequence[Message]) -> tuple[Message | None, list[Any]]:
    """Return the last assistant message with tool calls and those of its calls without a result.

    Only the tail of the transcript is looked at: the last assistant message and the tool
    messages after it.
    """
    answered: set[str] = set()
    for m in reversed(transcript):
        if m.role == "tool":
            answered.add(m.tool_call_id or "")
            continue
        if m.role == "assistant" and m.tool_calls:
            return m, [c for c in m.tool_calls if c.id not in answered]
        return None, []
    return None, []
