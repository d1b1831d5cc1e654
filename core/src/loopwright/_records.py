"""Records and headers on their way to the store: :class:`Recorder`.

A run queues records as it goes (:meth:`Recorder.queue`) and writes them with the save that
follows (:meth:`Recorder.flush`): to the store's record log, then to every record sink and the
``loopwright_on_record`` observers, which fail open (a failure becomes an ``observer_error``
record of its own). Header writes of one instance go one at a time, in the order asked for
(:meth:`Recorder.write_header`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from loopwright._hooks import notify
from loopwright._instance import now_iso
from loopwright._types import Record

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from loopwright._instance import Instance
    from loopwright._plugins import PluginHost
    from loopwright.abc import RecordSink, Store

__all__ = ["Recorder"]


class Recorder:
    """The record queue, the record sinks and the header write order of one open runtime.

    Attributes:
        store: The runtime's store (set when the runtime opens, before anything is queued).
        sinks: The assembly's record sinks, in its order (the runtime's list, filled as it opens).
        redact: ``(data)``: the assembly's ``redaction:`` applied to a record's data before the sinks
            and observers get it (the store's record log keeps it as it was), or ``None``.
    """

    def __init__(self, plugins: PluginHost, sinks: Sequence[RecordSink]) -> None:
        """Write to ``sinks`` (and the store, once set), and call ``plugins``' ``on_record`` observers."""
        self.store: Store = None  # type: ignore[assignment]
        self.sinks = sinks
        self._plugins = plugins
        self.redact: Callable[[Any], Any] | None = None
        self._queued: dict[str, list[dict[str, Any]]] = {}
        self._header_locks: dict[str, anyio.Lock] = {}

    def queue(self, instance_id: str, kind: str, data: Mapping[str, Any]) -> None:
        """Queue a record; :meth:`flush` writes it with the next save."""
        self._queued.setdefault(instance_id, []).append(
            {"kind": kind, "instanceId": instance_id, "at": now_iso(), "data": data})

    def drop(self, instance_id: str) -> None:
        """Forget the records queued for ``instance_id`` (its segment ended without saving them)."""
        self._queued.pop(instance_id, None)

    async def flush(self, instance_id: str) -> None:
        """Write queued records to the store, the record sinks and the ``on_record`` hook."""
        queued = self._queued.pop(instance_id, None)
        if not queued:
            return
        await self.store.append_records(instance_id, queued)
        impls = self._plugins.impls("loopwright_on_record")
        if not impls and not self.sinks:
            return

        for raw in queued:
            data = raw["data"] if self.redact is None else self.redact(raw["data"])
            record = Record(kind=raw["kind"], instance_id=instance_id, at=raw["at"], data=data)
            for sink in self.sinks:
                try:
                    await sink.write(record)
                except Exception as exc:  # noqa: BLE001 - sinks fail open
                    self.queue(instance_id, "observer_error",
                               {"plugin": type(sink).__name__, "error": f"{type(exc).__name__}: {exc}"})
            if impls:
                await notify(impls, {"record": record}, on_error=lambda plugin, exc: self.queue(
                    instance_id, "observer_error", {"plugin": plugin, "error": f"{type(exc).__name__}: {exc}"}))

    async def write_header(self, inst: Instance) -> None:
        """Save the instance's header atomically, one write at a time per instance.

        Writes of one instance's header are applied in the order they were asked for, each
        with the header as it is when its turn comes: two writes in flight at once (two agents
        started in parallel by the same caller, a store that writes in a worker thread) can
        never leave the older copy on disk.
        """
        lock = self._header_locks.get(inst.id)
        if lock is None:
            lock = self._header_locks[inst.id] = anyio.Lock()
        try:
            async with lock:
                await self.store.write_header(inst.id, inst.header.json)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting and self._header_locks.get(inst.id) is lock:
                del self._header_locks[inst.id]
