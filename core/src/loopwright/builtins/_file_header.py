"""The file store's header writes: each replaced atomically, several at once group-committed.

A header is written to a temporary file in the instance's folder, flushed and ``os.replace``-d
over ``instance.json`` (see the :mod:`loopwright.builtins.file_store` docstring). While several
instances run, the headers written at the same time are committed as one group in a worker thread:
their temp files written, one ``syncfs(2)`` for the filesystem, then each renamed.

A part of :class:`~loopwright.builtins.file_store.FileStore` (a mixin). The module globals
``_write_all`` and ``_syncfs`` are the patch points of the kill matrix (``tests/crash``) and of the
tests: every header rewrite goes through them. ``syncfs(2)`` is looked up on the first group
commit, so that a process that only reads the store (``loopwright ls``) never loads ctypes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from loopwright.builtins._file_io import (
    HEADER_FILE,
    O_CLOEXEC,
    TMP_NUMBERS,
    check_id,
    encode_header,
    fsync_dir,
    load_syncfs,
    write_all,
)
from loopwright.errors import InstanceNotFoundError, StoreError

if TYPE_CHECKING:
    import anyio

__all__ = ["Headers"]

# Module globals, so that the kill matrix (tests/crash/crash_plugin.py) and the tests can wrap them.
_write_all = write_all
_UNLOADED: Final = object()
#: ``syncfs(2)`` (or ``None`` where there is none) once :func:`_loaded_syncfs` looked it up; a test may set it first.
_syncfs: Any = _UNLOADED


def _loaded_syncfs() -> Any:
    """Return ``_syncfs``, looking ``syncfs(2)`` up on first use (ctypes only for group commits)."""
    global _syncfs  # noqa: PLW0603 - looked up once, a patch point
    if _syncfs is _UNLOADED:
        _syncfs = load_syncfs()
    return _syncfs


class Headers:
    """The file store's header writes (a part of :class:`~loopwright.builtins.file_store.FileStore`)."""

    root: Path
    fsync: bool
    _held: set[str]
    _header_queue: list[_PendingHeader]
    _committing: anyio.Event | None

    async def write_header(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Replace the header atomically (temp file, fsync, rename; and fsync the folder with ``fsync: true``).

        Raise :class:`~loopwright.errors.InstanceNotFoundError` if the instance does not exist.
        """
        folder = self.root / check_id(instance_id)
        data = self._header_bytes(instance_id, header)
        if len(self._held) <= 1:
            # One runner alone: inline, which costs less CPU than a thread hop.
            self._replace_header(instance_id, folder, data)
            return
        # Several instances run at once: a group commit. Each header fsync is a disk flush
        # (milliseconds on many disks, and flushes of different files queue behind each other),
        # so the headers written while one flush runs wait for it and are then committed
        # together, in a worker thread, with one flush for the group (see _commit_headers).
        # Every header is still on disk before its rename, and before this returns.
        pending = _PendingHeader(instance_id, folder, data)
        self._header_queue.append(pending)
        # Shielded, like the inline write: a cancelled writer must not leave its header queued,
        # to land later over a newer one.
        import anyio  # noqa: PLC0415 - only for group commits: keeps readers of the store (ls, show) cheap

        with anyio.CancelScope(shield=True):
            while not pending.done:
                if self._committing is not None:
                    await self._committing.wait()
                    continue
                group, self._header_queue = self._header_queue, []
                self._committing = committed = anyio.Event()
                try:
                    await anyio.to_thread.run_sync(self._commit_headers, group)
                finally:
                    self._committing = None
                    committed.set()
        if pending.error is not None:
            raise pending.error


    @staticmethod
    def _header_bytes(instance_id: str, header: Mapping[str, Any]) -> bytes:
        if not isinstance(header, Mapping):
            raise StoreError(f"the header must be a mapping, not {type(header).__name__}",
                             instance_id=instance_id)
        try:
            return (encode_header(dict(header)) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise StoreError(f"the header is not JSON-ready: {exc}", instance_id=instance_id) from exc

    def _commit_headers(self, group: list[_PendingHeader]) -> None:
        """Replace several headers with one disk flush: write each temp file, ``syncfs`` once, rename each.

        Where ``syncfs`` is not available (not Linux), or the group is a single header, each is
        written as :meth:`_replace_header` writes one. Runs in a worker thread.
        """
        syncfs = _loaded_syncfs() if len(group) > 1 else None
        if syncfs is None:
            for p in group:
                self._replace_one(p)
            return
        ready = [(p, tmp) for p in group if (tmp := self._write_temp(p)) is not None]
        if not ready:
            return
        # One flush of the filesystem the store is on makes every temp file above durable
        # (what an fsync of each would do, with one disk flush instead of one per header).
        try:
            syncfs(self.root)
        except OSError as exc:
            for p, tmp in ready:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                p.finish(StoreError(f"cannot sync {self.root}: {exc}", instance_id=p.instance_id))
            return
        for p, tmp in ready:
            try:
                tmp.replace(p.folder / HEADER_FILE)
                if self.fsync:
                    fsync_dir(p.folder)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                p.finish(StoreError(f"cannot write {p.folder / HEADER_FILE}: {exc}", instance_id=p.instance_id))
                continue
            p.finish(None)

    @staticmethod
    def _write_temp(p: _PendingHeader) -> Path | None:
        """Write a pending header to a new temp file (no fsync) and return its path; on failure, finish it."""
        tmp = p.folder / f".{HEADER_FILE}.{os.getpid()}.{next(TMP_NUMBERS)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o600)
        except (FileNotFoundError, NotADirectoryError):
            p.finish(InstanceNotFoundError(p.instance_id))
            return None
        except OSError as exc:
            p.finish(StoreError(f"cannot write {p.folder / HEADER_FILE}: {exc}", instance_id=p.instance_id))
            return None
        try:
            _write_all(fd, p.data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            p.finish(StoreError(f"cannot write {p.folder / HEADER_FILE}: {exc}", instance_id=p.instance_id))
            return None
        finally:
            os.close(fd)
        return tmp

    def _replace_one(self, p: _PendingHeader) -> None:
        try:
            self._replace_header(p.instance_id, p.folder, p.data)
        except Exception as exc:  # noqa: BLE001 - handed to the writer waiting for it
            p.finish(exc)
        else:
            p.finish(None)

    def _replace_header(self, instance_id: str, folder: Path, data: bytes) -> None:
        """Write ``data`` to a temp file in ``folder``, fsync, rename it over the header.

        With ``fsync: true`` the folder is fsynced after the rename too.
        """
        target = folder / HEADER_FILE
        # Unique per process and per write: writes of several instances may run in threads.
        tmp = folder / f".{HEADER_FILE}.{os.getpid()}.{next(TMP_NUMBERS)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o600)
        except (FileNotFoundError, NotADirectoryError):
            raise InstanceNotFoundError(instance_id) from None
        except OSError as exc:
            raise StoreError(f"cannot write {target}: {exc}", instance_id=instance_id) from exc
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            tmp.replace(target)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(exc, OSError):
                raise StoreError(f"cannot write {target}: {exc}", instance_id=instance_id) from exc
            raise
        if not self.fsync:
            return  # the file's own fsync and the atomic rename suffice against a killed process
        try:
            fsync_dir(folder)
        except OSError as exc:
            raise StoreError(f"cannot fsync {folder}: {exc}", instance_id=instance_id) from exc


@attrs.define(eq=False)
class _PendingHeader:
    """A header write waiting for a group commit (see :meth:`FileStore.write_header`)."""

    instance_id: str
    folder: Path
    data: bytes
    done: bool = False
    error: Exception | None = None

    def finish(self, error: Exception | None) -> None:
        self.error = error
        self.done = True

