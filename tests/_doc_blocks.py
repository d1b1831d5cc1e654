"""Collect the command and program blocks of the docs, and run them in a scratch project.

Used by ``tests/test_doc_blocks.py``, which documents the markers. Run as a script
(``python _doc_blocks.py BLOCK.py``), it executes one python block as a program, as a reader who
saved it in the current folder and ran ``python BLOCK.py`` there would (so the folder's modules
import; top-level ``await`` is a ``SyntaxError``, as it is for ``python``: a block is a complete
program), then checks that every ``loopwright_*`` hook implementation the block defines names a
real hookspec and only arguments that hookspec passes.
"""

from __future__ import annotations

import inspect
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LANGUAGES = ("bash", "console", "sh", "python")
#: A hang guard only: the slowest block takes a few seconds.
TIMEOUT = 120

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_MARKER = re.compile(r"^\s*<!-- (run by|not run|save as): (.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and the marker comments just above it."""

    page: str  #: relative to the repository, e.g. ``docs/cli.md``
    line: int  #: the line of the opening fence (1-based)
    language: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)  #: ``{"run by"|"not run"|"save as": value}``

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first_code_line(self) -> str:
        for line in self.text.splitlines():
            stripped = line.strip().removeprefix("$ ").strip()
            if stripped and not stripped.startswith("#"):
                return stripped
        return ""


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def collect(page: Path, languages: tuple[str, ...] | None = None) -> list[Block]:
    """Every fenced block of ``page`` (of ``languages``, all when None), with the markers above it.

    The markers are the ``<!-- KEY: VALUE -->`` lines directly above the fence (a run of them,
    read upwards until the first line that is not such a comment).
    """
    lines = page.read_text(encoding="utf-8").splitlines()
    rel = page.relative_to(ROOT).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language = fence.groups()
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        assert j < len(lines), f"{rel}:{i + 1}: the block is never closed"
        body = [line.removeprefix(indent) for line in lines[i + 1 : j]]
        markers: dict[str, str] = {}
        k = i - 1
        while k >= 0 and lines[k].strip().startswith("<!--"):
            marker = _MARKER.match(lines[k])
            if marker:
                assert marker.group(1) not in markers, f"{rel}:{i + 1}: two '{marker.group(1)}' markers"
                markers[marker.group(1)] = marker.group(2)
            k -= 1
        if languages is None or language in languages:
            found.append(Block(rel, i + 1, language, "\n".join(body) + "\n", markers))
        i = j + 1
    return found


# -- output comparison ------------------------------------------------------------------------------

_VOLATILE = [
    (re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{8}\b"), "<ID>"),  # instance ids
    (re.compile(r"\blw-\d+-\d+-[0-9a-f]{6}\b"), "<CALL>"),  # tool call ids
    (re.compile(r"\b[0-9a-f]{64}\b"), "<DIGEST>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?Z?( UTC)?"), "<TIME>"),
    (re.compile(r"\$\d+\.\d+"), "<COST>"),
    (re.compile(r'"(cost|subtreeCost|duration)":( ?)[-\d.e]+'), r'"\1":\2<N>'),
    (re.compile(r'"(inputTokens|outputTokens|totalTokens)":( ?)\d+'), r'"\1":\2<N>'),
    (re.compile(r"\b\d+ tokens \(\d+ in, \d+ out\)"), "<N> tokens"),
    (re.compile(r"(?m)^(tokens\s+)\d+ \(\d+ in, \d+ out\)"), r"\1<N> tokens"),
]


def normalize(text: str) -> str:
    """``text`` with ids, digests, times, costs and token counts replaced, and runs of spaces made one."""
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return "\n".join(re.sub(r"[ \t]+", " ", line).rstrip() for line in text.strip("\n").splitlines())


def output_pattern(expected: str) -> re.Pattern[str]:
    """A regex for the shown output: ``...`` alone on a line stands for any lines, ``...`` in one for any text."""
    parts = []
    for line in normalize(expected).splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        parts.append(".*".join(re.escape(piece) for piece in line.split("...")) + "\n")
    return re.compile("".join(parts), re.DOTALL)


def matches(expected: str, actual: str) -> bool:
    return output_pattern(expected).fullmatch(normalize(actual) + "\n") is not None


# -- the scratch project of one page ------------------------------------------------------------------


