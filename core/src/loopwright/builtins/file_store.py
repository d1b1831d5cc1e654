"""Built-in plugin: the ``file`` store, the embedded default.

Assembly::

    store:
      kind: file
      path: .loopwright/instances   # default; relative to the assembly's folder
      fsync: false                  # default; true also survives power loss, at a cost per append
      createParents: false          # default; true creates the folders above path too

The folder above ``path`` must exist when the store is built (a mistyped path is a
:class:`~loopwright.errors.ConfigError` at ``store.path``, not a new empty store), unless
``createParents: true`` or it is ``.loopwright`` in the assembly's folder, where the default lives.

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
open log handles are kept in an LRU (:attr:`FileStore.max_open_logs`, a third of the process's
descriptor limit) closed by :meth:`FileStore.aclose`. A log the store closed itself while it held
the instance's lease, and which is unchanged since (inode, size, ctime), is reopened without
reading its tail again. The methods are ``async def`` but do their file I/O directly, without
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

The code is split by concern: this module holds the store, its header reads and its logs;
:mod:`~loopwright.builtins._file_create` the creation of instances,
:mod:`~loopwright.builtins._file_header` the header rewrites and their group commit,
:mod:`~loopwright.builtins._file_lease` the lease, :mod:`~loopwright.builtins._file_mailbox` the
mailbox, :mod:`~loopwright.builtins._file_checkpoint` the checkpoints (parts of :class:`FileStore`
as mixins), and :mod:`~loopwright.builtins._file_io` the file names, the id rule and the
low-level reads and writes they share.

Headers that cannot be read are skipped by :meth:`FileStore.list_headers` with a warning logged
on the ``loopwright.builtins.file_store`` logger (not :mod:`warnings`: it is a problem of the
data at run time, not of the calling code, and must be reported every time).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pluggy

from loopwright._header_fields import HeaderFields
from loopwright._ids import is_instance_id
from loopwright.abc import Store, StoreSettings
from loopwright.builtins._file_checkpoint import Checkpoints
from loopwright.builtins._file_create import Creating
from loopwright.builtins._file_header import Headers, _PendingHeader
from loopwright.builtins._file_io import (
    CHECKPOINT_FILE,
    DEFAULT_PATH,
    ENTRIES_FILE,
    HEADER_FILE,
    O_CLOEXEC,
    POSTS_FILE,
    RECORDS_FILE,
    check_id,
    encode_item,
    log,
    open_logs_limit,
    parse_lines,
    repair_tail,
    write_all,
)
from loopwright.builtins._file_lease import Lease, Locking
from loopwright.builtins._file_mailbox import Mailbox
from loopwright.builtins._store_path import store_path
from loopwright.errors import (
    ConfigError,
    ConfigProblem,
    InstanceNotFoundError,
    StoreError,
)

if TYPE_CHECKING:
    import anyio

__all__ = [
    "CHECKPOINT_FILE",
    "DEFAULT_PATH",
    "ENTRIES_FILE",
    "HEADER_FILE",
    "POSTS_FILE",
    "RECORDS_FILE",
    "FileStore",
    "Lease",
    "loopwright_register_stores",
]

_OPTIONS: Final = frozenset({"path", "fsync", "createParents"})
#: :data:`loopwright.hookimpl` (the same marker: ``pluggy.HookimplMarker("loopwright")``), made here
#: so that reading the store without a runtime (``ls``, ``show``) imports no hookspecs (issue 30).
hookimpl: Final = pluggy.HookimplMarker("loopwright")
# A module global, so that the kill matrix (tests/crash/crash_plugin.py) can wrap it: every write of a
# log goes through it (a new instance's header: _file_create._write_all; rewrites: _file_header._write_all).
_write_all = write_all


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    """Return what shows that a log changed: its inode, size and ctime (every write and truncation sets it)."""
    return (st.st_ino, st.st_size, st.st_ctime_ns)


@hookimpl
def loopwright_register_stores(register: Callable[..., None]) -> None:
    """Register the ``file`` store kind."""
    register("file", FileStore)


class FileStore(Creating, Headers, Checkpoints, Mailbox, Locking, Store):
    """Instances as folders of JSON files: the embedded default store (see the module docstring).

    :param settings: ``settings.options`` may hold ``path`` (the store folder, default
        ``.loopwright/instances``, relative to ``settings.base_dir``; ``~`` is expanded),
        ``fsync`` (bool, default ``False``: fsync every append too) and ``createParents`` (bool,
        default ``False``: create the missing folders above ``path`` too). Any other key, a value
        of the wrong type, or a ``path`` whose parent folder does not exist (unless
        ``createParents``, or the parent is ``.loopwright`` in ``settings.base_dir``, the
        runtime's own folder) raises :class:`~loopwright.errors.ConfigError` at ``$.store.KEY``;
        nothing is created then.

    Attributes:
        root: The store folder, absolute. Created on the first :meth:`create`.
        create_parents: Whether that first :meth:`create` also creates the folders above ``root``.
        fsync: Whether every append is fsynced.
        max_open_logs: How many log files stay open for appending (least recently used closed
            first): a third of the soft ``RLIMIT_NOFILE`` (64 to 65,536), leaving the rest to the
            leases (one descriptor per held instance), the mailboxes and everything else.
        checkpoint_bytes: How much an entry log grows between two checkpoints (see :meth:`checkpoint`).
    """

    max_open_logs: int
    #: How many bytes must be appended to an entry log since its checkpoint before :meth:`checkpoint` writes a new one.
    checkpoint_bytes: int = 256 * 1024

    def __init__(self, settings: StoreSettings) -> None:
        """Check the options and resolve the store folder; nothing is created yet."""
        options = settings.options
        problems = [
            ConfigProblem(f"unknown option {key!r} of the file store (known: {', '.join(sorted(_OPTIONS))})",
                          path=f"$.store.{key}")
            for key in options if key not in _OPTIONS
        ]
        where = store_path(options, settings.base_dir, DEFAULT_PATH, "the file store")
        problems += where.problems
        fsync = options.get("fsync", False)
        if not isinstance(fsync, bool):
            problems.append(ConfigProblem("must be true or false", path="$.store.fsync"))
        if problems:
            raise ConfigError("invalid options for the file store", problems=problems)
        self.root: Path = where.path
        self.create_parents: bool = where.create_parents
        self.fsync: bool = fsync
        self._root_s = os.fspath(self.root)
        self.max_open_logs = open_logs_limit()
        # (instance_id, file name) -> _identity() of a log this store closed while it held the lease.
        self._clean: dict[tuple[str, str], tuple[int, int, int]] = {}
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

    async def read_header(self, instance_id: str) -> dict[str, Any]:
        """Return the header.

        Raise :class:`~loopwright.errors.InstanceNotFoundError` if absent (a header torn by a
        crash during :meth:`create`, with nothing logged yet, counts as absent: that instance
        never ran), and :class:`~loopwright.errors.StoreError` naming the file if it is not a
        JSON object.
        """
        path = self.root / check_id(instance_id) / HEADER_FILE
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
            if not is_instance_id(name):
                continue
            try:
                header = await self.read_header(name)
            except InstanceNotFoundError:
                continue
            except StoreError as exc:
                log.warning("file store: skipping an instance whose header cannot be read: %s", exc)
                continue
            created = HeaderFields(header).created_at
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

    # -- deleting ------------------------------------------------------------------------------

    async def delete(self, instance_id: str) -> None:
        """Delete the instance's folder: its header, logs, mailbox and checkpoint (see :meth:`Store.delete`).

        The folder is first renamed to a hidden name (``.deleted-ID-RANDOM``, which is no
        instance id), so every reader finds the instance gone at once, then removed with
        everything in it. The caller's lease (an ``flock`` on the folder) stays valid until it
        is released. A crash between the two leaves only the hidden folder, which no read sees.

        :raises InstanceNotFoundError: There is no such instance.
        :raises StoreError: The folder cannot be renamed or removed (naming it).
        """
        folder = self.root / check_id(instance_id)
        if not (folder / HEADER_FILE).is_file():
            raise InstanceNotFoundError(instance_id)
        self._forget(instance_id)
        tomb = self.root / f".deleted-{instance_id}-{os.urandom(4).hex()}"
        try:
            folder.rename(tomb)
        except OSError as exc:
            raise StoreError(f"cannot delete {folder}: {exc}", instance_id=instance_id) from exc
        import shutil  # noqa: PLC0415 - only to delete: ls and show import no more than they need (issue 30)

        try:
            shutil.rmtree(tomb)
        except OSError as exc:
            raise StoreError(f"deleted, but cannot remove {tomb}: {exc}", instance_id=instance_id) from exc

    def _forget(self, instance_id: str) -> None:
        """Close and drop every descriptor and cache this store keeps for ``instance_id``."""
        for name in (ENTRIES_FILE, RECORDS_FILE):
            fd = self._logs.pop((instance_id, name), None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._clean.pop((instance_id, name), None)
        fd = self._post_fds.pop(instance_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._post_paths.pop(instance_id, None)
        self._checkpointed.pop(instance_id, None)

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

    def _append(self, instance_id: str, name: str, items: Sequence[Mapping[str, Any]]) -> None:
        """Encode ``items`` as lines and append them with one write (the hot path: keep it lean)."""
        if not items:
            return
        try:
            lines = [encode_item(item) for item in items]
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
        """Open a log for appending, cut a torn tail left by a crash, and cache the handle.

        The tail is not read again when this store itself closed the log (to keep the LRU in
        bounds) while it held the instance's lease, and the file is as it was then: same inode,
        size and ctime. Anything else (another writer, a torn write of this process) is repaired.
        """
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        folder = f"{self._root_s}/{check_id(instance_id)}"
        path = f"{folder}/{name}"
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | O_CLOEXEC)
            except FileNotFoundError:
                if not os.path.isfile(f"{folder}/{HEADER_FILE}"):  # noqa: PTH113 - no Path objects on the hot path
                    raise InstanceNotFoundError(instance_id) from None
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open {path}: {exc}", instance_id=instance_id) from exc
        try:
            seen = self._clean.pop((instance_id, name), None)
            if seen is None or instance_id not in self._held or _identity(os.fstat(fd)) != seen:
                repair_tail(fd, path)
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot repair {path}: {exc}", instance_id=instance_id) from exc
        self._cache_log(instance_id, name, fd)
        return fd

    def _cache_log(self, instance_id: str, name: str, fd: int) -> None:
        """Keep an open log handle, closing the least recently used beyond ``max_open_logs``.

        A log closed while its instance's lease is held here is remembered (inode, size,
        ctime) so that reopening it need not repair its tail (see :meth:`_open_log`).
        """
        logs = self._logs
        logs[(instance_id, name)] = fd
        held = self._held
        while len(logs) > self.max_open_logs:
            key, old = logs.popitem(last=False)
            with contextlib.suppress(OSError):
                if key[0] in held:
                    self._clean[key] = _identity(os.fstat(old))
                os.close(old)

    def _read_log(self, instance_id: str, name: str) -> list[dict[str, Any]]:
        folder = self.root / check_id(instance_id)
        path = folder / name
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            if not (folder / HEADER_FILE).is_file():
                raise InstanceNotFoundError(instance_id) from None
            return []
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}", instance_id=instance_id) from exc
        return parse_lines(data, path, 0, instance_id)[0]
