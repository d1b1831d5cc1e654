"""Where a built-in store lives: its ``path`` and ``createParents`` options, shared by the file and sqlite stores.

A store's ``path`` (a folder for the file store, a database file for the sqlite store) is
resolved against the assembly's folder, and its parent folder must already exist: a mistyped
path is refused when the store is built (so ``loopwright validate`` reports it, at the
assembly's ``store.path``), rather than silently creating a new, empty store somewhere else.
Two exceptions create the missing folders on the first write instead, as before:

* ``createParents: true`` in the assembly's ``store:``;
* a path directly inside ``.loopwright`` in the assembly's folder, the runtime's own folder,
  where the defaults (``.loopwright/instances``, ``.loopwright/loopwright.db``) live.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from loopwright.errors import ConfigProblem, shown_path

__all__ = ["RUNTIME_FOLDER", "StorePath", "store_path"]

#: The runtime's own folder, in the assembly's folder: the default stores live in it.
RUNTIME_FOLDER: Final = ".loopwright"


class StorePath:
    """A resolved store path and whether the store may create the folders above it.

    Attributes:
        path: The path, absolute and resolved.
        create_parents: Whether the store creates the missing folders above ``path`` on its
            first write (``createParents: true``, or a path in the runtime's own folder).
        problems: What is wrong with the two options, each at its ``$.store.KEY``.
    """

    __slots__ = ("create_parents", "path", "problems")

    def __init__(self, path: Path, *, create_parents: bool, problems: list[ConfigProblem]) -> None:
        self.path = path
        self.create_parents = create_parents
        self.problems = problems


def store_path(options: Mapping[str, Any], base_dir: Path | str, default: str, what: str) -> StorePath:
    """Read ``path`` (default ``default``) and ``createParents`` (default ``False``) from a store's options.

    ``~`` is expanded and a relative path is resolved against ``base_dir`` (the assembly's folder).

    :param what: The store, for messages (``the file store``).
    :returns: The resolved path; its ``problems`` (nothing is raised here) name ``$.store.path``
        when the path is empty or not a string, or when its parent folder does not exist (or is not
        a folder) and the store may not create it, and ``$.store.createParents`` when that is not a
        bool. Nothing is created.
    """
    problems: list[ConfigProblem] = []
    raw = options.get("path", default)
    if not isinstance(raw, (str, os.PathLike)) or not os.fspath(raw):
        problems.append(ConfigProblem("must be a non-empty path", path="$.store.path"))
        raw = default
    create = options.get("createParents", False)
    if not isinstance(create, bool):
        problems.append(ConfigProblem("must be true or false", path="$.store.createParents"))
        create = False
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path(base_dir) / path
    path = path.resolve()
    parent = path.parent
    own = parent == (Path(base_dir) / RUNTIME_FOLDER).resolve()
    is_dir = os.path.isdir(parent)  # noqa: PTH112 - never raises (an unreadable folder counts as missing)
    if not is_dir and os.path.exists(parent):  # noqa: PTH110 - as isdir
        problems.append(ConfigProblem(f"{shown_path(parent)} is a file, not a folder: correct the path of {what} "
                                      "(nothing was created)", path="$.store.path"))
    elif not (create or own or is_dir):
        problems.append(ConfigProblem(
            f"the folder {shown_path(parent)} does not exist: create it, correct the path, or set createParents: true "
            f"to have {what} create it (nothing was created)",
            path="$.store.path"))
    return StorePath(path, create_parents=create or own, problems=problems)
