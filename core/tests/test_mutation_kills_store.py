"""The ``file`` store's edges that mutation testing found untested (docs/testing.md, "The instance
log and the file store, session 7").

Each test failed against a mutant of ``builtins/file_store.py``, ``_file_io.py`` or
``_file_checkpoint.py`` that the rest of the suite let through. They test documented behaviour with
real files: when a checkpoint is written, a log missing from its folder, a creation cut short.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import CHECKPOINT_FILE, ENTRIES_FILE, RECORDS_FILE, FileStore

pytestmark = pytest.mark.anyio


def make_store(base: Path) -> FileStore:
    return FileStore(StoreSettings(kind="file", base_dir=base, options={}))


@pytest.fixture
async def store(tmp_path: Path):
    s = make_store(tmp_path)
    yield s
    await s.aclose()


def count_fold(checkpoint: Any, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A fold that counts the entries it has seen."""
    return {"n": (checkpoint or {}).get("n", 0) + len(entries)}


def sized(n: int) -> dict[str, str]:
    """An entry whose line (with its newline) is exactly ``n`` bytes."""
    entry = {"p": "x" * (n - len('{"p":""}\n'))}
    assert len(f'{{"p":"{entry["p"]}"}}\n') == n
    return entry


# -- checkpoints -----------------------------------------------------------------------------------


async def test_the_first_checkpoint_waits_for_256_kib_of_log(store: FileStore) -> None:
    """By default a checkpoint is written once the entry log grew by 256 KiB since the last (none, for a
    new instance): one byte short of it writes nothing, and reaching it writes one that covers the log."""
    await store.create("c", {"id": "c"})
    await store.append_entries("c", [sized(1024)] * 255 + [sized(1023)])
    assert (store.root / "c" / ENTRIES_FILE).stat().st_size == 256 * 1024 - 1
    await store.checkpoint("c", count_fold)
    assert not (store.root / "c" / CHECKPOINT_FILE).exists()
    await store.append_entries("c", [{}])
    await store.checkpoint("c", count_fold)
    assert (store.root / "c" / CHECKPOINT_FILE).is_file()
    assert await store.read_resume("c") == ({"n": 257}, [])


# -- logs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [ENTRIES_FILE, RECORDS_FILE])
async def test_a_log_missing_from_its_folder_is_created_by_the_next_append(tmp_path: Path, name: str) -> None:
    """An instance whose log file is gone (its header is there) gets a new, private, append-only log on the
    next append; what later appends write follows it, and another store reads it all."""
    first = make_store(tmp_path)
    await first.create("m", {"id": "m"})
    await first.aclose()
    path = first.root / "m" / name
    path.unlink()
    store = make_store(tmp_path)
    try:
        append = store.append_entries if name == ENTRIES_FILE else store.append_records
        await append("m", [{"k": 1}])
        await append("m", [{"k": 2}, {"k": 3}])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_bytes() == b'{"k":1}\n{"k":2}\n{"k":3}\n'
    finally:
        await store.aclose()
    again = make_store(tmp_path)
    read = again.read_entries if name == ENTRIES_FILE else again.read_records
    assert await read("m") == [{"k": 1}, {"k": 2}, {"k": 3}]


# -- a creation cut short --------------------------------------------------------------------------


@pytest.mark.parametrize("failing", [ENTRIES_FILE, RECORDS_FILE, "instance.json"])
@pytest.mark.parametrize("owner", [None, "me"])
async def test_a_creation_cut_short_leaves_nothing_and_closes_only_its_own_files(
    store: FileStore, monkeypatch: pytest.MonkeyPatch, failing: str, owner: str | None,
) -> None:
    """If a file of a new instance cannot be created (here: the disk is full), ``create`` raises that error,
    closes every descriptor it opened and no other, and removes the folder: the id is free again."""
    opened: set[int] = set()
    closed: list[int] = []
    real_open, real_close = os.open, os.close

    def fake_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if os.fspath(path).endswith(f"/x/{failing}"):
            raise OSError(errno.ENOSPC, "No space left on device", os.fspath(path))
        fd = real_open(path, flags, mode, **kw)
        opened.add(fd)
        return fd

    def fake_close(fd: int) -> None:
        closed.append(fd)
        if fd in opened:  # never close a descriptor the store did not open (stdout, say)
            real_close(fd)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "close", fake_close)
    with pytest.raises(OSError, match="No space left") as caught:
        if owner is None:
            await store.create("x", {"id": "x"})
        else:
            await store.create_leased("x", {"id": "x"}, owner)
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC
    assert sorted(closed) == sorted(opened)
    assert not (store.root / "x").exists()
    lease = await store.create_leased("x", {"id": "x"}, "me")  # the id, and its lock, are free
    lease.release()
    assert await store.read_header("x") == {"id": "x"}
