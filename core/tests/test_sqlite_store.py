"""The ``sqlite`` store: options, files, schema, leases across processes, and runtimes and the CLI over it.

The generic store checks (headers, logs, mailbox, leases in one process, ids) are the store
contract kit's, in ``test_store_contract.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, kill, read_line, reply, run_to_rest

import loopwright
from loopwright import Capabilities, FileGrants, State, _plugins
from loopwright._definition import Assembly, StoreConfig
from loopwright.abc import StoreSettings
from loopwright.builtins import sqlite_store
from loopwright.builtins.sqlite_store import Lease, SqliteStore
from loopwright.errors import CapabilityError, ConfigError, InstanceLockedError, InstanceNotFoundError, StoreError

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).with_name("cli_fixtures")


def make_store(base: Path, **options: object) -> SqliteStore:
    return SqliteStore(StoreSettings(kind="sqlite", base_dir=base, options=options))


@pytest.fixture
async def store(tmp_path: Path):
    s = make_store(tmp_path)
    yield s
    await s.aclose()


def sqlite_runtime(tmp_path: Path, *plugins: object, **assembly: Any) -> loopwright.Runtime:
    """Return a runtime over a sqlite store at ``tmp_path/lw.db`` with only ``plugins`` added."""
    asm = Assembly(store=StoreConfig(kind="sqlite", options={"path": str(tmp_path / "lw.db")}), **assembly)
    return loopwright.Runtime(asm, plugins=plugins, autoload=False)


# A process that works on the store until the test SIGKILLs it (argv: mode, db, instance id).
HELPER = textwrap.dedent("""
    import os, sys, time, anyio
    from pathlib import Path
    from loopwright.abc import StoreSettings
    from loopwright.builtins.sqlite_store import SqliteStore

    async def main(mode, db, iid):
        store = SqliteStore(StoreSettings(kind="sqlite", base_dir=Path(db).parent, options={"path": db}))
        if mode == "append":
            n = 0
            while True:
                await store.append_entries(iid, [{"n": n, "pad": "x" * 2000}, {"n": n + 1}])
                print(n + 1, flush=True)
                n += 2
        header = await store.read_header(iid)
        await store.write_header(iid, {**header, "state": "running", "runner": f"helper (pid {os.getpid()})"})
        await store.acquire(iid, "helper")
        print("locked", flush=True)
        while True:
            time.sleep(60)

    anyio.run(main, *sys.argv[1:4])
""")


def spawn(mode: str, store: SqliteStore, instance_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HELPER, mode, str(store.path), instance_id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# -- plugin, options, files -----------------------------------------------------------------------


def test_registers_as_sqlite_store_kind() -> None:
    """The module is a built-in plugin that registers SqliteStore as store kind ``sqlite``."""
    host = _plugins.PluginHost()
    host.register(sqlite_store, "sqlite_store_under_test")
    assert host.stores.get("sqlite") is SqliteStore
    assert "loopwright.builtins.sqlite_store" in _plugins.BUILTIN_PLUGINS


def test_default_path_mirrors_the_file_store(tmp_path: Path) -> None:
    """Without options the database is ``.loopwright/loopwright.db`` under base_dir, synchronous normal."""
    s = make_store(tmp_path / "project" / ".." / "project")
    db = (tmp_path / "project" / ".loopwright" / "loopwright.db").resolve()
    assert s.path == db
    assert s.synchronous == "normal"
    assert s.locations() == (db, db.with_name("loopwright.db-wal"), db.with_name("loopwright.db-shm"),
                             db.with_name("loopwright.db.locks"))
    (tmp_path / "data").mkdir()
    assert make_store(tmp_path, path="data/x.db").path == (tmp_path / "data" / "x.db").resolve()
    assert make_store(tmp_path / "elsewhere", path=str(tmp_path / "abs.db")).path == (tmp_path / "abs.db").resolve()
    assert make_store(tmp_path, synchronous="full").synchronous == "full"


@pytest.mark.parametrize(("options", "where"), [
    ({"synchronous": "off"}, ["$.store.synchronous"]),
    ({"synchronous": True}, ["$.store.synchronous"]),
    ({"path": 3}, ["$.store.path"]),
    ({"path": ""}, ["$.store.path"]),
    ({"fsync": True}, ["$.store.fsync"]),
    ({"pth": "x", "synchronous": "FULL"}, ["$.store.pth", "$.store.synchronous"]),
    ({"createParents": 1}, ["$.store.createParents"]),
    ({"path": "no/such/x.db"}, ["$.store.path"]),
])
def test_bad_options_raise_config_error(tmp_path: Path, options: dict[str, object], where: list[str]) -> None:
    """Unknown option keys and wrong values raise ConfigError with each option's JSON path."""
    with pytest.raises(ConfigError) as info:
        make_store(tmp_path, **options)
    assert [p.path for p in info.value.problems] == where


