"""The in-memory state of one instance, and how it is saved to and rebuilt from a store.

An instance is saved as a header (rewritten at state changes) and an append-only entry log.
Entries, one JSON object each, with ``t`` naming the type:

``{"t": "seg"}``
    A new run segment starts: the limits' counters restart at zero.
``{"t": "msg", "m": MESSAGE, "turn"?: {...}, "spend"?: {...}, "task"?: true}``
    A message joins the transcript. Tool results are written as each call finishes, so their
    order on disk may be finishing order; loading puts them back in call order. An answer
    carries its model call's ``turn`` data (``n``, ``model``, ``usage``, ``cost``) on the same
    line, and a tool result the ``spend`` (``usage``, ``cost``) its tool reported, so a torn
    write keeps both or neither. ``task`` marks the task prompt.
``{"t": "start", "id": CALL_ID}``
    A tool call starts running (it counts toward the ``toolCalls`` limit). After a crash, a call
    with this entry and no result may have had its effect; one without it never ran.
``{"t": "turn", "n": N, "model": "PROVIDER:MODEL", "usage": USAGE, "cost": AMOUNT}``
    Model call N was answered (written together with the assistant message).
``{"t": "spend", "usage": USAGE, "cost": AMOUNT, "model"?: ...}``
    Model calls outside a turn used this: a context strategy's summary calls, when the
    strategy failed after making some (it counts toward usage, cost and the segment's limits).
``{"t": "reset", "messages": [MESSAGE, ...], "spend"?: {"usage", "cost", "model"}}``
    A context strategy replaced the transcript; ``spend`` is what its summary call used, on
    the same line, so a crash before this line is written loses the call and its spending
    together and the transcript stays as it was. The context size (``contextTokens``) is
    unknown again until the next model call.

Nothing is rewritten: saving a turn costs the same at turn 10,000 as at turn 1.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import cattrs

from loopwright._convert import converter
from loopwright._definition import Capabilities, Definition
from loopwright._header_fields import HeaderFields, as_fields
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

if TYPE_CHECKING:
    from loopwright.abc import Store

__all__ = [
    "CHECKPOINT_VERSION",
    "Instance",
    "entry_totals",
    "fold_checkpoint",
    "history_at",
    "log_totals",
    "new_id",
    "now_iso",
    "rebuild",
    "restore",
]

_log = logging.getLogger(__name__)

_message_unstructure = converter.get_unstructure_hook(Message)
_message_structure = converter.get_structure_hook(Message)
_usage_unstructure = converter.get_unstructure_hook(Usage)
_usage_structure = converter.get_structure_hook(Usage)


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
            message = shaped(data)
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
                                  "injected", "model", "providerData"))
_CALL_KEYS: Final = frozenset(("id", "name", "arguments", "rawArguments", "injected"))


_PLAIN: Final = frozenset((str, type(None)))


def _fast_call(data: Any) -> ToolCall:
    if type(data) is not dict or not _CALL_KEYS.issuperset(data):
        raise _NotFast
    get = data.get
    call_id, name, arguments, raw = get("id"), get("name"), get("arguments", {}), get("rawArguments")
    injected = get("injected", False)
    if (type(call_id) is not str or type(name) is not str or type(arguments) is not dict
            or type(injected) is not bool or type(raw) not in _PLAIN):
        raise _NotFast
    return ToolCall(id=call_id, name=name, arguments=dict(arguments), raw_arguments=raw, injected=injected)


def _fast_message(data: Any) -> Message:
    """Build a message from JSON whose every key is known and every value of its JSON type."""
    if type(data) is not dict or not _MESSAGE_KEYS.issuperset(data):
        raise _NotFast
    get = data.get
    role, content, call_id, name, source, model = (get("role"), get("content"), get("toolCallId"), get("name"),
                                                   get("source"), get("model"))
    if role not in _ROLES or not _PLAIN.issuperset((type(content), type(call_id), type(name), type(source),
                                                    type(model))):
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
                   status=status, source=source, injected=injected, model=model, provider_data=provider_data)


def _tool_result(data: dict[str, Any]) -> Message | None:
    """``{"role": "tool", "content", "toolCallId", "name", "status"}`` as loopwright writes a tool result."""
    content, call_id, name = data["content"], data["toolCallId"], data["name"]
    status = _STATUSES.get(data["status"]) if type(data["status"]) is str else None
    if (data["role"] != "tool" or status is None or type(content) is not str or type(call_id) is not str
            or type(name) is not str):
        return None
    return Message(role="tool", content=content, tool_call_id=call_id, name=name, status=status)


def _call_request(data: dict[str, Any]) -> Message | None:
    """``{"role": "assistant", "toolCalls": [...], "model"}`` as loopwright writes an answer made only of calls."""
    calls, model = data["toolCalls"], data["model"]
    if data["role"] != "assistant" or type(calls) is not list or type(model) not in _PLAIN:
        return None
    built = []
    for c in calls:
        if type(c) is not dict or tuple(c) != _CALL_SHAPE:
            return None
        call_id, name, arguments = c["id"], c["name"], c["arguments"]
        if type(call_id) is not str or type(name) is not str or type(arguments) is not dict:
            return None
        built.append(ToolCall(id=call_id, name=name, arguments=dict(arguments)))
    return Message(role="assistant", tool_calls=tuple(built), model=model)


#: The key order of ToolCall's JSON as loopwright writes it, for a call without raw arguments.
_CALL_SHAPE: Final = ("id", "name", "arguments")
#: Builders for the commonest messages, by the exact key order loopwright writes them in; each
#: checks every value's type and returns ``None`` (the general path decides) for anything else.
_SHAPES: Final = {
    ("role", "content", "toolCallId", "name", "status"): _tool_result,
    ("role", "toolCalls", "model"): _call_request,
}


@attrs.define(kw_only=True)
class Instance:
    """One instance's live state. Owned by the runtime; never handed to plugins.

    Attributes:
        id: The instance id.
        definition: The definition it runs.
        header: The header, typed fields over its JSON object as last saved (extra keys kept as
            they are); set from a store's JSON object, which it then wraps.
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
    header: HeaderFields = attrs.field(converter=as_fields)
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


