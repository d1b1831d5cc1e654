"""The workflow that dispatches one loopwright instance: :class:`InstanceWorkflow`.

This module runs inside Temporal's workflow sandbox, so it imports nothing but the standard
library and ``temporalio``: no model, tool or store is touched here, only the activity
``loopwright.advance`` (:mod:`loopwright_temporal._activities`) does that. The workflow holds no
transcript and makes no decision about the agent: the store is the source of truth, and the
workflow only decides *when* a runner should look at the instance again.

One workflow per instance; its workflow id is the instance id. Its loop:

1. run ``loopwright.advance`` (heartbeating; retried on another worker when its worker dies),
   which advances the instance by one segment under its lease and reports how it rests;
2. start a child workflow for each sub-agent instance not seen before, as soon as the activity
   signals it (``children``: a caller's segment starts its sub-agents while it runs) and again
   from the activity's result, so the tree is visible in Temporal and ``submit(child_id)``
   reaches the child's own workflow;
3. when the instance rests and waits for someone (``waiting``, ``waiting_for_approval``), or has
   a deadline (an armed ``elapsed`` monitor), wait for the ``wake`` signal
   (:meth:`~loopwright_temporal.TemporalEngine.submit` sends it after the store got a message, a
   decision, a cancel) or the deadline's timer; when it is ``stopped`` or in ``error`` with no
   wake pending, the workflow completes (a later ``submit`` starts a new run of the same id);
4. when another runner holds the instance's lease (``busy``), wait a growing back-off (or a
   wake) and look again;
5. after :data:`MAX_ITERATIONS` rounds (``InstanceInput.max_iterations``), or when the server
   suggests it, continue as new, so the history stays bounded; the children already started,
   the pending wakes and the round limit carry over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

__all__ = [
    "ADVANCE",
    "CHILDREN",
    "MAX_ITERATIONS",
    "WAKE",
    "WORKFLOW",
    "Advanced",
    "InstanceInput",
    "InstanceWorkflow",
    "Timeouts",
]

#: The workflow type's name.
WORKFLOW = "loopwright.instance"
#: The activity type's name.
ADVANCE = "loopwright.advance"
#: The signal that says the store holds new work for the instance.
WAKE = "wake"
#: The signal the activity sends its workflow with the ids of sub-agents the segment started.
CHILDREN = "children"
#: Rounds of the loop before the workflow continues as new.
MAX_ITERATIONS = 200
#: Back-off, in seconds, while another runner holds the instance: first and most.
_BUSY_FIRST, _BUSY_MOST = 0.5, 10.0
#: States in which the instance waits for someone: the workflow stays open and waits for a wake.
_WAITS = frozenset({"waiting", "waiting_for_approval"})


@dataclass
class Timeouts:
    """The activity's timeouts, in seconds (from the engine's options).

    Attributes:
        heartbeat: A worker that has not heartbeated for this long is taken for dead, and the
            activity is retried on another worker (which resumes the instance under its lease).
        segment: The most one segment may take (Temporal's start-to-close timeout).
    """

    heartbeat: float = 10.0
    segment: float = 86_400.0


@dataclass
class InstanceInput:
    """What a run of :class:`InstanceWorkflow` starts from.

    Attributes:
        instance_id: The instance (also the workflow id).
        timeouts: The activity's timeouts.
        children: Sub-agent instances whose child workflows were started already.
        wakes: Wake signals received but not acted on yet (carried over a continue-as-new).
        max_iterations: Rounds of the loop before this run continues as new (carried over);
            :data:`MAX_ITERATIONS` unless set (the tests set a few, to see it happen).
    """

    instance_id: str
    timeouts: Timeouts = field(default_factory=Timeouts)
    children: list[str] = field(default_factory=list)
    wakes: int = 0
    max_iterations: int = MAX_ITERATIONS


@dataclass
class Advanced:
    """What ``loopwright.advance`` reports (the activity's result).

    Attributes:
        state: The instance's state after the activity (``missing`` when there is no such instance).
        stop_reason: Its stop reason, if it rests.
        ran: Whether a segment ran (or was followed) in the activity.
        busy: Another runner holds the instance's lease; look again later.
        children: The ids of the instance's sub-agents, as its header lists them.
        deadline: Seconds from now to the instance's next deadline (an armed ``elapsed``
            monitor), or ``None``.
    """

    state: str
    stop_reason: str | None = None
    ran: bool = False
    busy: bool = False
    children: list[str] = field(default_factory=list)
    deadline: float | None = None


@workflow.defn(name=WORKFLOW)
class InstanceWorkflow:
    """Dispatches one instance: run a segment, wait for a wake, a deadline or a free lease, repeat."""

    def __init__(self) -> None:
        self._wakes = 0
        self._reported: list[str] = []

    @workflow.signal(name=WAKE)
    def wake(self) -> None:
        """Say that the store holds new work for the instance (a new instance, a message, a decision, a cancel)."""
        self._wakes += 1

    @workflow.signal(name=CHILDREN)
    def children(self, ids: list[str]) -> None:
        """Record sub-agents the running segment started (their child workflows start at once)."""
        self._reported.extend(i for i in ids if i not in self._reported)

    @workflow.query(name="wakes")
    def pending_wakes(self) -> int:
        """Wakes received and not acted on yet."""
        return self._wakes

    @workflow.run
    async def run(self, given: InstanceInput) -> Advanced:
        """Dispatch the instance until it is stopped (or in error) with nothing left to do."""
        self._wakes += given.wakes
        children = list(given.children)
        self._reported = list(children)
        busy_wait = _BUSY_FIRST
        for _ in range(max(given.max_iterations, 1)):
            self._wakes = 0
            out = await self._advance(given, children)
            await self._start_children(out.children, children, given.timeouts)
            if out.state == "missing":
                return out
            if out.busy:
                await self._wait(busy_wait)
                busy_wait = min(busy_wait * 2, _BUSY_MOST)
                continue
            busy_wait = _BUSY_FIRST
            if self._wakes:
                continue
            if out.state not in _WAITS and out.deadline is None:
                return out
            await self._wait(out.deadline)
            if workflow.info().is_continue_as_new_suggested():
                break
        # History stays bounded: the next run starts from what this one learnt (it raises).
        return workflow.continue_as_new(InstanceInput(instance_id=given.instance_id, timeouts=given.timeouts,
                                                      children=children, wakes=self._wakes,
                                                      max_iterations=given.max_iterations))

    async def _advance(self, given: InstanceInput, started: list[str]) -> Advanced:
        """Run the activity; meanwhile start a child workflow for each child it signals."""
        handle = workflow.start_activity(
            ADVANCE, given.instance_id, result_type=Advanced,
            start_to_close_timeout=timedelta(seconds=given.timeouts.segment),
            heartbeat_timeout=timedelta(seconds=given.timeouts.heartbeat),
            # A dead worker's activity is retried (on any worker) for as long as it takes: the
            # instance's lease, not Temporal, keeps two runners apart.
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                                     maximum_interval=timedelta(seconds=30)),
        )
        while True:
            await workflow.wait_condition(lambda: handle.done() or any(c not in started for c in self._reported))
            await self._start_children(self._reported, started, given.timeouts)
            if handle.done():
                result: Advanced = await handle
                return result

    async def _wait(self, seconds: float | None) -> None:
        """Wait for a wake, or ``seconds`` (forever when ``None``)."""
        if self._wakes:
            return
        timeout = None if seconds is None else timedelta(seconds=max(seconds, 0.0))
        try:
            await workflow.wait_condition(lambda: self._wakes > 0, timeout=timeout)
        except TimeoutError:
            return

    async def _start_children(self, reported: list[str], started: list[str], timeouts: Timeouts) -> None:
        """Start a child workflow for each sub-agent not seen before (ABANDON: it outlives this run)."""
        for child in reported:
            if child in started:
                continue
            started.append(child)
            try:
                await workflow.start_child_workflow(
                    WORKFLOW, InstanceInput(instance_id=child, timeouts=timeouts), id=child,
                    parent_close_policy=ParentClosePolicy.ABANDON)
            except WorkflowAlreadyStartedError:
                continue  # a submit(child) started it first: it dispatches the child all the same
