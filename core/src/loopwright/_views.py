"""The JSON views of instances: summary, result, approvals, usage, agent reports and the instance tree.

Each view is a frozen attrs class with snake_case fields, built from an
:class:`~loopwright.InstanceHeader` (a saved header read with ``lenient=True``: ``ls`` shows a
state this version does not know as it was saved) or from a value object
(:class:`~loopwright.AgentResult`, :class:`~loopwright.PendingApproval`), and turned into JSON
by the one converter :data:`view_converter`: camelCase keys in field order, every documented key
present, ``null`` where a value is unknown. A field whose metadata has ``_OMIT`` is left
out at its default (an approval's ``decision``, a usage's unknown counts); one with ``_RAW``
holds saved JSON (a call's arguments, an instance's output) and is copied by
reference, never walked. ``show``, ``ls``, ``--json``, the agent tools and the serve plugin print
these.

The functions (:func:`summary`, :func:`tree_node`, :func:`result_to_json` ...) are the views'
entry points: each builds its view and returns its JSON object. A view is built only where it
is shown, never on a turn's path.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Final

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from loopwright._convert import camel
from loopwright._header import InstanceHeader

if TYPE_CHECKING:
    from loopwright._types import AgentResult, PendingApproval, Usage

__all__ = [
    "AgentReport",
    "ApprovalView",
    "HeldCallView",
    "ResultView",
    "SummaryView",
    "TreeNode",
    "UsageView",
    "agent_report",
    "approval_json",
    "approval_to_json",
    "children_in",
    "header_of",
    "own_cost",
    "result_to_json",
    "short_json",
    "subtree_in",
    "summary",
    "tree_node",
    "usage_to_json",
    "view_converter",
]

#: A header as a store returns it, or already read.
HeaderLike = Mapping[str, Any] | InstanceHeader


#: Field metadata: the JSON leaves the field out when it holds its default.
_OMIT: Final = {"omit_if_default": True}
#: Field metadata: the field holds saved JSON, copied into the view's JSON as it is (never walked).
_RAW: Final = {"raw": True}


# -- reading a header ------------------------------------------------------------------------


def _digest(entry: Any) -> str:
    """Return :func:`~loopwright._types.approval_digest` of ``entry``.

    Imported here: ``ls`` and ``show`` read views without loading the types.
    """
    from loopwright._types import approval_digest  # noqa: PLC0415 - kept off the CLI's read path

    return approval_digest(entry)


def header_of(header: HeaderLike) -> InstanceHeader:
    """Return ``header`` as an :class:`InstanceHeader`, reading a store's JSON object leniently.

    A ``state`` or ``stopReason`` this version does not know is kept as it was saved (the
    views show it raw; see :meth:`InstanceHeader.from_json`).
    """
    return header if isinstance(header, InstanceHeader) else InstanceHeader.from_json(header, lenient=True)


def _plain(value: Any) -> Any:
    """Return a state or stop reason as the views show it: its string, or the saved value as it is."""
    return value.value if isinstance(value, enum.Enum) else value


def own_cost(header: InstanceHeader) -> float | None:
    """Return the own cost to sum: an absent ``cost`` is nothing spent (0.0), a ``null`` one unknown."""
    return 0.0 if header.cost is None and "cost" not in header.kept else header.cost


# -- the views -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ApprovalView:
    """A saved ``pendingApprovals`` entry as the views show it (every key present).

    Attributes:
        tool_call_id: The held call's id.
        tool: Its tool.
        arguments: Its arguments, as saved.
        reason: Why it is held.
        requested_at: When it was held.
        decision: ``None`` while undecided.
        digest: :func:`~loopwright._types.approval_digest` of the entry: a decision must carry it.
    """

    tool_call_id: Any = None
    tool: Any = None
    arguments: Any = attrs.field(default=None, metadata=_RAW)
    reason: Any = None
    requested_at: Any = None
    decision: Any = attrs.field(default=None, metadata=_RAW)
    digest: Any = None

    @classmethod
    def of(cls, saved: Mapping[str, Any]) -> ApprovalView:
        """Return the view of one saved entry (a missing key is ``None``)."""
        return cls(tool_call_id=saved.get("toolCallId"), tool=saved.get("tool"), arguments=saved.get("arguments"),
                   reason=saved.get("reason"), requested_at=saved.get("requestedAt"),
                   decision=saved.get("decision"), digest=_digest(saved))


@attrs.frozen(kw_only=True)
class HeldCallView:
    """The ``--json`` form of a :class:`~loopwright.PendingApproval`.

    Attributes:
        tool_call_id: The held call's id.
        tool: Its tool.
        arguments: Its arguments (a copy).
        reason: Why it is held.
        instance_id: Its holder, when the call was found in a tree (left out otherwise).
        path: From the asking instance down to the holder (present exactly when ``instance_id`` is).
        decision: Left out while undecided.
        digest: :func:`~loopwright._types.approval_digest` of the entry: a decision must carry it.
    """

    tool_call_id: str
    tool: str
    arguments: Any = attrs.field(metadata=_RAW)
    reason: str | None = None
    instance_id: str | None = attrs.field(default=None, metadata=_OMIT)
    path: Any = attrs.field(default=None, metadata=_OMIT | _RAW)
    decision: str | None = attrs.field(default=None, metadata=_OMIT)
    digest: str = ""

    @classmethod
    def of(cls, p: PendingApproval) -> HeldCallView:
        """Return the view of a pending approval."""
        held = p.instance_id is not None
        return cls(tool_call_id=p.tool_call_id, tool=p.tool, arguments=dict(p.arguments), reason=p.reason,
                   instance_id=p.instance_id, path=[dict(step) for step in p.path] if held else None,
                   decision=p.decision, digest=_digest(p))


@attrs.frozen(kw_only=True)
class UsageView:
    """``{inputTokens, outputTokens, totalTokens}`` (always) plus the counts that are known.

    Attributes:
        input_tokens: Prompt tokens.
        output_tokens: Completion tokens.
        total_tokens: Their sum.
        cache_read_tokens: Left out when unknown.
        cache_write_tokens: Left out when unknown.
        reasoning_tokens: Left out when unknown.
        requests: Model calls covered, left out when 0.
        unreported_requests: Calls without token counts, left out when 0.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int | None = attrs.field(default=None, metadata=_OMIT)
    cache_write_tokens: int | None = attrs.field(default=None, metadata=_OMIT)
    reasoning_tokens: int | None = attrs.field(default=None, metadata=_OMIT)
    requests: int = attrs.field(default=0, metadata=_OMIT)
    unreported_requests: int = attrs.field(default=0, metadata=_OMIT)

    @classmethod
    def of(cls, usage: Usage) -> UsageView:
        """Return the view of a usage."""
        return cls(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                   total_tokens=usage.total_tokens, cache_read_tokens=usage.cache_read_tokens,
                   cache_write_tokens=usage.cache_write_tokens, reasoning_tokens=usage.reasoning_tokens,
                   requests=usage.requests or 0, unreported_requests=usage.unreported_requests or 0)


