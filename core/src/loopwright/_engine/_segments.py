"""The kinds of run segment, and what each does first, inside the segment, before its turns.

A segment is the stretch of an instance's life between two resting states. The runtime starts
one for a reason, named here by a frozen type; :meth:`Segments.run` sets
the instance ``running``, does the kind's first step (:meth:`Segments.prepare`), then runs turns until it
rests. ``new_segment`` says whether the limits' counters restart (a start, a message) or go on
(an approval decision; a resume after a crash, once the first segment has begun).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loopwright._engine._common import SegmentEnd
from loopwright._instance import now_iso
from loopwright._types import State, StopReason

if TYPE_CHECKING:
    from loopwright._engine._calls import Calls
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._journal import Journal
    from loopwright._engine._recovery import Recovery
    from loopwright._engine._turn import Turns

__all__ = ["Decided", "LateMail", "Mail", "Resume", "Segment", "Segments", "Start"]


@attrs.frozen
class Start:
    """A new instance's first segment: its set-up (system prompt, initial prompts, task prompt) first."""

    new_segment: ClassVar[bool] = True


@attrs.frozen
class Resume:
    """The segment that continues an instance a dead runner left ``running``.

    First the records of the dead runner's last turn are written again, each call it left without
    a result gets one, the interrupted turn ends as it would have, and a set-up the crash cut
    short carries on from its first unsaved part.

    Attributes:
        new_segment: ``False`` once the first segment began (its counters go on); ``True`` when
            the crash came before it saved anything, so that segment starts over.

    """

    new_segment: bool


@attrs.frozen
class Decided:
    """Go on with a segment whose held calls are all decided: they get their results (approved ones run).

    A decision applies only to the call it was made on: when a held call changed since, it is
    held again and the segment rests ``waiting_for_approval`` without running anything.
    """

    new_segment: ClassVar[bool] = False


@attrs.frozen
class Mail:
    """A new segment of a resting instance, to read its mail; the calls a dead runner left are answered first."""

    new_segment: ClassVar[bool] = True


@attrs.frozen
class LateMail:
    """A new segment for a message that arrived after the last turn boundary of the segment that just ended."""

    new_segment: ClassVar[bool] = True


#: Why a segment runs: one of the kinds above.
Segment = Start | Resume | Decided | Mail | LateMail


@attrs.frozen
class Segments:
    """Runs segments: the state change to ``running``, the kind's first step, the turns, the rest at the end."""

    deps: EngineDeps
    journal: Journal
    turns: Turns
    recovery: Recovery
    calls: Calls

    async def run(self, run: SegmentRun, segment: Segment) -> None:
        """Run the instance until it rests: set it ``running``, do ``segment``'s first step, then turns.

        A new segment (``segment.new_segment``) restarts the limits' counters and saves a
        ``seg`` entry; the others go on counting.
        """
        inst = run.inst
        journal = self.journal
        if segment.new_segment:
            inst.seg_iterations = inst.seg_tool_calls = inst.seg_tokens = inst.tree_tokens = inst.tree_tool_calls = 0
            inst.seg_cost = inst.tree_cost = 0.0
            inst.completion_attempts = inst.output_attempts = 0
            inst.header.segment_started_at = time.time()
            await self.deps.store.append_entries(inst.id, [{"t": "seg", "at": now_iso()}])
        await journal.set_state(run, State.RUNNING, None, error=None, limit=None, cancelled=False,
                                runner=self.deps.owner)
        try:
            await self.prepare(run, segment)
            await self.turns.run(run)
        except SegmentEnd as end:
            run.failure = end.failure
            extra: dict[str, Any] = {"error": end.error, "limit": end.limit}
            if end.error:
                journal.record(inst, "error", {"message": end.error, "stopReason": end.reason.value})
            await journal.set_state(run, end.state, end.reason, **extra)

    async def prepare(self, run: SegmentRun, segment: Segment) -> None:
        """Do ``segment``'s first step, inside the segment (the instance is ``running``)."""
        deps = self.deps
        recovery = self.recovery
        inst = run.inst
        if isinstance(segment, Start):
            await deps.begin(run, resume=False)
        elif isinstance(segment, Resume):
            await recovery.repair_records(run)
            await recovery.repair_interrupted(run)
            beginning = deps.still_beginning(inst)
            try:
                await recovery.finish_interrupted_turn(run)
            except SegmentEnd as end:
                if beginning and end.reason in (StopReason.WAITING_FOR_APPROVAL, StopReason.WAITING):
                    deps.defer_task(inst)
                raise
            if beginning:
                await deps.begin(run, resume=True)
        elif isinstance(segment, Decided):
            if deps.hold_changed(inst):
                await deps.write_header(inst)
                await deps.flush_records(inst.id)
                raise SegmentEnd(State.WAITING_FOR_APPROVAL, StopReason.WAITING_FOR_APPROVAL)
            await self.calls.continue_after_decisions(run)
        elif isinstance(segment, Mail):
            await recovery.repair_interrupted(run)
