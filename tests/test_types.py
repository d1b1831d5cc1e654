"""The core type-checks: ``mypy --strict`` (the root pyproject.toml's ``[tool.mypy]``) over core/src.

It is what makes the typed header hold: ``inst.header`` is :class:`loopwright.HeaderFields`, not a
mapping, so ``inst.header.get("inboxCursor")`` or a misspelt field is a type error here, not a
``KeyError`` (or a silent ``None``) at run time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_core_type_checks_strictly() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "core/src"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_a_string_key_on_the_live_header_is_a_type_error(tmp_path: Path) -> None:
    """The check above can fail: a module that reads the live header by key does not pass it."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from loopwright._instance import Instance\n\n\n"
        "def cursor(inst: Instance) -> object:\n"
        '    return inst.header.get("inboxCursor")\n\n\n'
        "def typo(inst: Instance) -> object:\n"
        "    return inst.header.inbox_cursr\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 1, proc.stdout
    assert '"HeaderFields" has no attribute "get"' in proc.stdout
    assert '"HeaderFields" has no attribute "inbox_cursr"' in proc.stdout
