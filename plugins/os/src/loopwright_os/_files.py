"""``read-file``, ``write-file`` and ``list-directory``: file tools confined to the ``files`` grants.

Every path is made absolute (a relative one against the working folder: the first writable root
that is a folder, else the first readable one), then resolved with symlinks followed, and only
then compared with the roots, themselves resolved against the assembly's folder
(:func:`loopwright.capabilities.is_within`). So ``../`` and symlinks that lead out of a root
reach nothing outside it. Reads need a read or write root, writes a write root. Paths in the
runtime's store are refused even when a root would cover them (the runtime already refuses such
assemblies; this is defence in depth).

After opening, the file's real path is read back from the descriptor (``/proc/self/fd`` on Linux,
``F_GETPATH`` on macOS) and checked again, so a symlink swapped in between the check and the
open is caught; a written file is truncated only after that check.

``write-file`` makes missing folders and opens the file relative to directory descriptors, one
path component at a time from the granted root, none followed if it is a symlink (``O_NOFOLLOW``,
``mkdir(dir_fd=...)``), so no race can make a folder or a file outside the root.

A regular file with more than one hard link may be the same file as one outside the roots:
``write-file`` never writes one, and ``read-file`` reads one only when the assembly allows it
(``pluginSettings: {os: {allowHardLinks: true}}``). Both check the opened descriptor (``fstat``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopwright import ToolContext, tool
from loopwright.capabilities import is_within
from loopwright.errors import ToolError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from loopwright import Capabilities, Tool

__all__ = ["MAX_ENTRIES", "MAX_READ_BYTES", "list_directory", "read_file", "read_file_tool", "write_file"]

#: Bytes ``read-file`` returns per call; a longer file ends with a marker giving the next offset.
MAX_READ_BYTES = 64 * 1024
#: Entries ``list-directory`` shows; more are counted in a marker.
MAX_ENTRIES = 1000

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO must not hang the call
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _readable(grants: Capabilities) -> bool:
    return bool(grants.files.read or grants.files.write)


def _writable(grants: Capabilities) -> bool:
    return bool(grants.files.write)


class _Roots:
    """The calling instance's roots and the store, resolved once per call."""

    def __init__(self, context: ToolContext) -> None:
        base = context.base_dir
        self.write = tuple(_resolve(r, base) for r in context.grants.files.write)
        self.read = tuple(_resolve(r, base) for r in context.grants.files.read) + self.write
        self.store = tuple(_resolve(s, base) for s in context.store_locations)
        self.workdir = next((r for r in (*self.write, *self.read) if r.is_dir()), None)

    def check(self, path: Path, shown: str, *, write: bool) -> None:
        """Raise ToolError unless ``path`` (resolved) lies in an allowed root and outside the store."""
        allowed = self.write if write else self.read
        if not any(is_within(path, root) for root in allowed):
            kind = "writable" if write else "readable"
            roots = ", ".join(str(r) for r in allowed) or "(none)"
            raise ToolError(f"{shown}: not within a {kind} file root (it resolves to {path}); the {kind} "
                            f"roots are: {roots}")
        if any(is_within(path, store) for store in self.store):
            raise ToolError(f"{shown}: lies in the runtime's instance store, which agents may not touch")

    def root_of(self, resolved: Path) -> Path:
        """Return the writable root ``resolved`` (checked) lies in: the deepest, so the fewest steps."""
        return max((r for r in self.write if is_within(resolved, r)), key=lambda r: len(r.parts))

    def target(self, path: str, *, write: bool) -> Path:
        """Return ``path`` made absolute and resolved, after checking it."""
        p = Path(path).expanduser()
        if not p.is_absolute():
            if self.workdir is None:
                raise ToolError(f"{path}: a relative path needs a file root that is a folder; give an absolute path")
            p = self.workdir / p
        resolved = p.resolve()
        self.check(resolved, path, write=write)
        return resolved

    def check_open(self, fd: int, shown: str, *, write: bool) -> None:
        """Check the real path of an open descriptor (a symlink may have been swapped in)."""
        real = _fd_path(fd)
        if real is not None:
            self.check(real, shown, write=write)


