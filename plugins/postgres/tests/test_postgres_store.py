"""The ``postgres`` store against a real server: tables, logs, leases across processes, the mailbox.

Generic checks of the Store contract are in test_postgres_contract.py; these are the store's own:
options, what lands in the tables, advisory-lock leases held by another process (and SIGKILLed),
posts from another process, and the release/acquire race that background unlocking must not open.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import types
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql

import loopwright_postgres
from loopwright._plugins import PluginHost
from loopwright.abc import StoreSettings
from loopwright.errors import ConfigError, InstanceLockedError, InstanceNotFoundError, StoreError
from loopwright_postgres import Lease, PostgresStore

HELPER = Path(__file__).with_name("pg_helper.py")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def make(tmp_path: Path, **options: object) -> PostgresStore:
    return PostgresStore(StoreSettings(kind="postgres", base_dir=tmp_path, options=options))


def query(dsn: str, text: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(text, params or None).fetchall()  # type: ignore[arg-type]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HELPER), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        assert proc.stderr is not None
        pytest.fail(f"helper exited early ({proc.returncode}): {proc.stderr.read()}")
    return line.strip()


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


# -- plugin and options (no server needed) --------------------------------------------------------


def test_registers_as_postgres_store_kind_through_its_entry_point() -> None:
    """The distribution's entry point (group loopwright) registers store kind ``postgres``."""
    host = PluginHost()
    host.load(autoload=True)
    assert "postgres" in host.plugin_names()
    assert host.stores.get("postgres") is loopwright_postgres.make_store
    assert host.stores.plugin_of("postgres") == "postgres"


def test_importing_the_plugin_does_not_import_psycopg() -> None:
    """Loading the plugin at discovery stays cheap: psycopg is imported only when a store is built."""
    code = ("import sys, loopwright, loopwright_postgres; from loopwright._plugins import PluginHost; "
            "PluginHost().load(autoload=True); print('psycopg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("options", "where"), [
    ({}, "$.store.dsn"),
    ({"dsn": ""}, "$.store.dsn"),
    ({"dsn": 5}, "$.store.dsn"),
    ({"dsn": "host='unterminated"}, "$.store.dsn"),
    ({"dsn": "host=x", "dsnEnv": "X"}, "$.store.dsnEnv"),
    ({"dsnEnv": "LW_SURELY_NOT_SET_VAR"}, "$.store.dsnEnv"),
    ({"dsn": "host=x", "schema": "Has-Caps"}, "$.store.schema"),
    ({"dsn": "host=x", "schema": ""}, "$.store.schema"),
    ({"dsn": "host=x", "schema": "x" * 64}, "$.store.schema"),
    ({"dsn": "host=x", "poolSize": 0}, "$.store.poolSize"),
    ({"dsn": "host=x", "poolSize": True}, "$.store.poolSize"),
    ({"dsn": "host=x", "connectTimeout": "1s"}, "$.store.connectTimeout"),
    ({"dsn": "host=x", "path": "x"}, "$.store.path"),
])
def test_bad_options_raise_config_error(tmp_path: Path, options: dict[str, object], where: str) -> None:
    """Unknown keys, a missing or malformed DSN and wrongly typed values raise ConfigError at $.store.KEY."""
    with pytest.raises(ConfigError) as info:
        make(tmp_path, **options)
    assert [p.path for p in info.value.problems] == [where]


