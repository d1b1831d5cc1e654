"""Count what issue 9 measures in the core: imports inside functions, import cycles, largest module and class.

Usage: ``python scripts/architecture_counts.py [--list]`` from the repository root. ``--list`` prints
each import inside a function with its comment, so a reviewer can check each says why it is there.

- *imports inside functions*: ``import``/``from ... import`` statements in a function body, not under
  ``if TYPE_CHECKING:``;
- *cycles*: strongly connected components of the graph of module-level (run-time) imports between
  ``loopwright`` modules, plus those that appear once imports inside functions count too;
- *private attribute accesses*: ``x._name`` where ``x`` is not ``self``/``cls`` (best effort: an
  attribute of another object or module, not a dunder).
"""

# A command-line script that prints its report, not a package module.
# ruff: noqa: T201

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "core" / "src"


def module_name(path: Path) -> str:
    """Return the dotted name of the module at ``path``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """Return the absolute module a ``from`` import names."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


class Visitor(ast.NodeVisitor):
    """Collects imports (top level or inside a function) and private attribute accesses."""

    def __init__(self, module: str, is_package: bool, modules: set[str]) -> None:
        self.module, self.is_package, self.modules = module, is_package, modules
        self.depth = 0
        self.top: set[str] = set()
        self.inner: set[str] = set()
        self.inner_lines: list[int] = []
        self.private: list[int] = []

    def targets(self, node: ast.Import | ast.ImportFrom) -> set[str]:
        """Return the core modules an import statement names."""
        names: set[str] = set()
        if isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        else:
            base = resolve(self.module, node, self.is_package)
            names = {base}
            names |= {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in self.modules}
        return {name for name in names if name in self.modules}

    def visit_If(self, node: ast.If) -> None:
        """Skip the body of ``if TYPE_CHECKING:`` (it never runs)."""
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """Note that imports below are inside a function."""
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        """Count an import, at the top level or inside a function."""
        if self.depth:
            self.inner_lines.append(node.lineno)
            self.inner |= self.targets(node)
        else:
            self.top |= self.targets(node)

    visit_ImportFrom = visit_Import  # noqa: N815

    def visit_Attribute(self, node: ast.Attribute) -> None:
        """Count ``x._name`` where ``x`` is not ``self`` or ``cls``."""
        name = node.attr
        if name.startswith("_") and not name.startswith("__") and not (
            isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        ):
            self.private.append(node.lineno)
        self.generic_visit(node)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:  # noqa: C901 - Tarjan's algorithm in one piece
    """Return the strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def parents(module: str) -> set[str]:
    """Return the packages importing ``module`` runs first (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def main() -> None:
    """Print the counts."""
    paths = sorted((ROOT / "loopwright").rglob("*.py"))
    modules = {module_name(path) for path in paths}
    top: dict[str, set[str]] = {}
    every: dict[str, set[str]] = {}
    inner_total = private_total = 0
    sizes: list[tuple[int, str]] = []
    classes: list[tuple[int, str]] = []
    listing: list[str] = []
    for path in paths:
        name = module_name(path)
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        visitor = Visitor(name, path.name == "__init__.py", modules)
        visitor.visit(tree)
        # A package's own modules import the package first, but that is no edge back to them.
        top[name] = {t for t in visitor.top if t != name and t not in parents(name)}
        every[name] = top[name] | {t for t in visitor.inner if t != name and t not in parents(name)}
        inner_total += len(visitor.inner_lines)
        private_total += len(visitor.private)
        listing += [f"{path.relative_to(ROOT.parent.parent)}:{n}: {lines[n - 1].strip()}" for n in visitor.inner_lines]
        sizes.append((len(lines), name))
        classes += [(node.end_lineno - node.lineno + 1, f"{name}.{node.name}")
                    for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    if "--list" in sys.argv:
        print("\n".join(listing))
    print(f"imports inside functions: {inner_total}")
    print(f"private attribute accesses on other objects (best effort): {private_total}")
    print(f"largest modules: {', '.join(f'{m} ({n})' for n, m in sorted(sizes, reverse=True)[:3])}")
    print(f"largest classes: {', '.join(f'{c} ({n})' for n, c in sorted(classes, reverse=True)[:3])}")
    print(f"cycles at import time: {cycles(top) or 'none'}")
    print(f"cycles counting imports inside functions: {cycles(every) or 'none'}")


if __name__ == "__main__":
    main()