@attrs.frozen(kw_only=True)
class ResultView:
    """The ``--json`` form of an :class:`~loopwright.AgentResult`: every key present.

    Attributes:
        instance_id: The instance.
        state: Its state.
        stop_reason: Why its last segment ended.
        text: The final text.
        output: The structured output, as parsed.
        usage: Its usage.
        cost: Its own cost (``None`` when unknown).
        subtree_cost: With its descendants'.
        pending_approvals: Its undecided calls.
        error: The error, in an error state.
        cancelled: Whether it was cancelled.
        limit: The limit it exceeded.
        model: Its model.
    """

    instance_id: str
    state: str
    stop_reason: str | None
    text: str | None
    output: Any = attrs.field(metadata=_RAW)
    usage: UsageView
    cost: float | None
    subtree_cost: float | None
    pending_approvals: tuple[HeldCallView, ...]
    error: str | None
    cancelled: bool
    limit: str | None
    model: str | None

    @classmethod
    def of(cls, result: AgentResult) -> ResultView:
        """Return the view of a result (its undecided calls only)."""
        return cls(instance_id=result.instance_id, state=result.state.value,
                   stop_reason=result.stop_reason.value if result.stop_reason else None, text=result.text,
                   output=result.output, usage=UsageView.of(result.usage), cost=result.cost.amount,
                   subtree_cost=result.subtree_cost.amount,
                   pending_approvals=tuple(HeldCallView.of(p) for p in result.pending_approvals if p.decision is None),
                   error=result.error, cancelled=result.cancelled, limit=result.limit, model=result.model)


