"""The one way to hold an instance's runner lease: :func:`held_lease`.

Every place that works on a saved instance takes its lease (:meth:`loopwright.abc.Store.acquire`),
reads the instance again under it, and then either gives the lease back or hands it to the
segment that runs the instance (which gives it back when it ends). Written out by hand, that is
``acquire``, ``try``/``except BaseException: release; raise``, and a ``release`` on every early
return; :func:`held_lease` is that dance once::

    async with held_lease(store, instance_id, owner) as held:
        await refresh(run)                    # under the lease: what another process saved wins
        if run.inst.state is not State.RUNNING:
            return run                        # released on the way out
        await start_segment(run, held.hand_over())  # the segment owns it from here

Any exception inside the block, cancellation included, releases the lease unless it was handed over.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal, overload

from loopwright.errors import InstanceLockedError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from loopwright.abc import Lease, Store

__all__ = ["HeldLease", "held_lease", "holding"]


class HeldLease:
    """A lease :func:`held_lease` took; released when the block ends unless :meth:`hand_over` was called.

    Attributes:
        instance_id: The instance whose lease it is.
        handed_over: Whether :meth:`hand_over` gave it away.
    """

    __slots__ = ("_lease", "handed_over", "instance_id")

    def __init__(self, lease: Lease, instance_id: str) -> None:
        """Hold ``lease`` (taken for ``instance_id``)."""
        self._lease = lease
        self.instance_id = instance_id
        self.handed_over = False

    def hand_over(self) -> Lease:
        """Return the lease to a new owner, which must release it; the block will not.

        :raises RuntimeError: If it was handed over already.
        """
        if self.handed_over:
            raise RuntimeError(f"the lease of {self.instance_id!r} was handed over already")
        self.handed_over = True
        return self._lease


@overload
def held_lease(store: Store, instance_id: str, owner: str, *,
               if_free: Literal[False] = False) -> contextlib.AbstractAsyncContextManager[HeldLease]: ...


@overload
def held_lease(store: Store, instance_id: str, owner: str, *,
               if_free: Literal[True]) -> contextlib.AbstractAsyncContextManager[HeldLease | None]: ...


def held_lease(store: Store, instance_id: str, owner: str, *,
               if_free: bool = False) -> contextlib.AbstractAsyncContextManager[HeldLease | None]:
    """Take the runner lease of ``instance_id`` for ``owner`` for the ``async with`` block.

    :param store: The store that keeps the instance.
    :param instance_id: The instance.
    :param owner: The runner taking it (``Runtime.owner``).
    :param if_free: Yield ``None`` instead of raising when another runner holds the lease (for
        callers that leave a busy instance to its runner); only the ``acquire`` is guarded, an
        :class:`~loopwright.errors.InstanceLockedError` raised inside the block propagates.
    :raises InstanceLockedError: Another runner holds it (unless ``if_free``).
    """
    return _held(store, instance_id, owner, if_free=if_free)


@contextlib.asynccontextmanager
async def _held(store: Store, instance_id: str, owner: str, *, if_free: bool) -> AsyncIterator[HeldLease | None]:
    try:
        lease = await store.acquire(instance_id, owner)
    except InstanceLockedError:
        if not if_free:
            raise
        yield None
        return
    async with holding(lease, instance_id) as held:
        yield held


@contextlib.asynccontextmanager
async def holding(lease: Lease, instance_id: str) -> AsyncIterator[HeldLease]:
    """Hold a lease taken otherwise (:meth:`~loopwright.abc.Store.create_leased`) as :func:`held_lease` does.

    It is released when the block ends, on any exit, unless it was handed over.
    """
    held = HeldLease(lease, instance_id)
    try:
        yield held
    finally:
        if not held.handed_over:
            lease.release()
