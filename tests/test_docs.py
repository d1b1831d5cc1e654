"""The docs keep up with the code: every hookspec is documented with its signature, and the docs site
(mkdocs.yml: the pages and the API reference) builds with ``--strict``."""

from __future__ import annotations

import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import loopwright
import loopwright_testing
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


def _isort_style(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps ``__all__`` in: CONSTANTS, then ClassNames, then the rest, each A-Z."""
    if name.isupper():
        return 0, name
    return (1 if name[:1].isupper() else 2), name


def test_public_all_is_sorted_and_complete() -> None:
    """loopwright.__all__ is sorted (as the linter sorts it) and every name in it resolves."""
    assert loopwright.__all__ == sorted(loopwright.__all__, key=_isort_style)
    for name in loopwright.__all__:
        assert getattr(loopwright, name) is not None


# -- the docs site (mkdocs.yml): built with --strict, so a broken link or a stale name fails ---------

ROOT = DOCS.parent
#: Public modules of the core that have no API reference page, and why.
NOT_IN_REFERENCE = {
    "builtins": "plugins registered through entry points; each is documented on its own page (stores, context)",
    "cli": "the command line is its interface, documented in docs/cli.md",
}


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, cwd=config.parent, env=env, timeout=300, check=False)


def _config_for(docs: Path, nav: list[str], tmp_path: Path) -> Path:
    """Write mkdocs.yml with its paths made absolute, for ``docs`` holding only ``nav``'s pages."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["nav"] = nav
    config["hooks"] = [str(ROOT / hook) for hook in config["hooks"]]
    python = next(p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict))["handlers"]["python"]
    python["paths"] = [str(ROOT / p) for p in python["paths"]]
    python["options"]["extensions"] = [str(ROOT / e) for e in python["options"]["extensions"]]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict`` passes: links, anchors, the nav and the API reference's names all resolve."""
    out = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    for module, page in ((loopwright, "loopwright"), (loopwright_testing, "testing")):
        html = (tmp_path / "site" / "reference" / page / "index.html").read_text()
        missing = [n for n in module.__all__ if f'id="{module.__name__}.{n}"' not in html]
        assert not missing, f"reference/{page}.md renders no entry for {missing}"


@pytest.mark.parametrize(("page", "why"), [
    ("[the set-up](b.md#no-such-heading)", "does not contain an anchor '#no-such-heading'"),
    ("[a page](gone.md)", "'gone.md', but the target is not found"),
    ("[a file of the repository](../NO-SUCH-FILE.md)", "'../NO-SUCH-FILE.md', but the target is not found"),
    ("::: loopwright.no_such_module", "no_such_module"),
])
def test_the_strict_build_fails_on_a_broken_reference(tmp_path: Path, page: str, why: str) -> None:
    """The same configuration refuses a broken anchor, a missing page or file, and a module that is gone."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(f"# A\n\n{page}\n")
    (docs / "b.md").write_text("# B\n\n## Set-up\n")
    out = _mkdocs(_config_for(docs, ["a.md", "b.md"], tmp_path), tmp_path / "site")
    assert out.returncode != 0
    assert why in out.stdout + out.stderr


def test_the_strict_build_fails_on_a_page_left_out_of_the_nav(tmp_path: Path) -> None:
    """A page of docs/ that the nav does not list fails the build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    out = _mkdocs(_config_for(docs, ["a.md"], tmp_path), tmp_path / "site")
    assert out.returncode != 0
    assert "orphan.md" in out.stdout + out.stderr


def test_every_public_module_has_a_reference_page() -> None:
    """Each public module of loopwright (no leading underscore) is rendered by a docs/reference page."""
    pages = "".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    modules = {m.name for m in pkgutil.iter_modules(loopwright.__path__) if not m.name.startswith("_")}
    assert set(NOT_IN_REFERENCE) <= modules, "NOT_IN_REFERENCE names a module that is gone"
    missing = [m for m in sorted(modules - set(NOT_IN_REFERENCE)) if f"::: loopwright.{m}\n" not in pages]
    assert not missing, f"no docs/reference page for {missing}"
