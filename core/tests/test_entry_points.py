"""Entry points read without importlib.metadata (issue 30): the same ones importlib.metadata finds, or its own.

:func:`loopwright._entry_points.entry_points` reads the metadata folders of :data:`sys.path`
itself; wherever its search could differ (a zip on the path, a metadata folder whose name does
not give the distribution's), it asks importlib.metadata. Each case is compared with
importlib.metadata on real folders.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loopwright._entry_points import FileEntryPoint, _scan, entry_points


def metadata(group: str) -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}


def ours(group: str) -> dict[str, str]:
    return {name: ep.value for name, ep in entry_points(group).items()}


def dist(root: Path, folder: str, text: str | None, *, name: str | None = None) -> None:
    d = root / folder
    d.mkdir(parents=True)
    name = name or folder.split("-", maxsplit=1)[0]
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1\n")
    if text is not None:
        (d / "entry_points.txt").write_text(text)


@pytest.mark.parametrize("group", ["loopwright", "console_scripts", "pytest11", "no-such-group"])
def test_the_installed_entry_points_are_importlib_metadatas(group: str) -> None:
    """In this environment every group reads as importlib.metadata reads it, without asking it."""
    assert _scan(group) is not None
    assert ours(group) == metadata(group)


def test_folders_on_the_path_are_read_in_order_first_distribution_of_a_name_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two folders, a distribution in both, comments, other sections, an egg-info, a later name winning."""
    first, second = tmp_path / "a", tmp_path / "b"
    dist(first, "alpha_pkg-1.0.dist-info",
         "# a comment\n[other]\nx = nope\n\n[lwtest]\n  one = alpha:one  \nshared = alpha\n")
    dist(second, "Alpha.Pkg-2.0.dist-info", "[lwtest]\nhidden = alpha2\n")  # the same name normalized: not read
    dist(second, "beta-1.0.dist-info", "[lwtest]\nshared = beta:mod.attr\n")
    dist(second, "gamma.egg-info", "[lwtest]\ngamma = gamma\n")
    dist(second, "delta-1.0.dist-info", None)  # no entry points at all
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(tmp_path / "missing")])
    got = entry_points("lwtest")
    assert all(isinstance(ep, FileEntryPoint) for ep in got.values())
    assert {n: ep.value for n, ep in got.items()} == metadata("lwtest")
    assert set(got) == {"one", "shared", "gamma"}
    assert got["one"].value == "alpha:one"


@pytest.mark.parametrize("odd", ["zip", "case"])
def test_where_the_search_could_differ_importlib_metadata_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: str,
) -> None:
    """A zip on the path, or a folder named ``.DIST-INFO``: importlib.metadata's own entry points, the same."""
    dist(tmp_path / "plain", "plain-1.0.dist-info", "[lwtest]\nplain = plain\n")
    path = [str(tmp_path / "plain")]
    if odd == "zip":
        archive = tmp_path / "z.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\nVersion: 1\n")
            z.writestr("zipped-1.0.dist-info/entry_points.txt", "[lwtest]\nzipped = zipped\n")
        path.append(str(archive))
    else:
        dist(tmp_path / "odd", "Odd-1.0.DIST-INFO", "[lwtest]\nodd = odd\n", name="odd")
        path.append(str(tmp_path / "odd"))
    monkeypatch.setattr(sys, "path", path)
    assert _scan("lwtest") is None
    got = entry_points("lwtest")
    assert {n: ep.value for n, ep in got.items()} == metadata("lwtest")
    assert len(got) == 2


def test_an_entry_point_loads_its_module_or_the_attribute_it_names() -> None:
    """``module``, ``module:attr.path``; a malformed value is refused with its name."""
    assert FileEntryPoint(name="j", value="json", group="g").load() is sys.modules["json"]
    assert FileEntryPoint(name="d", value="json : JSONDecoder.decode", group="g").load() is (
        sys.modules["json"].JSONDecoder.decode)
    with pytest.raises(ValueError, match="'bad'"):
        FileEntryPoint(name="bad", value="not a value!", group="g").load()
    with pytest.raises(ModuleNotFoundError):
        FileEntryPoint(name="m", value="no_such_module_lw:x", group="g").load()


def test_reading_entry_points_imports_no_importlib_metadata() -> None:
    """The point of the module: ``loopwright plugins``, ``run`` start without importlib.metadata."""
    code = ("import sys; from loopwright._plugins import _entry_points; eps = _entry_points(); "
            "assert 'testing' in eps, eps; print('importlib.metadata' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
