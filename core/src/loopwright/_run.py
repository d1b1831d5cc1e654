"""An agent run: the handle on one instance that a caller follows, steers, approves and cancels.

An :class:`AgentRun` lives as long as someone holds it (a running segment's task, or a caller);
the runtime keeps it in a weak map. It owns its own segment state: whether a segment runs
(its done event), the cancel scope of that segment and a cancel asked for, the events kept for
late followers, and whether the copy of the instance in memory may be ahead of the store.
"""

from __future__ import annotations

import collections
import contextlib
import math
import weakref
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import attrs

from loopwright._types import AgentResult, Cost, Event, PendingApproval, State, StopReason
from loopwright.errors import RunCancelledError, RunError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Mapping

    from loopwright._instance import Instance
    from loopwright._runtime import Runtime  # the public type of AgentRun.runtime

__all__ = ["AgentRun", "LiveRuns", "RunHost"]

_EVENT_HISTORY = 10_000


class RunHost(Protocol):
    """What an :class:`AgentRun` asks of the runtime it belongs to (:class:`loopwright.Runtime` is one)."""

    def tree_events(self, run: AgentRun) -> AsyncIterator[Event]:
        """Yield the events of ``run`` and of every agent below it that runs here."""

    async def children_cost(self, header: Mapping[str, Any]) -> float | None:
        """Return the summed subtree cost of the agents ``header``'s instance started."""

    async def tree_approvals(self, instance_id: str) -> list[PendingApproval]:
        """Return every undecided call in the subtree of ``instance_id``."""

    async def decide(self, run: AgentRun, tool_call_id: str | None, decision: Literal["approved", "denied"],
                     reason: str | None, *, by: str | None = None, digest: str | None = None,
                     ) -> list[PendingApproval]:
        """Record a decision on held calls; continue once every one is decided (only if ``digest`` matches)."""

    async def deliver(self, run: AgentRun, text: str, source: str) -> None:
        """Deliver a message through the instance's mailbox."""

    async def cancel_run(self, run: AgentRun) -> None:
        """Cancel a run."""


