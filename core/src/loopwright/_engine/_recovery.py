"""Recovery: what a runner does with an instance a dead process (or a cancel) left mid-turn.

A take-over writes the records the dead runner lost (:meth:`Recovery.repair_records`), answers
the calls it left without a result (:meth:`Recovery.repair_interrupted`) and ends its last turn
the way it would have (:meth:`Recovery.finish_interrupted_turn`). A cancel settles the calls
where they stand (:meth:`Recovery.settle_cancelled`). See docs/crash-safety.md.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from loopwright._engine._common import (
    Call,
    SegmentEnd,
    make_result,
    restore_call_order,
    take_decisions,
    tool_message,
)
from loopwright._engine._mailbox import first_answer, mail_to_give
from loopwright._instance import shown_call, unanswered_calls
from loopwright._replay import rebuild
from loopwright._types import State, StopReason, ToolResult, ToolStatus

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from loopwright._engine._calls import Calls
    from loopwright._engine._checks import Checks
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._journal import Journal
    from loopwright._instance import Instance

__all__ = ["Recovery"]


class Recovery:
    """Repairs an interrupted instance so that every call is answered once and the records add up."""

    def __init__(self, deps: EngineDeps, journal: Journal, calls: Calls, checks: Checks) -> None:
        """Read the log from ``deps.store``; give calls their results through ``calls``; ``checks`` end the turn."""
        self.deps = deps
        self.store = deps.store
        self.journal = journal
        self.calls = calls
        self.checks = checks

    async def repair_records(self, run: SegmentRun) -> None:
        """Write the ``turn`` and ``tool_call`` records a dead runner saved the entries of but not the records.

        Records are queued in memory and written once a turn, and before the header says the
        instance rests, after the entries they describe: a process killed in between loses the
        records of its last turn while the entries stay. So a runner that takes over a dead
        runner's instance (:meth:`loopwright.Runtime.resume`, a worker's ``resume``, a message
        or a cancel that finds its runner dead) calls this first: each answer of the current
        segment whose turn has no ``turn`` record, and each tool result without a ``tool_call``
        record, gets one built from the entry log (marked ``repaired: true``), so that the
        records always add up to the instance's turns, tokens and tool calls. It reads the whole
        record log, once per take-over.

        Queued mail the dead runner already gave the model (a message entry carries its post's
        id, and the runner died before the header that empties the queue was saved) leaves the
        queue here, so it is given once.
        """
        inst = run.inst
        record = self.journal.record
        entries = await self.store.read_entries(inst.id)
        start = max((n for n, e in enumerate(entries) if e.get("t") == "seg"), default=-1) + 1
        _drop_given_mail(inst, entries[start:])
        records = await self.store.read_records(inst.id)
        turns = {r["data"].get("turn") for r in records if r.get("kind") == "turn" and isinstance(r.get("data"), dict)}
        calls = {r["data"].get("toolCallId") for r in records
                 if r.get("kind") == "tool_call" and isinstance(r.get("data"), dict)}
        turn = next((int(e["turn"].get("n", 0)) for e in reversed(entries[:start])
                     if e.get("t") == "msg" and isinstance(e.get("turn"), dict)), 0)
        repaired = 0
        for entry in entries[start:]:
            m = entry.get("m")
            if entry.get("t") != "msg" or not isinstance(m, dict):
                continue
            spent = entry.get("turn")
            if isinstance(spent, dict):
                turn = int(spent.get("n", turn + 1))
                if turn not in turns:
                    turns.add(turn)
                    repaired += 1
                    record(inst, "turn", {
                        "turn": turn, "model": spent.get("model"), "usage": spent.get("usage") or {},
                        "cost": spent.get("cost"), "toolCalls": len(m.get("toolCalls") or []), "repaired": True})
            elif m.get("role") == "tool" and m.get("toolCallId") not in calls:
                calls.add(m.get("toolCallId"))
                repaired += 1
                data: dict[str, Any] = {"turn": turn, "toolCallId": m.get("toolCallId"), "tool": m.get("name"),
                                        "status": m.get("status") or ToolStatus.SUCCESS.value, "repaired": True}
                extra = entry.get("spend")
                if isinstance(extra, dict):
                    data["usage"], data["cost"] = extra.get("usage") or {}, extra.get("cost")
                if data["status"] != ToolStatus.SUCCESS.value:
                    data["error"] = str(m.get("content") or "")[:1000]
                record(inst, "tool_call", data)
        if repaired:
            await self.deps.flush_records(inst.id)

    async def repair_interrupted(self, run: SegmentRun) -> None:  # noqa: C901, PLR0912 - one case per way a call was left
        """Give each call a dead process left without a result one, in call order.

        A call that never started runs now. A call that started may have had its effect:
        idempotent tools run again, for the others the model is told the outcome is unknown.

        A held call that a person decided is one of them: the decision was saved before the
        segment went on, so a dead runner may have left it unstarted (it runs if approved, gets
        its ``denied`` result if not), in flight (interrupted like any call: approval was given),
        or answered. Every decision is taken off the header's pending approvals here; only
        undecided held calls stay there, without a result. Likewise a question whose answer is
        saved is answered (see :func:`_settle_answered_question`): it is never answered twice.
        """
        inst = run.inst
        deps = self.deps
        calls = self.calls
        _settle_answered_question(inst)
        decided = {p.tool_call_id: p for p in inst.pending_approvals if p.decision is not None}
        if decided:
            undecided = [p for p in take_decisions(inst) if p.decision is None]
            inst.set_pending(undecided)
        _assistant, unanswered = unanswered_calls(inst.transcript)
        if not unanswered:
            return
        skip = {p.tool_call_id for p in inst.pending_approvals}
        awaiting = inst.header.asked_call_id
        limits = deps.limits_of(inst)
        for index, call in enumerate(unanswered):
            if call.id in skip or call.id == awaiting:
                continue
            decision = decided.get(call.id)
            item = Call(index, call if decision is None else shown_call(call, decision))
            if decision is not None and (call.id not in inst.started_calls or decision.decision != "approved"):
                item.tool = deps.tool_for(inst.definition, call.name, inst.grants)
                await calls.decided(run, item, decision, limits)
            elif call.id not in inst.started_calls:
                await calls.prepare(run, item, inst.turn)
                if item.result is None and item.held is None:
                    await calls.execute(run, item, inst.turn)
                elif item.result is not None:
                    await calls.finish(run, item, inst.turn, save=True)
                else:
                    self.journal.record(inst, "error", {"message": f"call {call.id} needs approval after a restart"})
                    item.result = make_result(call, ToolStatus.DENIED, "denied: the call needs approval and the "
                                              "process that held it stopped; ask again if it is still needed")
                    await calls.finish(run, item, inst.turn, save=True)
            elif item.tool is None and (tool := deps.tool_for(inst.definition, call.name, inst.grants)) is not None \
                    and tool.idempotent:
                item.tool = tool
                await calls.execute(run, item, inst.turn)
            else:
                item.result = make_result(call, ToolStatus.UNKNOWN_OUTCOME,
                                          "the call was interrupted (the process stopped while it ran); "
                                          "its outcome is unknown. Check before calling it again.")
                await calls.finish(run, item, inst.turn, save=True)
            if item.result is not None:
                inst.transcript.append(tool_message(item))
            elif item.awaiting_user:
                run.awaiting_after_repair.add(call.id)
        restore_call_order(inst)

    async def settle_cancelled(self, run: SegmentRun) -> None:
        """Give each call still without a result one, as the instance stops cancelled; run nothing.

        A cancel ends the calls of the last turn where they stand: one that started (its start
        marker is saved) may have had its effect, so the model is told its outcome is unknown;
        one that never started, one held for approval and a question still waiting for its
        answer are skipped. Held calls leave the header's pending approvals, and the question
        leaves ``awaitingAnswer``. So a cancelled instance rests with every call answered once,
        and a message that continues it later starts from a whole transcript.
        """
        inst = run.inst
        # The log is the truth: calls cut off mid-batch saved their results there, not yet in
        # the transcript in memory (a batch's results join it together, in call order).
        rebuild(inst, await self.store.read_entries(inst.id))
        _settle_answered_question(inst)
        asked = inst.header.asked_call_id
        _assistant, unanswered = unanswered_calls(inst.transcript)
        for index, call in enumerate(unanswered):
            item = Call(index, call)
            if call.id == asked or call.name == "ask_user":  # asked, or about to be: no answer came
                item.result = make_result(call, ToolStatus.SKIPPED,
                                          "skipped: the instance was cancelled before the question was answered")
            elif call.id in inst.started_calls:
                item.result = make_result(call, ToolStatus.UNKNOWN_OUTCOME,
                                          "the call was interrupted (the instance was cancelled while it ran); "
                                          "its outcome is unknown. Check before calling it again.")
            else:
                item.result = make_result(call, ToolStatus.SKIPPED, "skipped: the instance was cancelled")
            await self.calls.finish(run, item, inst.turn, save=True)
            inst.transcript.append(tool_message(item))
        if inst.pending_approvals:
            inst.set_pending([])
        del inst.header.awaiting_answer
        restore_call_order(inst)

    async def finish_interrupted_turn(self, run: SegmentRun) -> None:  # noqa: C901 - one case per way a turn ends
        """After a crash, end the last turn the way the dead process would have.

        Called on resume, after :meth:`repair_interrupted`. If the transcript ends with an answer
        without tool calls, the segment rests as it would have (``waiting``, after the output
        check and the completion gate) instead of asking the model again; unless the header's
        queue holds mail to give, which means the dead segment began for that mail and never
        reached its first turn: the loop goes on, and gives it. If it ends with the
        results of a turn's calls, the turn's end is applied: a successful ``task_complete`` (or
        other loop-ending tool) completes the instance, an unanswered ``ask_user`` waits. Otherwise
        the loop goes on with the next model call.
        """
        inst = run.inst
        messages = inst.transcript
        if not messages:
            return
        last = messages[-1]
        limits = self.deps.limits_of(inst)
        if last.role == "assistant" and not last.tool_calls and mail_to_give(inst.header):
            # The dead runner's segment began for mail it had read into the header's queue but not
            # yet given to the model (its first turn boundary gives it): this answer is the segment
            # before's, which rested. The turns go on, and the first one gives the mail.
            return
        if last.role == "assistant" and not last.tool_calls:
            if inst.definition.output is not None and await self.checks.output_rejected(run, last):
                return
            if await self.checks.completion_gate(run):
                return
            raise SegmentEnd(State.WAITING, StopReason.WAITING)
        assistant, unanswered = unanswered_calls(messages)
        if assistant is None or (unanswered and not run.awaiting_after_repair):
            return
        results = {m.tool_call_id: m for m in messages[messages.index(assistant) + 1:] if m.role == "tool"}
        items: list[Call] = []
        for index, call in enumerate(assistant.tool_calls):
            item = Call(index, call, tool=self.deps.tool_for(inst.definition, call.name, inst.grants))
            m = results.get(call.id)
            if m is not None:
                data = None
                if m.status is ToolStatus.SUCCESS and item.tool is not None and item.tool.ends_loop:
                    try:
                        data = json.loads(m.content or "null")
                    except ValueError:
                        data = m.content
                item.result = ToolResult(tool_call_id=call.id, name=call.name, status=m.status or ToolStatus.SUCCESS,
                                         content=m.content or "", data=data)
            elif call.id in run.awaiting_after_repair:
                item.awaiting_user = True
            items.append(item)
        run.awaiting_after_repair = set()
        await self.calls.end_of_turn(run, items, exceeded=False, limits=limits)


def _settle_answered_question(inst: Instance) -> None:
    """Make the header agree with a saved answer to its ``ask_user``.

    The answer (the call's result) is appended before the header forgets the question and the
    message that answered it, so a dead runner may leave a header still ``awaitingAnswer``, the
    message still queued in ``inbox`` or unread in the mailbox (read into ``inbox`` when the next
    segment starts). The log is the truth: the question is answered, and the first message that
    may answer it (the one :meth:`loopwright._engine._mailbox.Mailbox.drain_inbox` took) leaves
    the queue if it is that answer.
    """
    call_id = inst.header.asked_call_id
    answer = next((m for m in inst.transcript if m.role == "tool" and m.tool_call_id == call_id), None)
    if call_id is None or answer is None:
        return
    del inst.header.awaiting_answer
    queue = inst.header.inbox
    first = first_answer(queue)
    if first is not None and str(first.get("text", "")) == (answer.content or ""):
        queue.remove(first)


def _drop_given_mail(inst: Instance, entries: Sequence[Mapping[str, Any]]) -> None:
    """Remove from the header's queue the posts whose message is among ``entries`` (the current segment's)."""
    queue = inst.header.inbox
    if not queue:
        return
    given = {e["post"] for e in entries if e.get("t") == "msg" and e.get("post")}
    if given:
        inst.header.inbox = [m for m in queue if m.get("id") not in given]
