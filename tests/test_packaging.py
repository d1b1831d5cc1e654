"""The distributions are versioned together: one version, pinned exactly by the meta-package.

``scripts/pip_install_check.sh`` (run by .ci/run) checks that the wheels install with plain pip;
these checks keep the metadata it relies on consistent, and CHANGELOG.md in step with it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The provider guide's example of a third party's package: it has its own version on purpose.
THIRD_PARTY = {"loopwright-example-echo"}


def projects() -> dict[str, dict]:
    paths = [ROOT / "pyproject.toml", ROOT / "core" / "pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml"))]
    found = {}
    for path in paths:
        project = tomllib.loads(path.read_text())["project"]
        found[project["name"]] = project
    return found


def first_party() -> dict[str, dict]:
    return {name: p for name, p in projects().items() if name not in THIRD_PARTY}


def test_one_version_for_every_first_party_distribution() -> None:
    versions = {name: p["version"] for name, p in first_party().items()}
    assert len(set(versions.values())) == 1, versions


def test_the_meta_package_pins_its_siblings_exactly() -> None:
    version = projects()["loopwright"]["version"]
    meta = projects()["loopwright"]
    requirements = [*meta["dependencies"], *(r for extra in meta["optional-dependencies"].values() for r in extra)]
    named = {}
    for req in requirements:
        name, _, spec = re.match(r"([A-Za-z0-9_.-]+)(?:\[[A-Za-z0-9_,-]+\])?(\s*(.*))", req).groups()
        named[name] = spec.strip()
    assert set(named) == set(first_party()) - {"loopwright"}, "every first-party distribution is a dependency or extra"
    assert all(spec == f"=={version}" for spec in named.values()), named


def test_plugins_require_the_core_of_their_minor_version() -> None:
    major, minor, _patch = projects()["loopwright"]["version"].split(".")
    expected = f"loopwright-core>={major}.{minor}.0,<{major}.{int(minor) + 1}"
    for name, project in first_party().items():
        if name in {"loopwright", "loopwright-core"}:
            continue
        assert expected in project["dependencies"], (name, project["dependencies"])


def test_the_changelog_has_a_section_for_the_version() -> None:
    version = projects()["loopwright"]["version"]
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()
