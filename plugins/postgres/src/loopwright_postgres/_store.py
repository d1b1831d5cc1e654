"""The ``postgres`` store: instances in PostgreSQL tables, shared by any number of processes.

See the package docstring and ``docs/stores/postgres.md`` for the options and the tables.

Why threads, not psycopg's async API: psycopg's ``AsyncConnection`` runs only under asyncio,
and loopwright runs under asyncio and trio (anyio). Every call here runs psycopg's blocking API
in a worker thread (``anyio.to_thread.run_sync``) on a connection from a
:class:`psycopg_pool.ConnectionPool`, so the store works the same under both. A thread hop costs
tens of microseconds, well under a round trip to a database server. The wait for a worker thread
is not cancellable: a write that started finishes (or fails) before the caller sees a
cancellation, so it is never left half-known.

Leases are session-level advisory locks (``pg_try_advisory_lock``), each held on a connection of
its own for as long as the lease is held. The server drops the lock when that connection ends,
which happens at once when the holding process dies (the kernel closes its socket) and, for a
machine that vanished, once TCP keepalives give up (set on the lock's session to about 40 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

import anyio
import attrs
import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg_pool
from psycopg import sql

from loopwright.abc import Lease as BaseLease
from loopwright.abc import Store, StoreSettings
from loopwright.errors import (
    ConfigError,
    ConfigProblem,
    InstanceLockedError,
    InstanceNotFoundError,
    StoreError,
)

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

__all__ = ["DEFAULT_SCHEMA", "Lease", "PostgresStore"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The schema the tables live in when ``schema`` is not set.
DEFAULT_SCHEMA: Final = "loopwright"

_OPTIONS: Final = ("connectTimeout", "dsn", "dsnEnv", "poolSize", "schema")
# The file store's rule, so that an id is valid in every store.
_ID_RE: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
# Lower case only: the name then needs no quoting in psql or anywhere else.
_SCHEMA_RE: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TABLES: Final = ("instances", "entries", "records", "posts")
# Instances that may have work for a worker (see find_work): the predicate of the partial index
# instances_work, repeated word for word in the query so that the planner uses that index. The
# columns are copies of header keys, written with the header (json operators cannot read every
# header: they refuse a string holding U+0000).
_WORK: Final = ("(state = 'running' OR (state = 'waiting_for_approval' AND decided) "
                "OR (state IN ('waiting', 'stopped', 'error') AND last_post > inbox_cursor))")
#: Columns added to ``instances`` for find_work, with their types (added to older tables too).
_WORK_COLUMNS: Final = (("state", "text"), ("inbox_cursor", "bigint NOT NULL DEFAULT 0"),
                        ("decided", "boolean NOT NULL DEFAULT false"), ("last_post", "bigint NOT NULL DEFAULT 0"))
_PG14: Final = 140000  # idle_session_timeout appeared in PostgreSQL 14
# How many released lease connections are kept open for the next acquire (saves a connect).
_IDLE_LOCK_CONNECTIONS: Final = 8
# On each lease's session: how soon the server notices a holder whose machine vanished
# (idle 20 s, then 4 probes 5 s apart: about 40 s). Ignored over unix sockets.
_LOCK_SESSION_SETTINGS: Final = (
    "SET tcp_keepalives_idle = 20",
    "SET tcp_keepalives_interval = 5",
    "SET tcp_keepalives_count = 4",
)


def _to_json(obj: object) -> object:
    """Let any Mapping (a MappingProxyType, a frozen mapping) serialise like a dict."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_encode: Final = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_to_json,
).encode


def _check_id(instance_id: object) -> str:
    """Return ``instance_id`` if it follows the id rule every store shares; raise StoreError otherwise."""
    if not isinstance(instance_id, str) or not _ID_RE.fullmatch(instance_id) or ".." in instance_id:
        raise StoreError(
            f"invalid instance id {instance_id!r}: use 1 to 128 of A-Z a-z 0-9 _ . -, "
            "not starting with '.' and without '..'",
        )
    return instance_id