def _resolve(path: str | Path, base: Path) -> Path:
    p = Path(path).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def _fd_path(fd: int) -> Path | None:
    """Return the path an open descriptor refers to, where the platform tells."""
    if sys.platform.startswith("linux"):
        try:
            return Path(f"/proc/self/fd/{fd}").readlink()
        except OSError:
            return None
    if sys.platform == "darwin":  # pragma: no cover - macOS only
        import fcntl  # noqa: PLC0415

        try:
            raw = fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024))  # type: ignore[attr-defined,unused-ignore]
        except OSError:
            return None
        return Path(os.fsdecode(raw.split(b"\0", 1)[0]))
    return None  # pragma: no cover


def _read(fd: int, limit: int) -> bytes:
    chunks = []
    while limit > 0:
        chunk = os.read(fd, limit)
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def _open(path: Path, shown: str, flags: int, mode: int = 0o666) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)
    except FileNotFoundError:
        raise ToolError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise ToolError(f"{shown}: is a folder") from None
    except NotADirectoryError:
        raise ToolError(f"{shown}: is not a folder (or a part of its path is not)") from None
    except OSError as exc:
        raise ToolError(f"{shown}: cannot open it ({exc.strerror})") from None


def read_file_tool(settings: Mapping[str, Any] | None = None) -> Tool:
    """Return ``read-file`` as the assembly's ``pluginSettings.os`` configure it.

    :param settings: The ``os`` entry of ``pluginSettings``; ``allowHardLinks: true`` lets it read
        regular files that have other hard links (refused by default).
    """
    allow_hard_links = bool((settings or {}).get("allowHardLinks", False))

    @tool(name="read-file", idempotent=True, available=_readable)
    def read_file(path: str, offset: int = 0, *, context: ToolContext) -> str:
        """Read a text file from a readable file root.

        Args:
            path: The file; a relative path is taken from the working folder.
            offset: The byte to start at (a long file is returned in parts, each ending with the next offset).
            context: The calling instance's grants, filled in by the loop (not an argument of the model's).
        """
        return _read_file(path, offset, context, allow_hard_links=allow_hard_links)

    return read_file


def _read_file(path: str, offset: int, context: ToolContext, *, allow_hard_links: bool) -> str:
    roots = _Roots(context)
    target = roots.target(path, write=False)
    if offset < 0:
        raise ToolError("offset must not be negative")
    fd = _open(target, path, os.O_RDONLY)
    try:
        roots.check_open(fd, path, write=False)
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{path}: is a folder; use list-directory")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path}: is not a regular file")
        if info.st_nlink > 1 and not allow_hard_links:
            raise ToolError(f"{path}: has other hard links (the same file may lie outside the roots); not read")
        os.lseek(fd, offset, os.SEEK_SET)
        data = _read(fd, MAX_READ_BYTES)
    finally:
        os.close(fd)
    size = info.st_size
    if b"\0" in data:
        return f"{target}: a binary file of {size:,} bytes; its content is not shown"
    text = data.decode("utf-8", errors="replace")
    end = offset + len(data)
    if end < size:
        text += (f"\n[truncated: the file has {size:,} bytes; bytes {offset:,} to {end:,} are shown. "
                 f"Read on with offset={end}.]")
    return text


#: ``read-file`` with the default settings (files with other hard links are refused).
read_file = read_file_tool()