@attrs.frozen(kw_only=True)
class SummaryView:
    """The summary of an instance (``show`` and ``ls``): every key present.

    Attributes:
        instance_id: The instance.
        name: Its definition's name.
        state: Its state as saved (one this version does not know is shown raw).
        queued: Whether it waits in the store for a worker.
        stop_reason: Why its last segment ended.
        cancelled: Whether it was cancelled.
        error: The error, in an error state.
        model: Its model.
        pending_approvals: Its saved held calls, decided or not.
        usage: Its saved usage, the three token counts always present.
        cost: Its own cost (``None`` when unknown or not saved).
        subtree_cost: With its descendants' (see :func:`summary`).
        spawner_instance_id: The instance that started it.
        caller_instance_id: The instance waiting on it.
        caller_tool_call_id: The call waiting on it.
        delegation_prompt: What its caller asked of it.
        created_at: When it was created.
        updated_at: When its header last changed.
        children: The agents it started.
        depth: How deep in its tree.
    """

    instance_id: str
    name: str
    state: Any
    queued: bool
    stop_reason: Any
    cancelled: bool
    error: str | None
    model: str | None
    pending_approvals: tuple[ApprovalView, ...]
    usage: Any = attrs.field(metadata=_RAW)
    cost: float | None
    subtree_cost: float | None
    spawner_instance_id: str | None
    caller_instance_id: str | None
    caller_tool_call_id: str | None
    delegation_prompt: str | None
    created_at: str
    updated_at: str
    children: Any = attrs.field(metadata=_RAW)
    depth: int

    @classmethod
    def of(cls, h: InstanceHeader, *, subtree_cost: float | EllipsisType | None = ...) -> SummaryView:
        """Return the summary of ``h`` (``subtree_cost`` as :func:`summary` takes it)."""
        return cls(
            instance_id=h.instance_id, name=h.name, state=_plain(h.state), queued=h.queued is True,
            stop_reason=_plain(h.stop_reason), cancelled=bool(h.cancelled), error=h.error, model=h.model,
            pending_approvals=tuple(ApprovalView.of(p) for p in h.pending_approvals),
            usage={"inputTokens": 0, "outputTokens": 0, "totalTokens": 0, **(h.usage or {})},
            cost=h.cost, subtree_cost=h.cost if isinstance(subtree_cost, EllipsisType) else subtree_cost,
            spawner_instance_id=h.spawner_instance_id, caller_instance_id=h.caller_instance_id,
            caller_tool_call_id=h.caller_tool_call_id, delegation_prompt=h.delegation_prompt,
            created_at=h.created_at, updated_at=h.updated_at, children=list(h.children), depth=int(h.depth or 0),
        )


@attrs.frozen(kw_only=True)
class TreeNode:
    """One node of an instance tree (``show --json``'s ``tree``, ``ls --tree``).

    Attributes:
        instance_id: The instance.
        name: Its definition's name.
        state: Its state as saved.
        stop_reason: Why its last segment ended.
        turns: Its turns.
        depth: How deep in its tree.
        pending_approvals: Its own undecided calls.
        waiting_on: Undecided calls in its subtree.
        cost: Its own cost (0.0 when none is saved, ``None`` when unknown).
        subtree_cost: With its descendants' (``None`` when any is unknown).
        forked_from: Where it was forked from, as saved.
        children: The nodes of the agents it started.
    """

    instance_id: str
    name: str
    state: Any
    stop_reason: Any
    turns: int
    depth: int
    pending_approvals: tuple[ApprovalView, ...]
    waiting_on: int
    cost: float | None
    subtree_cost: float | None
    forked_from: Any = attrs.field(metadata=_RAW)
    children: tuple[TreeNode, ...]


@attrs.frozen(kw_only=True)
class AgentReport:
    """What the agent tools report of an instance (``await_agent``, ``monitor_agent``): every key present.

    Attributes:
        instance_id: The instance.
        name: Its definition's name.
        state: Its state as saved.
        stop_reason: Why its last segment ended.
        text: Its final text.
        output: Its structured output, as saved.
        error: The error, in an error state.
        turns: Its turns (``None`` when not saved).
        cost: Its own cost (``None`` when unknown or not saved).
        subtree_cost: With its descendants'.
        context_tokens: The prompt tokens of its saved usage.
        pending_approvals: The ids of its undecided calls.
    """

    instance_id: str
    name: str
    state: Any
    stop_reason: Any
    text: str | None
    output: Any = attrs.field(metadata=_RAW)
    error: str | None
    turns: int | None
    cost: float | None
    subtree_cost: float | None
    context_tokens: Any = attrs.field(metadata=_RAW)
    pending_approvals: tuple[Any, ...]


# -- the converter ---------------------------------------------------------------------------


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(unstruct_collection_overrides={tuple: list})

    def unstructure_factory(cls: type) -> Any:
        overrides: dict[str, Any] = {
            a.name: override(rename=camel(a.name), omit_if_default=a.metadata.get("omit_if_default", False),
                             unstruct_hook=(lambda v: v) if a.metadata.get("raw") else None)
            for a in attrs.fields(cls)}
        return make_dict_unstructure_fn(cls, conv, **overrides)

    conv.register_unstructure_hook_factory(lambda t: attrs.has(t) and t.__module__ == __name__, unstructure_factory)
    return conv