def test_dsn_env_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dsnEnv reads the DSN from the environment; defaults are schema loopwright, poolSize 4; no files."""
    monkeypatch.setenv("LW_TEST_DSN_VAR", "host=db.internal user=agent password=hunter2 dbname=agents")
    store = make(tmp_path, dsnEnv="LW_TEST_DSN_VAR")
    assert (store.schema, store.pool_size, store.connect_timeout) == ("loopwright", 4, 10.0)
    assert store.locations() == ()
    assert "db.internal" in repr(store)
    assert "hunter2" not in repr(store)


async def test_an_unreachable_server_raises_store_error_naming_it(tmp_path: Path) -> None:
    """With no server at the DSN, the first call raises StoreError naming where it tried, without the password."""
    store = make(tmp_path, dsn=f"host={tmp_path} port=1 user=x password=hunter2", connectTimeout=2)
    with pytest.raises(StoreError) as info:
        await store.read_header("x")
    assert str(tmp_path) in str(info.value)
    assert "hunter2" not in str(info.value)
    await store.aclose()


# -- tables ---------------------------------------------------------------------------------------

pytestmark = pytest.mark.anyio


async def test_tables_are_created_in_the_schema_and_appends_are_rows(
    store_factory, pg_dsn: str, pg_schema: str,
) -> None:
    """The first call creates the five tables in the schema; each entry is one row, the header one row."""
    store = store_factory()
    try:
        await store.create("t1", {"state": "waiting", "text": "é ✓"})
        tables = query(pg_dsn, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                               "ORDER BY table_name", pg_schema)
        assert [t[0] for t in tables] == ["entries", "instances", "leases", "posts", "records"]
        await store.append_entries("t1", [{"n": 0}, {"n": 1}])
        await store.append_entries("t1", [{"n": 2}])
        await store.append_records("t1", [{"kind": "turn"}])
        schema = sql.Identifier(pg_schema)
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(sql.SQL("SELECT instance_id, data::text FROM {}.entries ORDER BY seq")
                                .format(schema)).fetchall()
            assert rows == [("t1", '{"n":0}'), ("t1", '{"n":1}'), ("t1", '{"n":2}')]
            (header,) = conn.execute(sql.SQL("SELECT header::text FROM {}.instances").format(schema)).fetchone()
            assert json.loads(header) == {"state": "waiting", "text": "é ✓"}
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}.records").format(schema)).fetchone() == (1,)
        # A second store over an existing schema creates nothing and sees everything.
        other = store_factory()
        assert await other.read_entries("t1") == [{"n": 0}, {"n": 1}, {"n": 2}]
        await other.aclose()
    finally:
        await store.aclose()


async def test_schemas_are_separate(store_factory, pg_dsn: str, pg_other_schema: str, tmp_path: Path) -> None:
    """Two schemas in one database hold separate instances, and their leases do not collide."""
    a = store_factory()
    b = make(tmp_path, dsn=pg_dsn, schema=pg_other_schema)
    try:
        await a.create("same-id", {"in": "a"})
        await b.create("same-id", {"in": "b"})
        assert (await a.read_header("same-id"), await b.read_header("same-id")) == ({"in": "a"}, {"in": "b"})
        la = await a.acquire("same-id", "x")
        lb = await b.acquire("same-id", "y")
        la.release()
        lb.release()
    finally:
        await a.aclose()
        await b.aclose()


async def test_unicode_and_nul_survive(store_factory) -> None:
    """Headers, entries and posts keep any unicode, including U+0000 and U+2028, and key order."""
    store = store_factory()
    try:
        text = 'nul \u0000 ls \u2028 emoji 🧪 漢字 "q" \\ back'
        header = {"z": 1, "a": text, "m": types.MappingProxyType({"y": [text], "b": None})}
        await store.create("uni", header)
        got = await store.read_header("uni")
        assert got == {"z": 1, "a": text, "m": {"y": [text], "b": None}}
        assert list(got) == ["z", "a", "m"]
        await store.append_entries("uni", [{"t": text}])
        await store.post("uni", {"t": text})
        assert await store.read_entries("uni") == [{"t": text}]
        assert (await store.read_posts("uni", 0))[0] == [{"t": text}]
    finally:
        await store.aclose()


async def test_a_failed_batch_writes_nothing(store_factory, pg_dsn: str, pg_schema: str) -> None:
    """A batch the database refuses part-way (a row that is not valid json) leaves no row of it behind."""
    store = store_factory()
    try:
        await store.create("atomic", {})
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER TABLE {}.entries ADD CONSTRAINT small CHECK (length(data::text) < 20)")
                         .format(sql.Identifier(pg_schema)))
        with pytest.raises(StoreError) as info:
            await store.append_entries("atomic", [{"n": 0}, {"n": 1}, {"big": "x" * 50}])
        assert info.value.instance_id == "atomic"
        assert "small" in str(info.value)
        assert await store.read_entries("atomic") == []
    finally:
        await store.aclose()


# -- leases ---------------------------------------------------------------------------------------


async def test_lease_is_a_row_whose_epoch_grows_and_release_frees_it(store_factory, pg_dsn: str) -> None:
    """A held lease is a row naming the store's session; release() frees it, keeping its epoch; the next one is +1."""
    store = store_factory()
    try:
        await store.create("lk", {"runner": "runner-a (host h, pid 1)"})
        lease = await store.acquire("lk", "runner-a (host h, pid 1)")
        assert isinstance(lease, Lease)
        assert (lease.previous_holder, lease.epoch) == (None, 1)

        def row() -> tuple[object, ...]:
            rows = query(pg_dsn, f"SELECT epoch, holder, session IS NOT NULL FROM {store.schema}.leases "  # noqa: S608
                                 "WHERE instance_id = 'lk'")
            return tuple(rows[0])

        assert row() == (1, "runner-a (host h, pid 1)", True)
        with pytest.raises(InstanceLockedError) as info:
            await store.acquire("lk", "runner-b")
        assert info.value.holder is not None
        assert "runner-a" in info.value.holder
        lease.release()
        lease.release()
        assert lease.released
        assert row() == (1, None, False)
        again = await store.acquire("lk", "runner-b")
        assert again.epoch == 2
        again.release()
    finally:
        await store.aclose()


