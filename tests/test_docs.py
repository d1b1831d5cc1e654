"""The docs keep up with the code: every hookspec is documented with its signature."""

from __future__ import annotations

import inspect
import re
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
    """Each hookspec has one rule in hookspecs.HOOKS: a registration, an interceptor or an observer."""
    assert set(hookspecs.HOOKS) == set(_specs())


_SECTIONS = {
    hookspecs.HookKind.REGISTRATION: "## Registration hooks",
    hookspecs.HookKind.INTERCEPTOR: "## Interceptors",
    hookspecs.HookKind.OBSERVER: "## Observers",
}
_DECISION_RE = re.compile(r"`(Modify[A-Za-z]+|Block|Respond|RequireApproval)\(")


def _hook_sections() -> dict[str, tuple[str, str]]:
    """Return ``{hook: (its "## " section heading, its text)}`` from docs/hooks.md."""
    out: dict[str, tuple[str, str]] = {}
    section = ""
    hook = None
    for line in (DOCS / "hooks.md").read_text().splitlines():
        if line.startswith("## "):
            section, hook = line, None
        elif line.startswith("### loopwright_"):
            hook = line[4:].split("(")[0]
            out[hook] = (section, "")
        elif hook is not None:
            out[hook] = (section, out[hook][1] + line + "\n")
    return out


def test_hooks_md_follows_the_table() -> None:
    """docs/hooks.md lists each hook under its kind's section, and each interceptor's decisions are the table's."""
    sections = _hook_sections()
    for name, rule in hookspecs.HOOKS.items():
        section, text = sections[name]
        assert section == _SECTIONS[rule.kind], name
        if rule.kind is hookspecs.HookKind.INTERCEPTOR:
            decisions = text.split("Decisions:", 1)[1]
            assert set(_DECISION_RE.findall(decisions)) == {d.__name__ for d in rule.decisions}, name


def test_public_all_is_sorted_and_complete() -> None:
    """loopwright.__all__ is sorted and every name in it resolves."""
    assert loopwright.__all__ == sorted(loopwright.__all__)
    for name in loopwright.__all__:
        assert getattr(loopwright, name) is not None
