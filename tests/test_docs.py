"""The docs keep up with the code: every hookspec is documented with its signature."""

from __future__ import annotations

import inspect
from pathlib import Path

import loopwright
from loopwright import hookspecs

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _specs() -> list[str]:
    return [n for n in dir(hookspecs) if n.startswith("loopwright_") and callable(getattr(hookspecs, n))]


def test_every_hookspec_has_a_heading_with_its_signature() -> None:
    """docs/hooks.md has a `### name(arg, ...)` heading for each hookspec, arguments in order."""
    text = (DOCS / "hooks.md").read_text()
    missing = []
    for name in _specs():
        args = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        if f"### {name}({args})" not in text:
            missing.append(f"{name}({args})")
    assert not missing, f"undocumented hooks: {missing}"


def test_hookspecs_groups_cover_every_spec() -> None:
    """Each hookspec is classed as a registration, an interceptor or an observer."""
    grouped = set(hookspecs.REGISTRATIONS) | set(hookspecs.INTERCEPTORS) | set(hookspecs.OBSERVERS)
    assert grouped == set(_specs())


def test_public_all_is_sorted_and_complete() -> None:
    """loopwright.__all__ is sorted and every name in it resolves."""
    assert loopwright.__all__ == sorted(loopwright.__all__)
    for name in loopwright.__all__:
        assert getattr(loopwright, name) is not None
