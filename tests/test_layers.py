"""The core's layers (docs/architecture.md) hold: ``lint-imports`` keeps the contract in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "src" / "loopwright"


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
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
    assert "1 kept, 0 broken" in proc.stdout


def test_every_module_of_the_core_has_a_layer() -> None:
    """A new module of the core gets a layer: the contract names every top-level module and package."""
    layered = {name.strip() for layer in _contract()["layers"] for name in layer.split("|")}
    modules = {p.stem for p in CORE.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()}
    assert layered == modules | packages
