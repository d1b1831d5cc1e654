"""How an instance is rebuilt from its entry log: :func:`rebuild`, :func:`restore`, checkpoints, history.

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

``{"t": "fork", ...}``, ``{"t": "rewind", ...}``
    The history as it stood at the end of a turn (a fork's first entry, or a rewind).

Nothing is rewritten: saving a turn costs the same at turn 10,000 as at turn 1. A replay keeps
messages as JSON and builds each :class:`Message` once, at the end; a store may keep a checkpoint
of a log's prefix (:func:`fold_checkpoint`), and loading from it is the same as a full replay.

Checked checkpoints (issue 30): the fold builds every message it adds once, to check it, and marks
the checkpoint ``"checked": true`` when each of its messages was built so (by this fold or an
earlier one). Loading from a checked checkpoint builds no message of it: the transcript is a
:class:`~loopwright._instance.LazyTranscript` that keeps them as JSON until first read, and
builds only the messages after the checkpoint up front, so that a log that cannot be replayed
is still refused at load. A checkpoint without the mark (an earlier version's, or one holding a
message that does not build) is loaded as before, every message built up front.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import cattrs

from loopwright._convert import converter
from loopwright._instance import LazyTranscript, message_from_json
from loopwright._types import Cost, Message, Transcript, Usage

if TYPE_CHECKING:
    from loopwright._instance import Instance
    from loopwright.abc import Store

__all__ = [
    "CHECKPOINT_VERSION",
    "entry_totals",
    "fold_checkpoint",
    "history_at",
    "log_totals",
    "rebuild",
    "restore",
]

_log = logging.getLogger(__name__)

_usage_unstructure = converter.get_unstructure_hook(Usage)
_usage_structure = converter.get_structure_hook(Usage)


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
        #: Whether each message was built once (by a fold): see the module's docstring.
        self.checked = False

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
            "checked": self.checked,
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
            if type(messages) is not list or not set(map(type, messages)) <= {dict}:  # each exactly a dict
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
            r.checked = data.get("checked") is True
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


def _apply(instance: Instance, r: _Replay, checked: tuple[list[Any], int] | None = None) -> None:
    """Set ``instance``'s transcript and counters from a replay.

    ``checked``: the message list of the replay's start, a checked checkpoint, and its length
    then: the messages it held (JSON objects a fold built) stay JSON in a
    :class:`LazyTranscript`, and every other message is built now.
    """
    if checked is not None:
        prefix, n = checked
        messages = r.messages
        if messages is prefix:  # the usual case: the entries after the checkpoint only appended
            held: list[Any] = messages[:n]
            tail = [message_from_json(m) for m in messages[n:]]
            held.extend(tail)
            roles = [*map(_ROLE, held[:n]), *(m.role for m in tail)]
            instance.transcript = LazyTranscript(_call_order(held, roles), unbuilt=n)
        else:  # a reset, fork or rewind after it: what the checkpoint held stays JSON where kept
            ids = {id(m) for m in prefix[:n]}
            held = [m if id(m) in ids else message_from_json(m) for m in messages]
            instance.transcript = LazyTranscript(_call_order(held))
    else:
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
            held = (start.messages, len(start.messages)) if start.checked else None
            _apply(instance, _replay(entries, start), held)
            return
    rebuild(instance, entries)


def fold_checkpoint(checkpoint: Mapping[str, Any] | None, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return the checkpoint of a log: ``checkpoint`` (of its prefix, or ``None``) with ``entries`` replayed onto it.

    The ``fold`` of :meth:`Store.checkpoint <loopwright.abc.Store.checkpoint>`. Built from the
    log alone (never from a live instance), so loading from it is the same as a full replay.
    Every message it adds is built once, to check it; the result is marked ``checked`` when
    each of its messages was built so (see the module's docstring).
    """
    start = None if checkpoint is None else _Replay.from_json(checkpoint)
    prefix, n = (start.messages, len(start.messages)) if start is not None and start.checked else ([], 0)
    r = _replay(entries, start)
    if r.messages is prefix:  # only appended to: the checkpoint's messages were built already
        r.checked = _all_build(r.messages[n:])
    else:
        ids = {id(m) for m in prefix[:n]}
        r.checked = _all_build(m for m in r.messages if id(m) not in ids)
    return r.to_json()


def _all_build(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Return whether each message's JSON builds a :class:`Message` (as loading it would)."""
    try:
        for m in messages:
            message_from_json(m)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError, AttributeError):
        return False
    return True


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


def _call_order(messages: list[_H], roles: list[str] | None = None) -> list[_H]:
    """Reorder each run of tool messages to follow the calls of the assistant message before it.

    Only a run of two or more tool messages after an assistant message with calls can be out of
    order, so those runs are found first (one pass) and sorted in place; the rest is not touched.
    A message may still be the JSON of one a fold built (see :func:`_apply`): its role, calls
    and call id are read from the JSON's keys, as building it would read them.
    ``roles``: each message's role, when the caller has them.
    """
    n = len(messages)
    if roles is None:
        roles = [m["role"] if isinstance(m, dict) else m.role for m in messages]
    try:  # one letter per message, searched in C: a 20,000-message load spends ~1 ms here
        letters = "".join(map(_LETTERS.__getitem__, roles))
    except KeyError:  # a role of no message loopwright builds: compare one by one
        starts: Iterable[int] = (i for i in range(n - 2) if roles[i] == "assistant"
                                 and roles[i + 1] == "tool" and roles[i + 2] == "tool")
    else:
        starts = (found.start() for found in _RUN.finditer(letters))
    runs = [i for i in starts if _call_ids(messages[i])]
    if not runs:
        return messages
    out = list(messages)
    for i in runs:
        j = i + 1
        while j < n and roles[j] == "tool":
            j += 1
        order = {c: k for k, c in enumerate(_call_ids(out[i]))}
        out[i + 1:j] = sorted(out[i + 1:j], key=lambda r: order.get(_answered(r) or "", 1 << 30))
    return out


#: A transcript's message, or the JSON of one a fold built (kept so until first read).
_Held = Message | dict[str, Any]
#: What _call_order reorders: built messages, or their JSON (the same type comes back).
_H = TypeVar("_H", Message, dict[str, Any])
#: The role of a message's JSON.
_ROLE = operator.itemgetter("role")
#: A letter per role, and where a run that may be out of order starts: an assistant message
#: followed by two tool messages or more.
_LETTERS = {"assistant": "a", "tool": "t", "user": "u", "system": "s"}
_RUN = re.compile("(?=att)")


def _call_ids(m: _Held) -> list[str]:
    """Return the ids of a message's tool calls, in order."""
    if type(m) is dict:
        return [c["id"] for c in m.get("toolCalls") or ()]
    return [c.id for c in m.tool_calls]  # type: ignore[union-attr]


def _answered(m: _Held) -> str | None:
    """Return the id of the call a tool message answers."""
    return m.get("toolCallId") if type(m) is dict else m.tool_call_id  # type: ignore[union-attr]
