"""The file store's instance creation: a folder, its two logs and its header, made on the event loop.

A new instance is a folder, its two (empty) logs, and its header, written in place (see the
:mod:`loopwright.builtins.file_store` docstring). Each of the four names is a directory update
of the filesystem, a few tens to hundreds of microseconds of kernel time. The names in the folder
are created relative to the folder's own descriptor (the one its lock is taken on), so the
store's path is resolved once per creation, not four times.

The creation is made inline, on the caller's thread. (Making them in a worker thread while the
loop runs the instances already made was measured, with 1,000 instances at once, and lost: the
loop holds the GIL nearly all the time, so the worker waits for it after each of its system
calls, and the thousand creations took 6.7 s instead of 1.1 s; see ``bench/RESULTS.md``, issue 12,
session 7.) A creation that fails leaves nothing behind (no folder, no header, no lock).

A part of :class:`~loopwright.builtins.file_store.FileStore` (a mixin). The module global
``_write_all`` (the new header's write) and the method :meth:`Creating._make_instance` (the
whole of one creation) are the kill matrix's patch points (``tests/crash``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from loopwright.builtins._file_io import (
    ENTRIES_FILE,
    HEADER_FILE,
    O_CLOEXEC,
    RECORDS_FILE,
    check_id,
    write_all,
)
from loopwright.builtins._file_lease import Lease
from loopwright.errors import StoreError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Creating"]

# A module global, so that the kill matrix (tests/crash/crash_plugin.py) can wrap it: a new instance's
# header is written through it.
_write_all = write_all

_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_LOG_FLAGS: Final = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | O_CLOEXEC
_HEADER_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC


@attrs.frozen
class _Made:
    """A created instance's open descriptors: its folder (locked, or -1 without an owner) and its two logs."""

    lock_fd: int
    entries_fd: int
    records_fd: int


class Creating:
    """The file store's instance creation (a part of :class:`~loopwright.builtins.file_store.FileStore`)."""

    root: Path
    create_parents: bool
    fsync: bool
    _root_s: str
    _root_ready: bool
    _held: set[str]
    _leases: set[Lease]

    if TYPE_CHECKING:
        _cache_log: Callable[[str, str, int], None]
        _note_checkpoint: Callable[[str, int], None]
        _header_bytes: Callable[[str, Mapping[str, Any]], bytes]
        _released: Callable[[Lease], None]
        _dead_runner: Callable[[str, str], str | None]

    async def create(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Create the instance's folder, empty logs and header.

        Raise :class:`~loopwright.errors.StoreError` if the folder exists (even without a header),
        the id is invalid, or the header is not JSON-ready.
        """
        folder = f"{self._root_s}/{check_id(instance_id)}"
        data = self._header_bytes(instance_id, header)
        self._ensure_root(instance_id)
        self._adopt(instance_id, folder, self._make_instance(instance_id, folder, data, locked=False), None)

    async def create_leased(self, instance_id: str, header: Mapping[str, Any], owner: str) -> Lease:
        """Create the instance (as :meth:`create`) with its lock already held by ``owner``.

        The new folder is locked before its header is written, so another process's
        :meth:`acquire` finds no instance, then a locked one: never a free lease. It does not
        await: a caller cancelled around it either has no instance or has its lease.
        """
        folder = f"{self._root_s}/{check_id(instance_id)}"
        data = self._header_bytes(instance_id, header)
        self._ensure_root(instance_id)
        lease = self._adopt(instance_id, folder, self._make_instance(instance_id, folder, data, locked=True), owner)
        assert lease is not None  # noqa: S101 - an owner always gets its lease
        return lease

    # -- internals -----------------------------------------------------------------------------

    def _ensure_root(self, instance_id: str) -> None:
        """Create the store folder, once per store (before its first instance).

        The folders above it too only with :attr:`create_parents`: otherwise a parent that has
        disappeared since the store was built is a :class:`~loopwright.errors.StoreError`.
        """
        if self._root_ready:
            return
        try:
            self.root.mkdir(parents=self.create_parents, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StoreError(f"cannot create {self.root}: {exc}", instance_id=instance_id) from exc
        self._root_ready = True

    def _make_instance(self, instance_id: str, folder: str, data: bytes, *, locked: bool) -> _Made:
        """Create the folder (locked first if ``locked``), its two logs, and its header; return the descriptors.

        Touches no state of the store (:meth:`_adopt` takes the result in). On failure it removes
        what it made and raises: :class:`~loopwright.errors.StoreError` if the folder exists or
        cannot be made, the ``OSError`` of any later step.
        """
        try:
            os.mkdir(folder, 0o700)  # noqa: PTH102 - no Path objects on the way of every creation
        except FileExistsError:
            raise StoreError(f"already exists ({folder})", instance_id=instance_id) from None
        except OSError as exc:
            raise StoreError(f"cannot create {folder}: {exc}", instance_id=instance_id) from exc
        dir_fd = entries_fd = records_fd = -1
        try:
            # One descriptor of the folder: its lock, and the names below are created relative to it.
            dir_fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY | O_CLOEXEC)
            if locked:
                fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder nobody else knows of yet
            # The logs are created open, and stay cached for the appends that follow at once.
            entries_fd = os.open(ENTRIES_FILE, _LOG_FLAGS, 0o600, dir_fd=dir_fd)
            records_fd = os.open(RECORDS_FILE, _LOG_FLAGS, 0o600, dir_fd=dir_fd)
            # The folder is new and nobody reads it yet: the header is written in place (no
            # temp file and rename: each new name costs a directory update). A process killed
            # in the middle leaves an unreadable header, which readers skip: the instance never
            # ran. Like every append, it is fsynced (with its folder) only with fsync: true.
            fd = os.open(HEADER_FILE, _HEADER_FLAGS, 0o600, dir_fd=dir_fd)
            try:
                _write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if self.fsync:
                os.fsync(dir_fd)
                fd = os.open(self._root_s, os.O_RDONLY | _O_DIRECTORY | O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except BaseException:
            # Leave no header-less folder behind: it would block the id and look like litter.
            self._unmake(folder, _Made(dir_fd, entries_fd, records_fd))
            raise
        if not locked:
            os.close(dir_fd)
            dir_fd = -1
        return _Made(dir_fd, entries_fd, records_fd)

    @staticmethod
    def _unmake(folder: str, made: _Made) -> None:
        """Remove a new instance's names and folder, then close its descriptors (the lock last)."""
        path = Path(folder)
        for name in (HEADER_FILE, ENTRIES_FILE, RECORDS_FILE):
            with contextlib.suppress(OSError):
                (path / name).unlink()
        with contextlib.suppress(OSError):
            path.rmdir()
        for fd in (made.entries_fd, made.records_fd, made.lock_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _adopt(self, instance_id: str, folder: str, made: _Made, owner: str | None) -> Lease | None:
        """Take a made instance's descriptors into the store: its logs, and its lease if ``owner``."""
        self._cache_log(instance_id, ENTRIES_FILE, made.entries_fd)
        self._cache_log(instance_id, RECORDS_FILE, made.records_fd)
        self._note_checkpoint(instance_id, 0)
        if owner is None:
            return None
        self._held.add(instance_id)
        lease = Lease(instance_id=instance_id, owner=owner, path=Path(folder), fd=made.lock_fd,
                      on_release=self._released,
                      find_previous=functools.partial(self._dead_runner, instance_id, owner))
        self._leases.add(lease)
        return lease
