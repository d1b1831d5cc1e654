"""Built-in plugin: the ``file`` store, the embedded default.

Assembly::

    store:
      kind: file
      path: .loopwright/instances   # default; relative to the assembly's folder
      fsync: false                  # default; true also survives power loss, at a cost per append

On-disk layout, one folder per instance (folders and files are created owner-only, 0o700/0o600)::

    <path>/
      <instance_id>/
        instance.json    the header: one line of JSON, always replaced whole and atomically
        entries.jsonl    the entry log: append-only, one compact JSON object per line
        records.jsonl    the record log: append-only, one compact JSON object per line
        posts.jsonl      the mailbox: messages and cancel requests any process may append
                         (created by the first post)
        checkpoint.json  a checkpoint of the entry log (created once the log is long; see
                         :meth:`FileStore.checkpoint`): a frame line, then the state line

Creating a name in a folder is the expensive part of a new instance on many filesystems (a few
hundred microseconds each here), so an instance gets only the names it needs: the lock is an
``flock`` on the folder itself, the first header is written in place, and the mailbox appears
with the first post.

Instance ids must match ``[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}`` and must not contain ``..``, so
an id can never name a path outside ``<path>``.

Durability:

* **A killed process loses nothing already appended.** Each append call writes all its lines
  with a single ``write()`` to a file opened ``O_APPEND``, so when ``append_*`` returns the
  data is in the operating system's page cache and survives ``SIGKILL`` or a crash of Python.
  A process killed *during* an append leaves at most one torn last line. Readers drop it, and
  the next append after opening the log truncates it first so new lines never glue onto it.
* **The header is always atomic.** It is written to a temporary file in the same folder,
  fsynced and ``os.replace``-d over ``instance.json``: any reader sees the old header or the new
  one, never a mix, and the new one's bytes are on disk before it replaces the old. The
  runtime writes the header when the instance's state changes, not on every turn. While
  several instances run, headers written at the same time are group-committed: their temp
  files are written, one ``syncfs(2)`` flushes the filesystem for all of them (one disk flush
  instead of one per header), then each is renamed (:meth:`FileStore.write_header`).
* **fsync: true** adds an ``os.fsync`` after every append and of the folder after every header
  rename and instance creation, so everything also survives power loss or a kernel crash. It
  costs a disk flush per append (from tens of microseconds on fast NVMe to milliseconds
  elsewhere); without it, a power loss may lose the last few seconds of appends (never the
  header's atomicity).

Loading costs the same at turn 10,000 as at turn 100 (apart from the transcript itself):
:meth:`FileStore.read_resume` reads the checkpoint and the log's tail after it. The checkpoint's
frame ``{"v": 1, "offset": N, "prefix": SHA256, "sha256": SHA256}`` ties it to the log: its state
line must hash to ``sha256``, ``N`` must end a line of the log, and the log's (at most 64 KiB of)
bytes before ``N`` must hash to ``prefix``; otherwise it is ignored and the whole log is read.
Anything that ever rewrites an entry log in place must delete ``checkpoint.json`` first.

Appending costs the same at turn 10,000 as at turn 1: logs are never re-read or rewritten, and
open log handles are kept in a small LRU (:attr:`FileStore.max_open_logs`) closed by
:meth:`FileStore.aclose`. The methods are ``async def`` but do their file I/O directly, without
a thread hop: an append is a few tens of microseconds, cheaper than the hop. Reading a whole log
(``read_entries``, on resume) blocks the event loop for as long as it takes. A ``FileStore`` is
meant for one event loop; it is not thread-safe.

**The store folder must never lie inside a file root granted to an agent**: an agent that can
write there can rewrite its own transcript, grants and pending approvals. :meth:`FileStore.locations`
returns the folder so the runtime can refuse such an assembly.

One runner per instance: :meth:`FileStore.acquire` takes an exclusive, non-blocking
``fcntl.flock`` on the instance's folder. The kernel drops it when the holding process dies, so
a lock left by a killed process is simply taken over. Who holds it is the header's ``runner``
key, which the runtime writes when it starts a segment. ``flock`` is POSIX-only, is not reliable
on network filesystems (NFS, SMB), and is shared with children forked without ``exec``; use the
``postgres`` store to share instances between machines. Only the lease holder should append to
an instance's logs: opening a log cuts a torn last line, which could be another writer's write in
progress.

Headers that cannot be read are skipped by :meth:`FileStore.list_headers` with a warning logged
on the ``loopwright.builtins.file_store`` logger (not :mod:`warnings`: it is a problem of the
data at run time, not of the calling code, and must be reported every time).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self

import anyio
import attrs

from loopwright.abc import Lease as BaseLease
from loopwright.abc import Store, StoreSettings
from loopwright.errors import (
    ConfigError,
    ConfigProblem,
    InstanceLockedError,
    InstanceNotFoundError,
    StoreError,
)
from loopwright.hookspecs import hookimpl

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["FileStore", "Lease", "loopwright_register_stores"]

_log = logging.getLogger(__name__)

#: The store folder when ``path`` is not set, relative to the assembly's folder.
DEFAULT_PATH: Final = ".loopwright/instances"

HEADER_FILE: Final = "instance.json"
ENTRIES_FILE: Final = "entries.jsonl"
RECORDS_FILE: Final = "records.jsonl"
POSTS_FILE: Final = "posts.jsonl"
CHECKPOINT_FILE: Final = "checkpoint.json"
#: The version of the checkpoint file's own frame (its first line); the state inside has its own.
_CHECKPOINT_FRAME: Final = 1
#: How many bytes before a checkpoint's offset are hashed to tie it to its log.
_PREFIX_BYTES: Final = 64 * 1024

_ID_RE: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
_OPTIONS: Final = frozenset({"path", "fsync"})
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_TAIL_CHUNK: Final = 64 * 1024
_TMP_NUMBERS: Final = itertools.count()


def _to_json(obj: object) -> object:
    """Let any Mapping (a MappingProxyType, a frozen mapping) serialise like a dict."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


