"""The ``postgres`` store: instances in PostgreSQL tables, shared by any number of processes.

See the package docstring and ``docs/stores/postgres.md`` for the options and the tables.

Why threads, not psycopg's async API: psycopg's ``AsyncConnection`` runs only under asyncio,
and loopwright runs under asyncio and trio (anyio). Every call here runs psycopg's blocking API
in a worker thread (``anyio.to_thread.run_sync``) on a connection from the store's own small
pool (:class:`~loopwright_postgres._connections.Pool`), so the store works the same under both. A thread hop costs
tens of microseconds, well under a round trip to a database server. The wait for a worker thread
is not cancellable: a write that started finishes (or fails) before the caller sees a
cancellation, so it is never left half-known.

Leases are rows of the ``leases`` table: ``(instance_id, epoch, holder, session, writes,
server_start, expires_at)``. Taking one bumps its *epoch* (a fencing token), and every write this
store makes to an instance whose lease it holds checks, in the same statement, that the row
still carries that epoch and this store's session (and counts the write in ``writes``, which
makes a retried write idempotent); a write of a runner whose lease was taken over is refused
with :class:`~loopwright.errors.LeaseLostError`, never applied. A lease is free when it was
released, when it expired (``leaseTtl`` after its last heartbeat), or at once when its holder's
process died: each store holds a session-level advisory lock on its random *session key* on its
one keeper connection (:class:`~loopwright_postgres._connections.Keeper`), which also renews all
of the store's leases in one statement every ``leaseTtl / 6`` seconds and listens (``LISTEN``) for work.
A lease whose session lock is gone while the server that granted it still runs belongs to a dead
process; after a server restart every session lock is gone, so a lease renewed before the
restart is left to its holder until it expires (the holder reconnects and renews it). A process
thus needs ``poolSize + 1`` connections, however many instances it runs.

An outage (the server unreachable after the store first worked) is ridden out: every call
retries with bounded exponential backoff and jitter for up to ``outageTolerance`` seconds
(default 300), then raises :class:`~loopwright.errors.StoreUnavailableError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import attrs
import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg import sql

from loopwright import HeaderFields, State, check_instance_id
from loopwright.abc import Lease as BaseLease
from loopwright.abc import Store, StoreSettings
from loopwright.errors import (
    ConfigError,
    ConfigProblem,
    InstanceLockedError,
    InstanceNotFoundError,
    LeaseLostError,
    StoreError,
    StoreUnavailableError,
)
from loopwright_postgres._connections import CHANNEL, Keeper, Pool, PoolBusyError, jittered

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["DEFAULT_SCHEMA", "Lease", "PostgresStore"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The schema the tables live in when ``schema`` is not set.
DEFAULT_SCHEMA: Final = "loopwright"

_OPTIONS: Final = ("connectTimeout", "dsn", "dsnEnv", "leaseTtl", "outageTolerance", "poolSize", "schema")
# The file store's rule, so that an id is valid in every store.
# Lower case only: the name then needs no quoting in psql or anywhere else.
_SCHEMA_RE: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TABLES: Final = ("instances", "entries", "records", "posts", "leases")
# Instances that may have work for a worker (see find_work): the predicate of the partial index
# instances_work, repeated word for word in the query so that the planner uses that index. The
# columns are copies of header keys, written with the header (json operators cannot read every
# header: they refuse a string holding U+0000).
_WORK: Final = ("(state = 'running' OR (state = 'waiting_for_approval' AND decided) "
                "OR (state IN ('waiting', 'stopped', 'error') AND last_post > inbox_cursor))")
# The same, for the instances table under the alias ``i``.
_WORK_OF_I: Final = ("(i.state = 'running' OR (i.state = 'waiting_for_approval' AND i.decided) "
                     "OR (i.state IN ('waiting', 'stopped', 'error') AND i.last_post > i.inbox_cursor))")
#: Columns added to ``instances`` for find_work, with their types (added to older tables too).
_WORK_COLUMNS: Final = (("state", "text"), ("inbox_cursor", "bigint NOT NULL DEFAULT 0"),
                        ("decided", "boolean NOT NULL DEFAULT false"), ("last_post", "bigint NOT NULL DEFAULT 0"),
                        ("queued", "boolean NOT NULL DEFAULT false"))
_PG14: Final = 140000  # idle_session_timeout appeared in PostgreSQL 14
# On the keeper's session: how soon the server notices a holder whose machine vanished
# (idle 20 s, then 4 probes 5 s apart: about 40 s). Ignored over unix sockets.
_KEEPER_SESSION_SETTINGS: Final = (
    "SET tcp_keepalives_idle = 20",
    "SET tcp_keepalives_interval = 5",
    "SET tcp_keepalives_count = 4",
)
#: Seconds a lease lasts after its last heartbeat, and the longest outage ridden out, by default.
DEFAULT_LEASE_TTL: Final = 30.0
DEFAULT_OUTAGE_TOLERANCE: Final = 300.0
# While a worker waits for work: how often its keeper looks for leases of dead processes (no
# write notifies those), which bounds the take-over of a killed worker's instances.
_PROBE_INTERVAL: Final = 2.0
# Retries of a call during an outage: from 50 ms, doubling, at most 2 s, with jitter.
_FIRST_RETRY: Final = 0.05
_MAX_RETRY: Final = 2.0
# A lease whose holder is alive: a live session, under the server that granted it, unexpired.
_FREE_LEASE: Final = ("l.session IS NULL OR l.expires_at < now() OR (l.server_start = pg_postmaster_start_time() "
                      "AND pg_try_advisory_xact_lock(l.session))")


def _to_json(obj: object) -> object:
    """Let any Mapping (a MappingProxyType, a frozen mapping) serialise like a dict."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_encode: Final = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_to_json,
).encode


