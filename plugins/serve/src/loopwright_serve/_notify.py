"""Wake-ups for event streams: the runtime's observer hooks say when an instance's logs grew here.

An instance that runs in this server writes its records and messages through the runtime,
whose ``loopwright_on_record`` and ``loopwright_on_message`` hooks are called once the write is
saved. :class:`Wakeups` is a plugin implementing both: it wakes the streams following that
instance, which then read the logs at once instead of at their next poll. Instances run by other
processes have no such hook here: their streams poll (:data:`loopwright_serve._events.POLL`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from loopwright import hookimpl

if TYPE_CHECKING:
    from loopwright import InstanceInfo, Message, Record

__all__ = ["Waiter", "Wakeups"]


class Waiter:
    """One stream's wake-up: :attr:`event` is set when its instance's logs grew.

    Attributes:
        event: Set by :meth:`Wakeups.wake`; the stream makes a new one (:meth:`rearm`) before each read.
        woken: Whether it was ever woken (the instance runs here).
        records: Whether the record log grew since :meth:`rearm`.
        entries: Whether the entry log grew since :meth:`rearm`.
    """

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.woken = False
        self.records = True
        self.entries = True

    def rearm(self) -> None:
        """Start waiting for the next growth (call before reading the logs, so none is missed)."""
        if self.event.is_set():
            self.event = anyio.Event()
        self.records = self.entries = False

    def grew(self, *, records: bool = False, entries: bool = False) -> None:
        """Note which log grew, and wake the stream."""
        self.woken = True
        self.records |= records
        self.entries |= entries
        self.event.set()


class Wakeups:
    """A runtime plugin: wakes the :class:`Waiter` of every stream following an instance whose logs grew."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[Waiter]] = {}

    def add(self, instance_id: str) -> Waiter:
        """Return a new waiter for ``instance_id``'s stream; give it back with :meth:`remove`."""
        waiter = Waiter()
        self._waiters.setdefault(instance_id, set()).add(waiter)
        return waiter

    def remove(self, instance_id: str, waiter: Waiter) -> None:
        """Forget a stream's waiter."""
        waiters = self._waiters.get(instance_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[instance_id]

    def wake(self, instance_id: str, *, records: bool = False, entries: bool = False) -> None:
        """Wake every stream following ``instance_id``, saying which of its logs grew."""
        for waiter in self._waiters.get(instance_id, ()):
            waiter.grew(records=records, entries=entries)

    @hookimpl
    def loopwright_on_record(self, record: Record) -> None:
        """Wake the streams of the instance whose record was saved."""
        self.wake(record.instance_id, records=True)

    @hookimpl
    def loopwright_on_message(self, message: Message, instance: InstanceInfo) -> None:  # noqa: ARG002 - the hook's shape
        """Wake the streams of the instance whose message was saved."""
        self.wake(instance.instance_id, entries=True)
