"""The file store's lease: an ``flock`` on the instance's folder, and taking it (:class:`Locking`).

:class:`Lease` is also the sqlite store's (an ``flock`` on its per-instance lock file).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from loopwright._header_fields import HeaderFields
from loopwright.abc import Lease as BaseLease
from loopwright.builtins._file_io import ENTRIES_FILE, HEADER_FILE, O_CLOEXEC, RECORDS_FILE, check_id, repair_tail
from loopwright.errors import InstanceLockedError, InstanceNotFoundError, StoreError

if TYPE_CHECKING:
    from collections import OrderedDict

__all__ = ["Lease", "Locking"]


@attrs.define(eq=False)
class Lease(BaseLease):
    """An exclusive hold on one instance, from a store's ``acquire`` until :meth:`release`.

    Also a context manager that releases on exit. A lease is an ``flock`` on an open file or
    folder (the instance's folder for :class:`~loopwright.builtins.file_store.FileStore`, its lock
    file for the sqlite store): while it is held, no other process (and no other ``acquire`` in
    this one) can take it, and the kernel releases it when the holding process dies.

    Attributes:
        instance_id: The instance held.
        owner: The owner given to ``acquire``.
        path: The folder or file locked.
        previous_holder: The ``runner`` of a header left ``running`` by another owner: a process
            that died mid-run (so the instance may hold an interrupted step), else ``None``.
    """

    instance_id: str
    owner: str
    path: Path
    _fd: int | None = attrs.field(default=None, repr=False, alias="fd")
    _on_release: Callable[[Lease], None] | None = attrs.field(default=None, repr=False, alias="on_release")
    _find_previous: Callable[[], str | None] | None = attrs.field(default=None, repr=False, alias="find_previous")

    @functools.cached_property
    def previous_holder(self) -> str | None:
        """The ``runner`` of a header left ``running`` by another owner (read when first asked)."""
        return self._find_previous() if self._find_previous is not None else None

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._fd is None

    def release(self) -> None:
        """Unlock. Calling it again does nothing."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            if self._on_release is not None:
                self._on_release(self)



class Locking:
    """The file store's runner locks (a part of :class:`~loopwright.builtins.file_store.FileStore`)."""

    root: Path
    _closed: bool
    _held: set[str]
    _leases: set[Lease]
    _logs: OrderedDict[tuple[str, str], int]
    _clean: dict[tuple[str, str], tuple[int, int, int]]

    async def acquire(self, instance_id: str, owner: str) -> Lease:  # noqa: C901 - each step can fail its own way
        """Take the instance's runner lock without waiting and return the :class:`Lease`.

        The lock is an ``flock`` on the instance's folder (so taking it creates no file). Who
        holds it is what the runner wrote in the header's ``runner`` key. Raise
        :class:`~loopwright.errors.InstanceLockedError` (with ``holder`` when it is known) if a
        live runner holds it, and :class:`~loopwright.errors.InstanceNotFoundError` if the
        instance does not exist. A lock whose holder died is free again: the kernel released it.
        """
        folder = self.root / check_id(instance_id)
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        if instance_id in self._held:
            raise InstanceLockedError(instance_id, holder=self._runner(instance_id))
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise InstanceNotFoundError(instance_id) from None
        except OSError as exc:
            raise StoreError(f"cannot open {folder}: {exc}", instance_id=instance_id) from exc
        try:
            if not (folder / HEADER_FILE).is_file():
                raise InstanceNotFoundError(instance_id)  # noqa: TRY301 - the fd is closed below
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise StoreError(f"cannot lock {folder}: {exc}", instance_id=instance_id) from exc
                raise InstanceLockedError(instance_id, holder=self._runner(instance_id)) from None
        except BaseException:
            os.close(fd)
            raise
        self._held.add(instance_id)
        # Logs this store kept open (since create, say) skipped the repair that opening does:
        # another process may have died mid-append since. The new holder repairs them now.
        for name in (ENTRIES_FILE, RECORDS_FILE):
            cached = self._logs.get((instance_id, name))
            if cached is not None:
                try:
                    repair_tail(cached, folder / name)
                except OSError as exc:
                    os.close(fd)
                    self._held.discard(instance_id)
                    raise StoreError(f"cannot repair {folder / name}: {exc}", instance_id=instance_id) from exc
        lease = Lease(instance_id=instance_id, owner=owner, path=folder, fd=fd, on_release=self._released,
                      find_previous=functools.partial(self._dead_runner, instance_id, owner))
        self._leases.add(lease)
        return lease

    def _released(self, lease: Lease) -> None:
        self._leases.discard(lease)
        self._held.discard(lease.instance_id)
        # Another process may append once the lease is gone: the logs are repaired when reopened.
        for name in (ENTRIES_FILE, RECORDS_FILE):
            self._clean.pop((lease.instance_id, name), None)

    def _runner(self, instance_id: str) -> str | None:
        """Return the header's ``runner`` (who runs the instance), if it can be read."""
        try:
            header = json.loads((self.root / instance_id / HEADER_FILE).read_bytes())
        except (OSError, ValueError):
            return None
        runner = HeaderFields(header).runner if isinstance(header, dict) else None
        return str(runner) if runner else None

    def _dead_runner(self, instance_id: str, owner: str) -> str | None:
        """Return the runner of a header left ``running`` by someone else (who must have died)."""
        try:
            header = json.loads((self.root / instance_id / HEADER_FILE).read_bytes())
        except (OSError, ValueError):
            return None
        return HeaderFields(header).dead_runner(owner) if isinstance(header, dict) else None
