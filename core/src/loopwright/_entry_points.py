"""The installed entry points of one group, read without :mod:`importlib.metadata` (issue 30).

``importlib.metadata.entry_points(group=...)`` costs a command about 25 ms before it finds
anything: importing it (zipfile, email, csv, tempfile, importlib.resources: ~15 ms) and a scan
that builds a ``pathlib.Path`` and a distribution object per installed package (~10 ms for the
~150 of a workspace). :func:`entry_points` reads the same files the same way with ``os`` alone:
each :data:`sys.path` folder in order, its ``*.dist-info`` and ``*.egg-info`` folders grouped by
normalized distribution name as ``importlib.metadata`` groups them, the first distribution of
each name only, and each one's ``entry_points.txt`` parsed as that module parses it (``[group]``
sections, ``name = value`` lines, ``#`` comments). A later entry point of a name replaces an
earlier one, as ``{ep.name: ep for ep in ...}`` does.

Whenever the search could differ from ``importlib.metadata``'s, it asks ``importlib.metadata``
instead: a :data:`sys.path` entry that is a zip file or an ``.egg``, a metadata folder whose name
does not give its distribution's name, or a finder on :data:`sys.meta_path` other than the
standard path finder that can find distributions. The entry points it returns have the
``name``, ``value``, ``group`` and :meth:`~FileEntryPoint.load` of ``importlib.metadata``'s.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Mapping
from importlib.machinery import PathFinder
from typing import Any, Final

import attrs

__all__ = ["FileEntryPoint", "entry_points"]

#: ``importlib.metadata.EntryPoint.pattern``: ``module[:attr.path][ [extras]]``.
_PATTERN: Final = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")
_SUFFIXES: Final = (".dist-info", ".egg-info")


@attrs.frozen(kw_only=True)
class FileEntryPoint:
    """An installed entry point, as its distribution's ``entry_points.txt`` declares it.

    Attributes:
        name: Its name (``serve``).
        value: What it points at: ``module`` or ``module:attr.path`` (``loopwright_serve``).
        group: Its group (``loopwright``).
    """

    name: str
    value: str
    group: str

    def load(self) -> Any:
        """Import the module the entry point names and return it, or the attribute it names in it.

        :raises ValueError: The value is not of the form ``module[:attr]``.
        :raises ImportError: The module cannot be imported (or what importing it raises).
        :raises AttributeError: The module has no such attribute.
        """
        match = _PATTERN.match(self.value)
        if match is None:
            raise ValueError(f"entry point {self.name!r}: {self.value!r} is not of the form module[:attr]")
        module = importlib.import_module(match.group("module"))
        names = filter(None, (match.group("attr") or "").split("."))
        return functools.reduce(getattr, names, module)


def entry_points(group: str) -> dict[str, Any]:
    """Return the installed entry points of ``group`` by name, as ``importlib.metadata`` finds them.

    Each value has ``name``, ``value``, ``group`` and ``load()``: a :class:`FileEntryPoint`, or
    ``importlib.metadata``'s own ``EntryPoint`` where the search is left to it (see the
    module's docstring).
    """
    found = _scan(group)
    if found is None:
        import importlib.metadata  # noqa: PLC0415 - only where the fast search could differ from it

        return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}
    return found


def _scan(group: str) -> dict[str, Any] | None:
    """Return the entry points of ``group`` read from the metadata folders, or ``None`` to ask importlib.metadata."""
    if any(getattr(f, "find_distributions", None) is not None and f is not PathFinder for f in sys.meta_path):
        return None
    seen: set[str] = set()
    out: dict[str, Any] = {}
    for root in sys.path:
        infos = _infos(root)
        if infos is None:
            return None
        for name, folders in infos.items():
            for folder in folders:
                stem = folder.rpartition(".")[0].partition("-")[0]
                if _normalize(stem) != name:  # importlib.metadata would read its METADATA's name
                    return None
                if name in seen:
                    continue
                seen.add(name)
                text = _read(os.path.join(root or ".", folder, "entry_points.txt"))  # noqa: PTH118 - strings, no Path per package
                for ep_name, value in _section(text, group):
                    out[ep_name] = FileEntryPoint(name=ep_name, value=value, group=group)
    return out


def _infos(root: str) -> Mapping[str, list[str]] | None:
    """Return the metadata folders under one sys.path entry by normalized name, in ``importlib.metadata``'s order.

    ``None`` for an entry ``importlib.metadata`` reads in a way this does not (a zip file, an ``.egg``).
    """
    if os.path.basename(root).lower().endswith(".egg"):  # noqa: PTH119 - strings, no Path per folder
        return None
    try:
        children = os.listdir(root or ".")  # noqa: PTH208 - names only, as importlib.metadata lists them
    except OSError:
        # A zip file on the path (importlib.metadata reads it); a missing folder holds nothing.
        return None if os.path.isfile(root) else {}  # noqa: PTH113 - strings, no Path per folder
    infos: dict[str, list[str]] = {}
    for child in children:
        low = child.lower()
        if low.endswith(_SUFFIXES):
            if not child.endswith(_SUFFIXES):  # its name is read from METADATA there: ask importlib.metadata
                return None
            infos.setdefault(_normalize(low.rpartition(".")[0].partition("-")[0]), []).append(child)
    return infos


def _normalize(name: str) -> str:
    """``importlib.metadata.Prepared.normalize``: PEP 503 normalization, with underscores."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _read(path: str) -> str:
    """Return a metadata file's text, or ``""`` where ``importlib.metadata`` finds none (missing, unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:  # noqa: PTH123 - no pathlib on this path (the point of the module)
            return f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        return ""


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """Return the ``(name, value)`` pairs of section ``[group]`` of an ``entry_points.txt``, in order."""
    if f"[{group}]" not in text:
        return []
    pairs: list[tuple[str, str]] = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        if section == group:
            name, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"invalid entry point line {line!r} in [{group}]")
            pairs.append((name.strip(), value.strip()))
    return pairs
