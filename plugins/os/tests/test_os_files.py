"""read-file, write-file and list-directory through a real Runtime, and the attacks they must refuse."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from _os_testlib import Script, call, definition, grants, reply, result_of, run_to_rest, runtime

import loopwright_os._files as files_module
from loopwright import Message, ToolCall, ToolContext, ToolStatus
from loopwright.errors import ToolError
from loopwright_os import list_directory, read_file, write_file

pytestmark = pytest.mark.anyio

OUTSIDE_TEXT = "the secret outside every root"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """rw/ (writable), ro/ (read-only), outside/ (no grant) with a secret, and symlinks leading out."""
    for name in ("rw", "ro", "outside"):
        (tmp_path / name).mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(OUTSIDE_TEXT)
    (tmp_path / "ro" / "notes.txt").write_text("read-only notes")
    (tmp_path / "rw" / "link-out").symlink_to(tmp_path / "outside")  # a folder link leading out
    (tmp_path / "rw" / "secret-link").symlink_to(tmp_path / "outside" / "secret.txt")  # a file link leading out
    (tmp_path / "rw" / "inner-link").symlink_to(tmp_path / "ro" / "notes.txt")  # a link that stays inside
    return tmp_path


async def _run_calls(tmp_path: Path, *calls: ToolCall) -> list[Message]:
    """Make one model turn with ``calls`` under rw (write) and ro (read); return the results in order."""
    script = Script(reply(None, *calls), reply("ok"))
    async with runtime(tmp_path, script, grants(write=[tmp_path / "rw"], read=[tmp_path / "ro"])) as rt:
        run, _ = await run_to_rest(rt, definition())
    return [result_of(run.inst.transcript, c.id) for c in calls]


async def test_read_write_and_list_inside_the_roots(tree: Path) -> None:
    """Inside the roots the tools work: relative paths start at the first writable root, folders are made."""
    write = call("write-file", path="sub/new.txt", content="héllo\n")
    read = call("read-file", path=str(tree / "rw" / "sub" / "new.txt"))
    inner = call("read-file", path="inner-link")
    listing = call("list-directory", path=".")
    ro_read = call("read-file", path=str(tree / "ro" / "notes.txt"))
    results = await _run_calls(tree, write, read, inner, listing, ro_read)
    assert [r.status for r in results] == [ToolStatus.SUCCESS] * 5
    assert results[0].content == f"wrote 7 bytes to {tree / 'rw' / 'sub' / 'new.txt'}"
    assert results[1].content == "héllo\n"
    assert results[2].content == "read-only notes"
    assert results[3].content == f"{tree / 'rw'}:\ninner-link@\nlink-out@\nsecret-link@\nsub/"
    assert results[4].content == "read-only notes"


@pytest.mark.parametrize(("tool", "arguments"), [
    pytest.param("read-file", {"path": "../outside/secret.txt"}, id="dotdot-traversal"),
    pytest.param("read-file", {"path": "sub/../../outside/secret.txt"}, id="dotdot-inside-path"),
    pytest.param("read-file", {"path": "{tmp}/outside/secret.txt"}, id="absolute-outside"),
    pytest.param("read-file", {"path": "{tmp}/rw/../outside/secret.txt"}, id="absolute-with-dotdot"),
    pytest.param("read-file", {"path": "secret-link"}, id="file-symlink-leading-out"),
    pytest.param("read-file", {"path": "link-out/secret.txt"}, id="folder-symlink-leading-out"),
    pytest.param("list-directory", {"path": "link-out"}, id="list-through-symlink"),
    pytest.param("list-directory", {"path": "{tmp}"}, id="list-parent-of-roots"),
    pytest.param("read-file", {"path": "{tmp}/store"}, id="read-the-store"),
])
async def test_reads_outside_the_roots_are_refused(tree: Path, tool: str, arguments: dict[str, str]) -> None:
    """Every read that resolves (after symlinks) outside the readable roots is a tool_error, and nothing leaks."""
    c = call(tool, **{k: v.format(tmp=tree) for k, v in arguments.items()})
    [result] = await _run_calls(tree, c)
    assert result.status is ToolStatus.TOOL_ERROR
    assert "not within a readable file root" in result.content
    assert OUTSIDE_TEXT not in result.content


@pytest.mark.parametrize(("path", "victim"), [
    pytest.param("{tmp}/ro/notes.txt", "ro/notes.txt", id="read-only-root"),
    pytest.param("{tmp}/ro/new.txt", "ro/new.txt", id="new-file-in-read-only-root"),
    pytest.param("link-out/pwned.txt", "outside/pwned.txt", id="through-symlinked-parent"),
    pytest.param("secret-link", "outside/secret.txt", id="through-file-symlink"),
    pytest.param("inner-link", "ro/notes.txt", id="symlink-into-read-only-root"),
    pytest.param("../outside/secret.txt", "outside/secret.txt", id="dotdot-traversal"),
    pytest.param("{tmp}/outside/pwned.txt", "outside/pwned.txt", id="absolute-outside"),
    pytest.param("{tmp}/store/pwned.txt", "store/pwned.txt", id="into-the-store"),
])
async def test_writes_outside_the_writable_roots_are_refused(tree: Path, path: str, victim: str) -> None:
    """Every write that resolves outside the writable roots is refused and changes nothing on disk."""
    before = (tree / victim).read_text() if (tree / victim).exists() else None
    c = call("write-file", path=path.format(tmp=tree), content="pwned")
    [result] = await _run_calls(tree, c)
    assert result.status is ToolStatus.TOOL_ERROR
    assert "not within a writable file root" in result.content
    after = (tree / victim).read_text() if (tree / victim).exists() else None
    assert after == before


async def test_tools_are_offered_only_under_file_grants(tmp_path: Path) -> None:
    """Without roots no file tool is offered; with read roots only, write-file is not offered and is unknown_tool."""
    (tmp_path / "ro").mkdir()
    script = Script(reply("ok"))
    async with runtime(tmp_path, script, grants()) as rt:
        await run_to_rest(rt, definition())
    assert [t.name for t in script.requests[0].tools] == []
    c = call("write-file", path=str(tmp_path / "ro" / "x"), content="x")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(read=[tmp_path / "ro"])) as rt:
        run, _ = await run_to_rest(rt, definition())
    assert [t.name for t in script.requests[0].tools] == ["read-file", "list-directory"]
    assert result_of(run.inst.transcript, c.id).status is ToolStatus.UNKNOWN_TOOL
    assert not (tmp_path / "ro" / "x").exists()


async def test_huge_files_are_read_in_capped_parts(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file longer than the cap is cut with a marker naming the next offset, and reading on continues there."""
    monkeypatch.setattr(files_module, "MAX_READ_BYTES", 1000)
    (tree / "rw" / "big.txt").write_text("a" * 1000 + "b" * 1500)
    first, second, third = (call("read-file", path="big.txt", offset=n) for n in (0, 1000, 2000))
    results = await _run_calls(tree, first, second, third)
    assert results[0].content == "a" * 1000 + (
        "\n[truncated: the file has 2,500 bytes; bytes 0 to 1,000 are shown. Read on with offset=1000.]")
    assert results[1].content.startswith("b" * 1000 + "\n[truncated: the file has 2,500 bytes; bytes 1,000 to 2,000")
    assert results[2].content == "b" * 500


