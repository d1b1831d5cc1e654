"""Tools and a tools plugin for the loopwright-testing tests (a uniquely named module, not conftest)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import loopwright

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["ToolsPlugin", "add", "run_pytest", "shout"]


def run_pytest(folder: Path, source: str) -> str:
    """Run pytest in a fresh process on ``source`` written to ``folder/test_project.py``; return its output.

    (The ``pytester`` fixture would need ``pytest_plugins`` in the root conftest, which is not ours.)
    """
    (folder / "test_project.py").write_text(textwrap.dedent(source), encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(folder),
            str(folder),
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return done.stdout + done.stderr


@loopwright.tool(parallel_safe=True)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@loopwright.tool(parallel_safe=True)
def shout(word: str, times: int = 1) -> str:
    """Repeat a word in capitals.

    Args:
        word: The word.
        times: How many times.
    """
    return " ".join([word.upper()] * times)


class ToolsPlugin:
    """Registers the test tools ``add`` and ``shout``, and counts their calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @loopwright.hookimpl
    def loopwright_register_tools(self, register):
        register(add, shout)

    @loopwright.hookimpl
    def loopwright_after_tool_call(self, call):
        self.calls.append(call.name)
