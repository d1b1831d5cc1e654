"""Starting, resuming and driving run segments: :class:`Driver`.

Every segment runs as a task of the runtime's task group, under the instance's runner lease,
which the task releases when the segment ends (the callers take it with
:func:`~loopwright._lease.held_lease` and hand it over). The driver also creates new
instances (their header, their first state, their set-up: system prompt, initial prompts and
injected calls, task prompt), loads a saved instance's definition and grants (failing closed),
keeps a loaded instance in its tree's one budget, and watches the mailboxes of running
segments for cancel requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from loopwright._capabilities import (
    bind_memory,
    capabilities_to_dict,
    check_store_outside,
    intersect,
    resolve_roots,
)
from loopwright._engine import Decided, LateMail, Mail, Resume, SegmentEnd, Start
from loopwright._gc import BURST
from loopwright._header_fields import ChildLinks, HeaderFields
from loopwright._instance import Instance, message_to_json, new_id, now_iso, shown_call, unanswered_calls
from loopwright._lease import holding
from loopwright._plans import check_templates
from loopwright._replay import fold_checkpoint
from loopwright._run import AgentRun
from loopwright._template import render, render_value, resolve_inputs
from loopwright._types import Message, PendingApproval, State, StopReason, ToolCall, call_digest
from loopwright.errors import (
    ConfigError,
    LeaseLostError,
    LoopwrightError,
    StoreError,
    StoreUnavailableError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from loopwright._definition import Capabilities, Definition
    from loopwright._engine import Segment
    from loopwright._lease import HeldLease
    from loopwright._runtime import Runtime
    from loopwright.abc import Lease

__all__ = ["Driver", "memory_grants", "new_id"]

_log = logging.getLogger("loopwright")

#: Seconds between looks at the mailbox for a cancel request while a segment runs.
_CANCEL_POLL = 0.25


class Driver:
    """The segments of one runtime's instances: creating, starting, resuming and driving them."""

    def __init__(self, runtime: Runtime) -> None:
        """Drive the instances of ``runtime`` (its store, loop, task group and live runs)."""
        self._rt = runtime

    async def create_run(
        self, defn: Definition, inputs: Mapping[str, Any] | None, prompt: str | None, *, grants: Capabilities,
        stream: bool = False, instance_id: str | None = None, links: ChildLinks | None = None,
        spawner: Instance | None = None, history: Sequence[Message] = (), registered: str | None = None,
    ) -> AgentRun:
        """Create an instance of ``defn`` with exactly ``grants`` and start it (see :meth:`start_agent`).

        :param grants: The instance's grants, already narrowed by the caller (never widened here).
        :param links: What a child's header says of its spawner.
        :param spawner: The live instance that started it: it draws from that instance's tree budget.
        :param registered: The name in the assembly's ``agentDefinitions`` ``defn`` was read from:
            whenever the instance is loaded again, its definition is read from the assembly again.
        """
        self._rt.loop  # noqa: B018 - raises if the runtime is not open
        header = self.new_header(defn, inputs, prompt, grants=grants, instance_id=instance_id, history=history,
                                 registered=registered)
        iid = header.instance_id
        grants = memory_grants(defn, header.inputs or {}, grants)
        if links:
            links.write(header)
        self.sign(header)
        # Created with its lease held: a worker polling the store never takes it for a dead runner's.
        async with holding(await self._rt.store.create_leased(iid, header.json, self._rt.owner), iid) as held:
            inst = Instance(id=iid, definition=defn, header=header, grants=grants, task_given=not prompt,
                            spawner=spawner, tree_counted=True)
            run = AgentRun(self._rt, inst)
            run.stream = stream
            self._rt.live.add(run)
            await self.announce_running(inst)
            await self.start_first_segment(run, held)
        return run

    async def announce_running(self, inst: Instance) -> None:
        """Record, and tell observers, a new instance's first state: ``running``."""
        self._rt.recorder.queue(inst.id, "state", {"from": None, "to": State.RUNNING.value, "stopReason": None})
        if self._rt.plugins.impls("loopwright_on_state_change"):
            await self._rt.loop.observe(inst, "loopwright_on_state_change", old=None, new=State.RUNNING.value,
                                    stop_reason=None)

    async def start_first_segment(self, run: AgentRun, held: HeldLease) -> None:
        """Start a new instance's first segment (its set-up, :meth:`begin`, first), under the lease ``held``."""
        await self.start_segment(run, Start(), held, fresh=True)

    def new_header(self, defn: Definition, inputs: Mapping[str, Any] | None, prompt: str | None, *,
                    grants: Capabilities, instance_id: str | None,
                    history: Sequence[Message] = (), registered: str | None = None) -> HeaderFields:
        """Check ``defn`` and ``inputs`` and return a new instance's header (``running``, run by this runtime).

        Every configuration error is raised here, before anything is created. The header is not
        signed yet (:meth:`sign`, once everything it says of its definition and grants is in it).

        :param registered: See :meth:`create_run`.

        :raises ConfigError: The definition or inputs are invalid, or it names unknown tools.
        """
        plan = self._rt.plans.plan(defn)
        values = resolve_inputs(defn, inputs or {})
        check_templates(defn, values)
        task_history = _history_json(defn, history)
        grants = memory_grants(defn, values, grants)
        header = HeaderFields.new(
            instance_id=instance_id or new_id(), name=defn.name,
            definition_path=str(defn.source) if defn.source else None, definition=plan.header_snapshot(),
            inputs=dict(values), capabilities=capabilities_to_dict(grants), created_at=now_iso(),
            model=plan.model_ref, runner=self._rt.owner, task_prompt=prompt, task_history=task_history)
        if registered is not None:
            header.registered_definition = registered
        return header

    def sign(self, header: HeaderFields) -> None:
        """Sign a new row's definition, grants and gates, when the assembly names an integrity key (``_integrity``)."""
        if self._rt.signer is not None:
            self._rt.signer.sign(header.json)

    async def begin(self, run: AgentRun, *, resume: bool = False) -> None:  # noqa: C901 - the set-up, in order
        """First segment of a new instance: system prompt, initial prompts and injected calls, task prompt.

        What has no tool call is saved in as few writes as possible (everything, for a definition
        without injected calls: one write), each initial prompt marked with its index (``ip``)
        and the task prompt marked ``task``. So after a crash, ``resume=True`` carries on from the
        first part that was not saved.
        """
        loop = self._rt.loop
        inst = run.inst
        defn = inst.definition
        values = inst.header.inputs or {}
        prompt = inst.header.task_prompt
        pending: list[tuple[Message, dict[str, Any]]] = []

        async def flush() -> None:
            if pending:
                await loop.save(inst, [entry for _m, entry in pending])
                for message, _entry in pending:
                    await loop.observe(inst, "loopwright_on_message", message=message)
                pending.clear()

        def queue(message: Message, **marks: Any) -> None:
            inst.transcript.append(message)
            pending.append((message, {"t": "msg", "m": message_to_json(message), **marks}))

        has_system = bool(inst.transcript) and inst.transcript[0].role == "system"
        if defn.system_prompt and not (resume and has_system):
            queue(Message(role="system", content=render(defn.system_prompt, values)))
        for n, ip in enumerate(defn.initial_prompts):
            if resume and n <= inst.last_initial:
                continue
            content = render(ip.content, values) if ip.content else None
            if not ip.tool_calls:
                queue(Message(role=ip.role, content=content, source="definition", injected=True), ip=n)
                continue
            calls = tuple(
                ToolCall(id=tc.id or f"injected_{n}_{k}", name=tc.name,
                         arguments=render_value(dict(tc.arguments), values), injected=True)
                for k, tc in enumerate(ip.tool_calls))
            queue(Message(role="assistant", content=content, tool_calls=calls, injected=True), ip=n)
            await flush()
            try:
                await loop.run_calls(run, calls, self._rt.plans.limits_of(inst))
            except SegmentEnd as end:
                if end.reason in (StopReason.WAITING_FOR_APPROVAL, StopReason.WAITING):
                    self.defer_task(inst)
                raise
        for entry in inst.header.task_history:
            role = entry["role"]
            queue(Message(role=role, content=entry["content"], source="api" if role == "user" else None))
        if prompt:
            queue(Message(role="user", content=prompt, source="api"), task=True)
        await flush()

    def defer_task(self, inst: Instance) -> None:
        """Seed 000: the task prompt goes behind a held injected turn; the remaining initial prompts do not run."""
        prompt = inst.header.task_prompt
        if prompt and not any(i.get("behindTurn") for i in inst.header.inbox):
            deferred = {"type": "message", "text": prompt, "source": "api", "at": now_iso(), "behindTurn": True}
            inst.header.inbox = [*inst.header.inbox, deferred]

    def still_beginning(self, inst: Instance) -> bool:
        """Whether a crash stopped the first segment before its task prompt was given or deferred."""
        return bool(inst.header.task_prompt) and not inst.task_given and not any(
            i.get("behindTurn") for i in inst.header.inbox)

    async def start_segment(self, run: AgentRun, segment: Segment, held: HeldLease, *, fresh: bool = False) -> None:
        """Start a segment of kind ``segment`` in the background, under the lease ``held``.

        The lease is handed over to the segment, which releases it when it ends; if anything
        fails before that, the caller's ``held_lease`` block releases it.

        :param fresh: The instance was just created here, so the copy in memory is current.
        :raises LoopwrightError: The runtime is not open, or the instance already runs here.
        """
        if run.running:
            raise LoopwrightError(f"instance {run.instance_id} is already running here")
        if not fresh:
            await self._rt.loader.refresh(run)
            # A cancel posted to a segment that has ended came too late and is dropped; one
            # posted to an instance its dead runner left running still stands: it stops the
            # instance before anything more runs (see _drive).
            if await self._rt.loop.absorb_mail(run, running=run.inst.state is State.RUNNING):
                run.mark_cancelled()
            await self._rt.forest.join_tree(run.inst)
        run.segment_starting()
        self._rt.live.segment_started(run)
        BURST.segment_started()
        try:
            self._rt.start_soon(self._drive, run, segment, held.hand_over())
        except BaseException:
            BURST.segment_ended()
            raise

    async def _drive(self, run: AgentRun, segment: Segment, lease: Lease) -> None:
        """Run segments of ``run`` until it rests (a late message starts the next one), then give ``lease`` back."""
        loop = self._rt.loop
        inst = run.inst
        try:
            while True:
                with run.segment_scope() as scope:
                    await loop.run_segment(run, segment)
                if run.cancelled_in(scope):
                    with anyio.CancelScope(shield=True):
                        await loop.settle_cancelled(run)
                        await loop.set_state(run, State.STOPPED, StopReason.CANCELLED, cancelled=True)
                    break
                # A message that arrived after the last turn boundary starts the next segment
                # now, so nothing posted while the instance was running is left unread.
                if inst.state is State.WAITING_FOR_APPROVAL or not await loop.has_mail(run):
                    break
                segment = LateMail()
        except (LeaseLostError, StoreUnavailableError) as exc:
            # Not the instance's failure: another runner took it over (this one's write was
            # refused), or the store stayed out of reach. Its state stays as last saved, for its
            # new runner or the next worker; the copy here may be ahead of the store.
            run.failure = exc
            run.stale = True
            self._rt.recorder.drop(inst.id)  # the segment's unsaved records go with it
            _log.warning("instance %s: segment ended without a state change: %s", inst.id, exc)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the instance "running"
            run.failure = exc
            with anyio.CancelScope(shield=True):
                loop.record(inst, "error", {"message": f"{type(exc).__name__}: {exc}", "internal": True})
                try:
                    await loop.set_state(run, State.ERROR, StopReason.ERROR, error=f"{type(exc).__name__}: {exc}")
                except StoreError as saving:
                    # Saving the error failed too: the instance stays as last saved (a worker
                    # resumes it); this must not take down the other segments of the runtime.
                    run.stale = True
                    _log.warning("instance %s: cannot save the error state: %s", inst.id, saving)
                except Exception as telling:  # noqa: BLE001 - saved; telling its observers failed (its hooks cannot load)
                    _log.warning("instance %s: error state saved, its observers not told: %s", inst.id, telling)
        finally:
            try:
                # At rest, still holding the lease: a store may fold its log into a checkpoint
                # (only when it grew enough since the last one), so loading it later costs O(1).
                if not run.stale:  # no checkpoint of a copy that may be ahead of the store
                    with anyio.CancelScope(shield=True):
                        await self._rt.store.checkpoint(inst.id, fold_checkpoint)
            except StoreError as exc:
                _log.warning("instance %s: no checkpoint: %s", inst.id, exc)
            finally:
                lease.release()
                run.segment_ended()
                BURST.segment_ended()

    async def watch_for_cancel(self) -> None:
        """While the runtime is open, look for posts other processes made to the instances running here.

        One task for the whole runtime: every :data:`_CANCEL_POLL` seconds it looks at the
        mailbox of each segment running here (an ``fstat`` per instance for the file store), so
        that a cancel request stops even a long tool call. Messages are read at turn boundaries;
        a run that crossed one within the last poll interval read its mailbox then and is skipped.
        """
        while True:
            await anyio.sleep(_CANCEL_POLL)
            fresh = time.monotonic() - _CANCEL_POLL
            for run in self._rt.live.runs():
                if not run.running or not run.cancellable or run.mail_read_at > fresh:
                    continue
                try:
                    posted = await self._rt.loop.cancel_posted(run)
                except StoreError as exc:  # the store is out of reach: look again at the next poll
                    _log.warning("instance %s: cannot look for a cancel request: %s", run.instance_id, exc)
                    continue
                if posted:
                    run.request_cancel()

    async def start_resumed(self, run: AgentRun, held: HeldLease) -> None:
        """Start the segment that continues an instance a dead runner left ``running`` (under the lease ``held``)."""
        # A crash before the first segment saved anything: that segment starts over.
        await self.start_segment(run, Resume(new_segment=not run.inst.begun), held)

    async def start_queued(self, run: AgentRun, held: HeldLease) -> None:
        """Start the first segment of a submitted instance no runner started yet (under the lease ``held``).

        The header stops being ``queued`` before anything else is saved, so a crash from here on
        leaves an instance that a worker resumes as a dead runner's.
        """
        inst = run.inst
        del inst.header.queued
        inst.header.runner = self._rt.owner
        inst.header.updated_at = now_iso()
        inst.tree_counted = True  # a top-level instance that never ran: nothing below it yet
        await self._rt.recorder.write_header(inst)
        await self.announce_running(inst)
        await self.start_first_segment(run, held)

    async def continue_decided(self, run: AgentRun, held: HeldLease) -> None:
        """Go on with a segment whose held calls are all decided (under the lease ``held``).

        A decision applies only to the call it was made on (its ``decisionDigest``): a held call
        whose name or arguments in the log differ from it now is held again, undecided, and
        the segment rests waiting for approval without running anything.
        """
        await self.start_segment(run, Decided(), held)

    def hold_changed(self, inst: Instance) -> bool:
        """Undo the decisions whose call changed since (see :meth:`continue_decided`); return whether any did."""
        calls = {c.id: c for c in unanswered_calls(inst.transcript)[1]}
        changed = False
        kept: list[PendingApproval] = []
        for p in inst.pending_approvals:
            held = calls.get(p.tool_call_id)
            shown = shown_call(held, p) if held is not None else None
            now = call_digest(shown.name, shown.arguments) if shown is not None else None
            if p.decision is not None and now != p.decision_digest:
                changed = True
                self._rt.recorder.queue(inst.id, "approval", {
                    "toolCallId": p.tool_call_id, "tool": p.tool, "decision": None,
                    "reason": "held again: the call is not the one that was decided"})
                p = attrs.evolve(p, decision=None, decision_reason=None, decision_digest=None, decided_by=None,  # noqa: PLW2901
                                 tool=shown.name if shown is not None else p.tool,
                                 arguments=dict(shown.arguments) if shown is not None else p.arguments,
                                 original_digest=p.original_digest if shown is not held else None)
            kept.append(p)
        if changed:
            inst.set_pending(kept)
        return changed

    async def start_for_mail(self, run: AgentRun, held: HeldLease) -> None:
        """Start a new segment of a resting instance to read its mail (under the lease ``held``).

        An instance a dead runner left ``running`` is taken over here too (by :meth:`deliver`):
        the records of its interrupted turn are written again first, as :meth:`resume` does.
        """
        if run.inst.state is State.RUNNING:  # before the new segment's entry: the records of the one cut short
            await self._rt.loop.repair_records(run)
        await self.start_segment(run, Mail(), held)

    def requested_grants(self, capabilities: Capabilities | None) -> Capabilities:
        """Return the grants of a new top-level instance: ``capabilities`` narrowed to the runtime's.

        Relative roots are resolved against the assembly's folder.

        :raises CapabilityError: A granted root would reach the store or a record sink.
        """
        assembly = self._rt.assembly
        if capabilities is not None:
            capabilities = resolve_roots(capabilities, assembly.base_dir)
        grants = intersect(assembly.capabilities, capabilities)
        self.check_out_of_reach(grants)
        return grants

    def check_out_of_reach(self, grants: Capabilities) -> None:
        """Raise CapabilityError if a granted root overlaps the store or a record sink's locations."""
        rt = self._rt
        base = rt.assembly.base_dir
        check_store_outside(rt.store.locations(), grants, base=base)
        if rt.memory is not None:
            check_store_outside(rt.memory.locations(), grants, base=base, what="the memory")
        for sink, spec in zip(rt.recorder.sinks, rt.assembly.records, strict=False):
            check_store_outside(sink.locations(), grants, base=base, what=f"the record sink {spec.kind!r}")