async def test_release_then_acquire_at_once_never_fails(store_factory) -> None:
    """When release() returns the lease is free: an acquire right after it, here or in another store, succeeds."""
    store, other = store_factory(), store_factory()
    try:
        await store.create("again", {})
        for n in range(60):
            first, second = (store, other) if n % 2 else (other, store)
            lease = await first.acquire("again", "me")
            lease.release()
            (await second.acquire("again", "you")).release()
        with await store.acquire("again", "me") as last:
            assert not last.released
        assert last.released
    finally:
        await store.aclose()
        await other.aclose()


async def test_lease_held_by_another_process_then_taken_over_after_sigkill(store_factory, pg_dsn: str) -> None:
    """A live process's lease raises InstanceLockedError at once naming it; after SIGKILL it is taken over."""
    store = store_factory()
    try:
        await store.create("shared", {})
        proc = spawn("lock", pg_dsn, store.schema, "shared")
        try:
            assert read_line(proc) == "locked"
            # Refused while the holder still holds it: a blocking acquire would wait for the holder,
            # which lets go only when killed below (the hang guard fails such a test).
            with anyio.fail_after(60), pytest.raises(InstanceLockedError) as info:
                await store.acquire("shared", "me")
            assert proc.poll() is None
            assert info.value.holder is not None
            assert f"pg-helper (pid {proc.pid})" in info.value.holder
        finally:
            kill(proc)
        # The server notices the closed socket at once; give its backend a moment to exit.
        with anyio.fail_after(10):
            while True:
                try:
                    lease = await store.acquire("shared", "me")
                    break
                except InstanceLockedError:
                    await anyio.sleep(0.05)
        assert lease.previous_holder is not None
        assert f"pid {proc.pid}" in lease.previous_holder
        lease.release()
    finally:
        await store.aclose()


async def test_posts_from_another_process_reach_the_lease_holder(store_factory, pg_dsn: str) -> None:
    """While this process holds the lease, another process posts; the holder reads the posts in order."""
    store = store_factory()
    try:
        await store.create("mail", {})
        lease = await store.acquire("mail", "runner")
        items, cursor = await store.read_posts("mail", 0)
        assert (items, cursor) == ([], 0)
        proc = spawn("post", pg_dsn, store.schema, "mail", "3")
        assert read_line(proc) == "posted"
        assert proc.wait(10) == 0
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        items, cursor = await store.read_posts("mail", cursor)
        assert [i["text"] for i in items] == ["post 0", "post 1", "post 2"]
        assert await store.read_posts("mail", cursor) == ([], cursor)
        lease.release()
    finally:
        await store.aclose()


