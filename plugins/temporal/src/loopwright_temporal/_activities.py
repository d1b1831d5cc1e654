"""The activity ``loopwright.advance``: advance one instance by a segment, in a worker process.

The worker process keeps one open :class:`loopwright.Runtime` over the assembly's store (and its
plugins, providers and tools) for all its activities. An activity:

1. hands the instance to :meth:`loopwright.Runtime.pick_up`, which takes the instance's lease,
   checks again under it and starts what is due: the resume of an instance whose runner died
   (or that was just submitted), the continuation after decisions, a new segment for mail;
2. or, when a segment of the instance already runs in this process (a sub-agent its caller
   started here, a monitor that fired here), follows that one;
3. waits for the segment to rest, heartbeating every :data:`HEARTBEAT_EVERY` seconds, so that a
   worker that dies (SIGKILL, a lost machine) is noticed within the heartbeat timeout and the
   activity is retried on another worker, where ``pick_up`` resumes the instance from its
   journal: exactly-once rules decide the call that was in flight (an idempotent call runs
   again, any other one gets ``unknown_outcome``);
4. reports how the instance rests (:class:`~loopwright_temporal._workflow.Advanced`).

When another process holds the instance's lease the activity reports ``busy`` at once (the
workflow looks again after a back-off): the lease, not Temporal, keeps two runners apart, so a
retried activity that lands while the dead worker's lease lingers, or a CLI that decides a
call, never makes a second runner.

A cancelled activity (the worker drains past its grace, or Temporal gave up on the attempt)
only stops following: the segment belongs to the runtime, which the worker closes on its way
out, and closing stops it the way a crash would, but cleanly (its lease is released at once).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal

import anyio
from temporalio import activity

from loopwright import HeaderFields
from loopwright.errors import InstanceLockedError, InstanceNotFoundError
from loopwright_temporal._workflow import ADVANCE, CHILDREN, Advanced

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwright import AgentRun, Runtime

__all__ = ["HEARTBEAT_EVERY", "Advancer", "next_deadline"]

#: Seconds between heartbeats while a segment runs (well under any heartbeat timeout).
HEARTBEAT_EVERY = 1.0
#: Seconds an activity woken by a deadline waits for this runtime's monitors to fire it.
_MONITOR_WAIT = 2.0


def next_deadline(header: HeaderFields, now: float) -> float | None:
    """Return the seconds from ``now`` to the instance's next ``elapsed`` monitor, or ``None``."""
    ends = [float(spec["elapsedAt"]) for spec in header.monitors
            if isinstance(spec, dict) and isinstance(spec.get("elapsedAt"), (int, float))]
    return max(min(ends) - now, 0.0) if ends else None


class Advancer:
    """Holds the worker's runtime; :meth:`advance` is the activity.

    Attributes:
        runtime: The open runtime whose store, plugins and providers run the instances.
        log: Called with one line per segment started or followed, and per rest (the worker's log).
    """

    def __init__(self, runtime: Runtime, log: Callable[[str], None] | None = None) -> None:
        """Advance instances with ``runtime`` (open for the worker's lifetime)."""
        self.runtime = runtime
        self.log = log or (lambda _line: None)

    @activity.defn(name=ADVANCE)
    async def advance(self, instance_id: str) -> Advanced:
        """Advance ``instance_id`` by one segment (see the module docstring); report how it rests."""
        rt = self.runtime
        try:
            run = await self._start(instance_id)
            if run is None:
                return Advanced(state="running", busy=True)
            if run is not False:
                info = activity.info()
                self.log(f"advancing {instance_id} (attempt {info.attempt})")
                await _follow(run)
            header = HeaderFields(await rt.store.read_header(instance_id))
        except InstanceNotFoundError:
            return Advanced(state="missing")
        stop = header.stop_reason
        if run is not False:
            self.log(f"rested {instance_id}: {header.state}" + (f" ({stop})" if stop else ""))
        return Advanced(state=str(header.state), stop_reason=None if stop is None else str(stop), ran=run is not False,
                        children=[str(c) for c in header.children], deadline=next_deadline(header, time.time()))

    async def _start(self, instance_id: str) -> AgentRun | Literal[False] | None:
        """Start (or find) the segment to follow; ``False``: nothing to do; ``None``: another runner holds it."""
        rt = self.runtime
        picked = await rt.pick_up(instance_id)
        if picked is not None:
            return picked[0]
        run = await rt.get_agent(instance_id)
        if run.running:
            return run
        try:
            lease = await rt.store.acquire(instance_id, rt.owner)
        except InstanceLockedError:
            return None
        lease.release()
        deadline = next_deadline(run.inst.header, time.time())
        if deadline is not None and deadline <= 0:
            # The timer of an ``elapsed`` monitor: this runtime watches the monitors of the
            # instances it loaded (pick_up loaded this one); firing one messages the watcher.
            with anyio.move_on_after(_MONITOR_WAIT):
                while not run.running:  # noqa: ASYNC110 - a segment the monitor starts sets no event here
                    await anyio.sleep(0.05)
            if run.running:
                return run
        return False


async def _follow(run: AgentRun) -> None:
    """Wait for the segment to rest, heartbeating meanwhile; signal the sub-agents it starts to the workflow."""
    told = set(run.inst.header.children)
    while run.running:
        activity.heartbeat(run.inst.turn)
        with anyio.move_on_after(HEARTBEAT_EVERY):
            await run.wait()
        # A caller lists a child before creating it (loopwright issue 17): signal it once it exists.
        new = [str(c) for c in run.inst.header.children if c not in told and await _exists(run, str(c))]
        if new and run.running:
            # The caller's segment goes on (it may wait for them in await_agent): its workflow
            # starts their child workflows now, so a decision deep in the tree reaches them.
            info = activity.info()
            await activity.client().get_workflow_handle(info.workflow_id or run.instance_id).signal(CHILDREN, new)
            told.update(new)


async def _exists(run: AgentRun, instance_id: str) -> bool:
    """Whether the store holds ``instance_id`` (a child its caller listed may not be created yet)."""
    try:
        await run.runtime.store.read_header(instance_id)
    except InstanceNotFoundError:
        return False
    return True
