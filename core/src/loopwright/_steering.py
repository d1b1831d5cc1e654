"""Steering instances: decisions on held calls, messages and cancels, :class:`Steering`.

Each acts on the instance where it is: a live segment here is told directly; a resting
instance is changed under its runner lease (:func:`~loopwright._lease.held_lease`) on a fresh
copy, and continued here when the change lets it go on; an instance another process runs is
told through its mailbox, which its runner reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import anyio
import attrs

from loopwright._header_fields import HeaderFields
from loopwright._instance import now_iso, shown_call, unanswered_calls
from loopwright._lease import held_lease, holding
from loopwright._types import PendingApproval, State, StopReason, approval_digest, call_digest
from loopwright._views import short_json
from loopwright.abc import new_post_id
from loopwright.errors import ApprovalDigestMismatchError, LoopwrightError

if TYPE_CHECKING:
    from loopwright._run import AgentRun
    from loopwright._runtime import Runtime
    from loopwright.abc import Lease

__all__ = ["Steering"]


class Steering:
    """Decisions, messages and cancels for one runtime's instances."""

    def __init__(self, runtime: Runtime) -> None:
        """Steer the instances of ``runtime``."""
        self._rt = runtime

    async def decide(
        self, run: AgentRun, tool_call_id: str | None, decision: Literal["approved", "denied"], reason: str | None,
        *, by: str | None = None, detach: bool = False, digest: str | None = None,
    ) -> list[PendingApproval]:
        """Record a decision on held calls; continue the segment once every one is decided.

        With ``digest`` (needs ``tool_call_id``), the call is decided only when its
        :func:`~loopwright._types.approval_digest` is ``digest``: what the decider saw is what runs.

        With ``tool_call_id``, the call may be held anywhere in ``run``'s subtree: it is decided
        on the instance that holds it (:meth:`decide_held`), whose callers then go on too. Without,
        every undecided call held by ``run``'s own instance is decided. ``by`` names who decided
        (saved with each decision as ``decidedBy``, and in its ``approval`` record). With ``detach``,
        only the decisions are saved: nothing continues here (see :meth:`submit_decision`).

        :return: What was decided, each entry naming its holder and path.
        :raises ApprovalDigestMismatchError: ``digest`` is not the pending call's; nothing is decided.
        :raises LoopwrightError: No such call is waiting for approval (any more), or it is held
            by more than one instance of the tree (name the holder instead).
        """
        if tool_call_id is None:
            if digest is not None:
                raise LoopwrightError("a digest names one call: give its tool_call_id too")
            return await self.decide_held(run, None, decision, reason, by=by, detach=detach)
        header = HeaderFields(await self._rt.store.read_header(run.instance_id))
        if tool_call_id in header.undecided_calls() and header.state is State.WAITING_FOR_APPROVAL:
            return await self.decide_held(run, tool_call_id, decision, reason, by=by, detach=detach, digest=digest)
        found = [p for p in await self._rt.forest.tree_approvals(run.instance_id) if p.tool_call_id == tool_call_id]
        if not found:
            raise LoopwrightError(f"no call {tool_call_id!r} is waiting for approval in the tree of instance "
                                  f"{run.instance_id} (it was decided already, or never held)")
        if len({p.instance_id for p in found}) > 1:
            holders = ", ".join(str(p.instance_id) for p in found)
            raise LoopwrightError(f"call {tool_call_id!r} is held by more than one instance ({holders}); "
                                  "decide it on its holder: approve HOLDER --call CALL_ID")
        holder = await self._rt.get_agent(str(found[0].instance_id))
        decided = await self.decide_held(holder, tool_call_id, decision, reason, by=by, detach=detach, digest=digest)
        if not detach:
            await self._rt.forest.wake_callers(holder.instance_id)
        path = found[0].path
        return [attrs.evolve(p, instance_id=holder.instance_id, path=path) for p in decided]

    async def decide_subtree(
        self, run: AgentRun, decision: Literal["approved", "denied"], reason: str | None, *,
        by: str | None = None, detach: bool = False,
    ) -> list[PendingApproval]:
        """Decide every undecided call in ``run``'s subtree, holder by holder (deepest first).

        ``by`` names who decided, as in :meth:`decide`. With ``detach``, only the decisions are
        saved (see :meth:`decide`).

        :return: What was decided, each entry naming its holder and path.
        :raises LoopwrightError: Nothing in the tree waits for approval.
        """
        entries = await self._rt.forest.tree_approvals(run.instance_id)
        if not entries:
            raise LoopwrightError(f"no call is waiting for approval in the tree of instance {run.instance_id}")
        holders: dict[str, list[PendingApproval]] = {}
        for p in entries:
            holders.setdefault(str(p.instance_id), []).append(p)
        decided: list[PendingApproval] = []
        for holder_id in sorted(holders, key=lambda h: -len(holders[h][0].path)):
            holder = await self._rt.get_agent(holder_id)
            path = holders[holder_id][0].path
            done = await self.decide_held(holder, None, decision, reason, by=by, detach=detach)
            decided += [attrs.evolve(p, instance_id=holder_id, path=path) for p in done]
            if holder_id != run.instance_id and not detach:
                await self._rt.forest.wake_callers(holder_id)
        return decided

    async def decide_held(
        self, run: AgentRun, tool_call_id: str | None, decision: Literal["approved", "denied"], reason: str | None,
        *, by: str | None = None, detach: bool = False, digest: str | None = None,
    ) -> list[PendingApproval]:
        """Record a decision on calls ``run``'s own instance holds; continue once every one is decided.

        With ``detach``, the lease is given back once the decisions are saved, even when every
        call is decided: a runner continues it through :meth:`pick_up`.

        The decision is written under the instance's lease, on a fresh copy of its header, so a
        decision from another process is never lost, and two processes deciding the same call
        at once decide (and run) it once: the other one is refused. Each decision records the
        :func:`~loopwright._types.call_digest` of the call as shown; a held entry whose call in
        the log is not the one shown is refused and stays held.

        With ``digest``, the one chosen call is decided only when its
        :func:`~loopwright._types.approval_digest` is ``digest`` (checked under the lease).

        :return: The entries decided.
        :raises ApprovalDigestMismatchError: ``digest`` is not the pending call's; nothing is decided.
        :raises LoopwrightError: Nothing (or not that call) is waiting for approval, or the
            instance runs in another process (which is deciding or running its calls).
        """
        if run.running:
            raise LoopwrightError(f"instance {run.instance_id} is running; it has no call waiting for approval")
        async with held_lease(self._rt.store, run.instance_id, self._rt.owner, if_free=True) as lease:
            if lease is None:
                raise LoopwrightError(f"instance {run.instance_id} is running in another process, which is deciding "
                                      "or running its calls: none of them waits for approval here")
            await self._rt.loader.refresh(run)
            inst = run.inst
            pending = inst.pending_approvals
            undecided = [p for p in pending if p.decision is None]
            if not undecided or inst.state is not State.WAITING_FOR_APPROVAL:
                raise LoopwrightError(f"instance {inst.id} has no call waiting for approval")
            if tool_call_id is not None and tool_call_id not in {p.tool_call_id for p in undecided}:
                raise LoopwrightError(
                    f"instance {inst.id} has no undecided call {tool_call_id!r}; waiting: "
                    f"{', '.join(p.tool_call_id for p in undecided)}")
            chosen = [p for p in undecided if tool_call_id is None or p.tool_call_id == tool_call_id]
            if digest is not None:
                _check_digest(str(inst.id), chosen, digest)
            calls = {c.id: c for c in unanswered_calls(inst.transcript)[1]}
            for p in chosen:
                held = calls.get(p.tool_call_id)
                shown = shown_call(held, p) if held is not None else None
                if shown is None or call_digest(shown.name, shown.arguments) != call_digest(p.tool, p.arguments):
                    raise LoopwrightError(
                        f"instance {inst.id}: the held call {p.tool_call_id!r} in its log is not the call shown "
                        f"for approval ({p.tool} {short_json(p.arguments)}); it stays held, undecided")
            ids = {p.tool_call_id for p in chosen}
            decided = [
                attrs.evolve(p, decision=decision, decision_reason=reason,
                             decision_digest=call_digest(p.tool, p.arguments), decided_by=by)
                if p.tool_call_id in ids else p
                for p in pending]
            inst.set_pending(decided)
            inst.header.updated_at = now_iso()
            await self._rt.recorder.write_header(inst)
            if not detach and all(p.decision is not None for p in decided):
                await self._rt.driver.continue_decided(run, lease)
        return [p for p in decided if p.tool_call_id in ids]

    async def deliver(self, run: AgentRun, text: str, source: str) -> None:
        """Deliver a message (see :meth:`AgentRun.message`) through the instance's mailbox.

        A running instance (here or in another process) reads it at its next turn boundary; one
        waiting for approval reads it once the calls are decided; one left ``running`` by a dead
        runner is resumed here (as by :meth:`resume`) and reads it then; any other resting
        instance starts a new segment here at once.
        """
        await self._rt.store.post(run.instance_id, {"id": new_post_id(), "type": "message", "text": text,
                                                     "source": source, "at": now_iso()})
        if run.running or run.inst.state is State.WAITING_FOR_APPROVAL:
            return
        async with held_lease(self._rt.store, run.instance_id, self._rt.owner, if_free=True) as lease:
            if lease is None:
                return  # running in another process: its runner reads the mailbox
            await self._rt.loader.refresh(run)
            if run.inst.header.state is State.WAITING_FOR_APPROVAL:  # refreshed just now
                return  # another process held a call meanwhile: read once it is decided
            if run.inst.header.queued is True:  # submitted, never started: it starts here, and reads it
                await self._rt.driver.start_queued(run, lease)
            elif run.inst.state is State.RUNNING:
                # Its runner died (we hold the lease): carry on as a resume does, which finishes the
                # interrupted turn (and a beginning cut short) before it reads the mail.
                await self._rt.driver.start_resumed(run, lease)
            else:
                await self._rt.driver.start_for_mail(run, lease)

    async def cancel_run(self, run: AgentRun, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Cancel a run (see :meth:`AgentRun.cancel` and :meth:`cancel`)."""
        if run.running:
            run.request_cancel()
            await run.wait()
            return
        async with held_lease(self._rt.store, run.instance_id, self._rt.owner, if_free=True) as held:
            stopped = held is not None and await self._stop(run)
        if held is None:
            await self._rt.store.post(run.instance_id, {"id": new_post_id(), "type": "cancel", "at": now_iso()})
            await self._rt.engine.submit(run.instance_id)  # its runner may be the engine's, far away
            lease = await self._lease_once_free(run, timeout)
            if lease is None:
                await self._rt.loader.refresh(run)
                return
            async with holding(lease, run.instance_id):
                stopped = await self._stop(run)
        if stopped:
            await self._rt.engine.submit(run.instance_id)  # an engine that tracks the instance learns it is done

    async def _lease_once_free(self, run: AgentRun, timeout: float) -> Lease | None:  # noqa: ASYNC109
        """Wait (up to ``timeout`` seconds) for another process's run to stop; return its lease if it comes free.

        There is nothing local to wait on but its header, and its lease: if that comes free
        while the header still says running, the runner died before it read the request, and
        the instance is stopped here.
        """
        with anyio.move_on_after(timeout):
            while (await self._rt.store.read_header(run.instance_id)).get("state") == State.RUNNING.value:
                await anyio.sleep(0.05)
                async with held_lease(self._rt.store, run.instance_id, self._rt.owner, if_free=True) as held:
                    if held is not None:
                        return held.hand_over()
        return None

    async def _stop(self, run: AgentRun) -> bool:
        """Stop a resting instance (or a dead runner's) under its lease; False if it was stopped already."""
        await self._rt.loader.refresh(run)
        inst = run.inst
        if inst.state is State.STOPPED and inst.header.cancelled:
            return False
        with run.changing():
            if inst.state is State.RUNNING and inst.header.queued is not True:
                await self._rt.loop.repair_records(run)  # a dead runner's: the records of its last turn
            del inst.header.queued  # a queued instance is stopped before any runner started it
            # A dead runner's calls, held calls and an open question each get their result.
            await self._rt.loop.settle_cancelled(run)
            await self._rt.loop.set_state(run, State.STOPPED, StopReason.CANCELLED, cancelled=True)
        return True


def _check_digest(instance_id: str, chosen: list[PendingApproval], digest: str) -> None:
    """Refuse the decision unless every chosen call's :func:`~loopwright._types.approval_digest` is ``digest``.

    :raises ApprovalDigestMismatchError: One is not; it names the call and its current digest.
    """
    for p in chosen:
        if (current := approval_digest(p)) != digest:
            raise ApprovalDigestMismatchError(
                f"instance {instance_id}: call {p.tool_call_id!r} pending now is {p.tool} "
                f"{short_json(p.arguments)} with digest {current}, not the digest {digest} decided on; "
                "nothing was decided", instance_id=instance_id, tool_call_id=p.tool_call_id, current_digest=current)
