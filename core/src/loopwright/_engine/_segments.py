"""The kinds of run segment, and what each does first, inside the segment, before its turns.

A segment is the stretch of an instance's life between two resting states. The runtime starts
one for a reason, named here by a frozen type; :meth:`loopwright._engine.Loop.run_segment` sets
the instance ``running``, does the kind's first step (:func:`prepare`), then runs turns until it
rests. ``new_segment`` says whether the limits' counters restart (a start, a message) or go on
(an approval decision; a resume after a crash, once the first segment has begun).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs

from loopwright._engine._common import SegmentEnd
from loopwright._types import State, StopReason

if TYPE_CHECKING:
    from loopwright._engine._deps import SegmentRun
    from loopwright._engine._loop import Loop

__all__ = ["Decided", "LateMail", "Mail", "Resume", "Segment", "Start", "prepare"]


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


Segment = Start | Resume | Decided | Mail | LateMail


async def prepare(loop: Loop, run: SegmentRun, segment: Segment) -> None:
    """Do ``segment``'s first step, inside the segment (the instance is ``running``)."""
    deps = loop.deps
    inst = run.inst
    if isinstance(segment, Start):
        await deps.begin(run, resume=False)
    elif isinstance(segment, Resume):
        await loop.repair_records(run)
        await loop.repair_interrupted(run)
        beginning = deps.still_beginning(inst)
        try:
            await loop.finish_interrupted_turn(run)
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
        await loop.continue_after_decisions(run)
    elif isinstance(segment, Mail):
        await loop.repair_interrupted(run)