def _check_id(instance_id: object) -> str:
    """Return ``instance_id`` if it follows the id rule every store shares (:func:`loopwright.check_instance_id`)."""
    return check_instance_id(instance_id)


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


def _work_columns(header: object) -> tuple[str | None, int, bool, bool]:
    """Return the ``state``, ``inbox_cursor``, ``decided`` and ``queued`` columns for a header (see find_work).

    ``decided``: the instance holds calls for approval and every one of them is decided.
    ``queued``: submitted for any worker and not started yet (the header's ``queued: true``).
    """
    if not isinstance(header, Mapping):
        return None, 0, False, False
    fields = HeaderFields(header if isinstance(header, dict) else dict(header))
    state = _state_of(fields)
    cursor = fields.inbox_cursor
    decided = isinstance(fields.pending_approvals, list) and fields.held_calls_decided()
    return (str(state) if isinstance(state, str) else None,
            cursor if type(cursor) is int and -(1 << 63) <= cursor < 1 << 63 else 0, decided,
            fields.queued is True)


def _state_of(fields: HeaderFields) -> State | str | None:
    """Return the header's ``state``: ``None`` when it has none (absent, or a value no state can be).

    A store holds any JSON object, so a list or an object saved as the state is no state.
    """
    state = fields.state if fields.has("state") else None
    return state if isinstance(state, str) else None


def _runner_of(header: object) -> str | None:
    runner = HeaderFields(header).runner if isinstance(header, dict) else None
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

    A row of the ``leases`` table that names this store's session and carries the lease's
    ``epoch``; while it is held, every write the store makes to the instance is fenced with that
    epoch. :meth:`release` frees the row at once (one round trip), so any process can take the
    lease when it returns; if the server cannot be reached, the store's keeper frees it later.
    If the holding process dies, its session lock goes with its connection and the lease is free.
    Also a context manager that releases on exit.

    Attributes:
        instance_id: The instance held.
        owner: The owner given to :meth:`~PostgresStore.acquire`.
        epoch: The fencing token: one more than the epoch of the lease's previous holder.
        previous_holder: The ``runner`` of a header left ``running`` by another owner when the
            lease was taken: a process that died mid-run, else ``None``.
        writes: The fenced writes made under this epoch (a write retried after a lost reply is
            recognised by it and not applied twice).
        lost: Whether the store found that another runner took the lease over.
    """

    instance_id: str
    owner: str
    epoch: int
    previous_holder: str | None = None
    writes: int = 0
    lost: bool = False
    _on_release: Callable[[Lease], None] | None = attrs.field(default=None, repr=False, alias="on_release")
    _released: bool = attrs.field(default=False, repr=False, init=False)
    _mutex: anyio.Lock = attrs.field(factory=anyio.Lock, repr=False, init=False)

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._released

    @property
    def mutex(self) -> anyio.Lock:
        """The lock the store's fenced writes to the instance take turns on (the write count is shared)."""
        return self._mutex

    def release(self) -> None:
        """Give the lease back. Calling it again does nothing."""
        if self._released:
            return
        self._released = True
        if self._on_release is not None:
            self._on_release(self)



