"""The ``file`` store's edges that mutation testing found untested (docs/testing.md, "The instance
log and the file store, session 7").

Each test failed against a mutant of ``builtins/file_store.py``, ``_file_io.py`` or
``_file_checkpoint.py`` that the rest of the suite let through. They test documented behaviour with
real files: when a checkpoint is written and when it is used, a log missing from its folder, a
creation cut short, a short ``write()``, a torn tail.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import resource
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from loopwright.abc import StoreSettings
from loopwright.builtins import _file_io
from loopwright.builtins.file_store import CHECKPOINT_FILE, ENTRIES_FILE, RECORDS_FILE, FileStore
from loopwright.errors import StoreError

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
        name = os.fspath(path)  # by its path, or by its name in the new folder (opened relative to it)
        if name.endswith(f"/x/{failing}") or (name == failing and kw.get("dir_fd") is not None):
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
    making = store.create("x", {"id": "x"}) if owner is None else store.create_leased("x", {"id": "x"}, owner)
    with pytest.raises(OSError, match="No space left") as caught:
        await making
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC
    assert sorted(closed) == sorted(opened)
    assert not (store.root / "x").exists()
    lease = await store.create_leased("x", {"id": "x"}, "me")  # the id, and its lock, are free
    lease.release()
    assert await store.read_header("x") == {"id": "x"}


# -- the low-level reads and writes (_file_io) ----------------------------------------------------


async def test_an_append_cut_short_by_the_kernel_is_finished(
    store: FileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``write()`` may write less than it was given (a signal, a nearly full disk): the append writes the
    rest, so every line lands whole and in order."""
    await store.create("w", {"id": "w"})
    real_write = os.write
    sizes: list[int] = []

    def short_write(fd: int, data: Any) -> int:
        sizes.append(len(data))
        return real_write(fd, bytes(data[:5]))

    monkeypatch.setattr(os, "write", short_write)
    await store.append_entries("w", [{"n": 1}, {"n": 2}])
    monkeypatch.undo()
    assert len(sizes) > 1
    assert (store.root / "w" / ENTRIES_FILE).read_bytes() == b'{"n":1}\n{"n":2}\n'
    assert await make_store(tmp_path).read_entries("w") == [{"n": 1}, {"n": 2}]


async def test_a_torn_tail_warning_says_how_many_bytes_were_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Opening a log with a torn last line cuts it and logs its size in bytes."""
    first = make_store(tmp_path)
    await first.create("t", {"id": "t"})
    await first.append_entries("t", [{"n": 1}])
    await first.aclose()
    with (first.root / "t" / ENTRIES_FILE).open("ab") as f:
        f.write(b'{"n":2,"x"')  # 10 bytes, no newline: a write a kill cut short
    store = make_store(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="loopwright.builtins.file_store"):
            await store.append_entries("t", [{"n": 3}])
    finally:
        await store.aclose()
    assert "dropped a torn last line of 10 bytes" in caplog.text
    assert await store.read_entries("t") == [{"n": 1}, {"n": 3}]


@pytest.mark.parametrize("torn", [b'{"n":2,\n', b"[2]\n"], ids=["invalid-json", "not-an-object"])
async def test_a_checkpoint_over_a_log_with_a_bad_last_line_covers_the_lines_before_it(
    tmp_path: Path, torn: bytes,
) -> None:
    """A complete last line that is not an object (a torn write that ended in a newline) is dropped by
    readers, and a checkpoint folded then covers exactly the lines before it: it checks out, and loads."""
    store = make_store(tmp_path)
    store.checkpoint_bytes = 1
    await store.create("k", {"id": "k"})
    await store.append_entries("k", [{"n": 0}, {"n": 1}])
    good = (store.root / "k" / ENTRIES_FILE).stat().st_size
    with (store.root / "k" / ENTRIES_FILE).open("ab") as f:
        f.write(torn)
    await store.checkpoint("k", count_fold)
    await store.aclose()
    frame = json.loads((store.root / "k" / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])
    assert frame["offset"] == good
    assert await make_store(tmp_path).read_resume("k") == ({"n": 2}, [])


async def test_a_corrupt_line_is_named_by_its_line_or_by_its_byte_after_a_checkpoint(tmp_path: Path) -> None:
    """A corrupt line of a whole log is named by its line number; in the tail after a checkpoint, by the
    checkpoint's byte offset and the line number in that tail."""
    store = make_store(tmp_path)
    store.checkpoint_bytes = 1
    await store.create("e", {"id": "e"})
    await store.append_entries("e", [{"n": 0}])
    await store.checkpoint("e", count_fold)
    offset = (store.root / "e" / ENTRIES_FILE).stat().st_size
    await store.aclose()
    with (store.root / "e" / ENTRIES_FILE).open("ab") as f:
        f.write(b'{"n":1}\n{"n":\n{"n":3}\n')
    again = make_store(tmp_path)
    with pytest.raises(StoreError, match=rf"entries\.jsonl: byte {offset} \+ line 2 is not valid JSON"):
        await again.read_resume("e")
    with pytest.raises(StoreError, match=r"entries\.jsonl: line 3 is not valid JSON"):
        await again.read_entries("e")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="syncfs(2) is Linux's")
