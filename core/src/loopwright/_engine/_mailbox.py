"""The mailbox: posts read into the header's ``inbox``, delivered at turn boundaries; cancel requests.

Messages come from the instance's mailbox (any process may post) and wait in the header's
``inbox`` queue until a turn boundary delivers them. Reading an empty mailbox is one failed
``open`` for the file store (a few microseconds).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from loopwright._engine._common import SegmentEnd
from loopwright._types import Message, State, StopReason, ToolStatus

if TYPE_CHECKING:
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._journal import Journal
    from loopwright._header_fields import HeaderFields

__all__ = ["Mailbox", "first_answer", "mail_to_give"]


def first_answer(queue: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Return the first queued message that may answer a pending ``ask_user``, or ``None``.

    A message from ``api`` or ``user`` may; the task prompt that waits behind a held turn
    (``behindTurn``) and messages from agents or the runtime may not.
    """
    return next((m for m in queue if m.get("source") in ("api", "user") and not m.get("behindTurn")), None)


def mail_to_give(header: HeaderFields) -> bool:
    """Whether the header's queue (``inbox``) holds messages the next turn boundary gives the model.

    The rule of :meth:`Mailbox.drain_inbox`: every queued message, unless a question waits for
    its answer, when only one that may answer it (:func:`first_answer`) is.
    """
    queue = header.inbox
    if header.awaiting_answer:
        return first_answer(queue) is not None
    return bool(queue)


class Mailbox:
    """Reads an instance's posts and delivers its messages."""

    def __init__(self, deps: EngineDeps, journal: Journal) -> None:
        """Read posts from ``deps.store``, save headers through ``deps``; add messages through ``journal``."""
        self.deps = deps
        self.store = deps.store
        self.journal = journal

    async def absorb_mail(self, run: SegmentRun, *, running: bool) -> bool:
        """Move new mailbox posts into the header's queue (``inbox``); return whether a cancel came.

        Called when a segment starts (``running=False``: cancel requests are stale and dropped)
        and at every turn boundary (``running=True``). Nothing is written here; the header is
        saved with the next state change or by :meth:`drain_inbox`.
        """
        h = run.inst.header
        posts, new_cursor = await self.store.read_posts(run.inst.id, int(h.inbox_cursor or 0))
        run.mail_read_at = time.monotonic()
        if not posts:
            return False
        h.inbox_cursor = new_cursor
        queue = h.inbox
        h.inbox = queue  # saved with the header (a new list when it had none)
        cancel = False
        for post in posts:
            if post.get("type") == "message":
                queue.append(post)
            elif post.get("type") == "cancel":
                cancel = cancel or running
        return cancel

    async def drain_inbox(self, run: SegmentRun) -> None:
        """Deliver queued messages at a turn boundary; act on a cancel request.

        A message from ``api`` or ``user`` answers a pending ``ask_user`` (the task prompt that
        waits behind a held turn never does); the others wait behind the question. While a
        question is unanswered the segment rests ``waiting`` without calling the model.
        """
        inst = run.inst
        h = inst.header
        before = h.inbox_cursor
        if await self.absorb_mail(run, running=True):
            await self.deps.write_header(inst)
            run.request_cancel()
            await anyio.lowlevel.checkpoint()
        queue = h.inbox
        if h.awaiting_answer:
            answer = first_answer(queue)
            if answer is not None:
                queue.remove(answer)
                await self.answer_question(run, str(answer.get("text", "")))
        if queue and not h.awaiting_answer:
            h.inbox = []
            for item in queue:
                marks: dict[str, Any] = {"task": True} if item.get("behindTurn") else {}
                if item.get("id"):
                    # The post's id goes with the message: a runner killed before the header below
                    # is saved leaves the item queued, and the one that resumes drops it
                    # (Recovery.repair_records) instead of giving it twice.
                    marks["post"] = item["id"]
                await self.journal.add_message(
                    run, Message(role="user", content=item.get("text"), source=item.get("source")),
                    marks=marks or None)
                self.journal.record(inst, "message", {"source": item.get("source"), "at": item.get("at")})
            await self.deps.write_header(inst)
        elif h.inbox_cursor != before:
            await self.deps.write_header(inst)
        if h.awaiting_answer:
            raise SegmentEnd(State.WAITING, StopReason.WAITING)

    async def answer_question(self, run: SegmentRun, text: str) -> None:
        """Make ``text`` the result of the pending ``ask_user`` call."""
        inst = run.inst
        awaiting = inst.header.awaiting_answer or {}
        del inst.header.awaiting_answer
        call_id = awaiting.get("toolCallId")
        wire = next((c.wire_id for m in reversed(inst.transcript) if m.role == "assistant"
                     for c in m.tool_calls if c.id == call_id), None)
        message = Message(role="tool", tool_call_id=call_id, name="ask_user", content=text,
                          status=ToolStatus.SUCCESS, tool_call_wire_id=wire)
        await self.journal.add_message(run, message)
        self.journal.record(inst, "tool_call", {"turn": inst.turn, "toolCallId": call_id, "tool": "ask_user",
                                                "status": ToolStatus.SUCCESS.value, "answered": True})

    async def has_mail(self, run: SegmentRun) -> bool:
        """Return whether messages wait for a resting instance (cancel requests are dropped).

        They wait unread in the mailbox, or already read into the header's queue and not given:
        a runner that takes over a dead one reads the mailbox as its segment starts, and the
        interrupted turn may end that segment (``task_complete``) before a turn boundary gives
        the queue (see :func:`mail_to_give`). Either starts the next segment.
        """
        inst = run.inst
        if mail_to_give(inst.header):
            return True
        posts, new_cursor = await self.store.read_posts(inst.id, int(inst.header.inbox_cursor or 0))
        if not posts:
            return False
        if any(p.get("type") == "message" for p in posts):
            return True
        inst.header.inbox_cursor = new_cursor  # a cancel request for a segment that has ended
        await self.deps.write_header(inst)
        return False

    async def cancel_posted(self, run: SegmentRun) -> bool:
        """Return whether the unread posts hold a cancel request (nothing is consumed)."""
        posts, _ = await self.store.read_posts(run.inst.id, int(run.inst.header.inbox_cursor or 0))
        return any(p.get("type") == "cancel" for p in posts)