async def test_default_read_cap_keeps_a_huge_file_out_of_the_transcript(tree: Path) -> None:
    """A 5 MB file gives at most 64 KiB and a marker."""
    with (tree / "rw" / "huge.txt").open("wb") as f:
        f.truncate(5_000_000)
        f.seek(0)
        f.write(b"x" * 100_000)
    [result] = await _run_calls(tree, call("read-file", path="huge.txt"))
    assert result.content.startswith("x" * 65_536 + "\n[truncated: the file has 5,000,000 bytes")
    assert len(result.content) < 66_000


async def test_special_files_and_hard_links_are_refused(tree: Path) -> None:
    """A FIFO is refused without hanging; a file with another hard link (perhaps outside) is not written."""
    os.mkfifo(tree / "rw" / "pipe")
    os.link(tree / "outside" / "secret.txt", tree / "rw" / "hard")
    fifo, hard = call("read-file", path="pipe"), call("write-file", path="hard", content="pwned")
    folder = call("read-file", path=".")
    with anyio.fail_after(10):
        results = await _run_calls(tree, fifo, hard, folder)
    assert [r.status for r in results] == [ToolStatus.TOOL_ERROR] * 3
    assert results[0].content == "pipe: is not a regular file"
    assert "has other hard links" in results[1].content
    assert results[2].content == ".: is a folder; use list-directory"
    assert (tree / "outside" / "secret.txt").read_text() == OUTSIDE_TEXT