def test_a_failed_syncfs_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``syncfs`` returning -1 (an I/O error flushing the filesystem) raises ``OSError`` with its errno, so
    a group commit never renames headers that may not be on disk."""
    import ctypes  # noqa: PLC0415

    class FailingLibc:
        @staticmethod
        def syncfs(_fd: int) -> int:
            ctypes.set_errno(errno.EIO)
            return -1

    monkeypatch.setattr(ctypes, "CDLL", lambda *_a, **_k: FailingLibc())
    syncfs = _file_io.load_syncfs()
    assert syncfs is not None
    with pytest.raises(OSError, match=re.escape(str(tmp_path))) as caught:
        syncfs(tmp_path)
    assert caught.value.errno == errno.EIO


def test_a_soft_descriptor_limit_of_zero_keeps_the_smallest_lru(monkeypatch: pytest.MonkeyPatch) -> None:
    """A soft limit of 0 is a limit (the floor of 64 logs), not 'unlimited' (65,536)."""
    monkeypatch.setattr(resource, "getrlimit", lambda _what: (0, resource.RLIM_INFINITY))
    assert _file_io.open_logs_limit() == 64


# -- checkpoints, verified and rewritten (_file_checkpoint) ---------------------------------------


def frame_of(store: FileStore, iid: str) -> dict[str, Any]:
    return json.loads((store.root / iid / CHECKPOINT_FILE).read_bytes().split(b"\n")[0])


async def test_a_checkpoint_is_written_by_any_store_and_not_again_until_the_log_grew(tmp_path: Path) -> None:
    """A store that never opened the log (another process, after a restart) folds a checkpoint in the
    documented frame; a later store reads that frame's offset and writes none until the log grew by
    ``checkpoint_bytes`` past it."""
    first = make_store(tmp_path)
    await first.create("r", {"id": "r"})
    await first.append_entries("r", [sized(100), sized(100)])
    await first.aclose()
    second = make_store(tmp_path)
    second.checkpoint_bytes = 150
    await second.checkpoint("r", count_fold)
    await second.aclose()
    frame = frame_of(second, "r")
    body = (second.root / "r" / CHECKPOINT_FILE).read_bytes().split(b"\n")[1]
    assert frame["v"] == 1
    assert frame["offset"] == 200
    assert frame["sha256"] == hashlib.sha256(body).hexdigest()
    assert json.loads(body) == {"n": 2}
    third = make_store(tmp_path)
    third.checkpoint_bytes = 150
    try:
        await third.append_entries("r", [sized(100)])
        await third.checkpoint("r", count_fold)  # 100 bytes past the checkpoint: not yet
        assert frame_of(third, "r")["offset"] == 200
        await third.append_entries("r", [sized(50)])
        await third.checkpoint("r", count_fold)
        assert frame_of(third, "r")["offset"] == 350
        assert await third.read_resume("r") == ({"n": 4}, [])
    finally:
        await third.aclose()


async def test_a_checkpoint_whose_frame_is_garbage_is_replaced(tmp_path: Path) -> None:
    """A ``checkpoint.json`` whose frame line is not JSON (a torn write) does not stop new checkpoints."""
    store = make_store(tmp_path)
    await store.create("g", {"id": "g"})
    await store.append_entries("g", [{"n": 0}, {"n": 1}])
    await store.aclose()
    (store.root / "g" / CHECKPOINT_FILE).write_bytes(b'{"v":1,"off')
    again = make_store(tmp_path)
    again.checkpoint_bytes = 1
    try:
        await again.checkpoint("g", count_fold)
        assert await again.read_resume("g") == ({"n": 2}, [])
    finally:
        await again.aclose()


@pytest.mark.parametrize("change", ["v0", "digest-low", "digest-high"])
async def test_a_checkpoint_whose_frame_does_not_check_out_is_ignored(
    tmp_path: Path, change: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a frame of version 1 whose ``sha256`` is the state line's hash is used: any other version, or any
    other digest (above or below the true one), and the whole log is read."""
    store = make_store(tmp_path)
    store.checkpoint_bytes = 1
    await store.create("f", {"id": "f"})
    await store.append_entries("f", [{"n": 0}, {"n": 1}])
    await store.checkpoint("f", count_fold)
    await store.aclose()
    path = store.root / "f" / CHECKPOINT_FILE
    head, body = path.read_bytes().split(b"\n")[:2]
    frame = json.loads(head)
    frame.update({"v": 0} if change == "v0" else {"sha256": ("0" if change == "digest-low" else "f") * 64})
    path.write_bytes(json.dumps(frame).encode() + b"\n" + body + b"\n")
    with caplog.at_level(logging.WARNING, logger="loopwright.builtins.file_store"):
        assert await make_store(tmp_path).read_resume("f") == (None, [{"n": 0}, {"n": 1}])
    assert "ignoring the checkpoint" in caplog.text