def clean_env(home: Path) -> dict[str, str]:
    """The environment after ``source .venv/bin/activate``: the venv first on PATH, no LOOPWRIGHT_*."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPWRIGHT_", "VIRTUAL_ENV", "PYTHON"))}
    return {
        **base,
        "PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}",
        "HOME": str(home),
        "VIRTUAL_ENV": str(BIN.parent),
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }


class Project:
    """A page's scratch project: a folder, a HOME, and the shell state (variables, cwd) blocks share.

    Each shell command runs in a fresh ``bash``; the variables it sets (``ID=$(...)``) and the folder
    it ``cd``'s into carry over to the next block, as in one terminal.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.home = folder / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.state = folder / ".shell-state"
        self.cwd_file = folder / ".shell-cwd"
        self.cwd_file.write_text(str(folder / "project"), encoding="utf-8")
        (folder / "project").mkdir(exist_ok=True)
        self.env = clean_env(self.home)

    @property
    def cwd(self) -> Path:
        return Path(self.cwd_file.read_text(encoding="utf-8").strip())

    def shell(self, script: str, *, strict: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``script`` with bash in the shared state; stdout and stderr together in ``.stdout``."""
        prelude = (
            f"set -a\n[ -f {shlex.quote(str(self.state))} ] && source {shlex.quote(str(self.state))}\n"
            f"trap 'export -p > {shlex.quote(str(self.state))}; pwd > {shlex.quote(str(self.cwd_file))}' EXIT\n"
            + ("set -eo pipefail\n" if strict else "")
        )
        return subprocess.run(
            ["bash", "-c", prelude + script],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def save(self, block: Block) -> None:
        target = self.cwd / block.markers["save as"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")

    def python(self, block: Block) -> subprocess.CompletedProcess[str]:
        script = self.folder / f"block_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        return subprocess.run(
            [sys.executable, __file__, str(script)],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def run(self, block: Block) -> str | None:
        """Run one block (or save it, with ``save as``); what went wrong, naming the block, or None."""
        if "save as" in block.markers:
            self.save(block)
            return None
        if block.language in {"bash", "sh", "python"}:
            done = self.python(block) if block.language == "python" else self.shell(block.text)
            return None if done.returncode == 0 else f"{block.where}: exit {done.returncode}\n{done.stdout}"
        if block.language == "console":
            for command, expected in console_steps(block.text):
                done = self.shell(command, strict=False)
                if expected.strip():
                    if not matches(expected, done.stdout):
                        return (
                            f"{block.where}: $ {command}\nexpected (ids, times, costs, tokens aside):\n{expected}\n"
                            f"got (exit {done.returncode}):\n{done.stdout}"
                        )
                elif done.returncode != 0:
                    return f"{block.where}: $ {command}: exit {done.returncode}\n{done.stdout}"
            return None
        return f"{block.where}: no way to run a {block.language!r} block"


def console_steps(text: str) -> list[tuple[str, str]]:
    """The ``$ `` commands of a console block, each with the output shown under it."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"output before the first command: {line!r}"
            steps[-1][1].append(line)
    return [(command, "\n".join(out)) for command, out in steps]


# -- running one python block ---------------------------------------------------------------------------


def _check_hookimpls(namespace: dict[str, object]) -> list[str]:
    """The problems of the ``loopwright_*`` hook implementations defined in ``namespace``."""
    from loopwright import hookspecs  # noqa: PLC0415

    problems = []
    candidates: list[object] = list(namespace.values())
    candidates += [v for c in namespace.values() if inspect.isclass(c) for v in vars(c).values()]
    for value in candidates:
        name = getattr(value, "__name__", "")
        if not (inspect.isfunction(value) and name.startswith("loopwright_")):
            continue
        spec = getattr(hookspecs, name, None)
        if spec is None:
            problems.append(f"{name} is not a loopwright hookspec")
            continue
        allowed = set(inspect.signature(spec).parameters)
        extra = [p for p in inspect.signature(value).parameters if p not in allowed | {"self"}]
        if extra:
            problems.append(f"{name} takes {extra}, which the hookspec does not pass (it has {sorted(allowed)})")
    return problems


def _main(path: str) -> int:
    sys.path[0] = str(Path.cwd())  # not this script's folder: the block's, as if it were saved here
    sys.argv = [path]
    namespace = runpy.run_path(path, run_name="__main__")
    problems = _check_hookimpls(namespace)
    for problem in problems:
        print(f"hookimpl: {problem}", file=sys.stderr)  # noqa: T201 - this script's report
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
