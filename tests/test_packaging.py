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


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def changelog_sections(text: str) -> list[str]:
    """The names of CHANGELOG.md's ``## [...]`` sections, top first."""
    return re.findall(r"^## \[([^\]]+)\]", text, re.MULTILINE)


def changelog_problems(text: str, version: str) -> list[str]:
    """What keeps CHANGELOG.md from being in step with ``version`` (nothing when it is)."""
    sections = changelog_sections(text)
    problems = []
    if not sections or sections[0] not in {"Unreleased", version}:
        problems.append(f"the first section is {sections[:1]}, not [Unreleased] or [{version}]")
    if version not in sections:
        problems.append(f"no section [{version}]")
    released = [s for s in sections if s != "Unreleased"]
    if released != sorted(released, key=_version_key, reverse=True):
        problems.append(f"the versions are not newest first: {released}")
    newer = [s for s in released if _version_key(s) > _version_key(version)]
    if newer:
        problems.append(f"sections for versions newer than {version}: {newer}")
    return problems


def test_the_changelog_is_in_step_with_the_version() -> None:
    """CHANGELOG.md opens with [Unreleased] or the version, lists versions newest first, none newer than it."""
    version = projects()["loopwright"]["version"]
    assert changelog_problems((ROOT / "CHANGELOG.md").read_text(), version) == []


def test_the_changelog_check_finds_skew() -> None:
    """A changelog that names a newer version, or lacks the current one, is reported."""
    good = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-01\n\n## [0.1.0]\n"
    assert changelog_problems(good, "0.2.0") == []
    assert changelog_problems(good, "0.3.0") == ["no section [0.3.0]"]
    assert changelog_problems(good, "0.1.0") == ["sections for versions newer than 0.1.0: ['0.2.0']"]
    assert changelog_problems("## [0.1.0]\n\n## [0.2.0]\n", "0.2.0")[0].startswith("the first section")


def test_uv_lock_records_the_same_version() -> None:
    """uv.lock lists every first-party distribution at the pyprojects' version (a bump needs ``uv lock``)."""
    version = projects()["loopwright"]["version"]
    locked = {p["name"]: p.get("version") for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    assert {name: locked.get(name) for name in first_party()} == dict.fromkeys(first_party(), version)


def test_the_install_page_quotes_the_version() -> None:
    """Every pin docs/install.md shows (``loopwright-core==X``, ``loopwright==X``) is the current version."""
    version = projects()["loopwright"]["version"]
    text = (ROOT / "docs" / "install.md").read_text()
    pins = re.findall(r"loopwright(?:-[a-z]+)?(?:\[[a-z,]+\])?==([0-9][0-9.]*[0-9])", text)
    assert pins, "docs/install.md quotes no pinned version"
    assert set(pins) == {version}, pins


def test_the_release_workflow_publishes_with_trusted_publishing() -> None:
    """release.yml runs the release check, and publishes from a job holding ``id-token: write``, with no token."""
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert "bash scripts/release_check.sh" in workflow
    publish = workflow.split("\n  publish:\n", 1)[1]
    assert "id-token: write" in publish
    assert "uses: pypa/gh-action-pypi-publish@release/v1" in publish
    assert "password" not in publish, "trusted publishing needs no API token"