@tool(name="write-file", parallel_safe=False, idempotent=True, available=_writable)
def write_file(path: str, content: str, *, context: ToolContext) -> str:
    """Write a text file (UTF-8) in a writable file root, replacing it if it exists; missing folders are made.

    Args:
        path: The file; a relative path is taken from the working folder.
        content: The whole new content of the file.
        context: The calling instance's grants, filled in by the loop (not an argument of the model's).
    """
    roots = _Roots(context)
    target = roots.target(path, write=True)
    if target.is_dir():
        raise ToolError(f"{path}: is a folder")
    folder = _open_folder(roots, target, path)
    try:
        created, fd = _create(folder, target.name, path)
    finally:
        os.close(folder)
    try:
        try:
            roots.check_open(fd, path, write=True)
        except ToolError:
            if created:  # undo the empty file just made outside the roots (defence in depth)
                with contextlib.suppress(OSError):
                    os.unlink(_fd_path(fd) or target)  # noqa: PTH108
            raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path}: is not a regular file")
        if info.st_nlink > 1:
            raise ToolError(f"{path}: has other hard links (the same file may lie outside the roots); not written")
        data = content.encode("utf-8")
        os.ftruncate(fd, 0)  # only now: the checks above came first
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return f"wrote {len(data):,} bytes to {target}"


def _open_folder(roots: _Roots, target: Path, shown: str) -> int:
    """Open ``target``'s folder, making missing ones, one component at a time from its write root.

    Each step is relative to the descriptor of the folder before it, and none follows a symlink,
    so what is made or opened lies in the root even if the path is changed meanwhile (a folder
    swapped for a link is refused). Return the folder's descriptor.
    """
    root = roots.root_of(target)
    parts: tuple[str, ...] = ()
    if target == root:  # the root is the file itself
        root = target.parent
    else:
        parts = target.relative_to(root).parts[:-1]
    fd = _open(root, shown, os.O_RDONLY | _DIRECTORY)
    real = _fd_path(fd)
    if real is not None and real != root:  # the root's own path changed since it was resolved
        os.close(fd)
        raise ToolError(f"{shown}: the folder {root} changed while it was opened; not written")
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass  # a folder already, or something the open below refuses
            except OSError as exc:
                raise ToolError(f"{shown}: cannot make its folder {part!r} ({exc.strerror})") from None
            try:
                step = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise ToolError(f"{shown}: {part!r} on its path is not a folder (or is a symlink, "
                                f"which is not followed here: {exc.strerror})") from None
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create(folder: int, name: str, shown: str) -> tuple[bool, int]:
    """Open ``name`` in ``folder`` for writing without following a link: ``(created, fd)``."""
    flags = os.O_WRONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK
    try:
        return True, os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=folder)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ToolError(f"{shown}: cannot create it ({exc.strerror})") from None
    try:
        return False, os.open(name, flags, dir_fd=folder)
    except IsADirectoryError:
        raise ToolError(f"{shown}: is a folder") from None
    except OSError as exc:
        raise ToolError(f"{shown}: cannot open it ({exc.strerror})") from None


@tool(name="list-directory", idempotent=True, available=_readable)
def list_directory(path: str = ".", *, context: ToolContext) -> str:
    """List a folder in a readable file root: sub-folders end with /, symlinks with @, files show their size.

    Args:
        path: The folder; a relative path is taken from the working folder.
        context: The calling instance's grants, filled in by the loop (not an argument of the model's).
    """
    roots = _Roots(context)
    target = roots.target(path, write=False)
    fd = _open(target, path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        roots.check_open(fd, path, write=False)
        entries = sorted(os.scandir(fd), key=lambda e: e.name)
        # Sizes are read through the folder's descriptor, so before it is closed.
        lines = [f"{target}:", *(_entry_line(e) for e in entries[:MAX_ENTRIES])]
    finally:
        os.close(fd)
    if len(entries) > MAX_ENTRIES:
        lines.append(f"[... {len(entries) - MAX_ENTRIES:,} more entries not shown]")
    if not entries:
        lines.append("(empty)")
    return "\n".join(lines)


def _entry_line(entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return f"{entry.name}@"
        if entry.is_dir(follow_symlinks=False):
            return f"{entry.name}/"
        return f"{entry.name}  {entry.stat(follow_symlinks=False).st_size:,} bytes"
    except OSError:
        return f"{entry.name}  (unreadable)"

