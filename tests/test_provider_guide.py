"""docs/writing-a-provider.md and plugins/example-echo/ cannot drift apart.

Each code block of the guide that shows a file of the package is preceded by a marker line
``<!-- file: PATH -->`` (PATH relative to the package's folder). The block must hold the file's
exact text, and every file of the package (but its README) must be shown once.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "writing-a-provider.md"
PACKAGE = ROOT / "plugins" / "example-echo"
NOT_SHOWN = {"README.md"}
SKIPPED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}

_MARKER = re.compile(r"^<!-- file: (\S+) -->$")


def shown_files() -> dict[str, list[str]]:
    """Return each marked path with the text of every block shown for it."""
    shown: dict[str, list[str]] = {}
    pending: str | None = None
    block: list[str] | None = None
    for number, line in enumerate(GUIDE.read_text(encoding="utf-8").splitlines(), start=1):
        if block is not None:
            if line.startswith("```"):
                assert pending is not None
                shown.setdefault(pending, []).append("\n".join(block) + "\n")
                pending, block = None, None
            else:
                block.append(line)
            continue
        marker = _MARKER.match(line)
        if marker:
            assert pending is None, f"line {number}: a file marker before the previous one's block"
            pending = marker.group(1)
        elif line.startswith("```") and pending is not None:
            block = []
    assert pending is None, f"the marker for {pending} has no code block after it"
    return shown


def package_files() -> set[str]:
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file()
        and not SKIPPED_PARTS.intersection(path.parts)
        and not path.name.endswith((".pyc", ".egg-info"))
        and ".egg-info" not in path.as_posix()
    }


def test_each_shown_file_matches_the_package() -> None:
    """Every marked code block holds exactly the text of the file it names."""
    shown = shown_files()
    assert shown, "the guide marks no file"
    for rel, blocks in shown.items():
        path = PACKAGE / rel
        assert path.is_file(), f"the guide shows {rel}, which plugins/example-echo does not have"
        for text in blocks:
            assert text == path.read_text(encoding="utf-8"), (
                f"docs/writing-a-provider.md shows {rel} differently from plugins/example-echo/{rel}")


def test_every_file_of_the_package_is_shown_once() -> None:
    """The guide shows each file of the package (its README aside) exactly once."""
    shown = shown_files()
    expected = package_files() - NOT_SHOWN
    assert set(shown) == expected, (
        f"not shown: {sorted(expected - set(shown))}; shown but absent: {sorted(set(shown) - expected)}")
    assert all(len(blocks) == 1 for blocks in shown.values()), "a file is shown twice"


def test_the_guide_names_each_file_above_its_block() -> None:
    """A reader sees the path: each marker is followed by a bold caption with the file's path."""
    lines = GUIDE.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        marker = _MARKER.match(line)
        if marker:
            caption = f"**`{marker.group(1)}`**"
            assert lines[i + 1] == caption, f"line {i + 2}: expected the caption {caption}"


def test_docs_links_resolve() -> None:
    """Relative links in the user docs and the README point at files that exist."""
    docs = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", PACKAGE / "README.md"]
    broken = []
    for doc in docs:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, f"broken links: {broken}"
