"""The core's layers (docs/architecture.md) hold: ``lint-imports`` keeps the contract in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "src" / "loopwright"


def _contract(container: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c.get("containers") == [container]]
    return contract


def _lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is missing: it comes with the dev group (uv sync --all-packages)"
    return found


def test_the_layers_contract_is_kept() -> None:
    """Every module of the core imports only the layers below its own, at run time (inside functions too)."""
    proc = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def _layered(container: str) -> set[str]:
    return {name.strip() for layer in _contract(container)["layers"] for name in layer.split("|")}


def test_every_module_of_the_core_has_a_layer() -> None:
    """A new module of the core gets a layer: the contract names every top-level module and package."""
    modules = {p.stem for p in CORE.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()}
    assert _layered("loopwright") == modules | packages


def test_every_module_of_the_cli_has_a_layer() -> None:
    """The CLI's own contract names each of its private modules."""
    modules = {p.stem for p in (CORE / "cli").glob("_*.py") if p.stem not in ("__init__", "__main__")}
    assert _layered("loopwright.cli") == modules
