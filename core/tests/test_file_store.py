"""The ``file`` store: layout, atomic headers, append-only logs, crash recovery, ids and locks."""

from __future__ import annotations

import gc
import json
import logging
import os
import stat
import subprocess
import sys
import time
import types
from pathlib import Path
from statistics import fmean

import anyio
import pytest
from helpers import kill, read_line

from loopwright import _plugins
from loopwright.abc import StoreSettings
from loopwright.builtins import _file_create, _file_header, file_store
from loopwright.builtins.file_store import FileStore, Lease
from loopwright.errors import ConfigError, InstanceLockedError, InstanceNotFoundError, StoreError

pytestmark = pytest.mark.anyio

CRASH_WRITER = Path(__file__).with_name("crash_writer.py")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def make_store(base: Path, **options: object) -> FileStore:
    return FileStore(StoreSettings(kind="file", base_dir=base, options=options))


@pytest.fixture
async def store(tmp_path: Path):
    s = make_store(tmp_path)
    yield s
    await s.aclose()


def spawn(mode: str, store: FileStore, instance_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CRASH_WRITER), mode, str(store.root), instance_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


# -- plugin and options ---------------------------------------------------------------------------


def test_registers_as_file_store_kind() -> None:
    """The module is a plugin that registers FileStore as store kind ``file``."""
    host = _plugins.PluginHost()
    host.register(file_store, "file_store_under_test")
    assert host.stores.get("file") is FileStore
    assert "loopwright.builtins.file_store" in _plugins.BUILTIN_PLUGINS


def test_default_path_is_resolved_under_base_dir(tmp_path: Path) -> None:
    """Without options the store lives in ``.loopwright/instances`` under base_dir, absolute, no fsync."""
    s = make_store(tmp_path / "project" / ".." / "project")
    assert s.root == (tmp_path / "project" / ".loopwright" / "instances").resolve()
    assert s.root.is_absolute()
    assert s.fsync is False
    assert s.locations() == (s.root,)
    assert not s.root.exists()  # created lazily, by the first create()


def test_path_option_relative_and_absolute(tmp_path: Path) -> None:
    """A relative ``path`` is resolved against base_dir; an absolute one is kept."""
    (tmp_path / "data").mkdir()
    assert make_store(tmp_path, path="data/store").root == (tmp_path / "data" / "store").resolve()
    assert make_store(tmp_path / "elsewhere", path=str(tmp_path / "abs")).root == (tmp_path / "abs").resolve()


@pytest.mark.parametrize(("options", "where"), [
    ({"fsync": "yes"}, "$.store.fsync"),
    ({"path": 3}, "$.store.path"),
    ({"path": ""}, "$.store.path"),
    ({"pth": "x"}, "$.store.pth"),
    ({"createParents": "yes"}, "$.store.createParents"),
])
def test_bad_options_raise_config_error(tmp_path: Path, options: dict[str, object], where: str) -> None:
    """Unknown option keys and wrongly typed values raise ConfigError with the option's JSON path."""
    with pytest.raises(ConfigError) as info:
        make_store(tmp_path, **options)
    assert [p.path for p in info.value.problems] == [where]


async def test_a_path_whose_parent_folder_is_missing_is_refused_unless_create_parents(tmp_path: Path) -> None:
    """Issue 31, point 2: a mistyped folder above ``path`` is a ConfigError at ``$.store.path``, not a new store.

    ``createParents: true`` creates the folders on the first instance instead; so does the
    runtime's own folder, ``.loopwright`` in base_dir, where the default lives.
    """
    with pytest.raises(ConfigError) as info:
        make_store(tmp_path, path="no/such/store")
    assert [p.path for p in info.value.problems] == ["$.store.path"]
    assert f"the folder {tmp_path.resolve() / 'no' / 'such'} does not exist" in info.value.problems[0].message
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        make_store(tmp_path, path="a-file/store", createParents=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing was created
    for options in ({"path": "no/such/store", "createParents": True}, {"path": ".loopwright/other"}):
        s = make_store(tmp_path, **options)
        assert s.create_parents is True
        await s.create("inst-1", {"state": "running"})
        assert (s.root / "inst-1" / "instance.json").is_file()
        await s.aclose()
    plain = make_store(tmp_path, path="store")
    assert plain.create_parents is False
    await plain.aclose()


# -- headers --------------------------------------------------------------------------------------


async def test_header_round_trip(store: FileStore) -> None:
    """create, read_header and write_header round-trip the header, stored as one line of UTF-8 JSON."""
    header = {"state": "running", "capabilities": {"files": ["/srv/data"]}, "delegationPrompt": "héllo ✓",
              "nested": types.MappingProxyType({"a": 1})}
    await store.create("inst-1", header)
    assert await store.read_header("inst-1") == {**header, "nested": {"a": 1}}
    text = (store.root / "inst-1" / "instance.json").read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert text.count("\n") == 1
    assert "héllo ✓" in text
    await store.write_header("inst-1", {"state": "stopped"})
    assert await store.read_header("inst-1") == {"state": "stopped"}
    assert sorted(p.name for p in (store.root / "inst-1").iterdir()) == [
        "entries.jsonl", "instance.json", "records.jsonl",
    ]


async def test_files_are_private(store: FileStore) -> None:
    """Instance folders are created 0o700 and the header 0o600."""
    await store.create("priv", {})
    folder = store.root / "priv"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "instance.json").stat().st_mode) == 0o600