async def test_create_parents_makes_the_missing_folders_on_the_first_instance(tmp_path: Path) -> None:
    """Issue 31, point 2: with ``createParents: true`` a database in missing folders is made by the first create()."""
    s = make_store(tmp_path, path="no/such/x.db", createParents=True)
    assert not (tmp_path / "no").exists()
    await s.create("inst-1", {"state": "running"})
    assert (tmp_path / "no" / "such" / "x.db").is_file()
    await s.aclose()


async def test_nothing_is_created_until_the_first_instance(store: SqliteStore) -> None:
    """Reads on a store with no database find nothing and create no file; create() makes it owner-only."""
    assert await store.list_headers() == []
    with pytest.raises(InstanceNotFoundError):
        await store.read_header("x")
    with pytest.raises(InstanceNotFoundError):
        await store.read_posts("x", 0)
    assert not store.path.parent.exists()
    await store.create("x", {})
    (await store.acquire("x", "me")).release()
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.lock_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((store.lock_dir / "x.lock").stat().st_mode) == 0o600
    wal = store.path.with_name(store.path.name + "-wal")
    assert stat.S_IMODE(wal.stat().st_mode) == 0o600


async def test_schema_rows_and_indexed_reads(store: SqliteStore) -> None:
    """Headers and items are one compact JSON text per row; log and mailbox reads use the per-instance index."""
    await store.create("s", {"createdAt": "2026-01-01T00:00:00Z", "t": "é"})
    await store.append_entries("s", [{"n": 0}, {"n": 1}])
    await store.post("s", {"type": "cancel"})
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA user_version").fetchone() == (1,)
        assert db.execute("SELECT id, header, created_at FROM instances").fetchall() == [
            ("s", '{"createdAt":"2026-01-01T00:00:00Z","t":"é"}', "2026-01-01T00:00:00Z")]
        assert [r[0] for r in db.execute("SELECT json FROM entries WHERE instance_id = 's' ORDER BY seq")] == [
            '{"n":0}', '{"n":1}']
        for table in ("entries", "records", "posts"):
            plan = db.execute(f"EXPLAIN QUERY PLAN SELECT seq, json FROM {table} "  # noqa: S608
                              "WHERE instance_id = ? AND seq > ? ORDER BY seq", ("s", 0)).fetchall()
            assert any(f"{table}_by_instance" in row[-1] for row in plan), plan
            assert not any("TEMP B-TREE" in row[-1] for row in plan), plan  # no sort: index order
    finally:
        db.close()


