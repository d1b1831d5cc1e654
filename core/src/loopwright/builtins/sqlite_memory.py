"""Built-in plugin: the ``sqlite`` memory, facts in one SQLite database ranked by FTS5 (stdlib ``sqlite3``).

Assembly (every key optional; this is the default)::

    memory:
      kind: sqlite
      path: .loopwright/memory.db   # relative to the assembly's folder, beside the default stores
      createParents: false          # true creates the folders above path too

Schema (``PRAGMA user_version = 1``)::

    facts(rowid, id TEXT UNIQUE, subject TEXT, namespace TEXT, text TEXT,
          created REAL, expires REAL NULL)              seconds since the epoch, UTC
    facts_fts USING fts5(text, content=facts)           kept in step by three triggers
    + indexes on (subject, namespace, created) and on expires

Choices:

* **Ranking** is FTS5's BM25 over the fact's text (``unicode61`` tokens, diacritics removed): a
  query is split into its words, each quoted, joined with ``OR`` (so no query can use FTS5's
  syntax), and the rows are then filtered to the subject, the namespaces and the unexpired. A
  query without words returns the newest facts. No model is needed: it works offline.
* **Every write is its own committed transaction** in WAL mode (``synchronous=normal``, as the
  sqlite store's default): a process killed during ``remember`` loses at most that fact, and a
  committed one is seen by every process. Calls run inline on the event loop (each is well
  under a millisecond: bench/memory.py), one connection per memory object, under a lock.
* **Expired facts** are never returned (every read filters on ``expires``) and are deleted by
  the next ``remember``, through the ``expires`` index.
* **Nothing is opened or created until the first call**, and the first write creates the
  database owner-only (0o600, its folder 0o700 when created). :meth:`SqliteMemory.locations`
  names the database and its ``-wal``/``-shm`` files: the runtime refuses grants whose file
  roots reach them, as for the store.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from loopwright._capabilities import check_namespace, check_subject
from loopwright.builtins._store_path import RUNTIME_FOLDER
from loopwright.errors import ConfigError, ConfigProblem, StoreError, shown_path
from loopwright.hookspecs import hookimpl
from loopwright.memory import MAX_RECALL, Fact, Memory, MemorySettings, check_fact_text

if TYPE_CHECKING:
    import sqlite3

__all__ = ["DEFAULT_PATH", "SqliteMemory", "fts_query", "loopwright_register_memories"]

#: The database when ``path`` is not set, relative to the assembly's folder.
DEFAULT_PATH: Final = f"{RUNTIME_FOLDER}/memory.db"
SCHEMA_VERSION: Final = 1
_OPTIONS: Final = frozenset({"path", "createParents"})
_SCHEMA: Final = (
    (
        "CREATE TABLE IF NOT EXISTS facts (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
        "subject TEXT NOT NULL, namespace TEXT NOT NULL, text TEXT NOT NULL, created REAL NOT NULL, expires REAL)"
    ),
    "CREATE INDEX IF NOT EXISTS facts_by_subject ON facts(subject, namespace, created)",
    "CREATE INDEX IF NOT EXISTS facts_by_expiry ON facts(expires) WHERE expires IS NOT NULL",
    (
        "CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5(text, content='facts', content_rowid='rowid', "
        "tokenize='unicode61 remove_diacritics 2')"
    ),
    (
        "CREATE TRIGGER IF NOT EXISTS facts_ai AFTER INSERT ON facts BEGIN "
        "INSERT INTO facts_fts(rowid, text) VALUES (new.rowid, new.text); END"
    ),
    (
        "CREATE TRIGGER IF NOT EXISTS facts_ad AFTER DELETE ON facts BEGIN "
        "INSERT INTO facts_fts(facts_fts, rowid, text) VALUES ('delete', old.rowid, old.text); END"
    ),
    (
        "CREATE TRIGGER IF NOT EXISTS facts_au AFTER UPDATE ON facts BEGIN "
        "INSERT INTO facts_fts(facts_fts, rowid, text) VALUES ('delete', old.rowid, old.text); "
        "INSERT INTO facts_fts(rowid, text) VALUES (new.rowid, new.text); END"
    ),
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
#: The most words of a query that take part in ranking.
_MAX_QUERY_WORDS: Final = 32
_WORD: Final = re.compile(r"\w+")
_COLUMNS: Final = "f.id, f.subject, f.namespace, f.text, f.created, f.expires"


@hookimpl
def loopwright_register_memories(register: Callable[..., None]) -> None:
    """Register the ``sqlite`` memory kind."""
    register("sqlite", SqliteMemory)


def fts_query(query: str) -> str:
    """Return ``query`` as an FTS5 expression: its first 32 distinct words, each quoted, joined with OR.

    ``""`` when it has no words. Quoting keeps every word literal: no column filter, prefix,
    ``NEAR`` or boolean operator of FTS5's syntax can come from the query.
    """
    words = dict.fromkeys(w.lower() for w in _WORD.findall(query))
    return " OR ".join(f'"{w}"' for w in list(words)[:_MAX_QUERY_WORDS])


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _fact(row: Sequence[Any], score: float | None = None) -> Fact:
    return Fact(
        id=row[0],
        subject=row[1],
        namespace=row[2],
        text=row[3],
        created=_iso(row[4]) or "",
        expires=_iso(row[5]),
        score=score,
    )


class SqliteMemory(Memory):
    """Facts as rows of one SQLite database, ranked by FTS5 (see the module docstring).

    :param settings: ``settings.options`` may hold ``path`` (default ``.loopwright/memory.db``,
        relative to ``settings.base_dir``; ``~`` is expanded) and ``createParents`` (bool). Any
        other key, a value of the wrong type, or a ``path`` whose folder does not exist (unless
        ``createParents`` or the folder is ``.loopwright`` in ``settings.base_dir``) raises
        :class:`~loopwright.errors.ConfigError` at ``$.memory.KEY``; nothing is created then.

    Attributes:
        path: The database file, absolute. Created by the first :meth:`remember`.
        create_parents: Whether that first write also creates the folders above ``path``.
    """

    def __init__(self, settings: MemorySettings) -> None:
        """Check the options and resolve the database's path; nothing is opened or created yet."""
        options = settings.options
        problems = [
            ConfigProblem(
                f"unknown option {key!r} of the sqlite memory (known: {', '.join(sorted(_OPTIONS))})",
                path=f"$.memory.{key}",
            )
            for key in options
            if key not in _OPTIONS
        ]
        raw = options.get("path", DEFAULT_PATH)
        if not isinstance(raw, str) or not raw:
            problems.append(ConfigProblem("must be a non-empty path", path="$.memory.path"))
            raw = DEFAULT_PATH
        create = options.get("createParents", False)
        if not isinstance(create, bool):
            problems.append(ConfigProblem("must be true or false", path="$.memory.createParents"))
            create = False
        path = Path(raw).expanduser()
        path = (path if path.is_absolute() else Path(settings.base_dir) / path).resolve()
        own = path.parent == (Path(settings.base_dir) / RUNTIME_FOLDER).resolve()
        if not (create or own or path.parent.is_dir()):
            problems.append(
                ConfigProblem(
                    f"the folder {shown_path(path.parent)} does not exist: create it, correct the path, or set "
                    "createParents: true (nothing was created)",
                    path="$.memory.path",
                )
            )
        if problems:
            raise ConfigError("invalid options for the sqlite memory", problems=problems)
        self.path: Path = path
        self.create_parents: bool = create or own
        self._conn: sqlite3.Connection | None = None
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        """Show the database's path."""
        return f"SqliteMemory(path={str(self.path)!r})"

    def locations(self) -> Sequence[Path]:
        """Return the database and its ``-wal`` and ``-shm`` files."""
        return (self.path, self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm"))

    # -- connection ------------------------------------------------------------------------------

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        """Return the open connection, opening it first; ``None`` when there is no database and ``create`` is false."""
        if self._conn is not None:
            return self._conn
        import sqlite3  # noqa: PLC0415 - sqlite3 only when memory is used

        if not self.path.exists():
            if not create:
                return None
            if self.create_parents:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600)
            os.close(fd)
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                with conn:
                    for stmt in _SCHEMA:
                        conn.execute(stmt)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the sqlite memory at {shown_path(self.path)}: {exc}") from exc
        self._conn = conn
        return conn

    def _do(self, fn: Callable[[sqlite3.Connection], Any], *, create: bool = False, empty: Any = None) -> Any:
        """Run ``fn(connection)`` under the lock; ``empty`` when there is no database yet and ``create`` is false."""
        import sqlite3  # noqa: PLC0415 - as above

        with self._mutex:
            conn = self._connect(create=create)
            if conn is None:
                return empty
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                raise StoreError(f"the sqlite memory at {shown_path(self.path)} failed: {exc}") from exc

    # -- the contract ---------------------------------------------------------------------------

    async def remember(self, subject: str, namespace: str, text: str, *, expires: datetime | None = None) -> Fact:
        """Insert one fact (and delete expired ones) in one transaction; see :meth:`Memory.remember`."""
        check_subject(subject)
        check_namespace(namespace)
        check_fact_text(text)
        if expires is not None and expires.tzinfo is None:
            raise ValueError("expires must be an aware datetime (with a time zone)")
        now = time.time()
        until = expires.timestamp() if expires is not None else None
        fact_id = uuid.uuid4().hex

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("DELETE FROM facts WHERE expires IS NOT NULL AND expires <= ?", (now,))
                conn.execute(
                    "INSERT INTO facts(id, subject, namespace, text, created, expires) VALUES (?, ?, ?, ?, ?, ?)",
                    (fact_id, subject, namespace, text, now, until),
                )

        self._do(write, create=True)
        return _fact((fact_id, subject, namespace, text, now, until))

    async def recall(self, subject: str, namespaces: Sequence[str], query: str = "", *, limit: int = 10) -> list[Fact]:
        """Rank by BM25 (or newest first without words); see :meth:`Memory.recall`."""
        check_subject(subject)
        names = [check_namespace(n) for n in dict.fromkeys(namespaces)]
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECALL:
            raise ValueError(f"limit must be a whole number from 1 to {MAX_RECALL}")
        if not names:
            return []
        match = fts_query(query if isinstance(query, str) else "")
        marks = ", ".join("?" * len(names))
        scope = f"f.subject = ? AND f.namespace IN ({marks}) AND (f.expires IS NULL OR f.expires > ?)"
        args: list[Any] = [subject, *names, time.time()]

        def read(conn: sqlite3.Connection) -> list[Fact]:
            if not match:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM facts f WHERE {scope} "  # noqa: S608 - marks only
                    "ORDER BY f.created DESC LIMIT ?",
                    (*args, limit),
                ).fetchall()
                return [_fact(row) for row in rows]
            rows = conn.execute(
                f"SELECT {_COLUMNS}, bm25(facts_fts) AS rank FROM facts_fts JOIN facts f "  # noqa: S608 - marks only
                f"ON f.rowid = facts_fts.rowid WHERE facts_fts MATCH ? AND {scope} "
                "ORDER BY rank, f.created DESC LIMIT ?",
                (match, *args, limit),
            ).fetchall()
            return [_fact(row, score=-row[6]) for row in rows]

        found: list[Fact] = self._do(read, empty=[])
        return found

    async def forget(self, subject: str) -> int:
        """Delete every fact about ``subject``; see :meth:`Memory.forget`."""
        check_subject(subject)

        def delete(conn: sqlite3.Connection) -> int:
            with conn:
                return conn.execute("DELETE FROM facts WHERE subject = ?", (subject,)).rowcount

        removed: int = self._do(delete, empty=0)
        return removed

    async def forget_fact(self, fact_id: str) -> bool:
        """Delete one fact by id; see :meth:`Memory.forget_fact`."""
        if not isinstance(fact_id, str) or not fact_id:
            raise ValueError("a fact id is a non-empty string")

        def delete(conn: sqlite3.Connection) -> bool:
            with conn:
                return conn.execute("DELETE FROM facts WHERE id = ?", (fact_id,)).rowcount > 0

        gone: bool = self._do(delete, empty=False)
        return gone

    async def aclose(self) -> None:
        """Close the connection (a later call opens it again)."""
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
