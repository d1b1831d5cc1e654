"""The limits of a segment and the tree's one budget: checks, tool-call room, and the elapsed deadline.

An instance draws from its own limits and from each live ancestor's (a tree has one budget):
tokens and cost count what its descendants spent too (see :meth:`Instance.spend`), and a child's
calls end when an ancestor's tree runs out of time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from loopwright._engine._common import SegmentEnd, of_ancestor
from loopwright._types import State, StopReason

if TYPE_CHECKING:
    from loopwright._definition import Limits
    from loopwright._instance import Instance

__all__ = ["Budgets", "elapsed_reached", "elapsed_scope"]


class Budgets:
    """The limits an instance is held to, found through ``limits_of`` (its own, capped by its saved budget)."""

    def __init__(self, limits_of: Callable[[Instance], Limits]) -> None:
        """Read each instance's limits with ``limits_of``."""
        self.limits_of = limits_of

    def check(self, inst: Instance, limits: Limits) -> None:
        """Raise SegmentEnd for a limit reached: its own, or one of a live ancestor's (the tree's one budget).

        Tokens and cost count what its descendants spent too (see :meth:`Instance.spend`).
        """
        if limits.max_iterations is not None and inst.seg_iterations >= limits.max_iterations:
            raise SegmentEnd(State.ERROR, StopReason.MAX_ITERATIONS,
                             error=f"max iterations ({limits.max_iterations}) reached", limit="maxIterations")
        _check_budget(inst, limits, "")
        if inst.spawner is not None:
            for above in inst.ancestors():
                _check_budget(above, self.limits_of(above), of_ancestor(above))

    def of(self, inst: Instance, limits: Limits) -> list[tuple[Instance, Limits]]:
        """Return the budgets ``inst`` draws from: its own limits, then each live ancestor's."""
        if inst.spawner is None:
            return [(inst, limits)]
        return [(inst, limits), *((above, self.limits_of(above)) for above in inst.ancestors())]

    def tool_room(self, inst: Instance, limits: Limits) -> tuple[int | None, str]:
        """Return how many more tool calls ``inst`` may start (``None``: no limit) and the limit that says so."""
        room: int | None = None
        which = ""
        for owner, owned in self.of(inst, limits):
            if owned.tool_calls is None:
                continue
            left = max(owned.tool_calls - owner.seg_tool_calls - owner.tree_tool_calls, 0)
            if room is None or left < room:
                room = left
                which = f"the tool-call limit ({owned.tool_calls}){of_ancestor(owner) if owner is not inst else ''}"
        return room, which

    def draw_tool_call(self, inst: Instance) -> str | None:
        """Count one tool call toward ``inst`` and its tree, or return the limit that has no room for it.

        Checked and charged in one step (no await between): the calls of agents running in
        parallel cannot all pass the check before any of them is counted.
        """
        room, which = self.tool_room(inst, self.limits_of(inst))
        if room is not None and room <= 0:
            return which
        inst.seg_tool_calls += 1
        inst.tool_calls += 1
        if inst.spawner is not None:
            for above in inst.ancestors():
                above.tree_tool_calls += 1
        return None


def elapsed_scope(budgets: Sequence[tuple[Instance, Limits]]) -> anyio.CancelScope:
    """Return a cancel scope whose deadline is the first end of an ``elapsed`` limit in ``budgets``.

    ``budgets`` are the instance's own limits and its ancestors' (:meth:`Budgets.of`), so a
    call in a child also ends when an ancestor's tree runs out of time. Each clock starts at its
    owner's ``segmentStartedAt``; the waits for approval are left out of it
    (:func:`loopwright._engine._common.take_decisions` moves that start on by them). No limit, no deadline.
    """
    ends = [float(owner.header.segment_started_at or time.time()) + owned.elapsed
            for owner, owned in budgets if owned.elapsed is not None]
    if not ends:
        return anyio.CancelScope()
    return anyio.CancelScope(deadline=anyio.current_time() + min(ends) - time.time())


def elapsed_reached(budgets: Sequence[tuple[Instance, Limits]]) -> SegmentEnd:
    """Return the end of a segment whose call the elapsed deadline cut off, naming whose limit it was."""
    inst = budgets[0][0]
    ends = [(float(owner.header.segment_started_at or time.time()) + owned.elapsed, owner, owned)
            for owner, owned in budgets if owned.elapsed is not None]
    _end, owner, owned = min(ends, key=lambda e: e[0])
    whose = of_ancestor(owner) if owner is not inst else ""
    return SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="elapsed",
                      error=f"elapsed-time limit ({owned.elapsed:g} s){whose} reached")


def _check_budget(owner: Instance, limits: Limits, whose: str) -> None:
    """Raise SegmentEnd if ``owner``'s tree has used up its ``tokens``, ``cost`` or ``elapsed`` limit."""
    if limits.tokens is not None or limits.cost is not None:
        tokens, cost, _calls = owner.spent()
        if limits.tokens is not None and tokens >= limits.tokens:
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="tokens",
                             error=f"token limit ({limits.tokens}){whose} reached: {tokens} tokens used")
        if limits.cost is not None:
            if cost is None:
                raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="cost",
                                 error=f"cost limit{whose} set but the price of a model used is unknown")
            if cost >= limits.cost:
                raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="cost",
                                 error=f"cost limit ({limits.cost}){whose} reached: {cost:.6f} spent")
    if limits.elapsed is not None:
        started = float(owner.header.segment_started_at or time.time())
        if time.time() - started >= limits.elapsed:
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="elapsed",
                             error=f"elapsed-time limit ({limits.elapsed:g} s){whose} reached")
