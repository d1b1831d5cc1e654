"""The file store's files: names, the id rule, JSON lines, and the low-level reads and writes.

Shared by :mod:`loopwright.builtins.file_store` and the modules it is split into (the lease, the
mailbox, the checkpoints), and by the sqlite store (the id rule, the encoder). Everything here
is a plain function of file descriptors, paths and bytes; the store's state lives in
:class:`~loopwright.builtins.file_store.FileStore`. Warnings go to the
``loopwright.builtins.file_store`` logger, whichever module logs them.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from loopwright._ids import check_instance_id
from loopwright.errors import StoreError

__all__ = [
    "CHECKPOINT_FILE",
    "DEFAULT_PATH",
    "ENTRIES_FILE",
    "HEADER_FILE",
    "O_CLOEXEC",
    "POSTS_FILE",
    "RECORDS_FILE",
    "TMP_NUMBERS",
    "check_id",
    "encode_header",
    "encode_item",
    "encode_line",
    "fsync_dir",
    "is_object_line",
    "line_start",
    "load_syncfs",
    "log",
    "open_logs_limit",
    "parse_lines",
    "repair_tail",
    "to_json",
    "write_all",
]

class _Log:
    """The file store's logger, made at its first message: ``logging`` costs ``ls`` ~5 ms to import (issue 30)."""

    def warning(self, msg: str, *args: object) -> None:
        """Log a warning on ``loopwright.builtins.file_store``."""
        import logging  # noqa: PLC0415 - see the class

        logging.getLogger("loopwright.builtins.file_store").warning(msg, *args)


#: The file store's logger (one name for all its modules: what operators filter on).
log: Final = _Log()

#: The store folder when ``path`` is not set, relative to the assembly's folder.
DEFAULT_PATH: Final = ".loopwright/instances"

HEADER_FILE: Final = "instance.json"
ENTRIES_FILE: Final = "entries.jsonl"
RECORDS_FILE: Final = "records.jsonl"
POSTS_FILE: Final = "posts.jsonl"
CHECKPOINT_FILE: Final = "checkpoint.json"

O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
TAIL_CHUNK: Final = 64 * 1024
#: Numbers for temporary files, unique in the process (with its pid in the name).
TMP_NUMBERS: Final = itertools.count()


def to_json(obj: object) -> object:
    """Let any Mapping (a MappingProxyType, a frozen mapping) serialise like a dict."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


# Built once: json.dumps() with non-default arguments builds a new encoder on every call.
encode_line: Final = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=to_json,
).encode
# Headers are one line too: an indented encoder runs in pure Python, about 3x slower.
encode_header: Final = encode_line


def encode_item(item: Mapping[str, Any]) -> str:
    """Return ``item`` as one line of compact JSON, without the newline.

    :raises TypeError: ``item`` is not a mapping, or holds a value JSON cannot hold.
    :raises ValueError: It holds NaN or an infinity, or a cycle.
    """
    if type(item) is not dict and not isinstance(item, Mapping):
        raise TypeError(f"each item must be a mapping, not {type(item).__name__}")
    return encode_line(item)


def check_id(instance_id: object) -> str:
    """Return ``instance_id`` if it follows the instance id rule (:func:`loopwright.check_instance_id`)."""
    return check_instance_id(instance_id)


def fsync_dir(path: Path) -> None:
    """Flush a folder's own entries (new names, renames) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``: one ``write()``, unless a signal or a full disk cuts it short."""
    written = os.write(fd, data)
    if written != len(data):  # rare for regular files: a signal or a full disk
        view = memoryview(data)
        while written < len(data):
            written += os.write(fd, view[written:])


def line_start(fd: int, end: int) -> int:
    """Return the offset just after the last newline before ``end``, or 0 if there is none."""
    pos = end
    while pos > 0:
        start = max(0, pos - TAIL_CHUNK)
        chunk = os.pread(fd, pos - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return start + nl + 1
        pos = start
    return 0


def is_object_line(line: bytes) -> bool:
    """Whether ``line`` is one JSON object."""
    try:
        return type(json.loads(line)) is dict
    except ValueError:  # includes UnicodeDecodeError
        return False


def repair_tail(fd: int, path: Path | str) -> None:
    """Truncate a torn last line (no newline, or not a JSON object) so appends start clean.

    Reads only the last line, once per opening: the cost does not grow with the log.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return
    if os.pread(fd, 1, size - 1) == b"\n":
        start = line_start(fd, size - 1)
        if is_object_line(os.pread(fd, size - 1 - start, start)):
            return
    else:
        start = line_start(fd, size)
    os.ftruncate(fd, start)
    log.warning("file store: dropped a torn last line of %d bytes from %s", size - start, path)


def open_logs_limit() -> int:
    """Return how many logs a file store keeps open: a third of the soft ``RLIMIT_NOFILE``, 64 to 65,536.

    The other two thirds are left to the leases (one descriptor each), the mailboxes, sockets and
    the rest of the process. Where the limit cannot be read (not POSIX), 512.
    """
    try:
        import resource  # noqa: PLC0415 - POSIX only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 512
    if soft < 0 or soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, min(65536, soft // 3))


def load_syncfs() -> Callable[[Path], None] | None:
    """Return ``syncfs(2)`` (flush one filesystem) through libc, or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415 - only on Linux, once

    try:
        # The process's own symbols, libc's among them: ctypes.util.find_library would run
        # ldconfig in a child process (tens of milliseconds) to find the same library.
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syncfs
    except (OSError, AttributeError):
        return None

    def syncfs(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
        try:
            if call(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(path))
        finally:
            os.close(fd)

    return syncfs


def parse_lines(data: bytes, path: Path, start: int, instance_id: str) -> tuple[list[dict[str, Any]], int]:
    """Parse a log's bytes (from byte ``start`` of the file) into objects; return them and the bytes used.

    A torn last line (not valid JSON, or no trailing newline) is dropped and not counted as
    used; a corrupt line anywhere else raises :class:`StoreError` naming the file and line.
    """
    lines = data.split(b"\n")
    # With a trailing newline the split ends with b""; otherwise that piece is a torn line.
    torn = len(lines.pop())
    used = len(data) - torn
    out: list[dict[str, Any]] = []
    loads = json.loads
    last = len(lines) - 1
    ended_clean = torn == 0
    where = "line" if start == 0 else f"byte {start} + line"
    for number, line in enumerate(lines):
        try:
            obj = loads(line)
        except ValueError as exc:
            if number == last and ended_clean:
                return out, used - len(line) - 1  # a torn last line: dropped, and cut before the next append
            raise StoreError(f"{path}: {where} {number + 1} is not valid JSON: {exc}",
                             instance_id=instance_id) from exc
        if type(obj) is not dict:
            if number == last and ended_clean:
                return out, used - len(line) - 1
            raise StoreError(f"{path}: {where} {number + 1} holds a JSON {type(obj).__name__}, "
                             "not an object", instance_id=instance_id)
        out.append(obj)
    return out, used
