"""The postgres store's connections: a small pool for statements, and one keeper connection per store.

:class:`Pool` hands out up to ``size`` connections, one caller at a time each, and keeps the idle
ones. It never waits on a server that is down: a connection that fails is closed, and so are the
idle ones (after a server restart they are all dead), so the next attempt connects afresh.

:class:`Keeper` is the store's one background thread and its one connection of its own. On it,
the keeper holds a session-level advisory lock on the store's *session key* for as long as the
connection lives (that is how other processes tell a live store from a dead one at once), renews
the expiry of every lease the store holds in one statement every ``interval`` seconds, gives back
leases whose release could not reach the server, and listens (``LISTEN``) on the work channel. When the
connection drops (a server restart, an outage), it reconnects with bounded exponential backoff
and jitter, takes its session lock again and renews at once.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import psycopg

__all__ = ["CHANNEL", "Keeper", "Pool", "PoolBusyError"]

_log = logging.getLogger(__name__)

#: The channel writes that create work notify, with the instance id as payload.
CHANNEL: Final = "loopwright_work"
# Reconnect backoff of the keeper: from 50 ms, doubling, at most 2 s, with +-50% jitter.
_FIRST_DELAY: Final = 0.05
_MAX_DELAY: Final = 2.0
# The longest the keeper waits for notifications before it looks at its other duties.
_TICK: Final = 1.0


def jittered(delay: float) -> float:
    """Return ``delay`` scaled by a random factor in [0.5, 1.5) (spreads the retries of many processes)."""
    return delay * (0.5 + random.random())  # noqa: S311 - jitter, not cryptography


class PoolBusyError(Exception):
    """No pooled connection came free within the pool's timeout."""


class Pool:
    """Up to ``size`` connections made by ``connect``, each lent to one caller at a time (thread-safe).

    :param connect: Makes a new connection (autocommit).
    :param size: The most connections lent at once.
    :param timeout: Seconds a caller waits for a free slot before :class:`PoolBusyError`.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], size: int, timeout: float) -> None:
        """Make the pool; nothing connects until a caller needs a connection."""
        self._connect = connect
        self._slots = threading.BoundedSemaphore(size)
        self._timeout = timeout
        self._idle: list[psycopg.Connection[Any]] = []
        self._mutex = threading.Lock()
        self._closed = False

    def put(self, conn: psycopg.Connection[Any]) -> None:
        """Keep an open, idle connection for the next caller (or close it if the pool is closed)."""
        with self._mutex:
            if not self._closed and not conn.closed:
                self._idle.append(conn)
                return
        conn.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """Lend a connection for the ``with`` block.

        A connection the block left broken or inside a transaction is closed rather than kept;
        an :class:`psycopg.OperationalError` from the block also closes every idle connection.

        :raises PoolBusyError: Every connection stayed lent for ``timeout`` seconds.
        :raises psycopg.OperationalError: A new connection could not be made.
        """
        if not self._slots.acquire(timeout=self._timeout):
            raise PoolBusyError(f"all connections stayed in use for {self._timeout:g} s")
        conn: psycopg.Connection[Any] | None = None
        try:
            with self._mutex:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            yield conn
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            self.discard_idle()
            raise
        finally:
            if conn is not None and not conn.closed:
                if conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.close()
                else:
                    self.put(conn)
            self._slots.release()

    def discard_idle(self) -> None:
        """Close the idle connections (the server went away: they are dead too)."""
        with self._mutex:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        """Close the idle connections; lent ones are closed when they come back."""
        with self._mutex:
            self._closed = True
        self.discard_idle()


class Keeper(threading.Thread):
    """The store's background thread: liveness, lease heartbeats, deferred releases and LISTEN.

    :param connect: Makes the keeper's connection (autocommit).
    :param session: The store's session key, locked with ``pg_advisory_lock`` on the connection.
    :param interval: Seconds between heartbeats.
    :param beat: Called with the connection at each heartbeat (and at once after a reconnect);
        renews the store's leases and gives back those whose release failed.
    :param on_notify: Called with each payload received on :data:`CHANNEL`, and with ``None``
        after a reconnect (notifications sent while disconnected are lost: look again) or when
        ``probe`` finds work.
    :param probe: Called with the connection every ``probe_interval`` seconds; a true answer is
        reported to ``on_notify`` (work that no write notified: a dead process's leases).

    :attr:`connected` is set while the connection is up and the session lock held.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], session: int, *, interval: float,
                 beat: Callable[[psycopg.Connection[Any]], None],
                 on_notify: Callable[[str | None], None],
                 probe: Callable[[psycopg.Connection[Any]], bool], probe_interval: float) -> None:
        """Describe the keeper; :meth:`start` runs it."""
        super().__init__(name="loopwright-postgres-keeper", daemon=True)
        self._connect = connect
        self._session = session
        self._interval = interval
        self._beat = beat
        self._on_notify = on_notify
        self._probe = probe
        self._probe_interval = probe_interval
        self._due = self._probe_due = 0.0
        self._stop = threading.Event()
        self._beat_now = threading.Event()
        self.connected = threading.Event()

    def stop(self) -> None:
        """Ask the thread to end (within about a second); its connection closes then."""
        self._stop.set()

    def beat_soon(self) -> None:
        """Ask for a heartbeat at the next tick (a release that could not reach the server)."""
        self._beat_now.set()

    def _open(self) -> psycopg.Connection[Any]:
        conn = self._connect()
        try:
            # A holder of a lock can wait a moment for it: another process probing this session
            # (pg_try_advisory_xact_lock) holds it for one statement.
            conn.execute("SET lock_timeout = '10s'")
            conn.execute("SELECT pg_advisory_lock(%s)", (self._session,))
            conn.execute(f"LISTEN {CHANNEL}".encode())
        except BaseException:
            conn.close()
            raise
        return conn

    def run(self) -> None:
        """Keep the connection, beat and listen until stopped."""
        conn: psycopg.Connection[Any] | None = None
        delay = _FIRST_DELAY
        while not self._stop.is_set():
            if conn is None:
                try:
                    conn = self._open()
                except psycopg.Error as exc:
                    _log.debug("postgres store keeper: cannot connect: %s", exc)
                    self._stop.wait(jittered(delay))
                    delay = min(delay * 2, _MAX_DELAY)
                    continue
                delay = _FIRST_DELAY
                self._due = self._probe_due = 0.0
                self.connected.set()
                self._on_notify(None)
            try:
                self._tick(conn)
            except psycopg.Error as exc:
                _log.info("postgres store keeper: lost its connection: %s", exc)
                self.connected.clear()
                conn.close()
                conn = None
        self.connected.clear()
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _tick(self, conn: psycopg.Connection[Any]) -> None:
        """Beat and probe when due, then wait for notifications until the next duty (at most a second)."""
        now = time.monotonic()
        if now >= self._due or self._beat_now.is_set():
            self._beat_now.clear()
            self._beat(conn)
            self._due = time.monotonic() + self._interval
        if now >= self._probe_due:
            self._probe_due = time.monotonic() + self._probe_interval
            if self._probe(conn):
                self._on_notify(None)
        wait = max(0.0, min(_TICK, self._due - time.monotonic(), self._probe_due - time.monotonic()))
        for note in conn.notifies(timeout=wait):
            self._on_notify(note.payload)
            if self._stop.is_set() or self._beat_now.is_set():
                break
