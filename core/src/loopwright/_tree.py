"""The instance tree, read from the store or followed live: :class:`Trees`.

An instance's tree is the agents it started, their agents, and so on (each header lists its
``children`` and names its ``spawnerInstanceId``). :class:`Trees` answers what the operator
asks of a tree: its cost, the calls held anywhere in it, its nested view, whether it waits for
a person, and the live events of every instance of it that runs here; it wakes the callers a
stopped process left waiting, and links an instance loaded from the store into its tree's one
budget (:meth:`Trees.join_tree`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from loopwright import _reading
from loopwright._header_fields import HeaderFields
from loopwright._replay import log_totals
from loopwright._types import Event, PendingApproval, State
from loopwright._views import own_cost
from loopwright.errors import InstanceLockedError, InstanceNotFoundError, LoopwrightError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import TaskGroup

    from loopwright._header import InstanceHeader
    from loopwright._instance import Instance
    from loopwright._run import AgentRun
    from loopwright._runtime import Runtime

__all__ = ["Trees"]


class Trees:
    """The trees of one runtime's instances: queries over saved headers, and live followers."""

    def __init__(self, runtime: Runtime) -> None:
        """Read trees through ``runtime`` (its store and the runs it holds)."""
        self._rt = runtime

    async def subtree_cost(self, instance_id: str, header: Mapping[str, Any] | None = None) -> float | None:
        """Return the instance's cost plus that of every agent it started (:func:`loopwright._reading.subtree_cost`)."""
        return await _reading.subtree_cost(self._rt.store, instance_id, header)

    async def children_cost(self, header: Mapping[str, Any] | InstanceHeader) -> float | None:
        """Return the summed subtree cost of the agents ``header``'s instance started (``None`` if unknown)."""
        return await _reading.children_cost(self._rt.store, header)

    async def descendant_headers(self, header: Mapping[str, Any]) -> dict[Any, InstanceHeader]:
        """Return the saved headers of the agents ``header``'s instance started, directly or not, by id."""
        return await _reading.descendant_headers(self._rt.store, header)

    async def tree_approvals(self, instance_id: str) -> list[PendingApproval]:
        """Return every undecided call in the subtree of ``instance_id``, read from the store."""
        return await _reading.tree_approvals(self._rt.store, instance_id)

    async def tree(self, instance_id: str) -> dict[str, Any]:
        """Return the instance tree below ``instance_id`` as nested objects (:func:`loopwright._reading.tree`)."""
        return await _reading.tree(self._rt.store, instance_id)

    async def trees(self) -> list[dict[str, Any]]:
        """Return every tree in the store, one node per root, oldest first (:func:`loopwright._reading.trees`)."""
        return await _reading.trees(self._rt.store)

    def stalled(self, instance_id: str) -> bool:
        """Whether the instance can go on only after a person decides calls held in its tree.

        True for an instance resting in ``waiting_for_approval``, and for one running here that
        waits in ``await_agent`` for agents of which some are stalled and the others finished
        (a wait for all of them cannot end before the stalled ones go on). Read from what this
        runtime holds in memory (no store access): for the CLI, to stop following a tree that
        waits for its operator.
        """
        return self._stalled(instance_id, set())

    def _stalled(self, instance_id: str, seen: set[str]) -> bool:
        if instance_id in seen:
            return False
        seen.add(instance_id)
        run = self._rt.live.run(instance_id)
        if run is None:
            inst = self._rt.live.instance(instance_id)
            return inst is not None and inst.state is State.WAITING_FOR_APPROVAL
        if not run.running:
            return run.inst.state is State.WAITING_FOR_APPROVAL
        ids = self._rt.awaiting.get(instance_id)
        if not ids:
            return False
        stalled = [i for i in ids if self._stalled(i, seen)]
        return bool(stalled) and all(i in stalled or self._finished(i) for i in ids)

    def _finished(self, instance_id: str) -> bool:
        """Whether an instance known here rests in a state that ends a wait for it (not for approval)."""
        run = self._rt.live.run(instance_id)
        inst = run.inst if run is not None else self._rt.live.instance(instance_id)
        if inst is None or (run is not None and run.running):
            return False
        return inst.state not in {State.RUNNING, State.WAITING_FOR_APPROVAL}

    async def tree_events(self, run: AgentRun) -> AsyncIterator[Event]:
        """Yield the events of ``run`` and of every agent below it that runs here (see :meth:`AgentRun.events`).

        Each event keeps its ``instance_id``; its ``data`` gets ``depth`` (0 for ``run``) and
        ``agent`` (the instance's definition name).
        """
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        root = run.instance_id
        scope = anyio.CancelScope()
        group: list[TaskGroup] = []

        def depth_of(inst: Instance) -> int | None:
            depth = 0
            current: Instance | None = inst
            while current is not None and current.id != root:
                current = current.spawner
                depth += 1
            return depth if current is not None else None

        async def pump(target: AgentRun, depth: int) -> None:
            async for event in target.events():
                send.send_nowait(attrs.evolve(event, data={**event.data, "depth": depth,
                                                            "agent": target.inst.definition.name}))

        def started(other: AgentRun) -> None:
            """Follow a segment starting here if it belongs to the tree (its events are kept from its start)."""
            depth = depth_of(other.inst) if other is not run else None
            if depth is not None and group:
                group[0].start_soon(pump, other, depth)

        async def drive() -> None:
            try:
                with scope:
                    async with anyio.create_task_group() as tg:
                        group.append(tg)
                        for other in self._rt.live.running():
                            started(other)
                        await pump(run, 0)  # until this instance rests
                        tg.cancel_scope.cancel()
            finally:
                self._rt.live.watchers.remove(started)
                send.close()

        self._rt.start_soon(drive)  # raises if the runtime is not open; the task starts after the next line
        self._rt.live.watchers.append(started)
        try:
            async with receive:
                async for event in receive:
                    yield event
        finally:
            scope.cancel()

    async def _above(self, instance_id: str) -> AsyncIterator[tuple[str, dict[str, Any] | None]]:
        """Yield each id above ``instance_id`` (its spawner, theirs ...) with its saved header, up to the root.

        A spawner whose header is gone is yielded with ``None`` and ends the walk; so does a
        tampered link that would make a loop (not yielded).
        """
        seen = {instance_id}
        current: dict[str, Any] | None = await self._rt.store.read_header(instance_id)
        while current is not None:
            spawner = HeaderFields(current).spawner_instance_id
            if not isinstance(spawner, str) or not spawner or spawner in seen:
                return
            seen.add(spawner)
            try:
                current = await self._rt.store.read_header(spawner)
            except InstanceNotFoundError:
                current = None
            yield spawner, current

    async def callers(self, instance_id: str) -> list[str]:
        """Return the ids above ``instance_id`` (its spawner, theirs ...) up to the root, from the saved headers."""
        return [spawner async for spawner, _header in self._above(instance_id)]

    async def wake_callers(self, instance_id: str) -> list[str]:
        """Continue, in order up to the root, the callers of ``instance_id`` a stopped process left ``running``.

        A caller that waited in ``await_agent`` when its process stopped is resumed here (its
        wait runs again); one running here or in another process is left to its runner.

        :return: The ids of the callers resumed.
        """
        woken: list[str] = []
        async for spawner, current in self._above(instance_id):
            if current is None:
                break
            live = self._rt.live.run(spawner)
            if current.get("state") != State.RUNNING.value or (live is not None and live.running):
                continue
            try:
                await self._rt.work.resume(spawner)
            except InstanceLockedError:
                continue
            woken.append(spawner)
        return woken

    async def join_tree(self, inst: Instance) -> None:
        """Make an instance loaded from the store draw from its tree's one budget.

        Each instance on the way up is counted once per runtime (:meth:`_count_tree`), and linked
        to its spawner's live instance, loading the spawner if it is not live here. A spawner
        that cannot be loaded ends the chain (the saved ``budget`` still caps the instance); a
        tampered link that would make a loop is not followed.
        """
        current = inst
        while True:
            await self._count_tree(current)
            spawner_id = current.header.spawner_instance_id
            if current.spawner is not None or not isinstance(spawner_id, str) or not spawner_id:
                return
            try:
                parent = (await self._rt.get_agent(spawner_id)).inst
            except LoopwrightError:
                return
            if any(above is current for above in (parent, *parent.ancestors())):
                return
            current.spawner = parent
            current = parent

    async def _count_tree(self, inst: Instance) -> None:
        """Set a loaded instance's tree counters from its descendants' saved headers (once per runtime).

        ``descendants`` counts them all; the tokens, cost and tool calls are those of the descendants
        created since its current segment started (their whole spending: more than their share,
        never less), from the totals in their headers, or from the entry log of one a crash left
        ``running`` (its header's totals are those of its last state change).
        """
        if inst.tree_counted:
            return
        inst.tree_counted = True
        headers = await self.descendant_headers(inst.header.json)
        started = inst.header.segment_started_at
        since = _iso(float(started)) if isinstance(started, (int, float)) else ""
        tokens, calls = 0, 0
        cost: float | None = 0.0
        for iid, h in headers.items():
            if str(h.created_at or "") < since:
                continue
            if h.state == State.RUNNING.value:  # its totals were saved at its last state change: replay its log
                usage, spent, ran = log_totals(await self._rt.store.read_entries(iid))
                tokens += usage.input_tokens + usage.output_tokens
                calls += ran
                cost = None if cost is None or spent.amount is None else cost + spent.amount
                continue
            started_calls = h.tool_calls_started
            calls += started_calls if isinstance(started_calls, int) and not isinstance(started_calls, bool) \
                and started_calls > 0 else 0
            saved = h.usage
            if isinstance(saved, Mapping):
                tokens += sum(n for n in (saved.get("inputTokens"), saved.get("outputTokens"))
                              if isinstance(n, int) and not isinstance(n, bool) and n > 0)
            amount = own_cost(h)
            cost = None if cost is None or not isinstance(amount, (int, float)) else cost + max(amount, 0.0)
        inst.descendants = max(inst.descendants, len(headers))
        inst.tree_tokens += tokens
        inst.tree_tool_calls += calls
        inst.tree_cost = None if inst.tree_cost is None or cost is None else inst.tree_cost + cost


def _iso(seconds: float) -> str:
    """Return ``seconds`` since the epoch in the form of ``now_iso`` (so the two compare as text)."""
    whole = int(seconds)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(whole))}.{int((seconds - whole) * 1000):03d}Z"