class AgentRun:
    """A handle on one instance: follow it, steer it, approve its calls, cancel it.

    Get one from :meth:`Runtime.start_agent` or :meth:`Runtime.get_agent`. Every method works
    whether the instance is running in this runtime or resting in the store.
    """

    def __init__(self, runtime: RunHost, inst: Instance) -> None:
        """Wrap ``inst``; only the runtime makes these."""
        self._rt = runtime
        self.inst = inst
        self.stream = False
        #: The last turn whose answer was streamed, so a retried stream can announce a reset.
        self.streamed_turn = 0
        #: ``ask_user`` calls the crash repair ran again and that now wait for an answer.
        self.awaiting_after_repair: set[str] = set()
        self.failure: BaseException | None = None
        self._subscribers: list[Any] = []
        self._history: collections.deque[Event] = collections.deque(maxlen=_EVENT_HISTORY)
        self._done = anyio.Event()
        self._done.set()
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False
        #: The copy in memory may be ahead of the store (a segment ended on a refused or failed write).
        self.stale = False
        #: When (``time.monotonic()``) the loop last read the mailbox at a turn boundary.
        self.mail_read_at = 0.0

    @property
    def runtime(self) -> Runtime:
        """The runtime this run belongs to."""
        return self._rt  # type: ignore[return-value]  # the runtime is the only RunHost outside tests

    def __repr__(self) -> str:
        return f"AgentRun({self.instance_id!r}, state={self.inst.state.value!r})"

    @property
    def instance_id(self) -> str:
        """The instance's id."""
        return self.inst.id

    @property
    def state(self) -> State:
        """The instance's state now."""
        return self.inst.state

    @property
    def running(self) -> bool:
        """Whether a run segment is executing in this runtime."""
        return not self._done.is_set()

    # -- events ---------------------------------------------------------------------------

    def publish(self, event: Event) -> None:
        """Deliver an event to every follower and keep it for followers who come later."""
        self._history.append(event)
        for send in self._subscribers:
            send.send_nowait(event)

    async def events(self, *, subtree: bool = False) -> AsyncIterator[Event]:
        """Yield the events of the current run segment, from its start, until the instance rests.

        Events: ``state``, ``text``, ``usage``, ``tool_call``, ``tool_result`` and ``approval``.
        If no segment is running, yields what the last segment produced and returns.

        :param subtree: Also yield the events of every agent it starts (and theirs) that runs
            in this runtime, as they happen, until this instance rests. Each event's ``data``
            then carries ``depth`` (0 for this instance) and ``agent`` (its definition's name),
            and ``instance_id`` names its instance, so that a host can draw a live tree.
        """
        if subtree:
            async for event in self._rt.tree_events(self):
                yield event
            return
        backlog = list(self._history)
        if not self.running:
            for event in backlog:
                yield event
            return
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        self._subscribers.append(send)  # closed by the runtime when the segment ends
        try:
            for event in backlog:
                yield event
            async for event in receive:
                yield event
        finally:
            if send in self._subscribers:
                self._subscribers.remove(send)
            send.close()
            receive.close()

    def close_followers(self) -> None:
        """End every :meth:`events` iteration once it has drained (the segment ended)."""
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()

    # -- waiting ----------------------------------------------------------------------------

    async def wait(self) -> AgentResult:
        """Wait until the instance rests and return its result, raising nothing.

        ``subtree_cost`` includes the agents it started, read from the store now.
        """
        await self._done.wait()
        inst = self.inst
        if not inst.header.children:
            return inst.result()
        inst.children_cost = Cost(amount=await self._rt.children_cost(inst.header.json))
        return attrs.evolve(inst.result(), pending_approvals=tuple(await self._rt.tree_approvals(self.instance_id)))

    async def pending_approvals(self) -> tuple[PendingApproval, ...]:
        """Return every undecided call in this instance's subtree (its own first), read from the store.

        Each entry names the instance that holds it (``instance_id``) and the ``path`` from
        this instance down to that one; decide any of them with :meth:`approve` or
        :meth:`deny` and its ``tool_call_id``.
        """
        return tuple(await self._rt.tree_approvals(self.instance_id))

    async def result(self) -> AgentResult:
        """Wait until the instance rests and return its :class:`~loopwright.AgentResult`.

        :raises RunError: The model failed for good (``.cause`` holds the provider error) or a
            hook blocked the model call (:class:`~loopwright.errors.HookBlockedError`).
        :raises RunCancelledError: The run was cancelled; ``.result`` holds the saved result.

        Ending on ``max_iterations`` or another limit raises nothing: the result says so.
        """
        result = await self.wait()
        if result.cancelled and result.state is State.STOPPED:
            raise RunCancelledError(f"run of instance {self.instance_id} was cancelled", result=result)
        if result.state is State.ERROR and result.stop_reason is StopReason.ERROR:
            failure = self.failure
            if isinstance(failure, RunError):
                failure.result = result
                raise failure
            raise RunError(f"instance {self.instance_id} failed: {result.error}", result=result, cause=failure)
        return result

    # -- steering ---------------------------------------------------------------------------

    async def approve(self, tool_call_id: str | None = None, *, by: str | None = None,
                      digest: str | None = None) -> None:
        """Approve a held call (all of this instance's when ``tool_call_id`` is None).

        ``tool_call_id`` may name a call held anywhere in this instance's subtree: it is
        decided on the instance that holds it, which goes on once all its calls are decided,
        and so do the callers above it that wait for it. ``by`` names who decided (saved as
        ``decidedBy``). With ``digest`` (the :func:`~loopwright._types.approval_digest` shown),
        the call is approved only if it is still exactly that call.

        :raises ApprovalDigestMismatchError: ``digest`` is not the pending call's; nothing runs.
        :raises LoopwrightError: No such call is waiting for approval (any more).
        """
        await self._rt.decide(self, tool_call_id, "approved", None, by=by, digest=digest)

    async def deny(self, tool_call_id: str | None = None, reason: str | None = None, *, by: str | None = None,
                   digest: str | None = None) -> None:
        """Deny a held call (as :meth:`approve` finds it, ``digest`` too); the model sees ``denied`` with ``reason``."""
        await self._rt.decide(self, tool_call_id, "denied", reason, by=by, digest=digest)

    async def message(self, text: str, *, source: str = "api") -> None:
        """Send a message: read at the next turn boundary if running, else it starts a new segment.

        From ``api`` or ``user`` to an instance waiting on ``ask_user``, it is the answer.
        While approvals are pending it waits until they are decided.
        """
        await self._rt.deliver(self, text, source)

    # -- the segment's life (driven by the runtime's driver) ---------------------------------

    def segment_starting(self) -> None:
        """Mark a segment as started: :attr:`running` until :meth:`segment_ended`, its events kept from here."""
        self._done = anyio.Event()
        self._history.clear()
        self.failure = None

    @contextlib.contextmanager
    def segment_scope(self) -> Iterator[anyio.CancelScope]:
        """Run a piece of the segment in a cancel scope that :meth:`request_cancel` cancels.

        A cancel requested before the scope opened (a cancel read from the mailbox) cancels it
        at once. :meth:`cancelled_in` then says whether the scope ended for that reason.
        """
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self._cancelled:
                scope.cancel()
            yield scope

    def cancelled_in(self, scope: anyio.CancelScope) -> bool:
        """Whether ``scope`` (from :meth:`segment_scope`) ended because a cancel was requested."""
        return scope.cancelled_caught and self._cancelled

    @property
    def cancellable(self) -> bool:
        """Whether a segment scope is open, so that :meth:`request_cancel` stops it now."""
        return self._scope is not None

    def mark_cancelled(self) -> None:
        """Ask for a cancel that the next :meth:`segment_scope` applies (a cancel found before it opened)."""
        self._cancelled = True

    def segment_ended(self) -> None:
        """Mark the segment as ended: the run rests, its waiters wake and its followers drain."""
        self._scope = None
        self._cancelled = False
        self._done.set()
        self.close_followers()

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Make :meth:`wait` wait while the runtime changes a resting instance outside a segment (a cancel)."""
        self._done = anyio.Event()
        try:
            yield
        finally:
            self._done.set()

    def request_cancel(self) -> None:
        """Cancel the running segment from inside it (a cancel request reached its runner)."""
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    async def cancel(self) -> None:
        """Stop the run: the instance becomes ``stopped`` with ``cancelled: true``; the partial turn is kept."""
        await self._rt.cancel_run(self)


class LiveRuns:
    """The runs and instances one runtime holds now, and who follows the segments that start here.

    Both maps are weak: a run is kept while something holds it (its segment's task, or a
    caller), an instance while a run or a child whose spawner it is holds it, so that one
    object per instance charges the tree's one ledger.

    Attributes:
        watchers: Called with each run whose segment starts here (the followers of a live tree).
    """

    def __init__(self) -> None:
        """Hold nothing yet."""
        self._runs: weakref.WeakValueDictionary[str, AgentRun] = weakref.WeakValueDictionary()
        self._instances: weakref.WeakValueDictionary[str, Instance] = weakref.WeakValueDictionary()
        self.watchers: list[Callable[[AgentRun], None]] = []

    def run(self, instance_id: str) -> AgentRun | None:
        """Return the run of ``instance_id`` held here, if any."""
        return self._runs.get(instance_id)

    def instance(self, instance_id: str) -> Instance | None:
        """Return the live instance ``instance_id``, if anything here holds it."""
        return self._instances.get(instance_id)

    def add(self, run: AgentRun) -> None:
        """Hold ``run`` and its instance."""
        self._instances[run.instance_id] = run.inst
        self._runs[run.instance_id] = run

    def forget(self, instance_id: str) -> None:
        """Hold ``instance_id``'s run and instance no more (the instance was deleted)."""
        self._runs.pop(instance_id, None)
        self._instances.pop(instance_id, None)

    def runs(self) -> list[AgentRun]:
        """Return every run held here now."""
        return list(self._runs.values())

    def running(self) -> list[AgentRun]:
        """Return the runs with a segment running here now."""
        return [run for run in self.runs() if run.running]

    def segment_started(self, run: AgentRun) -> None:
        """Tell every watcher that a segment of ``run`` starts."""
        for watch in list(self.watchers):
            watch(run)