async def test_corrupt_rows_raise_naming_the_database_and_row(
    store: SqliteStore, caplog: pytest.LogCaptureFixture,
) -> None:
    """A row that is not a JSON object raises StoreError naming the instance, the database and the row."""
    await store.create("bad", {"id": "bad"})
    await store.create("good", {"id": "good"})
    await store.append_entries("bad", [{"n": 0}])
    db = sqlite3.connect(store.path)
    db.execute("UPDATE entries SET json = '[1]' WHERE instance_id = 'bad'")
    db.execute("UPDATE instances SET header = '{not json' WHERE id = 'bad'")
    db.commit()
    db.close()
    with pytest.raises(StoreError) as info:
        await store.read_entries("bad")
    assert info.value.instance_id == "bad"
    assert str(store.path) in str(info.value)
    assert "entries row" in str(info.value)
    with pytest.raises(StoreError, match="not valid JSON"):
        await store.read_header("bad")
    assert await store.list_headers() == [{"id": "good"}]
    assert "bad" in caplog.text


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A database written by a newer loopwright (a higher user_version) is refused, naming the file."""
    db = tmp_path / "new.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    s = make_store(tmp_path, path=str(db))
    with pytest.raises(StoreError, match="schema version 99") as info:
        await s.list_headers()
    assert str(db) in str(info.value)
    await s.aclose()


async def test_lease_is_a_context_manager_naming_its_lock_file(store: SqliteStore) -> None:
    """acquire() returns a Lease on ``<db>.locks/<id>.lock``, released on exit; the holder is the header's runner."""
    await store.create("lk", {"runner": "runner-a (pid 1)"})
    with await store.acquire("lk", "runner-a") as lease:
        assert isinstance(lease, Lease)
        assert lease.path == store.lock_dir / "lk.lock"
        assert lease.previous_holder is None
        with pytest.raises(InstanceLockedError) as info:
            await store.acquire("lk", "runner-b")
        assert info.value.holder == "runner-a (pid 1)"
    assert lease.released


# -- across processes -----------------------------------------------------------------------------


async def test_lock_held_by_live_process_then_taken_over_after_sigkill(store: SqliteStore) -> None:
    """A live process's lease raises InstanceLockedError at once; after SIGKILL the lease is taken over."""
    await store.create("shared", {})
    proc = spawn("lock", store, "shared")
    try:
        assert read_line(proc) == "locked"
        # Refused while the holder still holds it: a blocking acquire would wait for the holder,
        # which lets go only when killed below (the hang guard fails such a test).
        with anyio.fail_after(60), pytest.raises(InstanceLockedError) as info:
            await store.acquire("shared", "me")
        assert proc.poll() is None
        assert info.value.holder == f"helper (pid {proc.pid})"
    finally:
        kill(proc)
    lease = await store.acquire("shared", "me")
    assert lease.previous_holder == f"helper (pid {proc.pid})"
    lease.release()


async def test_killed_appender_loses_nothing_committed(store: SqliteStore) -> None:
    """A process SIGKILLed while appending loses no batch whose append returned, and never half a batch."""
    await store.create("crash", {})
    proc = spawn("append", store, "crash")
    try:
        reported = -1
        while reported < 300:
            reported = int(read_line(proc))
    finally:
        kill(proc)
    entries = await store.read_entries("crash")
    assert len(entries) > reported
    assert len(entries) % 2 == 0  # a batch is one transaction
    assert [e["n"] for e in entries] == list(range(len(entries)))
    (await store.acquire("crash", "next")).release()
    await store.append_entries("crash", [{"n": "after"}])
    assert (await store.read_entries("crash"))[-1] == {"n": "after"}


# -- the runtime over a sqlite store ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["db folder", "db file", "lock folder", "inside the lock folder"])
async def test_a_grant_reaching_the_database_is_refused(tmp_path: Path, where: str) -> None:
    """A runtime refuses to open when a granted root contains the database, its WAL or its lock folder."""
    root = {"db folder": tmp_path, "db file": tmp_path / "lw.db", "lock folder": tmp_path / "lw.db.locks",
            "inside the lock folder": tmp_path / "lw.db.locks" / "x.lock"}[where]
    grant = Capabilities(files=FileGrants(read=(str(root),), write=()))
    with pytest.raises(CapabilityError, match="store"):
        async with sqlite_runtime(tmp_path, Harness(), capabilities=grant):
            pass
    (tmp_path / "work").mkdir()
    beside = Capabilities(files=FileGrants(read=(str(tmp_path / "work"),), write=(str(tmp_path / "work"),)))
    async with sqlite_runtime(tmp_path, Harness(), capabilities=beside):
        pass