def memory_grants(defn: Definition, values: Mapping[str, Any], grants: Capabilities) -> Capabilities:
    """Return ``grants`` with their memory bound to what ``defn``'s ``memory:`` asks for (see ``bind_memory``).

    :raises ConfigError: The subject, rendered from ``values``, is not a valid subject.
    """
    spec = defn.memory
    if spec is None:
        return bind_memory(grants, None, None)
    subject = None if spec.subject is None else render(spec.subject, values)
    try:
        return bind_memory(grants, spec, subject)
    except ValueError as exc:
        raise ConfigError(f"definition {defn.name!r}: memory.subject: {exc}") from None


def _history_json(defn: Definition, history: Sequence[Message]) -> list[dict[str, str]]:
    """Return the header's ``taskHistory`` for ``history``, or raise ConfigError naming the bad message."""
    if not history:
        return []
    if any(ip.tool_calls for ip in defn.initial_prompts):
        raise ConfigError(f"definition {defn.name!r} injects tool calls in its initialPrompts, which can hold "
                          "the task prompt back; it cannot take a conversation history")
    out = []
    for n, message in enumerate(history):
        if message.role not in ("system", "user", "assistant") or message.tool_calls or message.content is None:
            raise ConfigError(f"history message {n} must be a system, user or assistant message with text "
                              f"and no tool calls (got role {message.role!r})")
        out.append({"role": message.role, "content": message.content})
    return out