async def test_concurrent_posters_are_never_skipped(store_factory) -> None:
    """Posts from many stores at once, read while they arrive, are each read exactly once."""
    reader = store_factory()
    posters = [store_factory() for _ in range(4)]
    try:
        await reader.create("busy", {})
        seen: list[str] = []
        cursor = 0
        done = anyio.Event()

        async def post_many(k: int, store: PostgresStore) -> None:
            for n in range(25):
                await store.post("busy", {"text": f"{k}-{n}"})

        async def read_all() -> None:
            nonlocal cursor
            while not done.is_set():
                items, cursor = await reader.read_posts("busy", cursor)
                seen.extend(i["text"] for i in items)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_all)
            async with anyio.create_task_group() as posting:
                for k, s in enumerate(posters):
                    posting.start_soon(post_many, k, s)
            done.set()
        items, cursor = await reader.read_posts("busy", cursor)
        seen.extend(i["text"] for i in items)
        assert sorted(seen) == sorted(f"{k}-{n}" for k in range(4) for n in range(25))
    finally:
        for s in (reader, *posters):
            await s.aclose()


async def test_calls_after_aclose_raise(store_factory) -> None:
    """After aclose() every call raises StoreError saying the store is closed."""
    store = store_factory()
    await store.create("c", {})
    await store.aclose()
    await store.aclose()  # twice is harmless
    for call in (store.read_header("c"), store.acquire("c", "x"), store.post("c", {})):
        with pytest.raises(StoreError, match="closed"):
            await call


async def test_unknown_instance_is_not_found_in_the_mailbox(store_factory) -> None:
    """post and read_posts on an unknown id raise InstanceNotFoundError naming it."""
    store = store_factory()
    try:
        for call in (store.post("ghost", {"t": 1}), store.read_posts("ghost", 0), store.acquire("ghost", "me")):
            with pytest.raises(InstanceNotFoundError) as info:
                await call
            assert info.value.instance_id == "ghost"
    finally:
        await store.aclose()



async def test_a_runner_whose_lease_was_taken_over_cannot_write(store_factory, pg_dsn: str) -> None:
    """Fencing: once another store took the lease (here: after it expired), every write of the old holder is refused."""
    from loopwright.errors import LeaseLostError  # noqa: PLC0415

    old, new = store_factory(leaseTtl=600), store_factory()  # old renews every 100 s: not during the test
    try:
        await old.create("f", {"state": "running", "n": 0})
        stale = await old.acquire("f", "old runner")
        await old.append_entries("f", [{"n": 1}])
        # The old holder was cut off for longer than the lease lasts: it expired, and the new one took it.
        query(pg_dsn, f"UPDATE {old.schema}.leases SET expires_at = now() - interval '1 second' "  # noqa: S608
                      "RETURNING instance_id")
        fresh = await new.acquire("f", "new runner")
        assert fresh.epoch == stale.epoch + 1
        for write in (old.write_header("f", {"state": "running", "n": "stale"}),
                      old.append_entries("f", [{"n": "stale"}]), old.append_records("f", [{"kind": "stale"}])):
            with pytest.raises(LeaseLostError) as info:
                await write
            assert info.value.instance_id == "f"
        assert stale.lost
        await new.append_entries("f", [{"n": 2}])
        await new.write_header("f", {"state": "waiting", "n": 2})
        stale.release()  # gives back nothing: the lease is the new runner's
        with pytest.raises(InstanceLockedError):
            await old.acquire("f", "old runner")
        assert await new.read_entries("f") == [{"n": 1}, {"n": 2}]
        assert await new.read_header("f") == {"state": "waiting", "n": 2}
        assert await new.read_records("f") == []
        fresh.release()
    finally:
        await old.aclose()
        await new.aclose()