def _encode_items(instance_id: str, what: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
    """Encode every item before anything is written, so a bad one leaves the batch unwritten."""
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            raise StoreError(f"cannot {what}: each item must be a mapping, not {type(item).__name__}",
                             instance_id=instance_id)
        try:
            out.append(_encode(item))
        except (TypeError, ValueError) as exc:
            raise StoreError(f"cannot {what}: {exc}", instance_id=instance_id) from exc
    return out


def _lock_key(schema: str, instance_id: str) -> int:
    """Return the advisory-lock key of an instance: 64 bits of a hash of schema and id, signed."""
    digest = hashlib.blake2b(f"loopwright\0{schema}\0{instance_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _work_columns(header: object) -> tuple[str | None, int, bool]:
    """Return the ``state``, ``inbox_cursor`` and ``decided`` columns for a header (see find_work).

    ``decided``: the instance holds calls for approval and every one of them is decided.
    """
    if not isinstance(header, Mapping):
        return None, 0, False
    state = header.get("state")
    cursor = header.get("inboxCursor")
    pending = header.get("pendingApprovals")
    decided = bool(pending) and isinstance(pending, list) and all(
        isinstance(p, Mapping) and p.get("decision") is not None for p in pending)
    return (state if isinstance(state, str) else None,
            cursor if type(cursor) is int and -(1 << 63) <= cursor < 1 << 63 else 0, decided)


def _runner_of(header: object) -> str | None:
    runner = header.get("runner") if isinstance(header, dict) else None
    return str(runner) if runner else None


def _safe_dsn(dsn: str) -> str:
    """Return the DSN without its password, for messages and ``repr``."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable dsn>"
    params.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in params.items())


@attrs.define(eq=False)
class Lease(BaseLease):
    """An exclusive hold on one instance, from :meth:`PostgresStore.acquire` until :meth:`release`.

    A session-level advisory lock held on a connection of the lease's own. :meth:`release`
    unlocks it at once (one round trip; the connection is kept for the next lease), so any
    process can take the lease when it returns. If the holding process dies, the server drops
    the lock with the connection. Also a context manager that releases on exit.

    Attributes:
        instance_id: The instance held.
        owner: The owner given to :meth:`~PostgresStore.acquire`.
        key: The advisory-lock key (see ``pg_locks.objid``/``classid``).
        previous_holder: The ``runner`` of a header left ``running`` by another owner when the
            lease was taken: a process that died mid-run, else ``None``.
    """

    instance_id: str
    owner: str
    key: int
    previous_holder: str | None = None
    _conn: psycopg.Connection[Any] | None = attrs.field(default=None, repr=False, alias="conn")
    _on_release: Callable[[Lease, psycopg.Connection[Any]], None] | None = attrs.field(
        default=None, repr=False, alias="on_release")

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._conn is None

    def release(self) -> None:
        """Give the lock back. Calling it again does nothing."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._on_release is not None:
            self._on_release(self, conn)
        else:
            conn.close()

    def __enter__(self) -> Self:
        """Return the lease itself."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        self.release()


class PostgresStore(Store):
    """Instances in PostgreSQL: any number of processes on any number of machines share them.

    :param settings: ``settings.options`` holds ``dsn`` (a libpq connection string or URI) or
        ``dsnEnv`` (the name of an environment variable holding one), exactly one of them;
        ``schema`` (default ``loopwright``: lower-case letters, digits and ``_``, up to 63);
        ``poolSize`` (the most connections used for reads and writes at once, default 4; each
        held lease has one more of its own); ``connectTimeout`` (seconds, default 10). Any other
        key, a missing DSN or a value of the wrong type raises
        :class:`~loopwright.errors.ConfigError` with the option's path (``$.store.KEY``).

    Nothing connects until the first call; that call creates the schema and its tables if they
    are missing. Every write commits before it returns, so when ``append_entries`` returns,
    any process can read the entries.

    Attributes:
        schema: The schema the tables are in.
        pool_size: The most pooled connections.
        connect_timeout: Seconds to wait for a connection.
    """

    def __init__(self, settings: StoreSettings) -> None:
        """Check the options; nothing connects yet."""
        options = settings.options
        problems = [
            ConfigProblem(f"unknown option {key!r} of the postgres store (known: {', '.join(_OPTIONS)})",
                          path=f"$.store.{key}")
            for key in options if key not in _OPTIONS
        ]
        dsn = self._dsn_option(options, problems)
        schema = options.get("schema", DEFAULT_SCHEMA)
        if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
            problems.append(ConfigProblem(
                "must be a schema name of 1 to 63 lower-case letters, digits and _, not starting with a digit",
                path="$.store.schema"))
        pool_size = options.get("poolSize", 4)
        if type(pool_size) is not int or pool_size < 1:
            problems.append(ConfigProblem("must be a whole number of at least 1", path="$.store.poolSize"))
        timeout = options.get("connectTimeout", 10)
        if type(timeout) not in (int, float) or not timeout > 0:
            problems.append(ConfigProblem("must be a number of seconds above 0", path="$.store.connectTimeout"))
        if problems:
            raise ConfigError("invalid options for the postgres store", problems=problems)
        self.schema: str = schema
        self.pool_size: int = pool_size
        self.connect_timeout: float = float(timeout)
        self._dsn: str = dsn
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._ready = False
        self._setup_lock = threading.Lock()
        self._closed = False
        self._known: set[str] = set()  # ids seen to exist (instances are never deleted)
        self._held: dict[str, str] = {}  # instance id -> the owner holding its lease here
        self._leases: set[Lease] = set()
        self._idle_locks: list[psycopg.Connection[Any]] = []
        self._locks_mutex = threading.Lock()
        self._sql = self._statements(schema)

    @staticmethod
    def _dsn_option(options: Mapping[str, Any], problems: list[ConfigProblem]) -> str:
        dsn, env = options.get("dsn"), options.get("dsnEnv")
        if dsn is not None and env is not None:
            problems.append(ConfigProblem("set dsn or dsnEnv, not both", path="$.store.dsnEnv"))
            return ""
        if env is not None:
            if not isinstance(env, str) or not env:
                problems.append(ConfigProblem("must be the name of an environment variable", path="$.store.dsnEnv"))
                return ""
            value = os.environ.get(env, "")
            if not value:
                problems.append(ConfigProblem(f"the environment variable {env} is not set", path="$.store.dsnEnv"))
            return value
        if dsn is None:
            problems.append(ConfigProblem(
                "the postgres store needs dsn (a connection string) or dsnEnv (an environment variable holding one)",
                path="$.store.dsn"))
            return ""
        if not isinstance(dsn, str) or not dsn:
            problems.append(ConfigProblem("must be a non-empty connection string", path="$.store.dsn"))
            return ""
        try:
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            problems.append(ConfigProblem(f"is not a valid connection string: {exc}", path="$.store.dsn"))
        return dsn

    @staticmethod
    def _statements(schema: str) -> dict[str, bytes]:
        """Build every statement once, with the schema quoted in."""
        s = sql.Identifier(schema)
        texts = {
            "create": ("INSERT INTO {s}.instances (id, header, state, inbox_cursor, decided) "
                       "VALUES (%s, %s::json, %s, %s, %s)"),
            "write_header": ("UPDATE {s}.instances SET header = %s::json, updated_at = now(), state = %s, "
                             "inbox_cursor = %s, decided = %s WHERE id = %s"),
            "read_header": "SELECT header::text FROM {s}.instances WHERE id = %s",
            "exists": "SELECT 1 FROM {s}.instances WHERE id = %s",
            "list": ("SELECT header::text FROM {s}.instances ORDER BY CASE json_typeof(header->'createdAt') "
                     "WHEN 'string' THEN header->>'createdAt' ELSE '' END COLLATE \"C\", id COLLATE \"C\""),
            "lock": ("SELECT header::text, pg_try_advisory_lock(%s) FROM {s}.instances WHERE id = %s"),
            "post_lock": "SELECT pg_advisory_xact_lock(%s)",
            "read_mailbox": "SELECT seq, data::text FROM {s}.posts WHERE instance_id = %s AND seq > %s ORDER BY seq",
            "post": ("WITH p AS (INSERT INTO {s}.posts (instance_id, data) VALUES (%s, %s::json) RETURNING seq) "
                     "UPDATE {s}.instances SET last_post = p.seq FROM p WHERE id = %s"),
            "held_leases": ("SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
                            "AND objsubid = 1 AND granted AND database = "
                            "(SELECT oid FROM pg_database WHERE datname = current_database())"),
            "find_work": ("SELECT id FROM {s}.instances WHERE " + _WORK  # noqa: S608 - constant text
                          + " ORDER BY state = 'running', updated_at, id LIMIT %s"),
        }
        for table in ("entries", "records", "posts"):
            texts[f"append_{table}"] = "INSERT INTO {s}.{t} (instance_id, data) VALUES (%s, %s::json)"
            texts[f"read_{table}"] = "SELECT data::text FROM {s}.{t} WHERE instance_id = %s ORDER BY seq"
        return {
            name: sql.SQL(text).format(s=s, t=sql.Identifier(name.partition("_")[2])).as_bytes(None)
            if "{t}" in text else sql.SQL(text).format(s=s).as_bytes(None)
            for name, text in texts.items()
        }

    def __repr__(self) -> str:
        """Show the DSN without its password, and the schema."""
        return f"PostgresStore(dsn={_safe_dsn(self._dsn)!r}, schema={self.schema!r})"

    # -- connections -----------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self._dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout)))

    def _setup(self) -> psycopg_pool.ConnectionPool[Any]:
        """Connect once to create the schema and tables if missing, then open the pool (in a thread)."""
        with self._setup_lock:
            if self._closed:
                raise StoreError("the store is closed")
            if self._pool is not None:
                return self._pool
            try:
                with self._connect() as conn:
                    self._create_tables(conn)
            except psycopg.Error as exc:
                raise StoreError(f"cannot set up the postgres store ({_safe_dsn(self._dsn)}, "
                                 f"schema {self.schema}): {exc}") from exc
            pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
                self._dsn, min_size=1, max_size=self.pool_size, open=False, timeout=self.connect_timeout,
                kwargs={"autocommit": True, "connect_timeout": max(1, round(self.connect_timeout))},
                name=f"loopwright-{self.schema}",
            )
            try:
                pool.open(wait=True, timeout=self.connect_timeout)
            except psycopg_pool.PoolTimeout as exc:
                pool.close()
                raise StoreError(f"cannot open connections to {_safe_dsn(self._dsn)} within "
                                 f"{self.connect_timeout:g} s: {exc}") from exc
            self._pool = pool
            return pool

    def _create_tables(self, conn: psycopg.Connection[Any]) -> None:
        s = sql.Identifier(self.schema)
        present = conn.execute(
            "SELECT count(to_regclass(format('%%I.%%I', %s::text, t))) FROM unnest(%s::text[]) AS t",
            (self.schema, [*_TABLES, "instances_work"]),
        ).fetchone()
        if present is not None and present[0] == len(_TABLES) + 1:
            return
        with conn.transaction():
            # Many processes may start at once: concurrent CREATE ... IF NOT EXISTS can still
            # collide in the catalogs, so they take turns.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema, "\0schema"),))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}").format(s=s))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {s}.instances ("
                ' id text COLLATE "C" PRIMARY KEY,'
                " header json NOT NULL,"
                " created_at timestamptz NOT NULL DEFAULT now(),"
                " updated_at timestamptz NOT NULL DEFAULT now())").format(s=s))
            for table in ("entries", "records", "posts"):
                conn.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {s}.{t} ("
                    ' instance_id text COLLATE "C" NOT NULL REFERENCES {s}.instances (id) ON DELETE CASCADE,'
                    " seq bigint GENERATED ALWAYS AS IDENTITY,"
                    " data json NOT NULL,"
                    " PRIMARY KEY (instance_id, seq))").format(s=s, t=sql.Identifier(table)))
            # Copies of the header keys find_work looks at, and the seq of the latest post, so
            # that finding work reads one small partial index; added to tables made before them.
            have = {row[0] for row in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = 'instances'", (self.schema,)).fetchall()}
            missing = [(name, kind) for name, kind in _WORK_COLUMNS if name not in have]
            for name, kind in missing:
                conn.execute(sql.SQL("ALTER TABLE {s}.instances ADD COLUMN {c} " + kind)
                             .format(s=s, c=sql.Identifier(name)))
            if missing:
                self._fill_work_columns(conn)
            conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS instances_work ON {s}.instances (updated_at) WHERE "
                                 + _WORK).format(s=s))

    def _fill_work_columns(self, conn: psycopg.Connection[Any]) -> None:
        """Set the find_work columns of rows written before they existed (once, while setting up)."""
        s = sql.Identifier(self.schema)
        rows = conn.execute(sql.SQL("SELECT id, header::text FROM {s}.instances").format(s=s)).fetchall()
        update = sql.SQL("UPDATE {s}.instances SET state = %s, inbox_cursor = %s, decided = %s WHERE id = %s"
                         ).format(s=s)
        with conn.cursor() as cur:
            cur.executemany(update, [(*_work_columns(_loads(text)), iid) for iid, text in rows])
        conn.execute(sql.SQL(
            "UPDATE {s}.instances AS i SET last_post = m.seq FROM "
            "(SELECT instance_id, max(seq) AS seq FROM {s}.posts GROUP BY instance_id) AS m "
            "WHERE i.id = m.instance_id").format(s=s))

    def _call(self, instance_id: str | None, what: str, fn: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """Run ``fn`` on a pooled connection (in the worker thread); wrap database errors in StoreError."""
        pool = self._pool if self._pool is not None and not self._closed else self._setup()
        try:
            with pool.connection() as conn:
                return fn(conn)
        except psycopg.errors.ForeignKeyViolation:
            raise InstanceNotFoundError(instance_id or "?") from None
        except psycopg_pool.PoolTimeout as exc:
            raise StoreError(f"cannot {what}: no database connection within {self.connect_timeout:g} s "
                             f"({_safe_dsn(self._dsn)}): {exc}", instance_id=instance_id) from exc
        except psycopg.OperationalError as exc:
            pool.check()  # drop the pool's other connections to a server that went away
            raise StoreError(f"cannot {what}: {exc}", instance_id=instance_id) from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot {what}: {exc}", instance_id=instance_id) from exc

    async def _run(self, instance_id: str | None, what: str, fn: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        return await anyio.to_thread.run_sync(self._call, instance_id, what, fn)

    # -- headers ---------------------------------------------------------------------------------

    async def create(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Insert the instance's row (one statement, so one transaction).

        Raise :class:`~loopwright.errors.StoreError` if the id exists, is invalid, or the
        header is not a JSON-ready mapping.
        """
        _check_id(instance_id)
        data = self._header_text(instance_id, header)
        columns = _work_columns(header)

        def create(conn: psycopg.Connection[Any]) -> None:
            try:
                conn.execute(self._sql["create"], (instance_id, data, *columns))
            except psycopg.errors.UniqueViolation:
                raise StoreError(f"already exists (schema {self.schema})", instance_id=instance_id) from None

        await self._run(instance_id, "create the instance", create)
        self._known.add(instance_id)

    async def write_header(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Replace the header with one ``UPDATE`` (atomic: a reader sees the old or the new one).

        Raise :class:`~loopwright.errors.InstanceNotFoundError` if the instance does not exist.
        """
        _check_id(instance_id)
        data = self._header_text(instance_id, header)
        columns = _work_columns(header)

        def write(conn: psycopg.Connection[Any]) -> int:
            return conn.execute(self._sql["write_header"], (data, *columns, instance_id)).rowcount

        if await self._run(instance_id, "write the header", write) == 0:
            raise InstanceNotFoundError(instance_id)

    async def read_header(self, instance_id: str) -> dict[str, Any]:
        """Return the header. Raise :class:`~loopwright.errors.InstanceNotFoundError` if absent."""
        _check_id(instance_id)

        def read(conn: psycopg.Connection[Any]) -> str | None:
            row = conn.execute(self._sql["read_header"], (instance_id,)).fetchone()
            return None if row is None else row[0]

        text = await self._run(instance_id, "read the header", read)
        if text is None:
            raise InstanceNotFoundError(instance_id)
        return self._decode(instance_id, "the header", text)

    async def list_headers(self) -> list[dict[str, Any]]:
        """Return every instance's header, sorted by ``createdAt`` (missing sorts first) and then by id.

        Both compare as byte strings (``COLLATE "C"``), as the file store sorts them.
        """

        def read(conn: psycopg.Connection[Any]) -> list[str]:
            return [row[0] for row in conn.execute(self._sql["list"]).fetchall()]

        out = []
        for text in await self._run(None, "list the instances", read):
            try:
                out.append(self._decode(None, "a header", text))
            except StoreError as exc:
                _log.warning("postgres store: skipping a header that cannot be read: %s", exc)
        return out

    # -- logs ------------------------------------------------------------------------------------

    async def append_entries(self, instance_id: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Insert the entries, in order, in one transaction; committed when this returns.

        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance and
        :class:`~loopwright.errors.StoreError` if an entry is not a JSON-ready mapping (nothing
        is written then) or the database fails.
        """
        await self._append(instance_id, "entries", entries)

    async def read_entries(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole entry log in insertion order."""
        return await self._read_log(instance_id, "entries")

    async def append_records(self, instance_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Insert the records; same contract as :meth:`append_entries`."""
        await self._append(instance_id, "records", records)

    async def read_records(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole record log in insertion order."""
        return await self._read_log(instance_id, "records")

    async def _append(self, instance_id: str, table: str, items: Sequence[Mapping[str, Any]]) -> None:
        _check_id(instance_id)
        lines = _encode_items(instance_id, f"append to {table}", items)
        if not lines:
            return
        statement = self._sql[f"append_{table}"]

        def append(conn: psycopg.Connection[Any]) -> None:
            if len(lines) == 1:
                conn.execute(statement, (instance_id, lines[0]))
                return
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(statement, [(instance_id, line) for line in lines])

        await self._run(instance_id, f"append to {table}", append)

    async def _read_log(self, instance_id: str, table: str) -> list[dict[str, Any]]:
        _check_id(instance_id)
        statement = self._sql[f"read_{table}"]

        def read(conn: psycopg.Connection[Any]) -> list[str] | None:
            rows = conn.execute(statement, (instance_id,)).fetchall()
            if not rows and conn.execute(self._sql["exists"], (instance_id,)).fetchone() is None:
                return None
            return [row[0] for row in rows]

        texts = await self._run(instance_id, f"read {table}", read)
        if texts is None:
            raise InstanceNotFoundError(instance_id)
        return [self._decode(instance_id, f"a row of {table}", text) for text in texts]

    # -- mailbox ---------------------------------------------------------------------------------

    async def post(self, instance_id: str, item: Mapping[str, Any]) -> None:
        """Insert ``item`` into the instance's mailbox (any process, any time).

        Posts to one instance take turns (a transaction-level advisory lock), so their ``seq``
        order is their commit order and a reader's cursor never skips a post that commits late.
        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance.
        """
        _check_id(instance_id)
        (line,) = _encode_items(instance_id, "post", [item])
        key = _lock_key(self.schema, f"\0posts\0{instance_id}")

        def post(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                conn.execute(self._sql["post_lock"], (key,))
                conn.execute(self._sql["post"], (instance_id, line, instance_id))

        await self._run(instance_id, "post", post)

    async def read_posts(self, instance_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Return the posts whose ``seq`` is above ``cursor`` and the last one's ``seq``.

        Nothing new costs one index lookup (the first call per instance also checks that it
        exists). The cursor is a ``seq`` of the posts table, not a count.
        """
        _check_id(instance_id)
        known = instance_id in self._known

        def read(conn: psycopg.Connection[Any]) -> list[tuple[int, str]] | None:
            rows = conn.execute(self._sql["read_mailbox"], (instance_id, cursor)).fetchall()
            if not rows and not known and conn.execute(self._sql["exists"], (instance_id,)).fetchone() is None:
                return None
            return rows

        rows = await self._run(instance_id, "read the mailbox", read)
        if rows is None:
            raise InstanceNotFoundError(instance_id)
        self._known.add(instance_id)
        if not rows:
            return [], cursor
        items = []
        for _seq, text in rows:
            obj = self._decode(instance_id, "a post", text)
            items.append(obj)
        return items, int(rows[-1][0])

    async def find_work(self, *, limit: int) -> list[str]:
        """Return up to ``limit`` ids of instances a worker may have to run, in one round trip.

        Those ``waiting_for_approval`` with every held call decided, and resting ones
        (``waiting``, ``stopped``, ``error``) whose latest post (``last_post``, set by
        :meth:`post`) is after the header's ``inboxCursor``, come first; then instances left
        ``running``, least recently updated first. ``state``, ``inbox_cursor`` and ``decided``
        are columns written with each header. Instances whose lease someone holds (a live
        runner anywhere, read from ``pg_locks``) are left out, so a dead runner's instance is
        found without trying live ones' leases. The query reads only the rows of the partial
        index ``instances_work`` (running, waiting for approval, or with unread posts), not the
        whole table.
        """
        limit = max(int(limit), 0)
        if limit == 0:
            return []
        schema = self.schema

        def find(conn: psycopg.Connection[Any]) -> list[str]:
            held = {key for (key,) in conn.execute(self._sql["held_leases"]).fetchall()}
            held = {key - (1 << 64) if key >= 1 << 63 else key for key in held}
            rows = conn.execute(self._sql["find_work"], (limit + len(held),)).fetchall()
            return [iid for (iid,) in rows if _lock_key(schema, iid) not in held]

        return (await self._run(None, "find work", find))[:limit]

    # -- leases ----------------------------------------------------------------------------------

    async def acquire(self, instance_id: str, owner: str) -> Lease:
        """Take the instance's runner lease without waiting and return the :class:`Lease`.

        The lease is a session-level ``pg_try_advisory_lock`` on a connection held for the
        lease's lifetime. Raise :class:`~loopwright.errors.InstanceLockedError` (with ``holder``
        from the header's ``runner`` key) if another runner, in any process on any machine,
        holds it, and :class:`~loopwright.errors.InstanceNotFoundError` if the instance does
        not exist. A lock whose holder died is free again: the server dropped it with its
        connection.
        """
        _check_id(instance_id)
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        if instance_id in self._held:
            raise InstanceLockedError(instance_id, holder=self._held[instance_id])
        key = _lock_key(self.schema, instance_id)
        self._held[instance_id] = owner  # claimed at once: a concurrent acquire here fails fast
        try:
            conn, header = await anyio.to_thread.run_sync(self._try_lock, instance_id, key)
        except BaseException:
            del self._held[instance_id]
            raise
        previous = None
        if isinstance(header, dict) and header.get("state") == "running":
            runner = _runner_of(header)
            previous = runner if runner and not runner.startswith(owner) else None
        lease = Lease(instance_id=instance_id, owner=owner, key=key, previous_holder=previous,
                      conn=conn, on_release=self._released)
        self._leases.add(lease)
        self._known.add(instance_id)
        return lease

    def _try_lock(self, instance_id: str, key: int) -> tuple[psycopg.Connection[Any], object]:
        """Take the advisory lock on a lease connection (in a worker thread)."""
        if self._pool is None:
            self._setup()
        for fresh in (False, True):
            conn = self._lock_connection(fresh=fresh)
            try:
                row = conn.execute(self._sql["lock"], (key, instance_id)).fetchone()
                break
            except psycopg.OperationalError as exc:
                conn.close()
                if fresh:
                    raise StoreError(f"cannot take the lease: {exc}", instance_id=instance_id) from exc
                # An idle lease connection to a server that restarted: retry on a fresh one.
            except psycopg.Error as exc:
                conn.close()
                raise StoreError(f"cannot take the lease: {exc}", instance_id=instance_id) from exc
        if row is None:
            self._park(conn)
            raise InstanceNotFoundError(instance_id)
        text, locked = row
        try:
            header: object = json.loads(text)
        except ValueError:
            header = None
        if not locked:
            self._park(conn)
            raise InstanceLockedError(instance_id, holder=_runner_of(header))
        return conn, header

    def _lock_connection(self, *, fresh: bool) -> psycopg.Connection[Any]:
        if not fresh:
            with self._locks_mutex:
                if self._idle_locks:
                    return self._idle_locks.pop()
        try:
            conn = self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to take a lease ({_safe_dsn(self._dsn)}): {exc}") from exc
        try:
            for statement in _LOCK_SESSION_SETTINGS:
                conn.execute(statement.encode())
            if conn.info.server_version >= _PG14:
                # A server-wide idle_session_timeout would end the lease while it is held.
                conn.execute(b"SET idle_session_timeout = 0")
        except psycopg.Error:
            conn.close()
            raise
        return conn

    def _park(self, conn: psycopg.Connection[Any]) -> None:
        """Keep a lease connection that holds no lock for the next acquire, or close it."""
        with self._locks_mutex:
            if not self._closed and len(self._idle_locks) < _IDLE_LOCK_CONNECTIONS:
                self._idle_locks.append(conn)
                return
        conn.close()

    def _released(self, lease: Lease, conn: psycopg.Connection[Any]) -> None:
        """Unlock now, so that the lease is free for any process when release() returns.

        This is one round trip on the caller's thread (release() is synchronous), once per
        segment. Unlocking in the background instead would let an acquire elsewhere right after
        release() find the lock still held.
        """
        self._leases.discard(lease)
        self._held.pop(lease.instance_id, None)
        if self._closed:
            conn.close()
            return
        self._unlock(conn, lease.key)

    def _unlock(self, conn: psycopg.Connection[Any], key: int) -> None:
        try:
            row = conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()
        except psycopg.Error as exc:
            _log.debug("postgres store: unlocking by closing the connection: %s", exc)
            conn.close()  # closing the session drops its locks too
            return
        if row is None or not row[0]:
            conn.close()
            return
        self._park(conn)

    # -- lifetime --------------------------------------------------------------------------------

    def locations(self) -> Sequence[Path]:
        """Return ``()``: the store keeps no local files."""
        return ()

    async def aclose(self) -> None:
        """Release every lease still held and close every connection. Calls afterwards raise."""
        if self._closed:
            return
        for lease in list(self._leases):
            lease.release()
        self._closed = True
        await anyio.to_thread.run_sync(self._close_all)

    def _close_all(self) -> None:
        with self._locks_mutex:
            idle, self._idle_locks = self._idle_locks, []
        for conn in idle:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        with self._setup_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- internals -------------------------------------------------------------------------------

    @staticmethod
    def _header_text(instance_id: str, header: Mapping[str, Any]) -> str:
        if not isinstance(header, Mapping):
            raise StoreError(f"the header must be a mapping, not {type(header).__name__}", instance_id=instance_id)
        try:
            return _encode(header)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"the header is not JSON-ready: {exc}", instance_id=instance_id) from exc

    def _decode(self, instance_id: str | None, what: str, text: str) -> dict[str, Any]:
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise StoreError(f"{what} in schema {self.schema} is not valid JSON: {exc}",
                             instance_id=instance_id) from exc
        if type(obj) is not dict:
            raise StoreError(f"{what} in schema {self.schema} holds a JSON {type(obj).__name__}, not an object",
                             instance_id=instance_id)
        return obj
