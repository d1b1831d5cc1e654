"""Built-in plugin: the ``sqlite`` store, every instance in one SQLite database (stdlib ``sqlite3``).

Assembly::

    store:
      kind: sqlite
      path: .loopwright/loopwright.db   # default; relative to the assembly's folder
      synchronous: normal               # default; full also survives power loss, at a disk flush per write
      createParents: false              # default; true creates the folders above path too

The folder of ``path`` must exist when the store is built (a mistyped path is a
:class:`~loopwright.errors.ConfigError` at ``store.path``, not a new empty database), unless
``createParents: true`` or it is ``.loopwright`` in the assembly's folder, where the default lives.

Schema (``PRAGMA user_version = 1``)::

    instances(id TEXT PRIMARY KEY, header TEXT NOT NULL, created_at TEXT NOT NULL)
    entries(seq INTEGER PRIMARY KEY, instance_id TEXT NOT NULL REFERENCES instances(id), json TEXT NOT NULL)
    records(...)   the same as entries
    posts(...)     the same as entries: the mailbox
    + an index on (instance_id, seq) of each log table

``header`` and ``json`` hold compact JSON text (one object each). ``created_at`` is the header's
``createdAt`` (``''`` without one), kept for :meth:`SqliteStore.list_headers`. A log row's
``seq`` is the table's rowid: SQLite has one writer at a time, so rows are numbered in commit
order across processes, and a mailbox cursor is the ``seq`` of the last post read.

Choices:

* **Every write is its own committed transaction**, in WAL mode: ``create`` is one ``INSERT``
  (a half-created instance cannot be seen), a header write one ``UPDATE``, an append one
  ``INSERT`` per item inside one transaction (all of a batch or none). When a write returns it
  is committed, so any process reading the database sees it; a process killed mid-write loses
  only that write (SQLite rolls it back). Appends are ``INSERT`` s into B-trees, and nothing is
  ever rewritten: an append cost 22 µs as the 1st of a log and 19 µs as the 20,000th here.
* **synchronous.** ``normal`` (the default, like the file store's ``fsync: false``): in WAL mode
  a commit is written to the ``-wal`` file without a flush, so it survives a killed process but
  the last commits may be lost on power loss or a kernel crash (never the database's
  consistency). ``full`` flushes the WAL at every commit, so commits also survive power loss.
* **Where the work runs.** With ``normal`` each call runs inline on the event loop: an append
  measured about 20 µs here, while a hop to a worker thread costs 60-90 µs by itself. With
  ``full`` a commit costs a disk flush (0.2 to 4 ms here), which would stall every other
  instance on the event loop, so every call runs in a worker thread. One connection per store
  object (``check_same_thread=False``), used under a lock. A busy database (another process
  writing) is waited on for up to 5 s (``busy_timeout``); writes are short, so waits are too.
* **Leases** (one runner per instance, across processes): an exclusive, non-blocking ``flock``
  on ``<path>.locks/<instance_id>.lock``, created by the first :meth:`~SqliteStore.acquire` of
  the instance and never removed (removing a lock file races with its next taker). The kernel
  drops an ``flock`` when its holder dies, so a killed runner's lease is free at once. A lock in
  the database instead would outlive a killed holder and need expiry times. Who holds it is the
  header's ``runner`` key, which the runtime writes when it starts a segment. ``flock`` is
  POSIX-only and unreliable on network file systems (NFS, SMB): as the database itself, the
  store is for processes on one machine; use ``postgres`` across machines. (The leases are
  :mod:`loopwright.builtins._sqlite_lease`.)

Instance ids follow the file store's rule (``[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}`` without
``..``), so an id is valid in both and can name a lock file. The database file and its folder
are created owner-only (0o600/0o700) by the first :meth:`~SqliteStore.create` (the folder only
with ``createParents`` or in ``.loopwright``); until then
reads find nothing and create nothing.

**The database must never lie inside a file root granted to an agent**: :meth:`SqliteStore.locations`
returns the database, its ``-wal`` and ``-shm`` files and the lock folder, so the runtime
refuses such an assembly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio

from loopwright._header_fields import HeaderFields
from loopwright.abc import Store, StoreSettings
from loopwright.builtins._file_io import check_id as _check_id
from loopwright.builtins._file_io import encode_line as _encode_line
from loopwright.builtins._file_lease import Lease
from loopwright.builtins._sqlite_lease import Locks, dead_runner
from loopwright.builtins._store_path import store_path
from loopwright.errors import (
    ConfigError,
    ConfigProblem,
    InstanceNotFoundError,
    StoreError,
)
from loopwright.hookspecs import hookimpl

if TYPE_CHECKING:
    import sqlite3  # noqa: TC004 - imported at run time by _import_sqlite3(), on first use

__all__ = ["Lease", "SqliteStore", "loopwright_register_stores"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The database when ``path`` is not set, relative to the assembly's folder (next to the file
#: store's default ``.loopwright/instances``).
DEFAULT_PATH: Final = ".loopwright/loopwright.db"

#: How long a write waits for another process's write to finish, in milliseconds.
BUSY_TIMEOUT_MS: Final = 5000

SCHEMA_VERSION: Final = 1
_LOGS: Final = ("entries", "records", "posts")
_SCHEMA: Final = (
    ("CREATE TABLE IF NOT EXISTS instances ("
     "id TEXT PRIMARY KEY, header TEXT NOT NULL, created_at TEXT NOT NULL) WITHOUT ROWID"),
    *(stmt for table in _LOGS for stmt in (
        (f"CREATE TABLE IF NOT EXISTS {table} (seq INTEGER PRIMARY KEY, "
         f"instance_id TEXT NOT NULL REFERENCES instances(id), json TEXT NOT NULL)"),
        f"CREATE INDEX IF NOT EXISTS {table}_by_instance ON {table}(instance_id, seq)",
    )),
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
_OPTIONS: Final = frozenset({"path", "synchronous", "createParents"})
_SYNCHRONOUS: Final = ("normal", "full")
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)


@hookimpl
def loopwright_register_stores(register: Callable[..., None]) -> None:
    """Register the ``sqlite`` store kind."""
    register("sqlite", SqliteStore)


def _import_sqlite3() -> None:
    """Import :mod:`sqlite3` on first use: every runtime registers this plugin, few open a database."""
    global sqlite3  # noqa: PLW0603 - bound once; ``except sqlite3.Error`` is only evaluated after it
    import sqlite3  # noqa: PLC0415 - sqlite3 only when the sqlite store is used


def _encode(instance_id: str, item: object, what: str) -> str:
    """Return ``item`` as one line of compact JSON; raise StoreError if it is not a JSON-ready mapping."""
    if not isinstance(item, Mapping):
        raise StoreError(f"cannot write to {what}: each item must be a mapping, not {type(item).__name__}",
                         instance_id=instance_id)
    try:
        return _encode_line(item)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"cannot write to {what}: {exc}", instance_id=instance_id) from exc


class SqliteStore(Store):
    """Instances as rows of one SQLite database (see the module docstring).

    :param settings: ``settings.options`` may hold ``path`` (the database file, default
        ``.loopwright/loopwright.db``, relative to ``settings.base_dir``; ``~`` is expanded),
        ``synchronous`` (``normal``, the default, or ``full``) and ``createParents`` (bool,
        default ``False``: create the missing folders above ``path`` too). Any other key, a value
        of the wrong type, or a ``path`` whose folder does not exist (unless ``createParents``,
        or the folder is ``.loopwright`` in ``settings.base_dir``, the runtime's own folder)
        raises :class:`~loopwright.errors.ConfigError` at ``$.store.KEY``; nothing is created then.

    Attributes:
        path: The database file, absolute. Created by the first :meth:`create`.
        create_parents: Whether that first :meth:`create` also creates the folders above ``path``.
        lock_dir: The folder of the lease lock files (``<path>.locks``).
        synchronous: ``"normal"`` or ``"full"``.
    """

    def __init__(self, settings: StoreSettings) -> None:
        """Check the options and resolve the database's path; nothing is opened or created yet."""
        options = settings.options
        problems = [
            ConfigProblem(f"unknown option {key!r} of the sqlite store (known: {', '.join(sorted(_OPTIONS))})",
                          path=f"$.store.{key}")
            for key in options if key not in _OPTIONS
        ]
        where = store_path(options, settings.base_dir, DEFAULT_PATH, "the sqlite store")
        problems += where.problems
        synchronous = options.get("synchronous", "normal")
        if synchronous not in _SYNCHRONOUS:
            problems.append(ConfigProblem("must be normal or full", path="$.store.synchronous"))
        if problems:
            raise ConfigError("invalid options for the sqlite store", problems=problems)
        self.path: Path = where.path
        self.create_parents: bool = where.create_parents
        self.lock_dir: Path = self.path.with_name(self.path.name + ".locks")
        self.synchronous: str = synchronous
        self._conn: sqlite3.Connection | None = None
        self._mutex = threading.Lock()
        self._closed = False
        self._known: set[str] = set()  # ids seen to exist (a delete here drops its id)
        self._locks = Locks(self.lock_dir)

    def __repr__(self) -> str:
        """Show the database's path and the synchronous option."""
        return f"SqliteStore(path={str(self.path)!r}, synchronous={self.synchronous!r})"

    # -- connection ------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` under the connection's lock: inline, or in a worker thread with ``full``."""
        if self.synchronous == "full":
            return await anyio.to_thread.run_sync(self._locked, fn, *args)
        return self._locked(fn, *args)

    def _locked(self, fn: Callable[..., _T], *args: Any) -> _T:
        with self._mutex:
            return fn(*args)

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        """Return the connection, opening it (and creating the database if ``create``) on first use.

        Return ``None`` when the database does not exist and ``create`` is false.
        """
        if self._closed:
            raise StoreError(f"the store is closed ({self.path})")
        if self._conn is not None:
            return self._conn
        _import_sqlite3()
        if not self.path.exists():
            if not create:
                return None
            try:
                if self.create_parents:
                    self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                # Created owner-only before SQLite opens it; its -wal and -shm files take its mode.
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600))
            except OSError as exc:
                raise StoreError(f"cannot create {self.path}: {exc}") from exc
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        try:
            self._prepare(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Set the connection's pragmas and create the schema if the database has none yet."""
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
        conn.execute("PRAGMA foreign_keys = ON")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}; this loopwright knows "
                             f"up to {SCHEMA_VERSION}: upgrade loopwright")
        if version < SCHEMA_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _SCHEMA:
                    conn.execute(stmt)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _error(self, exc: sqlite3.Error, instance_id: str, doing: str) -> StoreError:
        return StoreError(f"cannot {doing} in {self.path}: {exc}", instance_id=instance_id)

    def _exists(self, conn: sqlite3.Connection, instance_id: str) -> bool:
        if instance_id in self._known:
            return True
        if conn.execute("SELECT 1 FROM instances WHERE id = ?", (instance_id,)).fetchone() is None:
            return False
        self._known.add(instance_id)
        return True

    # -- headers -------------------------------------------------------------------------------

    async def create(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Insert the instance's row, in one transaction.

        Raise :class:`~loopwright.errors.StoreError` if the id exists, the id is invalid, or
        the header is not JSON-ready (nothing is written then).
        """
        text, created = self._header_text(_check_id(instance_id), header)
        await self._run(self._create, instance_id, text, created)

    async def create_leased(self, instance_id: str, header: Mapping[str, Any], owner: str) -> Lease:
        """Create the instance (as :meth:`create`) with its lease already held by ``owner``.

        The lock file is locked before the row is inserted, so another process's
        :meth:`acquire` finds no instance, then a locked one: never a free lease.
        """
        text, created = self._header_text(_check_id(instance_id), header)
        fd = self._locks.open(instance_id)
        try:
            if not self._locks.try_lock(fd, instance_id):  # a lock file left by an earlier instance of this id
                raise StoreError(f"already exists (in {self.path})", instance_id=instance_id)  # noqa: TRY301
            await self._run(self._create, instance_id, text, created)
        except BaseException:
            os.close(fd)
            raise
        return self._locks.lease(instance_id, owner, fd, functools.partial(self._dead_runner, instance_id, owner))

    def _create(self, instance_id: str, text: str, created: str) -> None:
        conn = self._connect(create=True)
        assert conn is not None  # noqa: S101 - create=True always connects
        try:
            conn.execute("INSERT INTO instances (id, header, created_at) VALUES (?, ?, ?)",
                         (instance_id, text, created))
        except sqlite3.IntegrityError:
            raise StoreError(f"already exists (in {self.path})", instance_id=instance_id) from None
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, "create the instance") from exc
        self._known.add(instance_id)

    async def write_header(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Replace the header in one ``UPDATE``: any reader sees the old one or the new one.

        Raise :class:`~loopwright.errors.InstanceNotFoundError` if the instance does not exist.
        """
        text, created = self._header_text(_check_id(instance_id), header)
        await self._run(self._write_header, instance_id, text, created)

    def _write_header(self, instance_id: str, text: str, created: str) -> None:
        conn = self._connect(create=False)
        if conn is None:
            raise InstanceNotFoundError(instance_id)
        try:
            cursor = conn.execute("UPDATE instances SET header = ?, created_at = ? WHERE id = ?",
                                  (text, created, instance_id))
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, "write the header") from exc
        if cursor.rowcount == 0:
            raise InstanceNotFoundError(instance_id)

    async def read_header(self, instance_id: str) -> dict[str, Any]:
        """Return the header; raise :class:`~loopwright.errors.InstanceNotFoundError` if absent.

        A header that is not a JSON object raises :class:`~loopwright.errors.StoreError` naming
        the database and the instance.
        """
        return await self._run(self._read_header, _check_id(instance_id))

    def _read_header(self, instance_id: str) -> dict[str, Any]:
        conn = self._connect(create=False)
        if conn is None:
            raise InstanceNotFoundError(instance_id)
        try:
            row = conn.execute("SELECT header FROM instances WHERE id = ?", (instance_id,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, "read the header") from exc
        if row is None:
            raise InstanceNotFoundError(instance_id)
        return self._parse(instance_id, row[0], "the header")

    async def list_headers(self) -> list[dict[str, Any]]:
        """Return every instance's header, sorted by ``createdAt`` (none first) and then by id.

        A header that cannot be read is skipped with a warning logged on this module's logger.
        """
        return await self._run(self._list_headers)

    def _list_headers(self) -> list[dict[str, Any]]:
        conn = self._connect(create=False)
        if conn is None:
            return []
        try:
            rows = conn.execute("SELECT id, header FROM instances ORDER BY created_at, id").fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot list the instances in {self.path}: {exc}") from exc
        headers = []
        for instance_id, text in rows:
            try:
                headers.append(self._parse(instance_id, text, "the header"))
            except StoreError as exc:
                _log.warning("sqlite store: skipping an instance whose header cannot be read: %s", exc)
        return headers

    # -- logs ----------------------------------------------------------------------------------

    async def append_entries(self, instance_id: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append to the entry log in one transaction; when this returns, any process can read them.

        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance and
        :class:`~loopwright.errors.StoreError` if an entry is not a JSON-ready mapping (nothing
        is written then).
        """
        await self._append(instance_id, "entries", entries)

    async def read_entries(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole entry log in order."""
        return await self._run(self._read_log, _check_id(instance_id), "entries")

    async def append_records(self, instance_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Append to the record log; same contract as :meth:`append_entries`."""
        await self._append(instance_id, "records", records)

    async def read_records(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole record log in order."""
        return await self._run(self._read_log, _check_id(instance_id), "records")

    async def _append(self, instance_id: str, table: str, items: Sequence[Mapping[str, Any]]) -> None:
        _check_id(instance_id)
        lines = [_encode(instance_id, item, table) for item in items]
        if lines or instance_id not in self._known:
            await self._run(self._insert, instance_id, table, lines)

    def _insert(self, instance_id: str, table: str, lines: list[str]) -> None:
        conn = self._connect(create=False)
        if conn is None:
            raise InstanceNotFoundError(instance_id)
        if not lines:
            if not self._exists(conn, instance_id):
                raise InstanceNotFoundError(instance_id)
            return
        sql = f"INSERT INTO {table} (instance_id, json) VALUES (?, ?)"  # noqa: S608 - table is one of _LOGS
        try:
            if len(lines) == 1:
                conn.execute(sql, (instance_id, lines[0]))  # one statement: its own transaction
            else:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(sql, [(instance_id, line) for line in lines])
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.IntegrityError:
            raise InstanceNotFoundError(instance_id) from None  # the foreign key: no such instance
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, f"append to {table}") from exc

    def _read_log(self, instance_id: str, table: str) -> list[dict[str, Any]]:
        conn = self._connect(create=False)
        if conn is None:
            raise InstanceNotFoundError(instance_id)
        try:
            rows = conn.execute(f"SELECT seq, json FROM {table} WHERE instance_id = ? ORDER BY seq",  # noqa: S608
                                (instance_id,)).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, f"read {table}") from exc
        if not rows and not self._exists(conn, instance_id):
            raise InstanceNotFoundError(instance_id)
        return [self._parse(instance_id, text, f"{table} row {seq}") for seq, text in rows]

    # -- mailbox ---------------------------------------------------------------------------------

    async def post(self, instance_id: str, item: Mapping[str, Any]) -> None:
        """Append ``item`` to the instance's mailbox (any process, any time), committed on return.

        An item with an ``id`` is idempotent (see :meth:`loopwright.abc.Store.post`): one
        ``INSERT ... WHERE NOT EXISTS`` over the instance's posts, atomic since SQLite has one
        writer at a time. Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance.
        """
        line = _encode(_check_id(instance_id), item, "the mailbox")
        post_id = item.get("id")
        if isinstance(post_id, str) and post_id:
            await self._run(self._insert_post, instance_id, line, post_id)
            return
        await self._run(self._insert, instance_id, "posts", [line])

    def _insert_post(self, instance_id: str, line: str, post_id: str) -> None:
        conn = self._connect(create=False)
        if conn is None:
            raise InstanceNotFoundError(instance_id)
        try:
            conn.execute("INSERT INTO posts (instance_id, json) SELECT ?, ? WHERE NOT EXISTS (SELECT 1 FROM posts "
                         "WHERE instance_id = ? AND json_extract(json, '$.id') = ?)",
                         (instance_id, line, instance_id, post_id))
        except sqlite3.IntegrityError:
            raise InstanceNotFoundError(instance_id) from None  # the foreign key: no such instance
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, "post") from exc

    async def delete(self, instance_id: str) -> None:
        """Delete the instance's row and its entries, records and posts in one transaction (see :meth:`Store.delete`).

        The lock file stays (as for every instance: removing one races with its next taker).

        :raises InstanceNotFoundError: There is no such instance.
        """
        await self._run(self._delete, _check_id(instance_id))

    def _delete(self, instance_id: str) -> None:
        conn = self._connect(create=False)
        if conn is None:
            raise InstanceNotFoundError(instance_id)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute("SELECT 1 FROM instances WHERE id = ?", (instance_id,)).fetchone() is None:
                    raise InstanceNotFoundError(instance_id)  # noqa: TRY301 - rolled back below
                for table in _LOGS:
                    conn.execute(f"DELETE FROM {table} WHERE instance_id = ?", (instance_id,))  # noqa: S608 - one of _LOGS
                conn.execute("DELETE FROM instances WHERE id = ?", (instance_id,))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, "delete the instance") from exc
        finally:
            self._known.discard(instance_id)

    async def read_posts(self, instance_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Return the posts after ``cursor`` (a row ``seq``; 0 reads all) and the ``seq`` of the last one.

        Nothing new costs one indexed query and returns ``cursor`` itself.
        """
        return await self._run(self._read_posts, _check_id(instance_id), cursor)

    def _read_posts(self, instance_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:
        conn = self._connect(create=False)
        if conn is None or not self._exists(conn, instance_id):
            raise InstanceNotFoundError(instance_id)
        try:
            rows = conn.execute("SELECT seq, json FROM posts WHERE instance_id = ? AND seq > ? ORDER BY seq",
                                (instance_id, cursor)).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc, instance_id, "read the mailbox") from exc
        if not rows:
            return [], cursor
        return [self._parse(instance_id, text, f"posts row {seq}") for seq, text in rows], rows[-1][0]

    # -- locking -------------------------------------------------------------------------------

    async def acquire(self, instance_id: str, owner: str) -> Lease:
        """Take the instance's runner lease without waiting and return the :class:`Lease`.

        The lease is an ``flock`` on ``<path>.locks/<instance_id>.lock``. Raise
        :class:`~loopwright.errors.InstanceLockedError` (with the header's ``runner`` as
        ``holder``) if a live runner holds it, and :class:`~loopwright.errors.InstanceNotFoundError`
        if the instance does not exist. A lease whose holder died is free: the kernel released it.
        """
        header = await self.read_header(instance_id)  # raises for an unknown or invalid id
        runner = HeaderFields(header).runner
        return self._locks.acquire(instance_id, owner, str(runner) if runner else None,
                                   functools.partial(self._dead_runner, instance_id, owner))

    def _dead_runner(self, instance_id: str, owner: str) -> str | None:
        """Return the runner of a header left ``running`` by someone else (who must have died)."""
        try:
            return dead_runner(self._locked(self._read_header, instance_id), owner)
        except StoreError:
            return None

    # -- lifetime ------------------------------------------------------------------------------

    def locations(self) -> Sequence[Path]:
        """Return the database, its ``-wal`` and ``-shm`` files and the lock folder."""
        return (self.path, self.path.with_name(self.path.name + "-wal"),
                self.path.with_name(self.path.name + "-shm"), self.lock_dir)

    async def aclose(self) -> None:
        """Close the connection and release every lease still held. Later calls raise StoreError."""
        self._closed = True
        self._locks.release_all()
        with self._mutex:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _header_text(instance_id: str, header: Mapping[str, Any]) -> tuple[str, str]:
        if not isinstance(header, Mapping):
            raise StoreError(f"the header must be a mapping, not {type(header).__name__}",
                             instance_id=instance_id)
        try:
            text = _encode_line(header)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"the header is not JSON-ready: {exc}", instance_id=instance_id) from exc
        created = HeaderFields(dict(header)).created_at
        return text, created if isinstance(created, str) else ""

    def _parse(self, instance_id: str, text: str, what: str) -> dict[str, Any]:
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise StoreError(f"{what} in {self.path} is not valid JSON: {exc}", instance_id=instance_id) from exc
        if type(obj) is not dict:
            raise StoreError(f"{what} in {self.path} holds a JSON {type(obj).__name__}, not an object",
                             instance_id=instance_id)
        return obj