# Built once: json.dumps() with non-default arguments builds a new encoder on every call.
_encode_line: Final = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_to_json,
).encode
# Headers are one line too: an indented encoder runs in pure Python, about 3x slower.
_encode_header: Final = _encode_line


@hookimpl
def loopwright_register_stores(register: Callable[..., None]) -> None:
    """Register the ``file`` store kind."""
    register("file", FileStore)


def _encode_item(item: Mapping[str, Any]) -> str:
    if type(item) is not dict and not isinstance(item, Mapping):
        raise TypeError(f"each item must be a mapping, not {type(item).__name__}")
    return _encode_line(item)


def _check_id(instance_id: object) -> str:
    """Return ``instance_id`` if it is safe as a folder name; raise StoreError otherwise."""
    if not isinstance(instance_id, str) or not _ID_RE.fullmatch(instance_id) or ".." in instance_id:
        raise StoreError(
            f"invalid instance id {instance_id!r}: use 1 to 128 of A-Z a-z 0-9 _ . -, "
            "not starting with '.' and without '..'",
        )
    return instance_id


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written != len(data):  # rare for regular files: a signal or a full disk
        view = memoryview(data)
        while written < len(data):
            written += os.write(fd, view[written:])


def _line_start(fd: int, end: int) -> int:
    """Return the offset just after the last newline before ``end``, or 0 if there is none."""
    pos = end
    while pos > 0:
        start = max(0, pos - _TAIL_CHUNK)
        chunk = os.pread(fd, pos - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return start + nl + 1
        pos = start
    return 0


def _has_post(fd: int, post_id: str) -> bool:
    """Whether the mailbox open at ``fd`` holds a complete line of an item whose ``id`` is ``post_id``."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    needle = _encode_line(post_id).encode()  # as post() writes it
    if needle not in data:  # the usual case: one scan, no parsing
        return False
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        if needle in line:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("id") == post_id:
                return True
    return False


def _is_object_line(line: bytes) -> bool:
    try:
        return type(json.loads(line)) is dict
    except ValueError:  # includes UnicodeDecodeError
        return False


@attrs.define(eq=False)
class Lease(BaseLease):
    """An exclusive hold on one instance, from a store's ``acquire`` until :meth:`release`.

    Also a context manager that releases on exit. A lease is an ``flock`` on an open file or
    folder (the instance's folder for :class:`FileStore`, its lock file for the sqlite store):
    while it is held, no other process (and no other ``acquire`` in this one) can take it, and
    the kernel releases it when the holding process dies.

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

    def __enter__(self) -> Self:
        """Return the lease itself."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        self.release()


class FileStore(Store):
    """Instances as folders of JSON files: the embedded default store (see the module docstring).

    :param settings: ``settings.options`` may hold ``path`` (the store folder, default
        ``.loopwright/instances``, relative to ``settings.base_dir``; ``~`` is expanded) and
        ``fsync`` (bool, default ``False``: fsync every append too). Any other key, or a value
        of the wrong type, raises :class:`~loopwright.errors.ConfigError`.

    Attributes:
        root: The store folder, absolute. Created on the first :meth:`create`.
        fsync: Whether every append is fsynced.
        max_open_logs: How many log files stay open for appending (least recently used closed first).
        checkpoint_bytes: How much an entry log grows between two checkpoints (see :meth:`checkpoint`).
    """

    max_open_logs: int = 512
    #: How many bytes must be appended to an entry log since its checkpoint before :meth:`checkpoint` writes a new one.
    checkpoint_bytes: int = 256 * 1024

    def __init__(self, settings: StoreSettings) -> None:
        """Check the options and resolve the store folder; nothing is created yet."""
        options = settings.options
        problems = [
            ConfigProblem(f"unknown option {key!r} of the file store (known: fsync, path)",
                          path=f"$.store.{key}")
            for key in options if key not in _OPTIONS
        ]
        raw_path = options.get("path", DEFAULT_PATH)
        if not isinstance(raw_path, (str, os.PathLike)) or not os.fspath(raw_path):
            problems.append(ConfigProblem("must be a non-empty path", path="$.store.path"))
            raw_path = DEFAULT_PATH
        fsync = options.get("fsync", False)
        if not isinstance(fsync, bool):
            problems.append(ConfigProblem("must be true or false", path="$.store.fsync"))
        if problems:
            raise ConfigError("invalid options for the file store", problems=problems)
        path = Path(raw_path).expanduser()
        if not path.is_absolute():
            path = Path(settings.base_dir) / path
        self.root: Path = path.resolve()
        self.fsync: bool = fsync
        # (instance_id, file name) -> fd opened O_RDWR | O_APPEND, most recently used last.
        self._logs: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()
        self._leases: set[Lease] = set()
        self._held: set[str] = set()
        self._closed = False
        self._root_ready = False
        # instance_id -> read-only fd of its mailbox, most recently used last.
        self._post_fds: collections.OrderedDict[str, int] = collections.OrderedDict()
        # instance_id -> the mailbox's path, for instances whose mailbox does not exist yet.
        self._post_paths: dict[str, str] = {}
        # instance_id -> the entry-log offset its checkpoint covers (0: none), once known here.
        self._checkpointed: dict[str, int] = {}
        # Header writes waiting for the group commit in progress (see write_header).
        self._header_queue: list[_PendingHeader] = []
        self._committing: anyio.Event | None = None

    def __repr__(self) -> str:
        """Show the store folder and the fsync option."""
        return f"FileStore(root={str(self.root)!r}, fsync={self.fsync})"

    # -- headers -------------------------------------------------------------------------------

    async def create(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Create the instance's folder, empty logs and header.

        Raise :class:`~loopwright.errors.StoreError` if the folder exists (even without a header),
        the id is invalid, or the header is not JSON-ready.
        """
        self._create(instance_id, header, None)

    async def create_leased(self, instance_id: str, header: Mapping[str, Any], owner: str) -> Lease:
        """Create the instance (as :meth:`create`) with its lock already held by ``owner``.

        The new folder is locked before its header is written, so another process's
        :meth:`acquire` finds no instance, then a locked one: never a free lease.
        """
        lease = self._create(instance_id, header, owner)
        assert lease is not None  # noqa: S101 - an owner always gets its lease
        return lease

    def _create(self, instance_id: str, header: Mapping[str, Any],  # noqa: C901, PLR0912 - cleanup paths
                owner: str | None) -> Lease | None:
        """Create the instance; with ``owner``, lock the folder first and return the lease."""
        folder = self.root / _check_id(instance_id)
        data = self._header_bytes(instance_id, header)
        try:
            if not self._root_ready:
                self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._root_ready = True
            folder.mkdir(mode=0o700)
        except FileExistsError:
            raise StoreError(f"already exists ({folder})", instance_id=instance_id) from None
        except OSError as exc:
            raise StoreError(f"cannot create {folder}: {exc}", instance_id=instance_id) from exc
        lock_fd = -1
        try:
            if owner is not None:
                lock_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder nobody else knows of yet
            # The logs are created open, and stay cached for the appends that follow at once.
            for name in (ENTRIES_FILE, RECORDS_FILE):
                fd = os.open(folder / name, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
                self._cache_log(instance_id, name, fd)
            # The folder is new and nobody reads it yet: the header is written in place (no
            # temp file and rename: each new name costs a directory update). A process killed
            # in the middle leaves an unreadable header, which readers skip: the instance never
            # ran. Like every append, it is fsynced (with its folder) only with fsync: true.
            fd = os.open(folder / HEADER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
            try:
                _write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if self.fsync:
                _fsync_dir(folder)
            if self.fsync:
                _fsync_dir(self.root)
            self._note_checkpoint(instance_id, 0)
        except BaseException:
            if lock_fd >= 0:
                os.close(lock_fd)
            # Leave no header-less folder behind: it would block the id and look like litter.
            for name in (ENTRIES_FILE, RECORDS_FILE):
                fd = self._logs.pop((instance_id, name), -1)
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            for name in (ENTRIES_FILE, RECORDS_FILE, HEADER_FILE):
                with contextlib.suppress(OSError):
                    (folder / name).unlink()
            with contextlib.suppress(OSError):
                folder.rmdir()
            raise
        if owner is None:
            return None
        self._held.add(instance_id)
        lease = Lease(instance_id=instance_id, owner=owner, path=folder, fd=lock_fd, on_release=self._released,
                      find_previous=functools.partial(self._dead_runner, instance_id, owner))
        self._leases.add(lease)
        return lease

    async def write_header(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Replace the header atomically (temp file, fsync, rename; and fsync the folder with ``fsync: true``).

        Raise :class:`~loopwright.errors.InstanceNotFoundError` if the instance does not exist.
        """
        folder = self.root / _check_id(instance_id)
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

    async def read_header(self, instance_id: str) -> dict[str, Any]:
        """Return the header.

        Raise :class:`~loopwright.errors.InstanceNotFoundError` if absent (a header torn by a
        crash during :meth:`create`, with nothing logged yet, counts as absent: that instance
        never ran), and :class:`~loopwright.errors.StoreError` naming the file if it is not a
        JSON object.
        """
        path = self.root / _check_id(instance_id) / HEADER_FILE
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise InstanceNotFoundError(instance_id) from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}", instance_id=instance_id) from exc
        try:
            header = json.loads(data)
        except ValueError as exc:
            if self._never_ran(path.parent):
                raise InstanceNotFoundError(instance_id) from None
            raise StoreError(f"{path} is not valid JSON: {exc}", instance_id=instance_id) from exc
        if type(header) is not dict:
            raise StoreError(f"{path} holds a JSON {type(header).__name__}, not an object",
                             instance_id=instance_id)
        return header

    @staticmethod
    def _never_ran(folder: Path) -> bool:
        """Whether an instance folder has no entries: its creation was cut short."""
        try:
            return (folder / ENTRIES_FILE).stat().st_size == 0
        except FileNotFoundError:
            return True

    async def list_headers(self) -> list[dict[str, Any]]:
        """Return every instance's header, sorted by ``createdAt`` and then by id.

        Folders that are not instances (a name that is not a valid id, no ``instance.json``) are
        skipped silently; an unreadable or invalid header is skipped with a logged warning.
        A header without a string ``createdAt`` sorts first.
        """
        try:
            names = [e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.root}: {exc}") from exc
        found: list[tuple[str, str, dict[str, Any]]] = []
        for name in names:
            if not _ID_RE.fullmatch(name) or ".." in name:
                continue
            try:
                header = await self.read_header(name)
            except InstanceNotFoundError:
                continue
            except StoreError as exc:
                _log.warning("file store: skipping an instance whose header cannot be read: %s", exc)
                continue
            created = header.get("createdAt")
            found.append((created if isinstance(created, str) else "", name, header))
        found.sort(key=lambda t: (t[0], t[1]))
        return [h for _c, _n, h in found]

    # -- logs ----------------------------------------------------------------------------------

    async def append_entries(self, instance_id: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append to the entry log with one write; when this returns, a new process can read them.

        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance and
        :class:`~loopwright.errors.StoreError` if an entry is not a JSON-ready mapping (nothing
        is written then) or the write fails.
        """
        self._append(instance_id, ENTRIES_FILE, entries)

    async def read_entries(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole entry log in order.

        A torn last line (not valid JSON, or no trailing newline) is dropped; a corrupt line
        anywhere else raises :class:`~loopwright.errors.StoreError` naming the file and line.
        """
        return self._read_log(instance_id, ENTRIES_FILE)

    async def append_records(self, instance_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Append to the record log; same contract as :meth:`append_entries`."""
        self._append(instance_id, RECORDS_FILE, records)

    async def read_records(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole record log in order; same contract as :meth:`read_entries`."""
        return self._read_log(instance_id, RECORDS_FILE)

    # -- checkpoints -----------------------------------------------------------------------------

    async def read_resume(self, instance_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Return ``(checkpoint, entries after it)``, or ``(None, all entries)`` without a valid checkpoint.

        ``checkpoint.json`` is used only if its checksum matches, its offset lies within the
        entry log on a line boundary, and the log's bytes before that offset hash as when it was
        written; otherwise it is ignored (with a logged warning) and the whole log is read. The
        cost is that of the checkpoint and the log's tail after it, whatever the log's length.
        Same errors as :meth:`read_entries`.
        """
        checkpoint, entries, offset, _end = self._read_resume(instance_id)
        self._note_checkpoint(instance_id, offset if checkpoint is not None else 0)
        return checkpoint, entries

    async def checkpoint(self, instance_id: str,
                         fold: Callable[[Mapping[str, Any] | None, list[dict[str, Any]]], dict[str, Any]],
                         ) -> None:
        """Write a new checkpoint if the entry log grew by :attr:`checkpoint_bytes` since the last one.

        Otherwise this costs one ``fstat``. The new one is ``fold(checkpoint, entries after it)``
        over the complete lines of the log, written to a temporary file and renamed over
        ``checkpoint.json`` (no fsync: a checkpoint torn by a power loss fails its checksum and
        the log is replayed whole). A checkpoint is a cache: any failure here is logged on the
        ``loopwright.builtins.file_store`` logger and the log stays as it was.
        """
        folder = self.root / _check_id(instance_id)
        try:
            fd = self._logs.get((instance_id, ENTRIES_FILE))
            size = os.fstat(fd).st_size if fd is not None else (folder / ENTRIES_FILE).stat().st_size
            done = self._checkpointed.get(instance_id)
            if done is None:
                done = self._checkpoint_offset(folder)
                self._note_checkpoint(instance_id, done)
            if size - done < self.checkpoint_bytes:
                return
            checkpoint, entries, _offset, end = self._read_resume(instance_id)
            state = fold(checkpoint, entries)
            self._write_checkpoint(instance_id, folder, state, end)
        except Exception as exc:  # noqa: BLE001 - a cache must never fail the run it follows
            _log.warning("file store: no checkpoint for %s: %s: %s", instance_id, type(exc).__name__, exc)
            return
        self._note_checkpoint(instance_id, end)

    # -- mailbox ---------------------------------------------------------------------------------

    async def post(self, instance_id: str, item: Mapping[str, Any]) -> None:
        """Append ``item`` to the instance's mailbox, ``posts.jsonl`` (any process, any time).

        Each post is one ``O_APPEND`` write of one line, so posts from several processes never
        interleave. An item with an ``id`` is idempotent (see :meth:`loopwright.abc.Store.post`):
        under an exclusive ``flock`` of the mailbox, which posters with an id take in turns, the
        mailbox is searched for the id first (a read of the whole mailbox, which stays small).
        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance.
        """
        folder = self.root / _check_id(instance_id)
        try:
            line = (_encode_item(item) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise StoreError(f"cannot post: {exc}", instance_id=instance_id) from exc
        post_id = item.get("id")
        if not (folder / HEADER_FILE).is_file():
            raise InstanceNotFoundError(instance_id)
        path = folder / POSTS_FILE
        try:
            flags = os.O_APPEND | os.O_CREAT | _O_CLOEXEC | (os.O_RDWR if post_id else os.O_WRONLY)
            fd = os.open(path, flags, 0o600)
            try:
                if isinstance(post_id, str) and post_id:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close below
                    if _has_post(fd, post_id):
                        return
                _write_all(fd, line)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"cannot post to {path}: {exc}", instance_id=instance_id) from exc

    async def read_posts(self, instance_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:  # noqa: C901
        """Return the complete mailbox lines after byte offset ``cursor`` and the offset after them.

        Nothing new costs one ``fstat`` of a cached handle. A line still being written (no
        newline yet) is left for the next call.
        """
        fd = self._post_fds.get(instance_id)
        if fd is None:
            path = self._post_paths.get(instance_id)
            if path is None:
                folder = self.root / _check_id(instance_id)
                if not (folder / HEADER_FILE).is_file():
                    raise InstanceNotFoundError(instance_id)
                path = self._post_paths[instance_id] = os.fspath(folder / POSTS_FILE)
                if len(self._post_paths) > 4 * self.max_open_logs:
                    self._post_paths.pop(next(iter(self._post_paths)))
            try:
                # Never created here: a new name costs a directory update, and most
                # instances never get a post. Until one comes, each look is one failed open().
                fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
            except FileNotFoundError:
                return [], cursor
            except OSError as exc:
                raise StoreError(f"cannot open the mailbox: {exc}", instance_id=instance_id) from exc
            self._post_fds[instance_id] = fd
            while len(self._post_fds) > self.max_open_logs:
                _key, old = self._post_fds.popitem(last=False)
                with contextlib.suppress(OSError):
                    os.close(old)
        size = os.fstat(fd).st_size
        if size <= cursor:
            return [], cursor
        data = os.pread(fd, size - cursor, cursor)
        end = data.rfind(b"\n") + 1
        items = []
        for number, line in enumerate(data[:end].splitlines()):
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise StoreError(f"mailbox line at byte {cursor} + {number} is not JSON: {exc}",
                                 instance_id=instance_id) from exc
            if isinstance(obj, dict):
                items.append(obj)
        return items, cursor + end

    # -- locking -------------------------------------------------------------------------------

    async def acquire(self, instance_id: str, owner: str) -> Lease:  # noqa: C901 - each step can fail its own way
        """Take the instance's runner lock without waiting and return the :class:`Lease`.

        The lock is an ``flock`` on the instance's folder (so taking it creates no file). Who
        holds it is what the runner wrote in the header's ``runner`` key. Raise
        :class:`~loopwright.errors.InstanceLockedError` (with ``holder`` when it is known) if a
        live runner holds it, and :class:`~loopwright.errors.InstanceNotFoundError` if the
        instance does not exist. A lock whose holder died is free again: the kernel released it.
        """
        folder = self.root / _check_id(instance_id)
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        if instance_id in self._held:
            raise InstanceLockedError(instance_id, holder=self._runner(instance_id))
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
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
                    self._repair_tail(cached, folder / name)
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

    def _runner(self, instance_id: str) -> str | None:
        """Return the header's ``runner`` (who runs the instance), if it can be read."""
        try:
            header = json.loads((self.root / instance_id / HEADER_FILE).read_bytes())
        except (OSError, ValueError):
            return None
        runner = header.get("runner") if isinstance(header, dict) else None
        return str(runner) if runner else None

    def _dead_runner(self, instance_id: str, owner: str) -> str | None:
        """Return the runner of a header left ``running`` by someone else (who must have died)."""
        try:
            header = json.loads((self.root / instance_id / HEADER_FILE).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(header, dict) or header.get("state") != "running":
            return None
        runner = header.get("runner")
        return str(runner) if runner and not str(runner).startswith(owner) else None

    # -- lifetime ------------------------------------------------------------------------------

    def locations(self) -> Sequence[Path]:
        """Return ``(root,)``: no file root granted to an agent may contain or lie inside it."""
        return (self.root,)

    async def aclose(self) -> None:
        """Close every open log and release every lease still held. Appends afterwards raise."""
        self._closed = True
        while self._logs:
            _key, fd = self._logs.popitem()
            with contextlib.suppress(OSError):
                os.close(fd)
        while self._post_fds:
            _iid, fd = self._post_fds.popitem()
            with contextlib.suppress(OSError):
                os.close(fd)
        for lease in list(self._leases):
            lease.release()

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _header_bytes(instance_id: str, header: Mapping[str, Any]) -> bytes:
        if not isinstance(header, Mapping):
            raise StoreError(f"the header must be a mapping, not {type(header).__name__}",
                             instance_id=instance_id)
        try:
            return (_encode_header(dict(header)) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise StoreError(f"the header is not JSON-ready: {exc}", instance_id=instance_id) from exc

    def _commit_headers(self, group: list[_PendingHeader]) -> None:
        """Replace several headers with one disk flush: write each temp file, ``syncfs`` once, rename each.

        Where ``syncfs`` is not available (not Linux), or the group is a single header, each is
        written as :meth:`_replace_header` writes one. Runs in a worker thread.
        """
        if len(group) == 1 or _syncfs is None:
            for p in group:
                self._replace_one(p)
            return
        ready = [(p, tmp) for p in group if (tmp := self._write_temp(p)) is not None]
        if not ready:
            return
        # One flush of the filesystem the store is on makes every temp file above durable
        # (what an fsync of each would do, with one disk flush instead of one per header).
        try:
            _syncfs(self.root)
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
                    _fsync_dir(p.folder)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                p.finish(StoreError(f"cannot write {p.folder / HEADER_FILE}: {exc}", instance_id=p.instance_id))
                continue
            p.finish(None)

    @staticmethod
    def _write_temp(p: _PendingHeader) -> Path | None:
        """Write a pending header to a new temp file (no fsync) and return its path; on failure, finish it."""
        tmp = p.folder / f".{HEADER_FILE}.{os.getpid()}.{next(_TMP_NUMBERS)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
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
        tmp = folder / f".{HEADER_FILE}.{os.getpid()}.{next(_TMP_NUMBERS)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
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
            _fsync_dir(folder)
        except OSError as exc:
            raise StoreError(f"cannot fsync {folder}: {exc}", instance_id=instance_id) from exc

    def _append(self, instance_id: str, name: str, items: Sequence[Mapping[str, Any]]) -> None:
        """Encode ``items`` as lines and append them with one write (the hot path: keep it lean)."""
        if not items:
            return
        try:
            lines = [_encode_item(item) for item in items]
        except (TypeError, ValueError) as exc:
            raise StoreError(f"cannot append to {name}: {exc}", instance_id=instance_id) from exc
        lines.append("")
        data = "\n".join(lines).encode()
        key = (instance_id, name)
        logs = self._logs
        fd = logs.get(key)
        if fd is None:
            fd = self._open_log(instance_id, name)
        else:
            logs.move_to_end(key)
        try:
            _write_all(fd, data)
            if self.fsync:
                os.fsync(fd)
        except OSError as exc:
            # The write may be torn: reopen (and so repair the tail) before the next append.
            del logs[key]
            with contextlib.suppress(OSError):
                os.close(fd)
            raise StoreError(f"cannot append to {self.root / instance_id / name}: {exc}",
                             instance_id=instance_id) from exc

    def _open_log(self, instance_id: str, name: str) -> int:
        """Open a log for appending, cut a torn tail left by a crash, and cache the handle."""
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        folder = self.root / _check_id(instance_id)
        path = folder / name
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | _O_CLOEXEC)
            except FileNotFoundError:
                if not (folder / HEADER_FILE).is_file():
                    raise InstanceNotFoundError(instance_id) from None
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open {path}: {exc}", instance_id=instance_id) from exc
        try:
            self._repair_tail(fd, path)
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot repair {path}: {exc}", instance_id=instance_id) from exc
        self._cache_log(instance_id, name, fd)
        return fd

    def _cache_log(self, instance_id: str, name: str, fd: int) -> None:
        """Keep an open log handle, closing the least recently used beyond ``max_open_logs``."""
        logs = self._logs
        logs[(instance_id, name)] = fd
        while len(logs) > self.max_open_logs:
            _key, old = logs.popitem(last=False)
            with contextlib.suppress(OSError):
                os.close(old)

    @staticmethod
    def _repair_tail(fd: int, path: Path) -> None:
        """Truncate a torn last line (no newline, or not a JSON object) so appends start clean.

        Reads only the last line, once per opening: the cost does not grow with the log.
        """
        size = os.fstat(fd).st_size
        if size == 0:
            return
        if os.pread(fd, 1, size - 1) == b"\n":
            start = _line_start(fd, size - 1)
            if _is_object_line(os.pread(fd, size - 1 - start, start)):
                return
        else:
            start = _line_start(fd, size)
        os.ftruncate(fd, start)
        _log.warning("file store: dropped a torn last line of %d bytes from %s", size - start, path)

    def _read_log(self, instance_id: str, name: str) -> list[dict[str, Any]]:
        folder = self.root / _check_id(instance_id)
        path = folder / name
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            if not (folder / HEADER_FILE).is_file():
                raise InstanceNotFoundError(instance_id) from None
            return []
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}", instance_id=instance_id) from exc
        return _parse_lines(data, path, 0, instance_id)[0]

    def _note_checkpoint(self, instance_id: str, offset: int) -> None:
        """Remember the offset an instance's checkpoint covers (a bounded map: forgetting costs one read)."""
        marks = self._checkpointed
        marks[instance_id] = offset
        if len(marks) > 16 * self.max_open_logs:
            marks.pop(next(iter(marks)))

    @staticmethod
    def _checkpoint_offset(folder: Path) -> int:
        """Return the offset the checkpoint's frame names (0 without one); the frame alone is read."""
        try:
            with (folder / CHECKPOINT_FILE).open("rb") as f:
                frame = json.loads(f.readline())
            return int(frame["offset"]) if type(frame) is dict else 0
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _read_resume(self, instance_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int, int]:
        """Return the verified checkpoint (or ``None``), the entries after it, its offset, and where they end."""
        folder = self.root / _check_id(instance_id)
        path = folder / ENTRIES_FILE
        try:
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            if not (folder / HEADER_FILE).is_file():
                raise InstanceNotFoundError(instance_id) from None
            return None, [], 0, 0
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}", instance_id=instance_id) from exc
        try:
            size = os.fstat(fd).st_size
            checkpoint, offset = self._verified_checkpoint(instance_id, folder, fd, size)
            data = os.pread(fd, size - offset, offset)
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}", instance_id=instance_id) from exc
        finally:
            os.close(fd)
        entries, used = _parse_lines(data, path, offset, instance_id)
        return checkpoint, entries, offset, offset + used

    @staticmethod
    def _verified_checkpoint(instance_id: str, folder: Path, fd: int, size: int) -> tuple[dict[str, Any] | None, int]:
        """Return the checkpoint and its offset if it checks out against the log ``fd``, else ``(None, 0)``."""
        path = folder / CHECKPOINT_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None, 0
        except OSError as exc:
            _log.warning("file store: ignoring the checkpoint of %s: cannot read %s: %s", instance_id, path, exc)
            return None, 0
        problem = "its frame is not valid"
        try:
            head, _nl, body = data.partition(b"\n")
            body = body.removesuffix(b"\n")
            frame = json.loads(head)
            if type(frame) is dict and frame.get("v") == _CHECKPOINT_FRAME:
                offset, prefix, digest = frame["offset"], frame["prefix"], frame["sha256"]
                if hashlib.sha256(body).hexdigest() != digest:
                    problem = "its checksum does not match (torn or changed)"
                elif type(offset) is not int or not 0 < offset <= size:
                    problem = f"it covers {offset!r} bytes of a {size}-byte log"
                elif os.pread(fd, 1, offset - 1) != b"\n" or prefix != _prefix_hash(fd, offset):
                    problem = "the log before its offset is not the one it was made from"
                else:
                    state = json.loads(body)
                    if type(state) is dict:
                        return state, offset
                    problem = "it does not hold a JSON object"
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"{problem}: {exc}"
        _log.warning("file store: ignoring the checkpoint of %s (%s): %s; replaying the whole log",
                     instance_id, path, problem)
        return None, 0

    def _write_checkpoint(self, instance_id: str, folder: Path, state: Mapping[str, Any], offset: int) -> None:
        """Write ``state`` as the checkpoint of the log's first ``offset`` bytes: temp file, rename."""
        body = _encode_line(state).encode()
        fd = self._logs.get((instance_id, ENTRIES_FILE))
        own = fd is None
        if own:
            fd = os.open(folder / ENTRIES_FILE, os.O_RDONLY | _O_CLOEXEC)
        try:
            prefix = _prefix_hash(fd, offset)
        finally:
            if own:
                os.close(fd)
        frame = {"v": _CHECKPOINT_FRAME, "offset": offset, "prefix": prefix,
                 "sha256": hashlib.sha256(body).hexdigest()}
        data = (_encode_line(frame) + "\n").encode() + body + b"\n"
        tmp = folder / f".{CHECKPOINT_FILE}.{os.getpid()}.{next(_TMP_NUMBERS)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
        try:
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            tmp.replace(folder / CHECKPOINT_FILE)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


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


def _load_syncfs() -> Callable[[Path], None] | None:
    """Return ``syncfs(2)`` (flush one filesystem) through libc, or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415 - only on Linux, once
    import ctypes.util  # noqa: PLC0415

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.syncfs
    except (OSError, AttributeError):
        return None

    def syncfs(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            if call(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(path))
        finally:
            os.close(fd)

    return syncfs


_syncfs: Final = _load_syncfs()


def _prefix_hash(fd: int, offset: int) -> str:
    """Hash the (at most :data:`_PREFIX_BYTES`) bytes of a log before ``offset``, and the offset itself."""
    start = max(0, offset - _PREFIX_BYTES)
    h = hashlib.sha256(str(offset).encode())
    h.update(os.pread(fd, offset - start, start))
    return h.hexdigest()


def _parse_lines(data: bytes, path: Path, start: int, instance_id: str) -> tuple[list[dict[str, Any]], int]:
    """Parse a log's bytes (from byte ``start`` of the file) into objects; return them and the bytes used.

    A torn last line (not valid JSON, or no trailing newline) is dropped and not counted as
    used; a corrupt line anywhere else raises :class:`StoreError` naming the file and line.
    """
    lines = data.split(b"\n")
    # With a trailing newline the split ends with b""; otherwise that piece is a torn line.
    torn = len(lines.pop())
    used = len(data) - torn
    out: list[dict[str, Any]] = []
    loads = json.loads
    last = len(lines) - 1
    ended_clean = torn == 0
    where = "line" if start == 0 else f"byte {start} + line"
    for number, line in enumerate(lines):
        try:
            obj = loads(line)
        except ValueError as exc:
            if number == last and ended_clean:
                return out, used - len(line) - 1  # a torn last line: dropped, and cut before the next append
            raise StoreError(f"{path}: {where} {number + 1} is not valid JSON: {exc}",
                             instance_id=instance_id) from exc
        if type(obj) is not dict:
            if number == last and ended_clean:
                return out, used - len(line) - 1
            raise StoreError(f"{path}: {where} {number + 1} holds a JSON {type(obj).__name__}, "
                             "not an object", instance_id=instance_id)
        out.append(obj)
    return out, used
