"""The file store's mailbox: ``posts.jsonl``, which any process appends to and the runner reads.

Posts carry no lock in the common case: each is one ``O_APPEND`` write of one line. A post with
an ``id`` takes an ``flock`` of the mailbox to look for the id before it appends (idempotent posts,
see :meth:`loopwright.abc.Store.post`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopwright.builtins._file_io import (
    HEADER_FILE,
    O_CLOEXEC,
    POSTS_FILE,
    check_id,
    encode_item,
    encode_line,
    write_all,
)
from loopwright.errors import InstanceNotFoundError, StoreError

if TYPE_CHECKING:
    from collections import OrderedDict

__all__ = ["Mailbox", "has_post"]


def has_post(fd: int, post_id: str) -> bool:
    """Whether the mailbox open at ``fd`` holds a complete line of an item whose ``id`` is ``post_id``."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    needle = encode_line(post_id).encode()  # as post() writes it
    if needle not in data:  # the usual case: one scan, no parsing
        return False
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        if needle in line:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("id") == post_id:
                return True
    return False


class Mailbox:
    """The file store's mailbox methods (a part of :class:`~loopwright.builtins.file_store.FileStore`)."""

    root: Path
    fsync: bool
    max_open_logs: int
    _post_fds: OrderedDict[str, int]
    _post_paths: dict[str, str]

    async def post(self, instance_id: str, item: Mapping[str, Any]) -> None:
        """Append ``item`` to the instance's mailbox, ``posts.jsonl`` (any process, any time).

        Each post is one ``O_APPEND`` write of one line, so posts from several processes never
        interleave. An item with an ``id`` is idempotent (see :meth:`loopwright.abc.Store.post`):
        under an exclusive ``flock`` of the mailbox, which posters with an id take in turns, the
        mailbox is searched for the id first (a read of the whole mailbox, which stays small).
        Raise :class:`~loopwright.errors.InstanceNotFoundError` for an unknown instance.
        """
        folder = self.root / check_id(instance_id)
        try:
            line = (encode_item(item) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise StoreError(f"cannot post: {exc}", instance_id=instance_id) from exc
        post_id = item.get("id")
        if not (folder / HEADER_FILE).is_file():
            raise InstanceNotFoundError(instance_id)
        path = folder / POSTS_FILE
        try:
            flags = os.O_APPEND | os.O_CREAT | O_CLOEXEC | (os.O_RDWR if post_id else os.O_WRONLY)
            fd = os.open(path, flags, 0o600)
            try:
                if isinstance(post_id, str) and post_id:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close below
                    if has_post(fd, post_id):
                        return
                write_all(fd, line)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"cannot post to {path}: {exc}", instance_id=instance_id) from exc

    async def read_posts(self, instance_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:  # noqa: C901
        """Return the complete mailbox lines after byte offset ``cursor`` and the offset after them.

        Nothing new costs one ``fstat`` of a cached handle (one ``access()`` while the mailbox
        does not exist). A line still being written (no newline yet) is left for the next call.
        """
        fd = self._post_fds.get(instance_id)
        if fd is None:
            path = self._post_paths.get(instance_id)
            if path is None:
                folder = self.root / check_id(instance_id)
                if not (folder / HEADER_FILE).is_file():
                    raise InstanceNotFoundError(instance_id)
                path = self._post_paths[instance_id] = os.fspath(folder / POSTS_FILE)
                if len(self._post_paths) > 4 * self.max_open_logs:
                    self._post_paths.pop(next(iter(self._post_paths)))
            # Never created here: a new name costs a directory update, and most instances never
            # get a post. Until one comes, each look is one access(): no exception to build,
            # half the cost of a failed open(). A post made just after it is seen at the next look.
            if not os.access(path, os.F_OK):
                return [], cursor
            try:
                fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
            except FileNotFoundError:
                return [], cursor
            except OSError as exc:
                raise StoreError(f"cannot open the mailbox: {exc}", instance_id=instance_id) from exc
            self._post_fds[instance_id] = fd
            while len(self._post_fds) > self.max_open_logs:
                _key, old = self._post_fds.popitem(last=False)
                with contextlib.suppress(OSError):
                    os.close(old)
        size = os.fstat(fd).st_size
        if size <= cursor:
            return [], cursor
        data = os.pread(fd, size - cursor, cursor)
        end = data.rfind(b"\n") + 1
        items = []
        for number, line in enumerate(data[:end].splitlines()):
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise StoreError(f"mailbox line at byte {cursor} + {number} is not JSON: {exc}",
                                 instance_id=instance_id) from exc
            if isinstance(obj, dict):
                items.append(obj)
        return items, cursor + end