class _Replay:
    """The running totals of an entry-log replay (see :func:`rebuild`).

    Messages are kept in their JSON form: replaying (and folding a checkpoint) never builds a
    :class:`Message`; :func:`rebuild` structures them once, at the end.
    """

    def __init__(self) -> None:
        self.messages: list[Mapping[str, Any]] = []
        self.usage = Usage()
        self.cost = Cost()
        self.turn = 0
        self.context_tokens: int | None = None
        self.seg_iter = self.seg_tools = self.seg_tokens = self.tools = 0
        self.seg_cost: float | None = 0.0
        self.started: set[str] = set()
        self.begun = self.task_given = False
        self.last_initial = -1

    def message(self, entry: Mapping[str, Any]) -> None:
        m = entry["m"]
        if type(m) is not dict and not isinstance(m, Mapping):
            message_from_json(m)  # raises the converter's error, as it always did
        self.messages.append(m)
        if m.get("role") == "assistant":
            self.started = set()
        self.task_given = self.task_given or bool(entry.get("task"))
        if "ip" in entry:
            self.last_initial = max(self.last_initial, int(entry["ip"]))
        spent = entry.get("turn") or entry.get("spend")
        if spent is None:
            return
        # What a model call (turn) or a tool's own work (spend) used, on the message's line.
        u = self.spend(spent)
        if "turn" in entry:
            self.turn = max(self.turn, int(spent.get("n", self.turn + 1)))
            self.seg_iter += 1
            if not u.unreported_requests:
                self.context_tokens = u.input_tokens

    def spend(self, spent: Mapping[str, Any]) -> Usage:
        """Count what one spending used (a turn, a tool's own work, a context strategy's calls)."""
        u: Usage = _usage_structure(spent.get("usage") or {}, Usage)
        amount = spent.get("cost")
        self.usage += u
        self.cost += Cost(amount=amount)
        self.seg_tokens += u.input_tokens + u.output_tokens
        self.seg_cost = None if self.seg_cost is None or amount is None else self.seg_cost + amount
        return u

    def segment(self) -> None:
        self.begun = True
        self.seg_iter = self.seg_tools = self.seg_tokens = 0
        self.seg_cost = 0.0

    # -- checkpoints ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Return the state as a checkpoint (see :data:`CHECKPOINT_VERSION`)."""
        return {
            "v": CHECKPOINT_VERSION,
            "messages": self.messages,
            "usage": _usage_unstructure(self.usage),
            "cost": self.cost.amount,
            "turn": self.turn,
            "contextTokens": self.context_tokens,
            "segIterations": self.seg_iter,
            "segToolCalls": self.seg_tools,
            "segTokens": self.seg_tokens,
            "segCost": self.seg_cost,
            "toolCalls": self.tools,
            "started": sorted(self.started),
            "begun": self.begun,
            "taskGiven": self.task_given,
            "lastInitial": self.last_initial,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Replay:
        """Return the state a checkpoint holds; raise ``ValueError`` if it is not one this version wrote."""
        if data.get("v") != CHECKPOINT_VERSION:
            msg = f"checkpoint version {data.get('v')!r}, not {CHECKPOINT_VERSION}"
            raise ValueError(msg)
        r = cls()
        try:
            messages = data["messages"]
            if type(messages) is not list or not all(type(m) is dict for m in messages):
                msg = "checkpoint messages are not a list of objects"
                raise ValueError(msg)
            r.messages = messages
            r.usage = _usage_structure(data["usage"], Usage)
            r.cost = Cost(amount=data["cost"])
            r.turn = int(data["turn"])
            r.context_tokens = None if data["contextTokens"] is None else int(data["contextTokens"])
            r.seg_iter, r.seg_tools = int(data["segIterations"]), int(data["segToolCalls"])
            r.seg_tokens, r.tools = int(data["segTokens"]), int(data["toolCalls"])
            r.seg_cost = None if data["segCost"] is None else float(data["segCost"])
            r.started = {str(s) for s in data["started"]}
            r.begun, r.task_given = bool(data["begun"]), bool(data["taskGiven"])
            r.last_initial = int(data["lastInitial"])
        except (KeyError, TypeError, cattrs.BaseValidationError) as exc:
            msg = f"malformed checkpoint: {exc!r}"
            raise ValueError(msg) from exc
        return r


#: The version of the checkpoint format (:meth:`_Replay.to_json`). A checkpoint of any other
#: version is ignored and the log replayed whole, so a change of what a replay keeps (a new
#: entry type whose effect the fields above cannot hold) bumps it and stays safe.
CHECKPOINT_VERSION = 1


def rebuild(instance: Instance, entries: Sequence[Mapping[str, Any]],
            checkpoint: Mapping[str, Any] | None = None) -> None:
    """Replay an entry log into ``instance``: transcript, counters, usage and cost.

    With ``checkpoint`` (a :func:`fold_checkpoint` result, as :meth:`Store.read_resume
    <loopwright.abc.Store.read_resume>` returns it), ``entries`` are those after it and the
    replay starts from its state; the result is the same as replaying the whole log.
    Tool results of one assistant message are put back in call order.

    :raises ValueError: ``checkpoint`` is malformed (a store verifies its checkpoints, so this
        means the store returned one it should not have).
    """
    _apply(instance, _replay(entries, None if checkpoint is None else _Replay.from_json(checkpoint)))


def _apply(instance: Instance, r: _Replay) -> None:
    instance.transcript = Transcript(_call_order([message_from_json(m) for m in r.messages]))
    instance.usage = r.usage
    instance.cost = r.cost
    instance.turn = r.turn
    instance.context_tokens = r.context_tokens
    instance.seg_iterations = r.seg_iter
    instance.seg_tool_calls = r.seg_tools
    instance.tool_calls = r.tools
    instance.seg_tokens = r.seg_tokens
    instance.seg_cost = r.seg_cost
    instance.started_calls = r.started
    instance.begun = r.begun
    instance.task_given = r.task_given
    instance.last_initial = r.last_initial


async def restore(instance: Instance, store: Store) -> None:
    """Load ``instance``'s entry log from ``store`` (from its checkpoint where it keeps one) and :func:`rebuild` it.

    A checkpoint the store vouches for but this version cannot read (another version's, or
    malformed) is dropped for the whole log, with a logged warning: it never stops a load.
    """
    checkpoint, entries = await store.read_resume(instance.id)
    if checkpoint is not None:
        try:
            start = _Replay.from_json(checkpoint)
        except ValueError as exc:
            _log.warning("instance %s: replaying the whole entry log: %s", instance.id, exc)
            entries = await store.read_entries(instance.id)
        else:
            _apply(instance, _replay(entries, start))
            return
    rebuild(instance, entries)


def fold_checkpoint(checkpoint: Mapping[str, Any] | None, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return the checkpoint of a log: ``checkpoint`` (of its prefix, or ``None``) with ``entries`` replayed onto it.

    The ``fold`` of :meth:`Store.checkpoint <loopwright.abc.Store.checkpoint>`. Built from the
    log alone (never from a live instance), so loading from it is the same as a full replay.
    """
    return _replay(entries, None if checkpoint is None else _Replay.from_json(checkpoint)).to_json()


def _replay(entries: Sequence[Mapping[str, Any]], start: _Replay | None = None) -> _Replay:  # noqa: C901 - one branch per entry kind
    r = start or _Replay()
    for entry in entries:
        t = entry.get("t")
        if t == "msg":
            r.message(entry)
        elif t == "start":
            r.started.add(entry.get("id", ""))
            r.seg_tools += 1
            r.tools += 1
        elif t == "seg":
            r.segment()
        elif t == "reset":
            messages = entry["messages"]
            for m in messages:
                if not isinstance(m, Mapping):
                    message_from_json(m)
            r.messages = list(messages)
            r.context_tokens = None
            if entry.get("spend"):
                r.spend(entry["spend"])
        elif t == "spend":
            r.spend(entry)
        elif t in {"fork", "rewind"}:
            # The history as it was at the end of a turn (a fork's first entry, or a rewind):
            # what the log holds after it is kept for the records, and no longer in the transcript.
            r.messages = list(entry["messages"])  # JSON, as the replay keeps them (see _Replay)
            r.turn = int(entry.get("turn") or 0)
            r.context_tokens = None
            r.started = set()
            r.begun = r.task_given = True
    return r


def history_at(entries: Sequence[Mapping[str, Any]], turn: int | None) -> tuple[list[Message], int]:
    """Return the transcript as it stood at the end of ``turn`` (default: as it stands), and that turn.

    The end of a turn is after its model call's message and the results of its tool calls,
    before whatever led to the next model call (a message that arrived, the next turn).

    :raises ValueError: ``turn`` is below 0 or above the turns the log holds.
    """
    r = _Replay()
    cut: list[Mapping[str, Any]] | None = None
    for entry in entries:
        if turn is not None and entry.get("t") == "msg" and "turn" in entry and cut is None:
            n = int((entry.get("turn") or {}).get("n", r.turn + 1))
            if n > turn:
                cut = list(r.messages)
        _replay([entry], r)
    last = r.turn
    if turn is None:
        return _call_order([message_from_json(m) for m in r.messages]), last
    if turn < 0 or turn > last:
        raise ValueError(f"turn {turn} is not in its history (it has {last} turn{'' if last == 1 else 's'})")
    messages = _call_order([message_from_json(m) for m in (cut if cut is not None else r.messages)])
    while messages and messages[-1].role == "user" and turn > 0:
        messages.pop()  # what led to the next turn is not part of this one
    return messages, turn


def log_totals(entries: Sequence[Mapping[str, Any]]) -> tuple[Usage, Cost, int]:
    """Return the usage, the cost and the tool calls started that an entry log holds, over the whole life."""
    r = _replay(entries)
    return r.usage, r.cost, r.tools


def entry_totals(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return the header's totals (``usage``, ``cost``, ``turns``) as an entry log adds them up.

    For a header that lags behind its log (the process was killed before the state changed).
    """
    r = _replay(entries)
    return {"usage": _usage_unstructure(r.usage), "cost": r.cost.amount, "turns": r.turn}


def _call_order(messages: list[Message]) -> list[Message]:
    """Reorder each run of tool messages to follow the calls of the assistant message before it.

    Only a run of two or more tool messages after an assistant message with calls can be out of
    order, so those runs are found first (one pass) and sorted in place; the rest is not touched.
    """
    n = len(messages)
    runs = [i for i in range(n - 2) if messages[i + 1].role == "tool" and messages[i + 2].role == "tool"
            and messages[i].role == "assistant" and messages[i].tool_calls]
    if not runs:
        return messages
    out = list(messages)
    for i in runs:
        j = i + 1
        while j < n and out[j].role == "tool":
            j += 1
        order = {c.id: k for k, c in enumerate(out[i].tool_calls)}
        out[i + 1:j] = sorted(out[i + 1:j], key=lambda r: order.get(r.tool_call_id or "", 1 << 30))
    return out


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