async def test_create_fails_if_folder_exists(store: FileStore) -> None:
    """create() raises StoreError when the instance folder exists, even without a header."""
    await store.create("dup", {"v": 1})
    with pytest.raises(StoreError, match="already exists") as info:
        await store.create("dup", {"v": 2})
    assert info.value.instance_id == "dup"
    assert await store.read_header("dup") == {"v": 1}
    (store.root / "bare").mkdir()
    with pytest.raises(StoreError, match="already exists"):
        await store.create("bare", {})


async def test_create_rejects_unserialisable_header_and_leaves_nothing(store: FileStore) -> None:
    """A header that is not JSON-ready raises StoreError before any folder is made."""
    with pytest.raises(StoreError, match="not JSON-ready"):
        await store.create("bad", {"x": {1, 2}})
    with pytest.raises(StoreError, match="not JSON-ready"):
        await store.create("bad", {"x": float("nan")})
    assert not (store.root / "bad").exists()


@pytest.mark.parametrize("leased", [False, True])
async def test_a_create_that_fails_midway_leaves_nothing(
    store: FileStore, monkeypatch: pytest.MonkeyPatch, leased: bool,
) -> None:
    """A creation whose header write fails removes its folder, closes what it opened, frees the id."""
    await store.create("first", {})  # the store folder exists: only the instance's own steps are left
    opened: list[int] = []
    closed: list[int] = []
    real_open, real_close = os.open, os.close

    def recording_open(*args: object, **kwargs: object) -> int:
        fd = real_open(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(fd)
        return fd

    def recording_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    def failing(fd: int, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "close", recording_close)
    monkeypatch.setattr(_file_create, "_write_all", failing)
    with pytest.raises(OSError, match="No space"):
        await (store.create_leased("half", {}, "me") if leased else store.create("half", {}))
    monkeypatch.undo()
    assert len(opened) == 4  # the folder (its lock), two logs, the header
    assert sorted(closed) == sorted(opened)
    assert not (store.root / "half").exists()
    assert "half" not in store._held
    assert [key for key in store._logs if key[0] == "half"] == []
    lease = await store.create_leased("half", {"v": 2}, "me")  # the id is free, and so is its lock
    assert await store.read_header("half") == {"v": 2}
    lease.release()


async def test_missing_instance_raises_not_found(store: FileStore) -> None:
    """Every per-instance method raises InstanceNotFoundError for an unknown id."""
    calls = [
        store.read_header("nope"), store.write_header("nope", {}), store.read_entries("nope"),
        store.read_records("nope"), store.append_entries("nope", [{"a": 1}]),
        store.append_records("nope", [{"a": 1}]), store.acquire("nope", owner="t"),
    ]
    for call in calls:
        with pytest.raises(InstanceNotFoundError) as info:
            await call
        assert info.value.instance_id == "nope"
    assert not (store.root / "nope").exists()


async def test_invalid_header_raises_naming_the_file(store: FileStore) -> None:
    """A header that is not valid JSON raises StoreError naming the instance and the file."""
    await store.create("broken", {"v": 1})
    await store.append_entries("broken", [{"t": "seg"}])  # it ran: a bad header is damage, not a torn create
    path = store.root / "broken" / "instance.json"
    path.write_text('{"v": ')
    with pytest.raises(StoreError) as info:
        await store.read_header("broken")
    assert str(path) in str(info.value)
    assert info.value.instance_id == "broken"
    path.write_text("[1, 2]")
    with pytest.raises(StoreError, match="not an object"):
        await store.read_header("broken")


async def test_header_write_is_atomic(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash before the rename leaves the old header whole; at rename time the new one is complete."""
    await store.create("atom", {"version": 1})
    folder = store.root / "atom"

    def crash(src: str, dst: str) -> None:
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StoreError, match="simulated crash"):
        await store.write_header("atom", {"version": 2, "big": "x" * 100_000})
    assert await store.read_header("atom") == {"version": 1}
    assert sorted(p.name for p in folder.iterdir()) == ["entries.jsonl", "instance.json", "records.jsonl"]

    seen: list[tuple[object, object]] = []
    real_replace = monkeypatch.undo
    real_replace()

    def spy(src: str, dst: str) -> None:
        # What a concurrent reader could see right before the rename: the old header, whole,
        # and a complete new one waiting in a temp file in the same folder.
        seen.append((json.loads(Path(dst).read_bytes()), json.loads(Path(src).read_bytes())))
        assert Path(src).parent == Path(dst).parent
        Path(src).rename(dst)

    monkeypatch.setattr(os, "replace", spy)
    await store.write_header("atom", {"version": 3})
    assert seen == [({"version": 1}, {"version": 3})]
    assert await store.read_header("atom") == {"version": 3}


@pytest.mark.parametrize(("strict", "expected"), [(False, ["file", "replace"]), (True, ["file", "replace", "dir"])])
async def test_header_write_fsyncs_file_and_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strict: bool, expected: list[str],
) -> None:
    """Every header write fsyncs the temp file before the rename; with fsync: true the folder after it too."""
    store = FileStore(StoreSettings(kind="file", base_dir=tmp_path, options={"fsync": strict}))
    await store.create("dur", {})
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    await store.write_header("dur", {"v": 2})
    assert events == expected
    await store.aclose()


async def test_list_headers_sorted_and_skips_non_instances(
    store: FileStore, caplog: pytest.LogCaptureFixture,
) -> None:
    """list_headers sorts by createdAt then id, skips non-instances, and logs unreadable headers."""
    assert await store.list_headers() == []  # no store folder yet
    await store.create("b", {"id": "b", "createdAt": "2026-01-02T00:00:00Z"})
    await store.create("a", {"id": "a", "createdAt": "2026-01-02T00:00:00Z"})
    await store.create("c", {"id": "c", "createdAt": "2026-01-01T00:00:00Z"})
    await store.create("z", {"id": "z"})  # no createdAt: first
    await store.create("bad", {"id": "bad"})
    await store.append_entries("bad", [{"t": "seg"}])
    (store.root / "bad" / "instance.json").write_text("{not json")
    (store.root / "empty-folder").mkdir()
    (store.root / "stray-file").write_text("{}")
    (store.root / ".hidden").mkdir()
    (store.root / ".hidden" / "instance.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="loopwright.builtins.file_store"):
        headers = await store.list_headers()
    assert [h["id"] for h in headers] == ["z", "c", "a", "b"]
    assert "bad" in caplog.text
    assert "instance.json" in caplog.text


# -- logs -----------------------------------------------------------------------------------------


async def test_append_and_read_entries_and_records(store: FileStore, tmp_path: Path) -> None:
    """Entries and records go to separate logs, in order, as compact lines another store can read."""
    await store.create("log", {})
    assert await store.read_entries("log") == []
    await store.append_entries("log", [{"n": 0}, {"n": 1, "text": "é\n\u2028"}])
    await store.append_entries("log", [])
    await store.append_entries("log", [types.MappingProxyType({"n": 2})])
    await store.append_records("log", [{"kind": "turn"}])
    assert await store.read_entries("log") == [{"n": 0}, {"n": 1, "text": "é\n\u2028"}, {"n": 2}]
    assert await store.read_records("log") == [{"kind": "turn"}]
    raw = (store.root / "log" / "entries.jsonl").read_bytes()
    assert raw == '{"n":0}\n{"n":1,"text":"é\\n\u2028"}\n{"n":2}\n'.encode()
    other = make_store(tmp_path)
    assert await other.read_entries("log") == await store.read_entries("log")
    await other.aclose()


async def test_append_rejects_non_json_and_writes_nothing(store: FileStore) -> None:
    """An item that is not a JSON-ready mapping raises StoreError and none of the batch is written."""
    await store.create("rej", {})
    for bad in ([{"ok": 1}, {"s": {1}}], [{"ok": 1}, ["not", "a", "mapping"]], [{"x": float("inf")}]):
        with pytest.raises(StoreError) as info:
            await store.append_entries("rej", bad)  # type: ignore[list-item]
        assert info.value.instance_id == "rej"
    assert await store.read_entries("rej") == []


async def test_torn_last_line_dropped_and_next_append_starts_fresh(store: FileStore, tmp_path: Path) -> None:
    """A torn last line (no newline) is dropped on read and cut before the next append."""
    await store.create("torn", {})
    await store.append_entries("torn", [{"n": 0}, {"n": 1}])
    await store.aclose()
    log = store.root / "torn" / "entries.jsonl"
    with log.open("ab") as f:
        f.write(b'{"n": 2, "half')
    reopened = make_store(tmp_path)
    assert await reopened.read_entries("torn") == [{"n": 0}, {"n": 1}]
    await reopened.append_entries("torn", [{"n": 2}])
    assert log.read_bytes() == b'{"n":0}\n{"n":1}\n{"n":2}\n'
    assert await reopened.read_entries("torn") == [{"n": 0}, {"n": 1}, {"n": 2}]
    await reopened.aclose()


async def test_invalid_complete_last_line_dropped_and_cut(store: FileStore, tmp_path: Path) -> None:
    """A newline-terminated last line that is not a JSON object is dropped and cut before appending."""
    await store.create("junk", {})
    await store.append_records("junk", [{"n": 0}])
    await store.aclose()
    log = store.root / "junk" / "records.jsonl"
    with log.open("ab") as f:
        f.write(b"\x00\x00garbage\n")
    reopened = make_store(tmp_path)
    assert await reopened.read_records("junk") == [{"n": 0}]
    await reopened.append_records("junk", [{"n": 1}])
    assert await reopened.read_records("junk") == [{"n": 0}, {"n": 1}]
    await reopened.aclose()


async def test_torn_tail_without_any_newline_is_cut_whole(store: FileStore, tmp_path: Path) -> None:
    """A log holding only a torn first line (longer than one read chunk) is emptied before appending."""
    await store.create("one", {})
    await store.aclose()  # the crashed writer's process is gone; a new one opens the log
    log = store.root / "one" / "entries.jsonl"
    log.write_bytes(b'{"big": "' + b"y" * 200_000)
    reopened = make_store(tmp_path)
    assert await reopened.read_entries("one") == []
    await reopened.append_entries("one", [{"n": 0}])
    assert log.read_bytes() == b'{"n":0}\n'
    await reopened.aclose()


async def test_corrupt_middle_line_raises_with_line_number(store: FileStore) -> None:
    """A corrupt line before the last raises StoreError naming the instance, the file and the line."""
    await store.create("mid", {})
    log = store.root / "mid" / "entries.jsonl"
    log.write_bytes(b'{"n":0}\n{"n":1,\n{"n":2}\n')
    with pytest.raises(StoreError) as info:
        await store.read_entries("mid")
    message = str(info.value)
    assert info.value.instance_id == "mid"
    assert str(log) in message
    assert "line 2" in message
    log.write_bytes(b'{"n":0}\n[1]\n{"n":2}\n')
    with pytest.raises(StoreError, match="line 2 holds a JSON list"):
        await store.read_entries("mid")
    log.write_bytes(b'{"n":0}\n{"n":1,\n{"n":2')  # torn tail after a corrupt complete line
    with pytest.raises(StoreError, match="line 2"):
        await store.read_entries("mid")


async def test_killed_appender_loses_nothing_appended(store: FileStore) -> None:
    """A process SIGKILLed while appending loses none of the entries whose append had returned."""
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
    assert [e["n"] for e in entries] == list(range(len(entries)))
    # The next writer takes the lease first, as a runtime does; taking it repairs a torn tail.
    (await store.acquire("crash", owner="next")).release()
    await store.append_entries("crash", [{"n": "after"}])
    after = await store.read_entries("crash")
    assert after[:-1] == entries
    assert after[-1] == {"n": "after"}


async def test_open_handles_are_bounded_and_closed(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most max_open_logs logs stay open; aclose closes them and later appends raise."""
    closed: list[int] = []
    real_close = os.close

    def recording_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(os, "close", recording_close)
    store.max_open_logs = 2
    for name in ("h1", "h2", "h3"):
        await store.create(name, {})
        await store.append_entries(name, [{"n": name}])
    await store.append_entries("h1", [{"n": "again"}])
    assert [key[0] for key in store._logs] == ["h3", "h1"]
    fds = list(store._logs.values())
    assert await store.read_entries("h1") == [{"n": "h1"}, {"n": "again"}]
    closed.clear()
    await store.aclose()
    assert store._logs == {}
    assert sorted(closed) == sorted(fds)
    with pytest.raises(StoreError, match="closed"):
        await store.append_entries("h1", [{"n": 1}])


async def test_fsync_option_fsyncs_each_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With fsync=false appends never call os.fsync; with fsync=true each append calls it once."""
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    for fsync, expected in ((False, 0), (True, 3)):
        s = make_store(tmp_path, fsync=fsync)
        await s.create(f"f-{fsync}", {})
        calls.clear()
        for n in range(3):
            await s.append_entries(f"f-{fsync}", [{"n": n}, {"n": n}])
        assert len(calls) == expected
        await s.aclose()


async def test_append_cost_does_not_grow(store: FileStore) -> None:
    """Appending entry 20,000 costs what entry 1 did: the log is never re-read or rewritten."""
    await store.create("perf", {})
    entry = {"role": "assistant", "content": "x" * 200, "usage": {"input": 10, "output": 20}}
    append, clock = store.append_entries, time.perf_counter
    costs: list[float] = []
    gc.collect()
    gc.disable()  # a collection landing in one window is noise, not complexity
    try:
        for _ in range(20_000):
            start = clock()
            await append("perf", [entry])
            costs.append(clock() - start)
    finally:
        gc.enable()

    def robust_mean(window: list[float]) -> float:
        return fmean(sorted(window)[: len(window) * 95 // 100])  # drop scheduler hiccups

    first, last = robust_mean(costs[:1000]), robust_mean(costs[-1000:])
    assert last <= 3 * first, f"first 1,000: {first * 1e6:.1f} µs, last 1,000: {last * 1e6:.1f} µs"
    assert len(await store.read_entries("perf")) == 20_000


# -- ids ------------------------------------------------------------------------------------------


ATTACK_IDS = ["../x", "..", ".", "", "a/b", "/etc/passwd", "a\\b", "a\x00b", ".hidden", "a..b",
              "x" * 129, "tab\t", "new\nline", "é", " lead", "-x", "-rf", "--help", None, 7]


@pytest.mark.parametrize("bad_id", ATTACK_IDS, ids=repr)
async def test_path_traversal_ids_are_rejected(store: FileStore, tmp_path: Path, bad_id: object) -> None:
    """Ids that could escape or confuse the store folder raise StoreError everywhere, touching nothing."""
    await store.create("victim", {"v": 1})
    before = sorted(tmp_path.rglob("*"))
    calls = [
        store.create(bad_id, {}), store.write_header(bad_id, {}), store.read_header(bad_id),  # type: ignore[arg-type]
        store.append_entries(bad_id, [{"a": 1}]), store.read_entries(bad_id),  # type: ignore[arg-type]
        store.append_records(bad_id, [{"a": 1}]), store.read_records(bad_id),  # type: ignore[arg-type]
        store.acquire(bad_id, owner="t"),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(StoreError, match="invalid instance id"):
            await call
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("good_id", ["a", "A-1_b.c", "x-", "_", "9" * 128, "01HZX3K9Q8Z1Y2W3V4T5S6R7P8"])
async def test_valid_ids_are_accepted(store: FileStore, good_id: str) -> None:
    """Ordinary ids (letters, digits, ``_ . -``, up to 128) work end to end."""
    await store.create(good_id, {"id": good_id})
    await store.append_entries(good_id, [{"n": 1}])
    assert await store.read_entries(good_id) == [{"n": 1}]
    assert [h["id"] for h in await store.list_headers()] == [good_id]


# -- locks ----------------------------------------------------------------------------------------


async def test_lock_is_exclusive_within_a_process(store: FileStore) -> None:
    """A second acquire fails with InstanceLockedError naming the header's runner until the lease is released."""
    await store.create("lk", {"runner": f"runner-a (pid {os.getpid()})"})
    lease = await store.acquire("lk", owner="runner-a")
    assert isinstance(lease, Lease)
    assert lease.previous_holder is None
    assert lease.path == store.root / "lk"
    with pytest.raises(InstanceLockedError) as info:
        await store.acquire("lk", owner="runner-b")
    assert info.value.instance_id == "lk"
    assert info.value.holder is not None
    assert "runner-a" in info.value.holder
    assert f"pid {os.getpid()}" in info.value.holder
    lease.release()
    lease.release()  # idempotent
    assert lease.released
    with await store.acquire("lk", owner="runner-b") as second:
        assert second.previous_holder is None  # the header is not left running
    assert second.released
    assert sorted(p.name for p in (store.root / "lk").iterdir()) == ["entries.jsonl", "instance.json", "records.jsonl"]


async def test_aclose_releases_outstanding_leases(store: FileStore, tmp_path: Path) -> None:
    """aclose() releases every lease still held, so another store can take the lock."""
    await store.create("rel", {})
    lease = await store.acquire("rel", owner="forgetful")
    await store.aclose()
    assert lease.released
    other = make_store(tmp_path)
    (await other.acquire("rel", owner="next")).release()
    await other.aclose()


async def test_lock_held_by_live_process_then_taken_over_after_sigkill(store: FileStore) -> None:
    """A live process's lock raises InstanceLockedError at once; after SIGKILL the lock is taken over."""
    await store.create("shared", {})
    proc = spawn("lock", store, "shared")
    try:
        assert read_line(proc) == "locked"
        # Refused while the holder still holds it: a blocking acquire would wait for the holder,
        # which lets go only when killed below (the hang guard fails such a test).
        with anyio.fail_after(60), pytest.raises(InstanceLockedError) as info:
            await store.acquire("shared", owner="me")
        assert proc.poll() is None
        assert info.value.holder is not None
        assert "crash-writer" in info.value.holder
        assert f"pid {proc.pid}" in info.value.holder
    finally:
        kill(proc)
    lease = await store.acquire("shared", owner="me")
    assert lease.previous_holder is not None
    assert f"pid {proc.pid}" in lease.previous_holder
    lease.release()


async def test_a_header_torn_during_create_reads_as_no_instance(store: FileStore) -> None:
    """A header cut short by a crash in create(), with no entries yet, is "not found", and ls skips it quietly."""
    await store.create("torn", {"a": 1})
    (store.root / "torn" / "instance.json").write_bytes(b'{"instanceId": "to')
    with pytest.raises(InstanceNotFoundError):
        await store.read_header("torn")
    assert await store.list_headers() == []
    await store.append_entries("torn", [{"t": "seg"}])
    with pytest.raises(StoreError, match="not valid JSON"):
        await store.read_header("torn")


# -- group commit of headers ----------------------------------------------------------------------


async def test_concurrent_header_writes_are_committed_together_and_each_lands(
    store: FileStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With several runners, headers written at once share one flush; each is on disk before its rename."""
    import anyio  # noqa: PLC0415 - only this test runs tasks

    ids = [f"g{i}" for i in range(6)]
    for iid in ids:
        await store.create(iid, {"id": iid, "n": 0})
    leases = [await store.acquire(iid, "me") for iid in ids]
    events: list[str] = []
    real_replace = Path.replace

    def replace(self: Path, target: Path) -> Path:
        events.append("rename")
        return real_replace(self, target)

    def syncfs(path: Path) -> None:
        events.append("sync")

    monkeypatch.setattr(Path, "replace", replace)
    monkeypatch.setattr(_file_header, "_syncfs", syncfs)
    (store.root / "g5" / "instance.json").unlink()
    (store.root / "g5" / "entries.jsonl").unlink()
    (store.root / "g5" / "records.jsonl").unlink()
    (store.root / "g5").rmdir()
    errors: dict[str, Exception] = {}

    async def write(iid: str) -> None:
        try:
            await store.write_header(iid, {"id": iid, "n": 1})
        except Exception as exc:  # noqa: BLE001 - checked below
            errors[iid] = exc

    async with anyio.create_task_group() as tg:
        for iid in ids:
            tg.start_soon(write, iid)
    for lease in leases:
        lease.release()
    assert set(errors) == {"g5"}
    assert isinstance(errors["g5"], InstanceNotFoundError)
    for iid in ids[:5]:
        assert (await store.read_header(iid))["n"] == 1
    # The first writer went alone (its own fsync; under trio it may be g5, which fails); the
    # others waited and shared one flush, which came before any of their renames.
    assert events.count("rename") == 5
    assert events.count("sync") == 1
    assert events.index("sync") <= 1