async def test_an_agent_runs_and_reloads_in_a_new_runtime(tmp_path: Path) -> None:
    """A run with tool calls rests on a sqlite store; a new runtime loads the same transcript and result by id."""

    @loopwright.tool(parallel_safe=True)
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    h = Harness(reply(None, call("add", "c1", a=1, b=2), call("add", "c2", a=3, b=4)), reply("3 and 7"), tools=[add])
    async with sqlite_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=[add]))
        transcript = [(m.role, m.content) for m in run.inst.transcript]
    assert (result.state, result.text) == (State.WAITING, "3 and 7")
    async with sqlite_runtime(tmp_path, Harness(tools=[add])) as again:
        loaded = await again.get_agent(run.instance_id)
        assert [(m.role, m.content) for m in loaded.inst.transcript] == transcript
        assert (await loaded.result()).text == "3 and 7"
        assert [r["kind"] for r in await again.records(run.instance_id)].count("turn") == 2
        assert [s["instanceId"] for s in await again.list_instances()] == [run.instance_id]


async def test_a_second_runner_is_refused_and_a_message_from_it_is_read(tmp_path: Path) -> None:
    """While one runtime runs an instance, another cannot resume it, but its message is read at the next turn."""
    started, release = anyio.Event(), anyio.Event()

    @loopwright.tool(name="slow")
    async def slow() -> str:
        """Wait until released."""
        started.set()
        await release.wait()
        return "slow done"

    h = Harness(reply(None, call("slow", "s1")), reply("saw it"), tools=[slow])
    async with sqlite_runtime(tmp_path, h) as a, sqlite_runtime(tmp_path, Harness(tools=[slow])) as b:
        run = await a.start_agent(defn(tools=[slow]), prompt="go")
        await started.wait()
        # The runner holds the lease until ``release`` is set, below: a resume that waited for it
        # would hang (the guard is only that); being refused at all is being refused at once.
        with anyio.fail_after(60), pytest.raises(InstanceLockedError, match="running elsewhere"):
            await b.resume(run.instance_id)
        other = await b.message(run.instance_id, "also check the logs")
        assert not other.running
        release.set()
        result = await run.result()
    assert result.text == "saw it"
    assert [(m.role, m.content) for m in h.sent[1]][-2:] == [("tool", "slow done"), ("user", "also check the logs")]


# -- the CLI, one process per command ---------------------------------------------------------------


def lw(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def test_cli_over_a_sqlite_assembly(tmp_path: Path) -> None:
    """run, approve, message, ls, show and records work across processes on a sqlite assembly."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURES, project)
    (project / "state").mkdir()  # a store's folder must exist (or the assembly says createParents: true)
    (project / "loopwright.yaml").write_text(
        "store: {kind: sqlite, path: ./state/lw.db}\nplugins: [replay_plugin.py]\n", encoding="utf-8")
    held = lw(project, "run", "--json", "agents/approve.yaml")
    assert held.returncode == 3, held.stderr
    iid = json.loads(held.stdout)["instanceId"]
    assert (project / "state" / "lw.db").is_file()
    assert not (project / ".loopwright").exists()  # nothing went to the file store
    done = lw(project, "approve", iid, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["text"].startswith("result: ")
    chat = lw(project, "run", "--json", "agents/chat.yaml")
    chat_id = json.loads(chat.stdout)["instanceId"]
    answered = lw(project, "message", chat_id, "ping", "--json")
    assert json.loads(answered.stdout)["text"] == "you said: ping", answered.stderr
    listed = lw(project, "ls", "--json")
    assert [s["instanceId"] for s in json.loads(listed.stdout)] == [iid, chat_id], listed.stderr
    shown = json.loads(lw(project, "show", iid, "--json").stdout)
    assert (shown["instanceId"], shown["state"], shown["pendingApprovals"]) == (iid, "waiting", [])
    records = [json.loads(line) for line in lw(project, "records", iid).stdout.splitlines()]
    assert records
    assert all("kind" in r for r in records)
    assert any(r["kind"] == "tool_call" and r["data"]["status"] == "success" for r in records), records
    assert lw(project, "show", "no-such-instance").returncode != 0
