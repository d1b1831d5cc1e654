"""The file store's checkpoints: ``checkpoint.json``, a fold of the entry log's first bytes.

The checkpoint's frame ``{"v": 1, "offset": N, "prefix": SHA256, "sha256": SHA256}`` ties it to the
log (see the :mod:`loopwright.builtins.file_store` docstring): a checkpoint that does not check
out is ignored, with a warning, and the whole log is read.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from loopwright.builtins._file_io import (
    CHECKPOINT_FILE,
    ENTRIES_FILE,
    HEADER_FILE,
    O_CLOEXEC,
    TMP_NUMBERS,
    check_id,
    encode_line,
    log,
    parse_lines,
    write_all,
)
from loopwright.errors import InstanceNotFoundError, StoreError

if TYPE_CHECKING:
    from collections import OrderedDict

__all__ = ["Checkpoints", "prefix_hash"]

#: The version of the checkpoint file's own frame (its first line); the state inside has its own.
CHECKPOINT_FRAME: Final = 1
#: How many bytes before a checkpoint's offset are hashed to tie it to its log.
PREFIX_BYTES: Final = 64 * 1024


def prefix_hash(fd: int, offset: int) -> str:
    """Hash the (at most :data:`PREFIX_BYTES`) bytes of a log before ``offset``, and the offset itself."""
    import hashlib  # noqa: PLC0415 - OpenSSL's hashes only for a checkpoint: ls and show read none (issue 30)

    start = max(0, offset - PREFIX_BYTES)
    h = hashlib.sha256(str(offset).encode())
    h.update(os.pread(fd, offset - start, start))
    return h.hexdigest()


class Checkpoints:
    """The file store's checkpoint methods (a part of :class:`~loopwright.builtins.file_store.FileStore`)."""

    root: Path
    max_open_logs: int
    checkpoint_bytes: int
    _logs: OrderedDict[tuple[str, str], int]
    _checkpointed: dict[str, int]

    async def read_resume(self, instance_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Return ``(checkpoint, entries after it)``, or ``(None, all entries)`` without a valid checkpoint.

        ``checkpoint.json`` is used only if its checksum matches, its offset lies within the
        entry log on a line boundary, and the log's bytes before that offset hash as when it was
        written; otherwise it is ignored (with a logged warning) and the whole log is read. The
        cost is that of the checkpoint and the log's tail after it, whatever the log's length.
        Same errors as :meth:`read_entries`.
        """
        checkpoint, entries, offset, _end = self._read_resume(instance_id)
        self._note_checkpoint(instance_id, offset if checkpoint is not None else 0)
        return checkpoint, entries

    async def checkpoint(self, instance_id: str,
                         fold: Callable[[Mapping[str, Any] | None, list[dict[str, Any]]], dict[str, Any]],
                         ) -> None:
        """Write a new checkpoint if the entry log grew by :attr:`checkpoint_bytes` since the last one.

        Otherwise this costs one ``fstat``. The new one is ``fold(checkpoint, entries after it)``
        over the complete lines of the log, written to a temporary file and renamed over
        ``checkpoint.json`` (no fsync: a checkpoint torn by a power loss fails its checksum and
        the log is replayed whole). A checkpoint is a cache: any failure here is logged on the
        ``loopwright.builtins.file_store`` logger and the log stays as it was.
        """
        folder = self.root / check_id(instance_id)
        try:
            fd = self._logs.get((instance_id, ENTRIES_FILE))
            size = os.fstat(fd).st_size if fd is not None else (folder / ENTRIES_FILE).stat().st_size
            done = self._checkpointed.get(instance_id)
            if done is None:
                done = self._checkpoint_offset(folder)
                self._note_checkpoint(instance_id, done)
            if size - done < self.checkpoint_bytes:
                return
            checkpoint, entries, _offset, end = self._read_resume(instance_id)
            state = fold(checkpoint, entries)
            self._write_checkpoint(instance_id, folder, state, end)
        except Exception as exc:  # noqa: BLE001 - a cache must never fail the run it follows
            log.warning("file store: no checkpoint for %s: %s: %s", instance_id, type(exc).__name__, exc)
            return
        self._note_checkpoint(instance_id, end)

    def _note_checkpoint(self, instance_id: str, offset: int) -> None:
        """Remember the offset an instance's checkpoint covers (a bounded map: forgetting costs one read)."""
        marks = self._checkpointed
        marks[instance_id] = offset
        if len(marks) > 16 * self.max_open_logs:
            marks.pop(next(iter(marks)))

    @staticmethod
    def _checkpoint_offset(folder: Path) -> int:
        """Return the offset the checkpoint's frame names (0 without one); the frame alone is read."""
        try:
            with (folder / CHECKPOINT_FILE).open("rb") as f:
                frame = json.loads(f.readline())
            return int(frame["offset"]) if type(frame) is dict else 0
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _read_resume(self, instance_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int, int]:
        """Return the verified checkpoint (or ``None``), the entries after it, its offset, and where they end."""
        folder = self.root / check_id(instance_id)
        path = folder / ENTRIES_FILE
        try:
            fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            if not (folder / HEADER_FILE).is_file():
                raise InstanceNotFoundError(instance_id) from None
            return None, [], 0, 0
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}", instance_id=instance_id) from exc
        try:
            size = os.fstat(fd).st_size
            checkpoint, offset = self._verified_checkpoint(instance_id, folder, fd, size)
            data = os.pread(fd, size - offset, offset)
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}", instance_id=instance_id) from exc
        finally:
            os.close(fd)
        entries, used = parse_lines(data, path, offset, instance_id)
        return checkpoint, entries, offset, offset + used

    @staticmethod
    def _verified_checkpoint(instance_id: str, folder: Path, fd: int, size: int) -> tuple[dict[str, Any] | None, int]:
        """Return the checkpoint and its offset if it checks out against the log ``fd``, else ``(None, 0)``."""
        path = folder / CHECKPOINT_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None, 0
        except OSError as exc:
            log.warning("file store: ignoring the checkpoint of %s: cannot read %s: %s", instance_id, path, exc)
            return None, 0
        problem = "its frame is not valid"
        import hashlib  # noqa: PLC0415 - see prefix_hash

        try:
            head, _nl, body = data.partition(b"\n")
            body = body.removesuffix(b"\n")
            frame = json.loads(head)
            if type(frame) is dict and frame.get("v") == CHECKPOINT_FRAME:
                offset, prefix, digest = frame["offset"], frame["prefix"], frame["sha256"]
                if hashlib.sha256(body).hexdigest() != digest:
                    problem = "its checksum does not match (torn or changed)"
                elif type(offset) is not int or not 0 < offset <= size:
                    problem = f"it covers {offset!r} bytes of a {size}-byte log"
                elif os.pread(fd, 1, offset - 1) != b"\n" or prefix != prefix_hash(fd, offset):
                    problem = "the log before its offset is not the one it was made from"
                else:
                    state = json.loads(body)
                    if type(state) is dict:
                        return state, offset
                    problem = "it does not hold a JSON object"
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"{problem}: {exc}"
        log.warning("file store: ignoring the checkpoint of %s (%s): %s; replaying the whole log",
                     instance_id, path, problem)
        return None, 0

    def _write_checkpoint(self, instance_id: str, folder: Path, state: Mapping[str, Any], offset: int) -> None:
        """Write ``state`` as the checkpoint of the log's first ``offset`` bytes: temp file, rename."""
        import hashlib  # noqa: PLC0415 - see prefix_hash

        body = encode_line(state).encode()
        cached = self._logs.get((instance_id, ENTRIES_FILE))
        fd = cached if cached is not None else os.open(folder / ENTRIES_FILE, os.O_RDONLY | O_CLOEXEC)
        try:
            prefix = prefix_hash(fd, offset)
        finally:
            if cached is None:
                os.close(fd)
        frame = {"v": CHECKPOINT_FRAME, "offset": offset, "prefix": prefix,
                 "sha256": hashlib.sha256(body).hexdigest()}
        data = (encode_line(frame) + "\n").encode() + body + b"\n"
        tmp = folder / f".{CHECKPOINT_FILE}.{os.getpid()}.{next(TMP_NUMBERS)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o600)
        try:
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            tmp.replace(folder / CHECKPOINT_FILE)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
