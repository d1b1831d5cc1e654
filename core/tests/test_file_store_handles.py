"""The file store's open log handles: the LRU's size, and when a reopened log's tail is repaired."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from loopwright.abc import StoreSettings
from loopwright.builtins import _file_io, file_store
from loopwright.builtins.file_store import ENTRIES_FILE, FileStore
from loopwright.errors import StoreError

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def store(tmp_path: Path):
    s = FileStore(StoreSettings(kind="file", base_dir=tmp_path, options={}))
    yield s
    await s.aclose()


@pytest.mark.parametrize(("soft", "expected"), [
    (20000, 6666), (1024, 341), (100, 64), (10**7, 65536), (resource.RLIM_INFINITY, 65536),
])
def test_open_logs_limit_is_a_third_of_the_descriptor_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, soft: int, expected: int,
) -> None:
    """max_open_logs is a third of the soft RLIMIT_NOFILE, clamped to 64..65,536."""
    monkeypatch.setattr(resource, "getrlimit", lambda _what: (soft, resource.RLIM_INFINITY))
    assert _file_io.open_logs_limit() == expected
    assert FileStore(StoreSettings(kind="file", base_dir=tmp_path, options={})).max_open_logs == expected


def _count_repairs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    repaired: list[str] = []
    real = file_store.repair_tail

    def counting(fd: int, path: Path | str) -> None:
        repaired.append(os.path.basename(path))  # noqa: PTH119
        real(fd, path)

    monkeypatch.setattr(file_store, "repair_tail", counting)
    return repaired


async def _evict(store: FileStore, *ids: str) -> None:
    """Append to other instances until the logs of ``ids`` are closed (the LRU holds 2 logs)."""
    for other in ("o1", "o2"):
        if (other, ENTRIES_FILE) not in store._logs:
            await store.create(other, {})
        await store.append_entries(other, [{"n": other}])
    assert not any(key[0] in ids for key in store._logs)


async def test_log_closed_here_while_leased_is_reopened_without_repair(
    store: FileStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reopening a log this store closed (LRU) while holding the lease, unchanged, skips the tail read."""
    store.max_open_logs = 2
    lease = await store.create_leased("a", {}, "me")
    await store.append_entries("a", [{"n": 1}])
    await _evict(store, "a")
    repaired = _count_repairs(monkeypatch)
    await store.append_entries("a", [{"n": 2}])
    assert repaired == []
    assert await store.read_entries("a") == [{"n": 1}, {"n": 2}]
    lease.release()


async def test_log_changed_by_another_writer_is_still_repaired(
    store: FileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A torn tail written by another process while the log was closed here is cut on reopen."""
    store.max_open_logs = 2
    lease = await store.create_leased("a", {}, "me")
    await store.append_entries("a", [{"n": 1}])
    await _evict(store, "a")
    path = store.root / "a" / ENTRIES_FILE
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # another writer, killed mid-line
    os.write(fd, b'{"n": "torn')
    os.close(fd)
    repaired = _count_repairs(monkeypatch)
    await store.append_entries("a", [{"n": 2}])
    assert repaired == [ENTRIES_FILE]
    assert await store.read_entries("a") == [{"n": 1}, {"n": 2}]
    lease.release()


async def test_same_size_rewrite_is_still_repaired(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite that keeps the size (a torn last line of the same length) is caught by the ctime."""
    store.max_open_logs = 2
    lease = await store.create_leased("a", {}, "me")
    await store.append_entries("a", [{"n": 1}, {"n": 2}])
    await _evict(store, "a")
    path = store.root / "a" / ENTRIES_FILE
    data = path.read_bytes()
    before = os.stat(path).st_ctime_ns  # noqa: PTH116
    while os.stat(path).st_ctime_ns == before:  # noqa: PTH116 - the clock's tick (a few ms at most)
        with path.open("r+b") as f:
            f.write(data[:-1] + b"x")  # the last line loses its newline: torn, same size
    repaired = _count_repairs(monkeypatch)
    await store.append_entries("a", [{"n": 3}])
    assert repaired == [ENTRIES_FILE]
    assert await store.read_entries("a") == [{"n": 1}, {"n": 3}]
    lease.release()


async def test_log_closed_without_the_lease_is_repaired(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the lease, or after it was released and taken again, a reopened log is always repaired."""
    store.max_open_logs = 2
    await store.create("free", {})
    await store.append_entries("free", [{"n": 1}])
    lease = await store.create_leased("a", {}, "me")
    await store.append_entries("a", [{"n": 1}])
    await _evict(store, "free", "a")
    lease.release()
    lease = await store.acquire("a", "me")
    repaired = _count_repairs(monkeypatch)
    await store.append_entries("free", [{"n": 2}])
    await store.append_entries("a", [{"n": 2}])
    assert repaired == [ENTRIES_FILE, ENTRIES_FILE]
    lease.release()


async def test_failed_append_forces_a_repair(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed (maybe torn) write the next append reopens the log and repairs it."""
    lease = await store.create_leased("a", {}, "me")
    await store.append_entries("a", [{"n": 1}])

    def failing(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file_store, "_write_all", failing)
    with pytest.raises(StoreError, match="No space"):
        await store.append_entries("a", [{"n": "lost"}])
    monkeypatch.undo()
    repaired = _count_repairs(monkeypatch)
    await store.append_entries("a", [{"n": 2}])
    assert repaired == [ENTRIES_FILE]
    assert await store.read_entries("a") == [{"n": 1}, {"n": 2}]
    lease.release()