def _context(tmp_path: Path, store: Path) -> ToolContext:
    return ToolContext(instance_id="i", tool_call_id="c", grants=grants(write=[tmp_path]), base_dir=tmp_path,
                       store_locations=(store,))


def test_paths_in_the_store_are_refused_even_inside_a_root(tmp_path: Path) -> None:
    """Defence in depth: were the store inside a granted root, the tools would still refuse it."""
    store = tmp_path / "store"
    (store / "i1").mkdir(parents=True)
    (store / "i1" / "instance.json").write_text("{}")
    ctx = _context(tmp_path, store)
    attempts = [
        lambda: read_file.function(path="store/i1/instance.json", context=ctx),
        lambda: write_file.function(path="store/i1/instance.json", content="{}", context=ctx),
        lambda: write_file.function(path=str(store / "new.json"), content="{}", context=ctx),
        lambda: list_directory.function(path="store", context=ctx),
    ]
    for attempt in attempts:
        with pytest.raises(ToolError, match="lies in the runtime's instance store"):
            attempt()
    assert not (store / "new.json").exists()
    (tmp_path / "ok.txt").write_text("ok")
    assert read_file.function(path="store/../ok.txt", context=ctx) == "ok"  # next to the store is fine


def test_a_symlink_swapped_in_after_the_check_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder on the path swapped for a link leading out after the check reaches nothing outside.

    write-file opens each folder relative to the one before, without following links: a link
    swapped in before its folder is opened is refused; one swapped in after is not on the way any
    more (the file lands in the real folder, inside the root).
    """
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(OUTSIDE_TEXT)
    ctx = ToolContext(instance_id="i", tool_call_id="c", grants=grants(write=[tmp_path / "root"]),
                      base_dir=tmp_path)
    real_open = os.open
    armed: list[str] = []

    def racing_open(path: str | os.PathLike[str], flags: int, mode: int = 0o777, **kw: object) -> int:
        # Just before the open of ``armed``, the folder d turns into a link leading out.
        if armed and str(path) == armed[0]:
            armed.clear()
            (tmp_path / "root" / "d").rename(tmp_path / "root" / "d-old")
            (tmp_path / "root" / "d").symlink_to(tmp_path / "outside")
        return real_open(path, flags, mode, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(files_module.os, "open", racing_open)
    for name in ("secret.txt", "created.txt"):  # an existing file outside, then a new one
        for when in ("d", name):  # before the folder is opened, then before the file is
            (tmp_path / "root" / "d").mkdir()
            armed.append(when)
            if when == "d":
                with pytest.raises(ToolError, match="is a symlink"):
                    write_file.function(path=f"d/{name}", content="pwned", context=ctx)
            else:
                write_file.function(path=f"d/{name}", content="pwned", context=ctx)
                assert (tmp_path / "root" / "d-old" / name).read_text() == "pwned"
                (tmp_path / "root" / "d-old" / name).unlink()
            assert not armed  # the swap happened
            (tmp_path / "root" / "d").unlink()
            (tmp_path / "root" / "d-old").rmdir()
    assert (tmp_path / "outside" / "secret.txt").read_text() == OUTSIDE_TEXT
    assert not (tmp_path / "outside" / "created.txt").exists()
