"""``loopwright worker``: a long-running process that runs the work other processes leave in the store.

Every poll interval (or sooner, when a segment it runs rests, or when work is submitted in its
own process) the worker asks the store for instances that may have work
(:meth:`loopwright.abc.Store.find_work`) and hands each to :meth:`loopwright.Runtime.pick_up`,
which takes the instance's lease, checks again under it and starts a segment: the first segment
of a submitted instance (``run --detach``, :meth:`loopwright.Runtime.submit`), a resume for an
instance whose runner died (these go ahead of the queue), the continuation of one whose held
calls were all decided elsewhere, or a new segment for a resting one with mail. The lease is what
keeps two workers (on one machine or many) from running one instance at once; a worker never
waits for a lease, it moves on. An instance whose saved row cannot be loaded (malformed or
tampered with) is quarantined, not retried: it is saved in state ``error`` with a
``quarantined:`` error, and the worker goes on serving the others (one bad row never stops a
fleet).

Stopping (SIGTERM, or SIGINT/Ctrl-C): the worker takes no more work and waits up to ``--grace``
for its segments to rest on their own. Segments still running then are stopped the way a crash
would stop them, but cleanly: whatever they saved stays saved, the instance stays ``running``
and its lease is released at once, so another worker resumes it at its next poll (a call in
flight is answered as after a crash). A second signal skips the wait.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import anyio
import click

from loopwright._instance import now_iso
from loopwright._runtime import Runtime, result_to_json
from loopwright.builtins.local_engine import LocalEngine
from loopwright.cli._exits import EXIT_CANCELLED, EXIT_ERROR, EXIT_OK
from loopwright.cli._output import status_line
from loopwright.display import safe_json, safe_text
from loopwright.errors import (
    InstanceLockedError,
    InstanceNotFoundError,
    LeaseLostError,
    LoopwrightError,
    StoreUnavailableError,
    UnloadableInstanceError,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from loopwright._runtime import AgentRun
    from loopwright.cli._settings import CliSettings

__all__ = ["Worker", "worker"]

#: Seconds a worker leaves an instance alone after picking it up failed (a broken header, a store error).
_BACKOFF = 30.0
#: Extra candidates asked of the store beyond the free slots, for those another runner holds.
_SLACK = 16


class Worker:
    """Serves the instances of one runtime's store until stopped (or, with ``once``, until idle).

    Attributes:
        rt: The open runtime whose store and plugins run the instances.
        poll: Seconds between looks at the store when nothing wakes the worker sooner.
        max_concurrent: The most segments run at once.
        once: Run what there is to do, wait for it to rest, and return.
        grace: Seconds to let running segments rest after a stop signal.
    """

    def __init__(self, rt: Runtime, settings: CliSettings, *, poll: float, max_concurrent: int, once: bool,
                 grace: float) -> None:
        """Describe the worker; :meth:`serve` runs it."""
        self.rt = rt
        self.poll = poll
        self.max_concurrent = max_concurrent
        self.once = once
        self.grace = grace
        self._json = settings.json
        self._active: dict[str, AgentRun] = {}
        self._backoff: dict[str, float] = {}
        self._wake = anyio.Event()
        self._stopped = anyio.Event()
        self._signal: int | None = None
        self._signals = 0
        self._failed = False
        self._filling: anyio.CancelScope | None = None
        self._collected_at: float | None = None

    # -- output -----------------------------------------------------------------------------------

    def _line(self, data: dict[str, Any], text: str) -> None:
        """Print a line of the worker's log: ``data`` as JSON under ``--json``, else ``text``; both safe to show."""
        if self._json:
            click.echo(safe_json(data, separators=(",", ":")))
        else:
            click.echo(safe_text(text))

    def _note(self, text: str) -> None:
        """Print a diagnostic on stderr (not under ``--json``)."""
        if not self._json:
            click.echo(text, err=True)

    def _error(self, instance_id: str | None, exc: BaseException) -> None:
        text = str(exc)
        message = text if isinstance(exc, LoopwrightError) and text else (
            f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
        where = f"instance {instance_id}: " if instance_id else ""
        click.echo(f"error: {where}{safe_text(message, multiline=True)}", err=True)
        if self._json:
            self._line({"event": "error", "instanceId": instance_id, "error": message, "at": now_iso()}, "")

    # -- running ----------------------------------------------------------------------------------

    async def serve(self) -> int:
        """Take work until stopped; return the exit code (0, 130 after SIGINT, 1 if ``once`` failed)."""
        self._note(f"worker: serving {self.rt.store!r}, polling every {self.poll:g} s, "
                   f"up to {self.max_concurrent} at once")
        engine = self.rt.engine
        unsubscribe = engine.subscribe(lambda _iid: self._wake.set()) if isinstance(engine, LocalEngine) else None
        try:
            return await self._serve()
        finally:
            if unsubscribe is not None:
                unsubscribe()

    async def _serve(self) -> int:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_signals)
            await self._take_work(tg)
            if self._active:
                if self._signal is not None:
                    self._note(f"worker: stopping: waiting up to {self.grace:g} s for "
                               f"{len(self._active)} segment{'' if len(self._active) == 1 else 's'} to rest")
                with anyio.move_on_after(self.grace if self._signal is not None else None):
                    while self._active and not (self._signals > 1):
                        self._wake = anyio.Event()
                        await self._wake.wait()
            left = sorted(self._active)
            tg.cancel_scope.cancel()
        if left:
            for iid in left:
                self._line({"event": "left", "instanceId": iid, "state": "running", "at": now_iso()},
                           f"left running {iid}: another worker resumes it")
        if self._signal == signal.SIGINT:
            return EXIT_CANCELLED
        return EXIT_ERROR if self._failed else EXIT_OK

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self._signals += 1
                if self._signal is None:
                    self._signal = int(signum)
                self._stopped.set()
                self._wake.set()
                if self._filling is not None:
                    self._filling.cancel()

    async def _take_work(self, tg: TaskGroup) -> None:
        while not self._stopped.is_set():
            # A fresh event before looking: a segment that rests (or work submitted here) while
            # the store is read wakes the wait below at once, instead of at the next poll.
            self._wake = anyio.Event()
            started = 0
            with anyio.CancelScope() as self._filling:  # a stop signal ends a look the store keeps retrying
                started = await self._fill(tg)
            self._filling = None
            if not started and not self._active:
                await self._collect()
            if self.once and not started and not self._active:
                return
            if self._stopped.is_set():
                return
            await self._wait()

    async def _collect(self) -> None:
        """With nothing to run, apply the assembly's ``retention:`` (at most every ``WORKER_INTERVAL`` s).

        A failure is noted and the worker goes on: retention waits for the next idle moment.
        """
        from loopwright._retention import WORKER_INTERVAL  # noqa: PLC0415 - only for an assembly with retention

        if self.rt.assembly.retention.instances is None:
            return
        now = time.monotonic()
        if self._collected_at is not None and now - self._collected_at < WORKER_INTERVAL:
            return
        self._collected_at = now
        try:
            done = await self.rt.collect_garbage(limit=100)
        except LoopwrightError as exc:
            self._note(f"retention: {exc}")
            return
        for gone in done.deleted:
            self._line({"event": "deleted", "instanceId": gone, "reason": "retention", "at": now_iso()},
                       f"deleted {gone} (past its retention)")

    async def _wait(self) -> None:
        """Wait for a wake-up (a slot freed, a signal), work the store notifies, or the poll interval."""
        with anyio.move_on_after(self.poll):
            async with anyio.create_task_group() as tg:

                async def woken() -> None:
                    await self._wake.wait()
                    tg.cancel_scope.cancel()

                async def notified() -> None:
                    try:
                        await self.rt.store.wait_for_work(self.poll)
                    except LoopwrightError:  # a store that cannot listen now: the poll interval it is
                        return
                    tg.cancel_scope.cancel()

                tg.start_soon(woken)
                tg.start_soon(notified)

    async def _fill(self, tg: TaskGroup) -> int:
        """Start segments for the work the store lists, up to the free slots; return how many."""
        free = self.max_concurrent - len(self._active)
        if free <= 0:
            return 0
        now = time.monotonic()
        self._backoff = {iid: until for iid, until in self._backoff.items() if until > now}
        try:
            ids = await self.rt.store.find_work(limit=free + len(self._active) + len(self._backoff) + _SLACK)
        except Exception as exc:  # noqa: BLE001 - a store that fails now may work at the next poll
            self._error(None, exc)
            if self.once:
                self._failed = True
                self._stopped.set()
            return 0
        started = 0
        for iid in ids:
            if started >= free or self._stopped.is_set():
                break
            if iid in self._active or iid in self._backoff:
                continue
            picked = await self._pick_up(iid)
            if picked is None:
                continue
            run, why = picked
            self._active[iid] = run
            started += 1
            self._line({"event": "pickedUp", "instanceId": iid, "reason": why, "at": now_iso()},
                       f"picked up {iid}: {why}")
            tg.start_soon(self._watch, run)
        return started

    async def _pick_up(self, iid: str) -> tuple[AgentRun, str] | None:
        """Pick up ``iid`` (:meth:`Runtime.pick_up`); ``None`` when there is nothing to do or it failed (reported)."""
        picked: tuple[AgentRun, str] | None = None
        try:
            picked = await self.rt.pick_up(iid)
        except (InstanceNotFoundError, InstanceLockedError):
            pass
        except UnloadableInstanceError as exc:  # a bad row: quarantined, never retried by the fleet
            self._quarantined(iid, exc)
        except Exception as exc:  # noqa: BLE001 - one broken instance must not stop the worker
            self._error(iid, exc)
            self._backoff[iid] = time.monotonic() + max(_BACKOFF, self.poll)
        return picked

    def _quarantined(self, instance_id: str, exc: UnloadableInstanceError) -> None:
        """Report a row that cannot be loaded (quarantined, or not when it could not be saved) and leave it alone."""
        if exc.quarantined:
            self._line({"event": "quarantined", "instanceId": instance_id, "reason": exc.reason, "at": now_iso()},
                       f"quarantined {instance_id}: {exc.reason}")
            self._note(f"worker: quarantined {instance_id} (state error): {safe_text(exc.reason, multiline=True)}")
        else:
            self._error(instance_id, exc)
        self._backoff[instance_id] = time.monotonic() + max(_BACKOFF, self.poll)

    async def _watch(self, run: AgentRun) -> None:
        """Wait for the segment to rest, print its result and free its slot."""
        try:
            result = await run.wait()
        finally:
            self._active.pop(run.instance_id, None)
            self._wake.set()
        if isinstance(run.failure, (LeaseLostError, StoreUnavailableError)):
            # Not finished: another runner has it now, or the store was out of reach too long.
            self._line({"event": "left", "instanceId": run.instance_id, "reason": str(run.failure), "at": now_iso()},
                       f"left {run.instance_id}: {run.failure}")
            return
        self._line({"event": "finished", "at": now_iso(), **result_to_json(result)},
                   f"finished {status_line(result, run.inst.turn)}")


async def worker(settings: CliSettings, poll: float, max_concurrent: int, once: bool, grace: float) -> int:
    """``loopwright worker``: serve the store's instances until stopped."""
    rt = Runtime.from_file(settings.assembly_path())
    async with rt:
        # An engine with workers of its own (a task queue) serves here; the default polls the store.
        code = await rt.engine.run_worker(poll=poll, max_concurrent=max_concurrent, once=once, grace=grace)
        if code is not None:
            return code
        return await Worker(rt, settings, poll=poll, max_concurrent=max_concurrent, once=once,
                            grace=grace).serve()
