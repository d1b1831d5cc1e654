"""Work for runners: submitting it, picking it up, resuming, and following it, :class:`Work`.

Submitted work is saved in the store first (an instance ``queued``, a message in a mailbox, a
decision in a header), then the engine is told (:meth:`loopwright.abc.Engine.submit`). A
runner picks it up under the instance's lease (:func:`~loopwright._lease.held_lease`) on a
fresh copy, so two runners never advance one instance, and a dead runner's instance is resumed
where its log ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import anyio

from loopwright._header_fields import HeaderFields
from loopwright._instance import now_iso
from loopwright._lease import held_lease
from loopwright._types import PendingApproval, State, StopReason
from loopwright.abc import new_post_id
from loopwright.errors import ConfigError, UnloadableInstanceError

if TYPE_CHECKING:
    import os
    from collections.abc import Sequence

    from loopwright._definition import Capabilities, Definition
    from loopwright._run import AgentRun
    from loopwright._runtime import Runtime
    from loopwright._types import Message

__all__ = ["Work"]


class Work:
    """The runner-facing side of one runtime: submit, pick up, resume, follow."""

    def __init__(self, runtime: Runtime) -> None:
        """Hand work of ``runtime``'s instances to its engine and take it up again."""
        self._rt = runtime

    async def resume(self, instance_id: str) -> AgentRun:
        """Continue an instance a crash left ``running``; a resting instance is left as it is.

        One waiting for approval whose held calls are all decided (the process that saved the
        last decision died before it went on) goes on as that decision would have.

        :raises InstanceLockedError: It is running in another process.
        """
        run = await self._rt.get_agent(instance_id)
        if run.running:
            return run
        async with held_lease(self._rt.store, instance_id, self._rt.owner) as lease:
            await self._rt.loader.refresh(run)
            pending = run.inst.pending_approvals
            if run.inst.state is State.WAITING_FOR_APPROVAL and pending and all(p.decision for p in pending):
                await self._rt.driver.continue_decided(run, lease)
            elif run.inst.state is State.RUNNING and run.inst.header.queued is True:
                await self._rt.driver.start_queued(run, lease)  # submitted, never started: start it here
            elif run.inst.state is State.RUNNING:
                await self._rt.driver.start_resumed(run, lease)
            # else it rests: left as it is (the lease is released on the way out)
        return run

    async def pick_up(
        self, instance_id: str,
    ) -> tuple[AgentRun, Literal["start", "resume", "approval", "message"]] | None:
        """Start the work another process left for an instance, if it has any.

        The one way a runner advances submitted work (``loopwright worker``, an engine's
        worker). Under the instance's lease, on a fresh copy of it: a submitted instance that no
        runner started yet (``queued``, see :meth:`Runtime.submit`) starts its first segment; an
        instance left ``running`` (its runner died) is resumed as by :meth:`~loopwright.Runtime.resume`; one waiting
        for approval whose held calls are all decided goes on as after the last
        :meth:`AgentRun.approve`; a resting one with a message in its mailbox starts a segment
        as :meth:`AgentRun.message` does. A cancel request needs no runner: :meth:`~loopwright.Runtime.cancel`
        stops a resting or queued instance itself, and the runner of a running one reads it.

        A row that cannot be loaded (malformed or tampered with: see
        :class:`~loopwright.errors.UnloadableInstanceError`), or whose definition this runtime
        cannot run, is quarantined (see :meth:`quarantine`) and nothing of it runs.

        :return: The run (its segment started in the background) and which of the four it
            was, or ``None``: nothing to do, or another runner holds the instance.
        :raises UnloadableInstanceError: The row cannot be loaded; ``quarantined`` says whether
            it was saved in state ``error`` for it (not when another runner holds it now, or
            the header itself cannot be read).
        """
        try:
            return await self._pick_up(instance_id)
        except UnloadableInstanceError as exc:
            if await self.quarantine(instance_id, exc.reason):
                raise UnloadableInstanceError(exc.reason, instance_id=instance_id, quarantined=True) from exc
            raise

    async def quarantine(self, instance_id: str, reason: str) -> bool:
        """Save an instance whose row cannot be loaded in state ``error``, so that no worker takes it again.

        Under the instance's lease (if it is free), on the header as the store holds it (never
        loaded: it cannot be): the state becomes ``error`` with stop reason ``error``, the error
        ``quarantined: <reason>`` (what ``loopwright ls`` and ``show`` print), the ``queued``
        mark goes, and a ``quarantined`` record names the reason and this runner. An ``error``
        instance is resting, so :meth:`loopwright.abc.Store.find_work` lists it again only for a
        message posted to it.

        :return: Whether it was saved so; ``False`` when another runner holds it or its header
            cannot be read or written (a row of the wrong shape, a store out of reach).
        """
        async with held_lease(self._rt.store, instance_id, self._rt.owner, if_free=True) as lease:
            if lease is None:
                return False
            try:
                header = HeaderFields(await self._rt.store.read_header(instance_id))
                header.state, header.stop_reason = State.ERROR, StopReason.ERROR
                header.error = f"quarantined: {reason}"
                del header.queued
                header.updated_at = now_iso()
                self._rt.recorder.queue(instance_id, "quarantined", {"reason": reason, "by": self._rt.owner})
                await self._rt.recorder.flush(instance_id)
                await self._rt.store.write_header(instance_id, header.json)
            except Exception:  # noqa: BLE001 - a row too broken to save: left as it is, the caller reports it
                self._rt.recorder.drop(instance_id)
                return False
        return True

    async def _pick_up(  # noqa: PLR0911 - one return per kind of work, or none
        self, instance_id: str,
    ) -> tuple[AgentRun, Literal["start", "resume", "approval", "message"]] | None:
        run = await self._rt.get_agent(instance_id)
        if run.running:
            return None
        async with held_lease(self._rt.store, instance_id, self._rt.owner, if_free=True) as lease:
            if lease is None:
                return None
            # Read again under the lease, the entry log too: the last runner may have appended a
            # result after this copy was read and before its lease lapsed, without a header write
            # (a result repaired from a stale copy would be a second one).
            run.stale = True
            await self._rt.loader.refresh(run)
            inst = run.inst
            try:  # what its segment would refuse only once it runs (a hook set or tool this runtime lacks)
                self._rt.plans.plan(inst.definition)
            except ConfigError as exc:
                raise UnloadableInstanceError(f"its definition cannot run here: {exc}",
                                              instance_id=instance_id) from exc
            pending = inst.pending_approvals
            if inst.state is State.RUNNING and inst.header.queued is True:
                await self._rt.driver.start_queued(run, lease)
                return run, "start"
            if inst.state is State.RUNNING:
                await self._rt.driver.start_resumed(run, lease)
                return run, "resume"
            if inst.state is State.WAITING_FOR_APPROVAL:
                if not pending or any(p.decision is None for p in pending):
                    return None
                await self._rt.driver.continue_decided(run, lease)
                return run, "approval"
            if not await self._rt.loop.has_mail(run):
                return None
            await self._rt.driver.start_for_mail(run, lease)
            return run, "message"

    async def submit(
        self, definition: str | os.PathLike[str] | Definition | Mapping[str, Any],
        inputs: Mapping[str, Any] | None = None, prompt: str | None = None, *,
        capabilities: Capabilities | None = None, instance_id: str | None = None, history: Sequence[Message] = (),
    ) -> str:
        """Create an instance of ``definition`` for a runner to start, hand it to the engine, and return its id.

        Nothing runs here. The checks are those of :meth:`~loopwright.Runtime.start_agent` (registered names, grants
        narrowed to the runtime's, roots out of the store's reach, every configuration error
        before anything is created). The instance is saved ``running`` and ``queued``, with no
        runner: a worker (``loopwright worker``, or the engine's) starts it through
        :meth:`~loopwright.Runtime.pick_up`, which never takes it for a dead runner's. Then
        :meth:`loopwright.abc.Engine.submit` is told; with the ``local`` engine the instance
        waits in the store for a worker. :meth:`~loopwright.Runtime.get_agent` follows it from any process.

        :param definition: As for :meth:`~loopwright.Runtime.start_agent`.
        :param inputs: As for :meth:`~loopwright.Runtime.start_agent`.
        :param prompt: As for :meth:`~loopwright.Runtime.start_agent`.
        :param capabilities: As for :meth:`~loopwright.Runtime.start_agent`.
        :param instance_id: An id to use instead of a generated one.
        :param history: As for :meth:`~loopwright.Runtime.start_agent`.
        :return: The new instance's id.
        :raises ConfigError: The definition or inputs are invalid, or it names unknown tools.
        :raises CapabilityError: A granted root would reach the store or a record sink.
        :raises LoopwrightError: The runtime is not open, or the engine could not take the work
            (the instance stays queued in the store, where a worker's poll finds it).
        """
        self._rt.loop  # noqa: B018 - raises if the runtime is not open
        defn = self._rt.load_definition(definition)
        grants = self._rt.driver.requested_grants(capabilities)
        header = self._rt.driver.new_header(defn, inputs, prompt, grants=grants, instance_id=instance_id,
                                            history=history, registered=self._rt.registered_name(definition))
        header.runner, header.queued, header.submitted_by = None, True, self._rt.owner
        self._rt.driver.sign(header)
        iid = header.instance_id
        await self._rt.store.create(iid, header.json)
        await self._rt.engine.submit(iid)
        return iid

    async def submit_message(self, instance_id: str, text: str, *, source: str = "api") -> None:
        """Post a message to an instance's mailbox for its runner, and tell the engine; nothing runs here.

        A running instance reads it at its next turn boundary; a resting one is picked up by a
        worker (:meth:`~loopwright.Runtime.pick_up`, ``message``); one waiting for approval reads it once its calls
        are decided.

        :raises InstanceNotFoundError: No such instance.
        """
        self._rt.loop  # noqa: B018 - raises if the runtime is not open
        await self._rt.store.read_header(instance_id)
        await self._rt.store.post(instance_id, {"id": new_post_id(), "type": "message", "text": text, "source": source,
                                           "at": now_iso()})
        await self._rt.engine.submit(instance_id)

    async def submit_decision(
        self, instance_id: str, tool_call_id: str | None, decision: Literal["approved", "denied"],
        reason: str | None = None, *, subtree: bool = False, by: str | None = None, digest: str | None = None,
    ) -> list[PendingApproval]:
        """Save decisions on held calls (as :meth:`Runtime.decide` or :meth:`Runtime.decide_subtree`); tell the engine.

        ``by`` names who decided, as in :meth:`Runtime.decide`.

        Nothing continues here: each holder whose calls are now all decided is handed to the
        engine, and so are the callers above it, for runners to continue (:meth:`~loopwright.Runtime.pick_up`,
        ``approval``; a caller a dead runner left ``running``, ``resume``).

        :return: What was decided, each entry naming its holder.
        :raises LoopwrightError: As :meth:`Runtime.decide`.
        """
        run = await self._rt.get_agent(instance_id)
        if subtree:
            decided = await self._rt.steering.decide_subtree(run, decision, reason, by=by, detach=True)
        else:
            decided = await self._rt.steering.decide(run, tool_call_id, decision, reason, by=by, detach=True,
                                                     digest=digest)
        told: list[str] = []
        for holder in dict.fromkeys(str(p.instance_id or instance_id) for p in decided):
            for iid in (holder, *await self._rt.forest.callers(holder)):
                if iid not in told:
                    told.append(iid)
                    await self._rt.engine.submit(iid)
        return decided

    async def submit_resume(self, instance_id: str) -> bool:
        """Hand an instance with work left to the engine, for a runner to continue; nothing runs here.

        Work left: a dead runner's instance (``running``, lease free), a queued one, or one
        waiting for approval whose held calls are all decided.

        :return: Whether it had such work (a resting instance has none; send it a message).
        :raises InstanceNotFoundError: No such instance.
        """
        self._rt.loop  # noqa: B018 - raises if the runtime is not open
        header = HeaderFields(await self._rt.store.read_header(instance_id))
        decided = header.state is State.WAITING_FOR_APPROVAL and header.held_calls_decided()
        if header.state is not State.RUNNING and not decided:
            return False
        await self._rt.engine.submit(instance_id)
        return True

    async def follow_submitted(self, instance_id: str, *, poll: float = 0.2) -> AgentRun:
        """Wait until an instance other runners advance rests with no work left; return its run, reloaded.

        For work handed to an engine (:meth:`Runtime.submit`, :meth:`Runtime.submit_message` ...).
        It rests when it is not ``running`` and has nothing a runner would pick up: no held calls that are all
        decided, and no unread message in its mailbox. An instance ``running`` only because
        calls held in its tree wait for approval counts as resting too (it waits for its
        operator).

        :param poll: Seconds between looks at the store.
        """
        stalled = 0
        while True:
            header = HeaderFields(await self._rt.store.read_header(instance_id))
            if header.state is State.RUNNING:
                stalled = stalled + 1 if await self._rt.forest.tree_approvals(instance_id) else 0
                if stalled >= 2:  # noqa: PLR2004 - twice: a decision taken in between resets it
                    break
            elif not await self._work_left(instance_id, header):
                break
            await anyio.sleep(poll)
        run = await self._rt.get_agent(instance_id)
        if not run.running:
            await self._rt.loader.refresh(run)
        return run

    async def _work_left(self, instance_id: str, header: HeaderFields) -> bool:
        """Whether a resting instance has work for a runner: its held calls all decided, or unread mail."""
        if header.state is State.WAITING_FOR_APPROVAL:
            return header.held_calls_decided()
        cursor = header.inbox_cursor
        posts, _ = await self._rt.store.read_posts(instance_id, cursor if isinstance(cursor, int) else 0)
        return any(p.get("type") == "message" for p in posts)