async def test_a_lease_of_a_live_store_is_renewed_and_not_taken(store_factory) -> None:
    """The keeper renews a held lease: after more than its ttl, another store still cannot take it."""
    holder, other = store_factory(leaseTtl=3), store_factory()
    try:
        await holder.create("kept", {})
        lease = await holder.acquire("kept", "holder")
        await anyio.sleep(4.5)
        with pytest.raises(InstanceLockedError):
            await other.acquire("kept", "other")
        await holder.append_entries("kept", [{"still": "mine"}])
        assert not lease.lost
        lease.release()
        (await other.acquire("kept", "other")).release()
    finally:
        await holder.aclose()
        await other.aclose()


async def test_create_leased_is_never_free_and_the_queue_comes_after_dead_runners(store_factory) -> None:
    """create_leased: the new instance's lease is held from the start; find_work lists the queue last."""
    store, other = store_factory(), store_factory()
    try:
        lease = await store.create_leased("mine", {"state": "running", "runner": "me"}, "me")
        assert lease.epoch == 1
        with pytest.raises(InstanceLockedError):
            await other.acquire("mine", "other")
        await store.create("queued", {"state": "running", "queued": True})
        await store.create("dead", {"state": "running", "runner": "gone"})
        assert await other.find_work(limit=10) == ["dead", "queued"]
        await store.append_entries("mine", [{"n": 1}])  # fenced under the lease create_leased took
        lease.release()
        assert await other.find_work(limit=10) == ["mine", "dead", "queued"]  # least recently updated first
    finally:
        await store.aclose()
        await other.aclose()


@pytest.mark.parametrize("given_id", [True, False], ids=["poster's id", "no id"])
async def test_a_post_whose_reply_is_lost_after_its_commit_lands_once(
        tmp_path: Path, pg_dsn: str, pg_schema: str, given_id: bool) -> None:
    """The connection drops after the post's transaction committed, before its reply: the retry inserts nothing.

    A proxy between the store and the server lets the post's COMMIT through, throws the server's
    answer away and cuts the connection; the store retries on a new connection (as in an outage).
    The mailbox holds the post once, and ``last_post`` names that one row.
    """
    from pg_proxy import Proxy  # noqa: PLC0415

    item: dict[str, object] = {"type": "message", "text": "once"}
    if given_id:
        item["id"] = "the-posters-id"
    with Proxy(pg_dsn) as proxy:
        store = make(tmp_path, dsn=proxy.dsn, schema=pg_schema)
        try:
            await store.create("retried", {})
            proxy.lose_commit_reply(b".posts (instance_id")
            await store.post("retried", item)
            assert proxy.lost.is_set()  # the first attempt committed and its answer never came
            assert (await store.read_posts("retried", 0))[0] == [item]
        finally:
            await store.aclose()
    rows = query(pg_dsn, sql.SQL("SELECT seq, data::text FROM {}.posts WHERE instance_id = 'retried'").format(
        sql.Identifier(pg_schema)).as_string(None))
    assert [json.loads(data) for _seq, data in rows] == [item]
    (last,) = query(pg_dsn, sql.SQL("SELECT last_post FROM {}.instances WHERE id = 'retried'").format(
        sql.Identifier(pg_schema)).as_string(None))
    assert last == (rows[0][0],)


async def test_tables_made_before_post_ids_get_the_column_at_the_first_start(store_factory, pg_dsn: str) -> None:
    """A schema whose posts table has no ``post_id`` (an older version made it) gets it; old posts stay."""
    store = store_factory()
    try:
        await store.create("old", {})
        await store.post("old", {"type": "message", "text": "before"})
    finally:
        await store.aclose()
    posts = sql.SQL("{}.posts").format(sql.Identifier(store.schema)).as_string(None)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as an older version made it
        conn.execute(f"DROP INDEX {store.schema}.posts_post_id")
        conn.execute(f"ALTER TABLE {posts} DROP COLUMN post_id")
    again = store_factory()
    try:
        item = {"id": "p-1", "type": "message", "text": "after"}
        await again.post("old", item)
        await again.post("old", item)
        assert [i["text"] for i in (await again.read_posts("old", 0))[0]] == ["before", "after"]
    finally:
        await again.aclose()
    assert query(pg_dsn, f"SELECT post_id FROM {posts} ORDER BY seq") == [(None,), ("p-1",)]  # noqa: S608