#: The one converter of the JSON views: camelCase keys, field order, marked fields left out at their default.
view_converter: Final = _make_converter()


# -- the entry points ------------------------------------------------------------------------


def subtree_in(header: HeaderLike, by_id: Mapping[Any, HeaderLike], seen: set[Any]) -> float | None:
    """Return the subtree cost of ``header``'s instance from headers already read (``by_id``)."""
    h = header_of(header)
    own, below = own_cost(h), children_in(h, by_id, seen)
    return None if own is None or below is None else own + below


def children_in(header: HeaderLike, by_id: Mapping[Any, HeaderLike], seen: set[Any]) -> float | None:
    """Return the summed subtree costs of ``header``'s children found in ``by_id`` (``None`` if unknown)."""
    total: float | None = 0.0
    for child in header_of(header).children:
        if child in seen or child not in by_id:
            continue
        seen.add(child)
        below = subtree_in(by_id[child], by_id, seen)
        total = None if total is None or below is None else total + below
    return total


def _node(h: InstanceHeader, by_id: Mapping[Any, HeaderLike], seen: set[Any]) -> TreeNode:
    seen.add(h.instance_id)
    children = tuple(_node(header_of(by_id[c]), by_id, seen) for c in h.children if c in by_id and c not in seen)
    own = tuple(ApprovalView.of(p) for p in h.pending_approvals if p.get("decision") is None)
    cost = own_cost(h)
    below = [c.subtree_cost for c in children]
    return TreeNode(
        instance_id=h.instance_id, name=h.name, state=_plain(h.state), stop_reason=_plain(h.stop_reason),
        turns=int(h.turns or 0), depth=int(h.depth or 0), pending_approvals=own,
        waiting_on=len(own) + sum(c.waiting_on for c in children), cost=cost,
        subtree_cost=None if cost is None or None in below else cost + sum(below),  # type: ignore[arg-type]
        forked_from=h.forked_from, children=children)


def _to_json(view: Any) -> dict[str, Any]:
    """Return the JSON object of a view (one of the frozen classes above)."""
    out: dict[str, Any] = view_converter.unstructure(view)
    return out


def tree_node(header: HeaderLike, by_id: Mapping[Any, HeaderLike], seen: set[Any]) -> dict[str, Any]:
    """Return the ``tree`` node of ``header``'s instance, its children's nodes from ``by_id`` (a loop is cut)."""
    return _to_json(_node(header_of(header), by_id, seen))


def approval_json(p: Mapping[str, Any]) -> dict[str, Any]:
    """Return a saved ``pendingApprovals`` entry as the views show it (every key present)."""
    return _to_json(ApprovalView.of(p))


def approval_to_json(p: PendingApproval) -> dict[str, Any]:
    """Return the ``--json`` form of a pending approval: with its holder and path when it has them."""
    return _to_json(HeldCallView.of(p))


def short_json(value: Any, limit: int = 200) -> str:
    """Return ``value`` as JSON text, cut to ``limit`` characters (for messages)."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def summary(header: HeaderLike, *, subtree_cost: float | EllipsisType | None = ...) -> dict[str, Any]:
    """Return the JSON summary of an instance (``show`` and ``ls``), camelCase keys.

    :param subtree_cost: Its ``subtreeCost`` when the caller read its children (see
        :meth:`Runtime.subtree_cost`); by default its own cost.
    """
    return _to_json(SummaryView.of(header_of(header), subtree_cost=subtree_cost))


def agent_report(header: HeaderLike, *, instance_id: str, subtree_cost: float | None) -> dict[str, Any]:
    """Return what the agent tools report of an instance (see :class:`AgentReport`)."""
    h = header_of(header)
    return _to_json(AgentReport(
        instance_id=instance_id, name=h.name, state=_plain(h.state), stop_reason=_plain(h.stop_reason),
        text=h.text, output=h.output, error=h.error, turns=h.turns, cost=h.cost, subtree_cost=subtree_cost,
        context_tokens=(h.usage or {}).get("inputTokens"),
        pending_approvals=tuple(p.get("toolCallId") for p in h.pending_approvals if p.get("decision") is None)))


def result_to_json(result: AgentResult) -> dict[str, Any]:
    """Return the ``--json`` form of a result: camelCase keys, every key present."""
    return _to_json(ResultView.of(result))


def usage_to_json(usage: Usage) -> dict[str, Any]:
    """Return ``{inputTokens, outputTokens, totalTokens}`` (always) plus the counts that are known.

    ``unreportedRequests`` appears when some model calls came back without token counts.
    """
    return _to_json(UsageView.of(usage))
