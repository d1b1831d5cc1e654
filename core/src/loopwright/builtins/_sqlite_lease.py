"""The sqlite store's runner leases: an ``flock`` on ``<database>.locks/<instance_id>.lock`` (:class:`Locks`).

The lock file of an instance is created by the first lease of it and never removed (removing a
lock file races with its next taker). The kernel drops an ``flock`` when its holder dies, so a
killed runner's lease is free at once. Who holds it is the header's ``runner`` key, which the
runtime writes when it starts a segment. :class:`~loopwright.builtins._file_lease.Lease` is the
lease object (the file store's too).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from loopwright._header_fields import HeaderFields
from loopwright.builtins._file_lease import Lease
from loopwright.errors import InstanceLockedError, StoreError

__all__ = ["Locks"]

_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)


class Locks:
    """The lock files of one sqlite store, and the leases it holds on them.

    Attributes:
        lock_dir: The folder of the lock files (``<database>.locks``), made owner-only (0o700)
            by the first lease.
        leases: The leases this store holds and has not released.
    """

    def __init__(self, lock_dir: Path) -> None:
        """Keep the lock files in ``lock_dir`` (nothing is created yet)."""
        self.lock_dir = lock_dir
        self.leases: set[Lease] = set()

    def path(self, instance_id: str) -> Path:
        """Return the lock file of ``instance_id`` (a checked id)."""
        return self.lock_dir / f"{instance_id}.lock"

    def open(self, instance_id: str) -> int:
        """Open (creating it and its folder if needed) the instance's lock file; return the descriptor.

        :raises StoreError: The folder or the file cannot be made or opened.
        """
        path = self.path(instance_id)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600)
        except FileNotFoundError:
            try:
                self.lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                return os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600)
            except OSError as exc:
                raise StoreError(f"cannot create {path}: {exc}", instance_id=instance_id) from exc
        except OSError as exc:
            raise StoreError(f"cannot open {path}: {exc}", instance_id=instance_id) from exc

    def try_lock(self, fd: int, instance_id: str) -> bool:
        """Take the exclusive ``flock`` on ``fd`` without waiting; return False if someone holds it.

        The descriptor stays open either way. :raises StoreError: Locking failed for another reason.
        """
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise StoreError(f"cannot lock {self.path(instance_id)}: {exc}", instance_id=instance_id) from exc
            return False
        return True

    def lease(self, instance_id: str, owner: str, fd: int, find_previous: Callable[[], str | None]) -> Lease:
        """Return the :class:`Lease` of the ``flock`` held on ``fd``, kept in :attr:`leases` until released."""
        lease = Lease(instance_id=instance_id, owner=owner, path=self.path(instance_id), fd=fd,
                      on_release=self.leases.discard, find_previous=find_previous)
        self.leases.add(lease)
        return lease

    def acquire(self, instance_id: str, owner: str, runner: str | None,
                find_previous: Callable[[], str | None]) -> Lease:
        """Take the instance's lease without waiting (the instance exists; ``runner`` is its header's).

        :raises InstanceLockedError: A live runner holds it (``holder`` is ``runner``).
        :raises StoreError: The lock file cannot be opened or locked.
        """
        fd = self.open(instance_id)
        try:
            locked = self.try_lock(fd, instance_id)
        except BaseException:
            os.close(fd)
            raise
        if not locked:
            os.close(fd)
            raise InstanceLockedError(instance_id, holder=runner or None)
        return self.lease(instance_id, owner, fd, find_previous)

    def release_all(self) -> None:
        """Release every lease still held (the store closes)."""
        for lease in list(self.leases):
            lease.release()


def dead_runner(header: dict[str, object] | None, owner: str) -> str | None:
    """Return the runner of a header left ``running`` by someone other than ``owner`` (who must have died)."""
    return None if header is None else HeaderFields(header).dead_runner(owner)