class PostgresStore(Store):
    """Instances in PostgreSQL: any number of processes on any number of machines share them.

    :param settings: ``settings.options`` holds ``dsn`` (a libpq connection string or URI) or
        ``dsnEnv`` (the name of an environment variable holding one), exactly one of them;
        ``schema`` (default ``loopwright``: lower-case letters, digits and ``_``, up to 63);
        ``poolSize`` (the most connections used for statements at once, default 4; the store
        has one more, its keeper's, once it holds a lease or waits for work);
        ``connectTimeout`` (seconds, default 10); ``leaseTtl`` (seconds a lease lasts after its
        last heartbeat, default 30, at least 3); ``outageTolerance`` (seconds a call keeps
        retrying while the server is unreachable, default 300). Any other key, a missing DSN or
        a value of the wrong type raises :class:`~loopwright.errors.ConfigError` with the
        option's path (``$.store.KEY``).

    Nothing connects until the first call; that call creates the schema and its tables if they
    are missing (and fails at once if the server cannot be reached: a store that never worked
    is misconfigured, not in an outage). Every write commits before it returns, so when
    ``append_entries`` returns, any process can read the entries.

    Attributes:
        schema: The schema the tables are in.
        pool_size: The most pooled connections.
        connect_timeout: Seconds to wait for a connection.
        lease_ttl: Seconds a lease lasts without a heartbeat.
        outage_tolerance: Seconds of failed attempts before a call gives up.
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
        timeout = self._seconds(options, "connectTimeout", 10, 0, problems)
        ttl = self._seconds(options, "leaseTtl", DEFAULT_LEASE_TTL, 3, problems, least=True)
        tolerance = self._seconds(options, "outageTolerance", DEFAULT_OUTAGE_TOLERANCE, 0, problems, least=True)
        if problems:
            raise ConfigError("invalid options for the postgres store", problems=problems)
        self.schema: str = schema
        self.pool_size: int = pool_size
        self.connect_timeout: float = timeout
        self.lease_ttl: float = ttl
        self.outage_tolerance: float = tolerance
        self._dsn: str = dsn
        self._pool: Pool | None = None
        self._setup_lock = threading.Lock()
        self._closed = False
        # Ids seen to exist (a delete here drops its id; another process's leaves it: its reads find nothing).
        self._known: set[str] = set()
        self._held: dict[str, Lease] = {}  # instance id -> the lease held here
        self._unreleased: dict[str, Lease] = {}  # released here, but the server was not told yet
        self._leases_mutex = threading.Lock()
        self._session = secrets.randbits(62)  # this store's session key (positive: pg_locks shows it as is)
        self._keeper: Keeper | None = None
        self._notes = 0  # notifications received on the work channel (and reconnects)
        self._notes_seen = 0  # the count at the end of the last wait_for_work
        self._waiters: set[tuple[Callable[[Callable[[], object]], object], anyio.Event]] = set()
        self._sql = self._statements(schema)

    @staticmethod
    def _seconds(options: Mapping[str, Any], key: str, default: float, low: float, problems: list[ConfigProblem],
                 *, least: bool = False) -> float:
        value = options.get(key, default)
        if type(value) not in (int, float) or not (value >= low if least else value > low) or not math.isfinite(value):
            above = f"of at least {low:g}" if least else f"above {low:g}"
            problems.append(ConfigProblem(f"must be a number of seconds {above}", path=f"$.store.{key}"))
            return float(default)
        return float(value)

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
        notify = f"CASE WHEN work THEN pg_notify('{CHANNEL}', id) END"
        # A fenced write first counts itself on its lease's row, and writes only if that row still
        # carries the lease's epoch and session (and the count the writer expects).
        fence = ("WITH l AS (UPDATE {s}.leases SET writes = writes + 1 WHERE instance_id = %s AND epoch = %s "
                 "AND session = %s AND writes = %s RETURNING 1) ")
        header_set = ("SET header = %s::json, updated_at = now(), state = %s, inbox_cursor = %s, decided = %s, "
                      "queued = %s")
        texts = {
            # New work (a new instance to run, a decision, a message) wakes the workers listening.
            "create": ("WITH i AS (INSERT INTO {s}.instances (id, header, state, inbox_cursor, decided, "  # noqa: S608
                       "queued) VALUES (%s, %s::json, %s, %s, %s, %s) RETURNING id, " + _WORK + " AS work) "
                       "SELECT " + notify + " FROM i"),
            "write_header": ("WITH i AS (UPDATE {s}.instances " + header_set + " WHERE id = %s "  # noqa: S608
                             "RETURNING id, " + _WORK + " AS work) SELECT " + notify + " FROM i"),
            # A new instance and its lease in one statement (create_leased): never seen with a free lease.
            "create_leased": ("WITH i AS (INSERT INTO {s}.instances (id, header, state, inbox_cursor, decided, "
                              "queued) VALUES (%s, %s::json, %s, %s, %s, %s) RETURNING id) "
                              "INSERT INTO {s}.leases (instance_id, epoch, holder, session, writes, server_start, "
                              "expires_at) SELECT id, 1, %s, %s, 0, pg_postmaster_start_time(), "
                              "now() + make_interval(secs => %s) FROM i"),
            "write_header_fenced": fence + "UPDATE {s}.instances " + header_set + " FROM l WHERE id = %s",
            "lease_state": "SELECT epoch, session, writes FROM {s}.leases WHERE instance_id = %s",
            "read_header": "SELECT header::text FROM {s}.instances WHERE id = %s",
            "exists": "SELECT 1 FROM {s}.instances WHERE id = %s",
            "delete": "DELETE FROM {s}.instances WHERE id = %s",
            # A fenced delete's first statement: the lease is still this store's (see delete()).
            "count_write": ("UPDATE {s}.leases SET writes = writes + 1 WHERE instance_id = %s AND epoch = %s "
                            "AND session = %s AND writes = %s"),
            "list": ("SELECT header::text FROM {s}.instances ORDER BY CASE json_typeof(header->'createdAt') "
                     "WHEN 'string' THEN header->>'createdAt' ELSE '' END COLLATE \"C\", id COLLATE \"C\""),
            # Take a free lease (see _FREE_LEASE; or one of this store's own whose release is
            # pending), bumping its epoch; or make its row. Returns the header, the epoch taken
            # (NULL if the lease is held) and the holder before.
            "acquire": ("WITH i AS (SELECT id, header::text AS header FROM {s}.instances WHERE id = %(id)s), "  # noqa: S608
                        "t AS (INSERT INTO {s}.leases AS l (instance_id, epoch, holder, session, writes, server_start, "
                        "expires_at) SELECT id, 1, %(holder)s, %(session)s, 0, pg_postmaster_start_time(), "
                        "now() + make_interval(secs => %(ttl)s) FROM i ON CONFLICT (instance_id) DO UPDATE SET "
                        "epoch = l.epoch + 1, holder = excluded.holder, session = excluded.session, writes = 0, "
                        "server_start = excluded.server_start, expires_at = excluded.expires_at "
                        "WHERE l.session = %(session)s OR " + _FREE_LEASE + " RETURNING epoch) "
                        "SELECT i.header, (SELECT epoch FROM t), "
                        "(SELECT holder FROM {s}.leases WHERE instance_id = %(id)s) FROM i"),
            # Free the leases (ids and epochs) that are still this session's; wake the workers
            # for those left unfinished (a worker that stopped, a segment given up).
            "release": ("WITH r AS (UPDATE {s}.leases AS l SET session = NULL, holder = NULL, "  # noqa: S608
                        "expires_at = NULL FROM unnest(%s::text[], %s::bigint[]) AS u(id, epoch) "
                        "WHERE l.instance_id = u.id AND l.epoch = u.epoch AND l.session = %s RETURNING l.instance_id) "
                        "SELECT pg_notify('" + CHANNEL + "', id) FROM {s}.instances, r "
                        "WHERE id = r.instance_id AND " + _WORK),
            "heartbeat": ("UPDATE {s}.leases SET expires_at = now() + make_interval(secs => %s), "
                          "server_start = pg_postmaster_start_time() WHERE session = %s AND instance_id = ANY(%s) "
                          "RETURNING instance_id, epoch"),
            "post_lock": "SELECT pg_advisory_xact_lock(%s)",
            "read_mailbox": "SELECT seq, data::text FROM {s}.posts WHERE instance_id = %s AND seq > %s ORDER BY seq",
            # Once per post id: a retried post (its reply lost) inserts nothing, and notifies nothing.
            "post": ("WITH p AS (INSERT INTO {s}.posts (instance_id, data, post_id) VALUES (%s, %s::json, %s) "  # noqa: S608
                     "ON CONFLICT (instance_id, post_id) DO NOTHING RETURNING seq), "
                     "i AS (UPDATE {s}.instances SET last_post = p.seq FROM p WHERE id = %s "
                     "RETURNING id, " + _WORK + " AS work) SELECT " + notify + " FROM i"),
            # Is there work under a lease whose holder is gone (a killed process) or that expired?
            "orphans": ("WITH live AS MATERIALIZED (SELECT (classid::bigint << 32) | objid::bigint AS session "  # noqa: S608
                        "FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted) "
                        "SELECT EXISTS (SELECT 1 FROM {s}.leases AS l JOIN {s}.instances AS i ON i.id = l.instance_id "
                        "WHERE l.session IS NOT NULL AND (l.expires_at < now() OR (l.server_start = "
                        "pg_postmaster_start_time() AND l.session NOT IN (SELECT session FROM live))) AND "
                        + _WORK_OF_I + ")"),
            # Sessions alive now (each store's keeper holds the lock of its session key).
            "live_sessions": ("SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks WHERE locktype = "
                              "'advisory' AND objsubid = 1 AND granted AND database = "
                              "(SELECT oid FROM pg_database WHERE datname = current_database())"),
            # Work whose lease is free: no row, released, expired, or its holder's session is gone
            # under the server that granted it (a process that died).
            "find_work": ("SELECT id FROM {s}.instances AS i WHERE " + _WORK  # noqa: S608 - constant text
                          + " AND NOT EXISTS (SELECT 1 FROM {s}.leases AS l WHERE l.instance_id = i.id "
                          "AND l.session IS NOT NULL AND l.expires_at >= now() AND (l.server_start <> "
                          "pg_postmaster_start_time() OR l.session = ANY(%s)))"
                          " ORDER BY state = 'running', queued, updated_at, id LIMIT %s"),
        }
        for table in ("entries", "records"):
            rows = "SELECT %s, u.d::json FROM {from_}unnest(%s::text[]) WITH ORDINALITY AS u(d, n) ORDER BY u.n"
            texts[f"append_{table}"] = "INSERT INTO {s}.{t} (instance_id, data) " + rows.format(from_="")
            texts[f"append_{table}_fenced"] = (fence + "INSERT INTO {s}.{t} (instance_id, data) "
                                               + rows.format(from_="l, "))
        for table in ("entries", "records", "posts"):
            texts[f"read_{table}"] = "SELECT data::text FROM {s}.{t} WHERE instance_id = %s ORDER BY seq"
        return {
            name: sql.SQL(text).format(s=s, t=sql.Identifier(name.split("_")[1])).as_bytes(None)
            if "{t}" in text else sql.SQL(text).format(s=s).as_bytes(None)
            for name, text in texts.items()
        }

    def __repr__(self) -> str:
        """Show the DSN without its password, and the schema."""
        return f"PostgresStore(dsn={_safe_dsn(self._dsn)!r}, schema={self.schema!r})"

    # -- connections -----------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self._dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout)))

    def _keeper_connection(self) -> psycopg.Connection[Any]:
        # Named, so that pg_stat_activity shows each process's keeper (and its pid).
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout)),
                               application_name=f"loopwright keeper (pid {os.getpid()})")
        try:
            for statement in _KEEPER_SESSION_SETTINGS:
                conn.execute(statement.encode())
            if conn.info.server_version >= _PG14:
                # A server-wide idle_session_timeout would end the session, and with it the leases.
                conn.execute(b"SET idle_session_timeout = 0")
        except psycopg.Error:
            conn.close()
            raise
        return conn

    def _setup(self) -> Pool:
        """Connect once to create the schema and tables if missing, then make the pool (in a thread)."""
        with self._setup_lock:
            if self._closed:
                raise StoreError("the store is closed")
            if self._pool is not None:
                return self._pool
            try:
                conn = self._connect()
                try:
                    self._create_tables(conn)
                except BaseException:
                    conn.close()
                    raise
            except psycopg.Error as exc:
                raise StoreError(f"cannot set up the postgres store ({_safe_dsn(self._dsn)}, "
                                 f"schema {self.schema}): {exc}") from exc
            pool = Pool(self._connect, self.pool_size, self.connect_timeout)
            pool.put(conn)
            self._pool = pool
            return pool

    def _start_keeper(self) -> Keeper:
        """Start the keeper thread if it is not running (in a worker thread, once set up)."""
        with self._leases_mutex:
            keeper = self._keeper
            if keeper is None:
                keeper = self._keeper = Keeper(self._keeper_connection, self._session, interval=self.lease_ttl / 6,
                                               beat=self._heartbeat, on_notify=self._noted, probe=self._orphans,
                                               probe_interval=_PROBE_INTERVAL)
                keeper.start()
        return keeper

    def _create_tables(self, conn: psycopg.Connection[Any]) -> None:
        s = sql.Identifier(self.schema)
        present = conn.execute(
            "SELECT count(to_regclass(format('%%I.%%I', %s::text, t))) + (SELECT count(*) FROM "
            "information_schema.columns WHERE table_schema = %s AND table_name = 'instances' "
            "AND column_name = %s) FROM unnest(%s::text[]) AS t",
            (self.schema, self.schema, _WORK_COLUMNS[-1][0], [*_TABLES, "instances_work", "posts_post_id"]),
        ).fetchone()
        if present is not None and present[0] == len(_TABLES) + 3:
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
            # One row per instance ever leased; the epoch only grows (a freed lease keeps it).
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {s}.leases ("
                ' instance_id text COLLATE "C" PRIMARY KEY REFERENCES {s}.instances (id) ON DELETE CASCADE,'
                " epoch bigint NOT NULL,"
                " holder text,"
                " session bigint,"
                " writes bigint NOT NULL DEFAULT 0,"
                " server_start timestamptz,"
                " expires_at timestamptz)").format(s=s))
            conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS leases_session ON {s}.leases (session) "
                                 "WHERE session IS NOT NULL").format(s=s))
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
            # The poster's id of each post (see post); NULL in rows written before it existed.
            conn.execute(sql.SQL("ALTER TABLE {s}.posts ADD COLUMN IF NOT EXISTS post_id text").format(s=s))
            conn.execute(sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS posts_post_id ON {s}.posts (instance_id, post_id)")
                         .format(s=s))

    def _fill_work_columns(self, conn: psycopg.Connection[Any]) -> None:
        """Set the find_work columns of rows written before they existed (once, while setting up)."""
        s = sql.Identifier(self.schema)
        rows = conn.execute(sql.SQL("SELECT id, header::text FROM {s}.instances").format(s=s)).fetchall()
        update = sql.SQL("UPDATE {s}.instances SET state = %s, inbox_cursor = %s, decided = %s, queued = %s "
                         "WHERE id = %s").format(s=s)
        with conn.cursor() as cur:
            cur.executemany(update, [(*_work_columns(_loads(text)), iid) for iid, text in rows])
        conn.execute(sql.SQL(
            "UPDATE {s}.instances AS i SET last_post = m.seq FROM "
            "(SELECT instance_id, max(seq) AS seq FROM {s}.posts GROUP BY instance_id) AS m "
            "WHERE i.id = m.instance_id").format(s=s))

    def _call(self, instance_id: str | None, what: str, fn: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """Run ``fn`` on a pooled connection (in a worker thread); wrap database errors in StoreError.

        A failure to reach the server (no connection, a connection that broke, a server shutting
        down) raises :class:`~loopwright.errors.StoreUnavailableError`, which :meth:`_run` retries.
        """
        pool = self._pool if self._pool is not None and not self._closed else self._setup()
        try:
            with pool.connection() as conn:
                return fn(conn)
        except psycopg.errors.ForeignKeyViolation:
            raise InstanceNotFoundError(instance_id or "?") from None
        except PoolBusyError as exc:
            raise StoreUnavailableError(f"cannot {what}: no database connection within {self.connect_timeout:g} s "
                                        f"({_safe_dsn(self._dsn)}): {exc}", instance_id=instance_id) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(f"cannot {what}: {exc}", instance_id=instance_id) from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot {what}: {exc}", instance_id=instance_id) from exc

    async def _run(self, instance_id: str | None, what: str, fn: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """Run ``fn`` in a worker thread, retrying while the server is unreachable.

        Retries wait from 50 ms, doubling up to 2 s, with jitter, for up to ``outageTolerance``
        seconds since the first failure; then the last :class:`StoreUnavailableError` is raised.
        ``fn`` must be safe to run again after a failure (every statement here is: a fenced write
        is counted on its lease's row, see :meth:`_fenced`). The waits between attempts can be
        cancelled; an attempt cannot (a write that started finishes, or fails, first).
        """
        deadline: float | None = None
        delay = _FIRST_RETRY
        while True:
            if self._closed:
                raise StoreError("the store is closed", instance_id=instance_id)
            try:
                return await anyio.to_thread.run_sync(self._call, instance_id, what, fn)
            except StoreUnavailableError as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.outage_tolerance
                    if self.outage_tolerance > 0:
                        _log.warning("postgres store: %s; retrying for up to %g s", exc, self.outage_tolerance)
                if now >= deadline:
                    if self.outage_tolerance > 0:
                        raise StoreUnavailableError(
                            f"cannot {what}: the database stayed unreachable for {self.outage_tolerance:g} s "
                            f"(outageTolerance): {exc}", instance_id=instance_id) from exc
                    raise
            await anyio.sleep(min(jittered(delay), max(deadline - time.monotonic(), 0.0)))
            delay = min(delay * 2, _MAX_RETRY)

    async def _fenced(self, lease: Lease, what: str, write: Callable[[psycopg.Connection[Any], int], int]) -> None:
        """Make a write under ``lease``: applied only if the lease is still this store's, exactly once.

        ``write(conn, expected)`` runs the fenced statement, which counts itself on the lease's
        row only if that row still carries the lease's epoch, this store's session and
        ``expected`` writes, and writes nothing otherwise; it returns the rows written. When it
        wrote nothing, the row says why: the count is one further (an earlier attempt was applied
        but its reply was lost, so this one is done), or the lease is someone else's now.

        :raises LeaseLostError: Another runner took the lease over; nothing was written.
        """
        iid = lease.instance_id
        if lease.lost:
            raise LeaseLostError(f"cannot {what}: another runner took over its lease", instance_id=iid)

        async with lease.mutex:
            expected = lease.writes

            def attempt(conn: psycopg.Connection[Any]) -> bool | None:
                if write(conn, expected):
                    return True
                row = conn.execute(self._sql["lease_state"], (iid,)).fetchone()
                if row is not None and tuple(row) == (lease.epoch, self._session, expected + 1):
                    return True
                if row is not None and tuple(row) == (lease.epoch, self._session, expected):
                    return None  # the lease is ours: the instance's row is what is missing
                return False

            done = await self._run(iid, what, attempt)
            if done is None:
                raise InstanceNotFoundError(iid)
            if not done:
                lease.lost = True
                raise LeaseLostError(f"cannot {what}: another runner took over its lease (epoch {lease.epoch} "
                                     "is not the latest); nothing was written", instance_id=iid)
            lease.writes = expected + 1

    def _fence_args(self, lease: Lease, expected: int) -> tuple[str, int, int, int]:
        return (lease.instance_id, lease.epoch, self._session, expected)

    # -- headers ---------------------------------------------------------------------------------

    async def create(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Insert the instance's row (one statement, so one transaction).

        Raise :class:`~loopwright.errors.StoreError` if the id exists, is invalid, or the
        header is not a JSON-ready mapping. Workers listening are notified if the new
        instance has work for them (see :meth:`find_work`).
        """
        _check_id(instance_id)
        data = self._header_text(instance_id, header)
        columns = _work_columns(header)
        tries = 0

        def create(conn: psycopg.Connection[Any]) -> None:
            nonlocal tries
            tries += 1
            try:
                conn.execute(self._sql["create"], (instance_id, data, *columns))
            except psycopg.errors.UniqueViolation:
                if tries > 1:  # an attempt whose reply was lost may have made it: is the row ours?
                    row = conn.execute(self._sql["read_header"], (instance_id,)).fetchone()
                    if row is not None and _loads(row[0]) == _loads(data):
                        return
                raise StoreError(f"already exists (schema {self.schema})", instance_id=instance_id) from None

        await self._run(instance_id, "create the instance", create)
        self._known.add(instance_id)

    async def create_leased(self, instance_id: str, header: Mapping[str, Any], owner: str) -> Lease:
        """Create the instance and take its lease (epoch 1) in one statement, and return the lease.

        No other process ever sees the new instance with its lease free, so no worker takes it
        for a dead runner's. The keeper is started and connected first, as for :meth:`acquire`.
        Nothing is notified: the instance is this process's to run. Raise as :meth:`create`.
        """
        _check_id(instance_id)
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        if instance_id in self._held:
            raise StoreError(f"already exists (schema {self.schema})", instance_id=instance_id)
        data = self._header_text(instance_id, header)
        columns = _work_columns(header)
        tries = 0

        def create(conn: psycopg.Connection[Any]) -> None:
            nonlocal tries
            tries += 1
            try:
                conn.execute(self._sql["create_leased"], (instance_id, data, *columns, owner, self._session,
                                                          self.lease_ttl))
            except psycopg.errors.UniqueViolation:
                if tries > 1:  # an attempt whose reply was lost may have made it: are the rows ours?
                    row = conn.execute(self._sql["read_header"], (instance_id,)).fetchone()
                    lease = conn.execute(self._sql["lease_state"], (instance_id,)).fetchone()
                    if row is not None and _loads(row[0]) == _loads(data) and lease is not None \
                            and tuple(lease) == (1, self._session, 0):
                        return
                raise StoreError(f"already exists (schema {self.schema})", instance_id=instance_id) from None

        self._held[instance_id] = Lease(instance_id=instance_id, owner=owner, epoch=0)  # claimed here
        try:
            await self._run(instance_id, "create the instance", self._keeper_up)
            await self._run(instance_id, "create the instance", create)
        except BaseException:
            del self._held[instance_id]
            raise
        lease = Lease(instance_id=instance_id, owner=owner, epoch=1, on_release=self._released)
        self._held[instance_id] = lease
        self._known.add(instance_id)
        return lease

    async def write_header(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Replace the header with one ``UPDATE`` (atomic: a reader sees the old or the new one).

        Under a lease this store holds, the write is fenced (see :class:`Lease`) and raises
        :class:`~loopwright.errors.LeaseLostError` if another runner took the lease over. A
        write by a process that holds no lease (a decision, a submission) notifies the workers
        listening when the instance has work for them.
        Raise :class:`~loopwright.errors.InstanceNotFoundError` if the instance does not exist.
        """
        _check_id(instance_id)
        data = self._header_text(instance_id, header)
        columns = _work_columns(header)
        lease = self._held.get(instance_id)
        if lease is not None and lease.epoch:  # epoch 0: a lease being taken, not held yet
            statement = self._sql["write_header_fenced"]
            await self._fenced(lease, "write the header", lambda conn, expected: conn.execute(
                statement, (*self._fence_args(lease, expected), data, *columns, instance_id)).rowcount)
            return

        def write(conn: psycopg.Connection[Any]) -> int:
            return len(conn.execute(self._sql["write_header"], (data, *columns, instance_id)).fetchall())

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
        """Insert the entries, in order, with one statement; committed when this returns.

        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance and
        :class:`~loopwright.errors.StoreError` if an entry is not a JSON-ready mapping (nothing
        is written then) or the database fails. Under a lease this store holds, the insert is
        fenced (see :class:`Lease`): :class:`~loopwright.errors.LeaseLostError` if the lease
        was taken over, and nothing is written.
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
        lease = self._held.get(instance_id)
        if lease is not None and lease.epoch:
            fenced = self._sql[f"append_{table}_fenced"]
            await self._fenced(lease, f"append to {table}", lambda conn, expected: conn.execute(
                fenced, (*self._fence_args(lease, expected), instance_id, lines)).rowcount)
            return
        statement = self._sql[f"append_{table}"]

        def append(conn: psycopg.Connection[Any]) -> None:
            conn.execute(statement, (instance_id, lines))

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
        A post that gives a resting instance work notifies the workers listening.

        Idempotent by the item's ``id`` (see :meth:`loopwright.abc.Store.post`), kept in the
        ``post_id`` column under a unique index: an item without one gets a random one here, once
        per call, so that a retry of this call after a lost reply (the insert committed, the
        connection dropped before the answer came) inserts nothing.
        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance.
        """
        _check_id(instance_id)
        (line,) = _encode_items(instance_id, "post", [item])
        key = _lock_key(self.schema, f"\0posts\0{instance_id}")
        given = item.get("id")
        post_id = given if isinstance(given, str) and given else secrets.token_hex(16)

        def post(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                conn.execute(self._sql["post_lock"], (key,))
                conn.execute(self._sql["post"], (instance_id, line, post_id, instance_id))

        await self._run(instance_id, "post", post)

    async def delete(self, instance_id: str) -> None:
        """Delete the instance's row; its logs, mailbox and lease row go with it (``ON DELETE CASCADE``).

        Fenced as every write under a lease is (see :class:`Lease`): in one transaction, the
        lease's row is counted only if it still carries this store's epoch and session, and the
        instance is deleted only then. A delete whose reply was lost is done when retried (the
        instance is gone). Without a lease held here it is one ``DELETE``.

        :raises InstanceNotFoundError: There is no such instance.
        :raises LeaseLostError: Another runner took the lease over; nothing was deleted.
        """
        _check_id(instance_id)
        self._known.discard(instance_id)
        lease = self._held.get(instance_id)
        remove = self._sql["delete"]
        if lease is None or not lease.epoch:
            def plain(conn: psycopg.Connection[Any]) -> int:
                return conn.execute(remove, (instance_id,)).rowcount

            if await self._run(instance_id, "delete the instance", plain) == 0:
                raise InstanceNotFoundError(instance_id)
            return
        if lease.lost:
            raise LeaseLostError("cannot delete it: another runner took over its lease", instance_id=instance_id)
        count = self._sql["count_write"]
        attempts = 0

        def fenced(conn: psycopg.Connection[Any]) -> bool | None:
            nonlocal attempts
            attempts += 1
            with conn.transaction():
                if conn.execute(count, self._fence_args(lease, lease.writes)).rowcount:
                    conn.execute(remove, (instance_id,))
                    return True
            if conn.execute(self._sql["exists"], (instance_id,)).fetchone() is None:
                return True if attempts > 1 else None  # gone: deleted by an attempt whose reply was lost
            return False

        async with lease.mutex:
            done = await self._run(instance_id, "delete the instance", fenced)
        if done is None:
            raise InstanceNotFoundError(instance_id)
        if not done:
            lease.lost = True
            raise LeaseLostError(f"cannot delete it: another runner took over its lease (epoch {lease.epoch} "
                                 "is not the latest); nothing was deleted", instance_id=instance_id)

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
        ``running`` by a runner that began them, least recently updated first; then the queue
        (submitted, ``queued: true``), oldest first. ``state``, ``inbox_cursor``, ``decided`` and
        ``queued`` are columns written with each header. Instances whose lease is held (by a live session,
        or renewed before a server restart and not yet expired) are left out, so a dead
        runner's instance is found without trying live ones' leases. The query reads only the
        rows of the partial index ``instances_work`` (running, waiting for approval, or with
        unread posts), not the whole table.
        """
        limit = max(int(limit), 0)
        if limit == 0:
            return []

        def find(conn: psycopg.Connection[Any]) -> list[str]:
            live = [key for (key,) in conn.execute(self._sql["live_sessions"]).fetchall()]
            return [iid for (iid,) in conn.execute(self._sql["find_work"], (live, limit)).fetchall()]

        return await self._run(None, "find work", find)

    async def wait_for_work(self, timeout: float) -> bool:  # noqa: ASYNC109 - the store's contract
        r"""Wait until a write that may create work is notified, or ``timeout`` seconds pass.

        The store's keeper listens (``LISTEN``) on the channel ``loopwright_work``, which every
        write that gives an instance work for a worker notifies (with the instance id): a new
        instance that has work, a message or cancel posted, a decision written, a lease
        released while its instance is unfinished. Notifications that came since the last
        call, and a reconnect of the keeper (notifications sent meanwhile are lost), return
        at once. Return whether a notification (rather than the timeout) ended the wait.
        """
        if self._closed:
            raise StoreError("the store is closed")
        seen = self._notes_seen
        if self._keeper is None:
            await self._run(None, "listen for work", lambda _conn: None)  # set up: fails fast if unreachable
            await anyio.to_thread.run_sync(self._start_keeper)
        if self._notes != seen:
            self._notes_seen = self._notes
            return True
        event = anyio.Event()
        waiter = (_soon(), event)
        self._waiters.add(waiter)
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
        finally:
            self._waiters.discard(waiter)
        self._notes_seen = self._notes
        return event.is_set()

    def _orphans(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether a worker waiting here should look: work under a dead or expired lease (in the keeper)."""
        if not self._waiters:
            return False
        row = conn.execute(self._sql["orphans"]).fetchone()
        return bool(row and row[0])

    def _noted(self, payload: str | None) -> None:
        """Count a notification and wake the waiters (in the keeper's thread)."""
        del payload
        self._notes += 1
        for soon, event in list(self._waiters):
            with contextlib.suppress(RuntimeError):  # its event loop is gone
                soon(event.set)

    # -- leases ----------------------------------------------------------------------------------

    async def acquire(self, instance_id: str, owner: str) -> Lease:
        """Take the instance's runner lease without waiting and return the :class:`Lease`.

        One statement: the lease's row is taken if it is free (released, expired, or held by a
        session that died under the running server) and its epoch goes up by one; from then
        on every write this store makes to the instance is fenced with that epoch. Raise
        :class:`~loopwright.errors.InstanceLockedError` (with ``holder``, the owner holding it)
        if another runner, in any process on any machine, holds it, and
        :class:`~loopwright.errors.InstanceNotFoundError` if the instance does not exist. The
        store's keeper (its one extra connection, holding its session lock) is started and
        connected first, so that a lease is never taken by a session that others see as dead.
        """
        _check_id(instance_id)
        if self._closed:
            raise StoreError("the store is closed", instance_id=instance_id)
        held = self._held.get(instance_id)
        if held is not None:
            raise InstanceLockedError(instance_id, holder=held.owner)
        claim = Lease(instance_id=instance_id, owner=owner, epoch=0)
        self._held[instance_id] = claim  # claimed at once: a concurrent acquire here fails fast
        try:
            await self._run(instance_id, "take the lease", self._keeper_up)
            row = await self._run(instance_id, "take the lease", lambda conn: conn.execute(
                self._sql["acquire"], {"id": instance_id, "holder": owner, "session": self._session,
                                       "ttl": self.lease_ttl}).fetchone())
        except BaseException:
            del self._held[instance_id]
            raise
        if row is None:
            del self._held[instance_id]
            raise InstanceNotFoundError(instance_id)
        text, epoch, holder = row
        header: object = _loads(text)
        if epoch is None:
            del self._held[instance_id]
            raise InstanceLockedError(instance_id, holder=_runner_of(header) or holder)
        fields = HeaderFields(header) if isinstance(header, dict) else None
        previous = fields.dead_runner(owner) if fields is not None and _state_of(fields) is State.RUNNING else None
        lease = Lease(instance_id=instance_id, owner=owner, epoch=int(epoch), previous_holder=previous,
                      on_release=self._released)
        with self._leases_mutex:
            self._unreleased.pop(instance_id, None)  # taken again: nothing left to give back
            self._held[instance_id] = lease
        self._known.add(instance_id)
        return lease

    def _keeper_up(self, conn: psycopg.Connection[Any]) -> None:
        """Start the keeper and wait until it holds the session lock (in a worker thread)."""
        del conn
        keeper = self._start_keeper()
        if not keeper.connected.wait(self.connect_timeout):
            raise psycopg.OperationalError(f"the lease keeper could not connect within {self.connect_timeout:g} s")

    def _released(self, lease: Lease) -> None:
        """Free the lease's row now, so that it is free for any process when release() returns.

        One round trip on the caller's thread (release() is synchronous), once per segment;
        freeing in the background instead would let an acquire elsewhere right after release()
        find the lease still held. If the server cannot be reached, the keeper frees it at its
        next heartbeat (the keeper renews only the leases still held, so it expires meanwhile).
        """
        with self._leases_mutex:
            if self._held.get(lease.instance_id) is lease:
                del self._held[lease.instance_id]
            if lease.lost or self._pool is None:
                return
            self._unreleased[lease.instance_id] = lease
        pool, keeper = self._pool, self._keeper
        if pool is None:
            return
        if keeper is not None and not keeper.connected.is_set():
            keeper.beat_soon()  # the server is out of reach: do not block the caller trying
            return
        try:
            with pool.connection() as conn:
                self._free(conn, [lease])
        except (psycopg.Error, PoolBusyError) as exc:
            _log.info("postgres store: releasing the lease of %s later: %s", lease.instance_id, exc)
            if self._keeper is not None:
                self._keeper.beat_soon()

    def _free(self, conn: psycopg.Connection[Any], leases: Sequence[Lease]) -> None:
        """Free the rows of ``leases`` still held by this session, and forget them."""
        conn.execute(self._sql["release"], ([le.instance_id for le in leases], [le.epoch for le in leases],
                                            self._session))
        with self._leases_mutex:
            for le in leases:
                if self._unreleased.get(le.instance_id) is le:
                    del self._unreleased[le.instance_id]

    def _heartbeat(self, conn: psycopg.Connection[Any]) -> None:
        """Renew every lease held here in one statement, free those left unreleased (in the keeper)."""
        with self._leases_mutex:
            unreleased = list(self._unreleased.values())
            held = [le for le in self._held.values() if le.epoch]
        if unreleased:
            self._free(conn, unreleased)
        if not held:
            return
        rows = conn.execute(self._sql["heartbeat"], (self.lease_ttl, self._session,
                                                     [le.instance_id for le in held])).fetchall()
        kept = {(iid, epoch) for iid, epoch in rows}
        for le in held:
            if (le.instance_id, le.epoch) not in kept and not le.released:
                # Taken over while this store could not renew it: the next write is refused.
                _log.warning("postgres store: the lease of %s was taken over", le.instance_id)
                le.lost = True

    # -- lifetime --------------------------------------------------------------------------------

    def locations(self) -> Sequence[Path]:
        """Return ``()``: the store keeps no local files."""
        return ()

    async def aclose(self) -> None:
        """Release every lease still held and close every connection. Calls afterwards raise."""
        if self._closed:
            return
        leases = [le for le in self._held.values() if le.epoch]
        if leases and self._pool is not None:
            for lease in leases:
                lease.release()
        self._closed = True
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()  # ends within a second; its session lock goes with its connection
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


def _soon() -> Callable[[Callable[[], object]], object]:
    """Return a thread-safe way to run a callback soon in the current event loop (asyncio or trio)."""
    import sniffio  # noqa: PLC0415 - only once a worker waits for work

    if sniffio.current_async_library() == "trio":
        import trio  # noqa: PLC0415

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio  # noqa: PLC0415

    return asyncio.get_running_loop().call_soon_threadsafe
