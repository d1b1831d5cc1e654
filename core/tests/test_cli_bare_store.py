"""``ls`` and ``show`` without a runtime (issue 10, item 7): the same bytes, codes and errors as through one.

On an assembly a bare store serves (:func:`loopwright._reading.bare_store`), ``ls`` and ``show`` read
the store without opening a runtime. Blocking a built-in plugin that reading does not use
(``LOOPWRIGHT_DISABLE_PLUGINS``) sends the same commands through a runtime, as every command went
before: each case here runs both ways and compares stdout, stderr and the exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loopwright._definition import Assembly, Capabilities, EngineConfig, FileGrants, PluginSpec, StoreConfig
from loopwright._reading import BareStore, bare_store

#: Sends ``ls`` and ``show`` through a runtime: a built-in plugin blocked, one that reading does not use.
THROUGH_A_RUNTIME = {"LOOPWRIGHT_DISABLE_PLUGINS": "loopwright.builtins.context"}


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``loopwright ARGS`` in ``cwd``; return its exit code, stdout and stderr."""
    full = {**os.environ, "NO_COLOR": "1"}
    full.pop("LOOPWRIGHT_DISABLE_PLUGINS", None)
    full.update(env or {})
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A folder with a file-store assembly, one instance run in it (its id), and assemblies of other kinds."""
    cwd = tmp_path_factory.mktemp("bare")
    (cwd / "loopwright.yaml").write_text("store: {kind: file, path: ./store}\ndefaultModel: test:any\n")
    (cwd / "bench.yaml").write_text("name: bench\nsystemPrompt: You answer.\n")
    code, out, err = cli(cwd, "--json", "run", "bench.yaml", "-p", "hello")
    assert code == 0, err
    (cwd / "sqlite.yaml").write_text("store: {kind: sqlite, path: ./db.sqlite}\ndefaultModel: test:any\n")
    assert cli(cwd, "-c", "sqlite.yaml", "run", "bench.yaml", "-p", "hello")[0] == 0
    (cwd / "granted.yaml").write_text("store: {kind: file, path: ./store}\ncapabilities: {files: {read: [.]}}\n")
    (cwd / "bad-options.yaml").write_text("store: {kind: file, path: ./store, fsync: 3, colour: red}\n")
    (cwd / "bad-sqlite.yaml").write_text("store: {kind: sqlite, synchronous: sometimes}\n")
    (cwd / "unknown-kind.yaml").write_text("store: {kind: nosuchstore}\n")
    (cwd / "invalid.yaml").write_text("store: {kind: file}\nlimits: {maxIterations: zero}\n")
    (cwd / "engine.yaml").write_text("store: {kind: file, path: ./store}\nengine: {kind: local, workers: 2}\n")
    return cwd, json.loads(out)["instanceId"]


CASES = [
    ("ls",), ("--json", "ls"), ("ls", "--tree"), ("--json", "ls", "--tree"), ("ls", "--state", "waiting"),
    ("ls", "--state", "error"), ("show", "{id}"), ("--json", "show", "{id}"), ("show", "nope"),
    ("show", "../etc"), ("--json", "show", "nope"),
    ("-c", "sqlite.yaml", "ls"), ("-c", "sqlite.yaml", "--json", "ls", "--tree"), ("-c", "sqlite.yaml", "show", "nope"),
    ("-c", "granted.yaml", "ls"), ("-c", "bad-options.yaml", "ls"), ("-c", "bad-sqlite.yaml", "show", "x"),
    ("-c", "unknown-kind.yaml", "ls"), ("-c", "invalid.yaml", "ls"), ("-c", "engine.yaml", "ls"),
    ("-c", "missing.yaml", "ls"),
]


@pytest.mark.parametrize("args", CASES, ids=" ".join)
def test_the_same_answer_with_and_without_a_runtime(project: tuple[Path, str], args: tuple[str, ...]) -> None:
    """Each case prints the same bytes on stdout and stderr, and exits with the same code, both ways."""
    cwd, instance = project
    argv = [a.format(id=instance) for a in args]
    bare = cli(cwd, *argv)
    through = cli(cwd, *argv, env=THROUGH_A_RUNTIME)
    assert bare == through


def test_a_shown_instance_is_the_one_run(project: tuple[Path, str]) -> None:
    """The cases above compare two real answers: ``show`` finds the instance, and errors say what they did."""
    cwd, instance = project
    code, out, _ = cli(cwd, "--json", "show", instance)
    assert (code, json.loads(out)["instanceId"]) == (0, instance)
    code, _, err = cli(cwd, "-c", "granted.yaml", "ls")
    assert code == 2
    assert "store" in err


def assembly(tmp_path: Path, **fields: Any) -> Assembly:
    fields.setdefault("store", StoreConfig(options={"path": str(tmp_path / "store")}))
    return Assembly(path=tmp_path / "loopwright.yaml", **fields)


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_built_in_store_alone_is_served_bare(tmp_path: Path, kind: str) -> None:
    """``file`` and ``sqlite`` stores, with nothing else to open, are built bare; the file store's reads run inline."""
    found = bare_store(assembly(tmp_path, store=StoreConfig(kind=kind, options={"path": str(tmp_path / "s")})))
    assert isinstance(found, BareStore)
    assert found.inline is (kind == "file")

    async def query(store: Any) -> list[dict[str, Any]]:
        return await store.list_headers()

    assert found.run(query) == []


@pytest.mark.parametrize("fields", [
    {"plugins": ("some_plugin",)},
    {"records": (PluginSpec(kind="jsonl", options={"path": "r.jsonl"}),)},
    {"engine": EngineConfig(kind="temporal")},
    {"engine": EngineConfig(options={"workers": 2})},
    {"disable_plugins": ("loopwright.builtins.tools",)},
    {"store": StoreConfig(kind="postgres")},
    {"store": StoreConfig(options={"fsync": "yes"})},
], ids=["plugins", "records", "engine", "engine options", "blocked built-in", "plugin store", "bad options"])
def test_anything_more_to_open_needs_a_runtime(tmp_path: Path, fields: dict[str, Any]) -> None:
    """Plugins, record sinks, another engine, a blocked built-in, a plugin's store or bad options: ``None``."""
    assert bare_store(assembly(tmp_path, **fields)) is None


def test_a_store_inside_a_granted_root_needs_a_runtime(tmp_path: Path) -> None:
    """The runtime refuses a store inside a granted root; the bare path leaves that refusal to it."""
    grants = Capabilities(files=FileGrants(read=(str(tmp_path),)))
    assert bare_store(assembly(tmp_path, capabilities=grants)) is None
    assert bare_store(assembly(tmp_path)) is not None


def test_a_blocked_built_in_in_the_environment_needs_a_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LOOPWRIGHT_DISABLE_PLUGINS`` blocks as ``disablePlugins`` does: a built-in in it needs a runtime."""
    monkeypatch.setenv("LOOPWRIGHT_DISABLE_PLUGINS", " other, loopwright.builtins.file_store ")
    assert bare_store(assembly(tmp_path)) is None
    monkeypatch.setenv("LOOPWRIGHT_DISABLE_PLUGINS", "other")
    assert bare_store(assembly(tmp_path)) is not None
