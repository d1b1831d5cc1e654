"""What the CLI imports, held structurally (issue 10, item 7): the modules each command leaves in ``sys.modules``.

These tests time nothing (``bench/cli_latency.py`` does): they check that a command imports
only what it needs, which is what keeps it fast. ``ls``, ``show`` and ``records`` import no
plugin, no HTTP stack and no live display; ``--help`` imports no runtime. Entry points load when
a lookup names what they provide, or all of them once an instance runs (their hooks take part
in every run; :mod:`loopwright._plugins`), checked here with entry points of our own.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import loopwright
from loopwright import _plugins
from loopwright._definition import Assembly, Definition, StoreConfig
from loopwright.errors import PluginError

#: Runs the CLI with ``sys.argv[2:]`` and writes the names in ``sys.modules`` at exit to ``sys.argv[1]``.
WRAPPER = """
import atexit, json, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["loopwright", *sys.argv[2:]]
runpy.run_module("loopwright.cli", run_name="__main__")
"""

#: Modules no store-reading command needs: the plugins of plugins/*, HTTP stacks, the live display,
#: the work of the commands that start, steer or serve runs or check the set-up.
NOT_FOR_READING = ("loopwright_", "aiohttp", "httpx", "starlette", "uvicorn", "importlib.metadata",
                   "loopwright.cli._progress", "loopwright.cli._worker", "loopwright.cli._running",
                   "loopwright.cli._steer", "loopwright.cli._serving", "loopwright.cli._checks",
                   "loopwright.cli._following", "loopwright.cli._displays")



def imported(cwd: Path, *args: str) -> set[str]:
    """Run ``loopwright ARGS`` in ``cwd`` as a subprocess; return the modules it had imported at exit."""
    out = cwd / "modules.json"
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(out), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return set(json.loads(out.read_text()))


def matching(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.startswith(prefixes))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A folder with an assembly (file store, ``test:any``) and one instance run in it; its id."""
    monkeypatch.delenv("LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("LOOPWRIGHT_DISABLE_PLUGINS", raising=False)
    (tmp_path / "loopwright.yaml").write_text("store: {kind: file, path: ./store}\ndefaultModel: test:any\n")
    (tmp_path / "bench.yaml").write_text("name: bench\nsystemPrompt: You answer.\n")
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", "--json", "run", "bench.yaml", "-p", "hello"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    return tmp_path, json.loads(done.stdout)["instanceId"]


def test_ls_imports_no_plugin_and_no_http_stack(project: tuple[Path, str]) -> None:
    """``ls`` on a file store imports no entry-point plugin, no HTTP client or server, no live display."""
    cwd, _ = project
    modules = imported(cwd, "ls")
    assert "loopwright.builtins.file_store" in modules  # it did read the store
    assert matching(modules, NOT_FOR_READING) == []


def test_reading_a_valid_store_imports_no_jsonschema(project: tuple[Path, str]) -> None:
    """``ls`` and ``show`` on a valid assembly validate it (and the store's options) without jsonschema.

    The schemas compiled ahead of time (``loopwright/_schema_*.py``) pass valid data; jsonschema
    is imported only to word the problems of invalid data.
    """
    cwd, instance = project
    for args in (("ls",), ("show", instance)):
        modules = imported(cwd, *args)
        assert "loopwright._schema_assembly" in modules, args  # it did validate the assembly
        assert matching(modules, ("jsonschema", "referencing")) == [], args


#: What ``ls`` and ``show`` on a file store leave out (issue 10, item 7): the runtime, the engine, the
#: plugin host and the tools, the value objects, any event loop, and the schema and FFI libraries;
#: since issue 30 also logging, secrets (hmac, hashlib) and RE2, which only writes, warnings and
#: pattern checks use, the hookspecs and decisions, which only a plugin host uses, hashlib (checkpoints)
#: and difflib (the wording of a problem).
NOT_FOR_A_BARE_STORE = ("loopwright._runtime", "loopwright._engine", "loopwright._plugins", "loopwright._tools",
                        "loopwright._types", "loopwright._instance", "anyio", "asyncio", "ctypes", "fastjsonschema",
                        "jsonschema", "logging", "secrets", "re2", "loopwright.hookspecs", "loopwright._decisions",
                        "hashlib", "difflib")


def test_reading_a_file_store_opens_no_runtime(project: tuple[Path, str]) -> None:
    """``ls``, ``ls --tree`` and ``show`` read a file store without a runtime, an engine or an event loop."""
    cwd, instance = project
    for args in (("ls",), ("--json", "ls", "--tree"), ("show", instance), ("--json", "show", instance)):
        modules = imported(cwd, *args)
        assert "loopwright.builtins.file_store" in modules, args  # it did read the store
        assert matching(modules, NOT_FOR_A_BARE_STORE) == [], args


def test_reading_a_sqlite_store_opens_no_runtime(project: tuple[Path, str]) -> None:
    """On the sqlite store (whose reads run in a thread) ``ls`` takes an event loop, still no runtime."""
    cwd, _ = project
    (cwd / "sqlite.yaml").write_text("store: {kind: sqlite, path: ./db.sqlite}\n")
    modules = imported(cwd, "-c", "sqlite.yaml", "ls")
    assert "loopwright.builtins.sqlite_store" in modules
    assert "anyio" in modules
    assert matching(modules, ("loopwright._runtime", "loopwright._engine", "loopwright._plugins")) == []


def test_an_assembly_with_more_to_open_reads_through_a_runtime(project: tuple[Path, str]) -> None:
    """An assembly with a record sink (or plugins, another engine ...) opens a runtime for ``ls``, as before."""
    cwd, _ = project
    (cwd / "sinks.yaml").write_text("store: {kind: file, path: ./store}\nrecords: [{kind: jsonl, path: ./r.jsonl}]\n")
    modules = imported(cwd, "-c", "sinks.yaml", "ls")
    assert "loopwright._runtime" in modules
    assert (cwd / "r.jsonl").exists()  # the runtime built the sink, as it always did


def test_show_and_records_import_no_plugin(project: tuple[Path, str]) -> None:
    """``show ID`` and ``records ID`` read the store as ``ls`` does, importing no plugin either."""
    cwd, instance = project
    for command in ("show", "records"):
        assert matching(imported(cwd, command, instance), NOT_FOR_READING) == [], command


def test_a_run_imports_every_installed_plugin(project: tuple[Path, str]) -> None:
    """A run's hooks are every installed plugin's: ``run`` imports each entry point's module, as listed."""
    cwd, _ = project
    modules = imported(cwd, "run", "bench.yaml", "-p", "again")
    installed = {ep.value.split(":")[0] for ep in importlib.metadata.entry_points(group="loopwright")}
    assert installed - modules == set()


def test_a_run_imports_no_http_server(project: tuple[Path, str]) -> None:
    """Importing loopwright-serve (an entry point, so imported by every run) imports no Starlette or uvicorn.

    Its public names import their modules on first access; a run on ``test:any`` starts no server.
    """
    cwd, _ = project
    modules = imported(cwd, "run", "bench.yaml", "-p", "again")
    assert "loopwright_serve" in modules
    assert matching(modules, ("starlette", "uvicorn", "loopwright_serve._app", "loopwright_serve._server")) == []


def test_loopwright_serve_names_import_on_first_access() -> None:
    """``loopwright_serve.build_app`` and the other public names still resolve, each to its module's object."""
    import loopwright_serve  # noqa: PLC0415 - the package under test
    from loopwright_serve import _app, _settings  # noqa: PLC0415

    assert loopwright_serve.build_app is _app.build_app
    assert loopwright_serve.ServerSettings is _settings.ServerSettings
    assert {name: getattr(loopwright_serve, name) for name in loopwright_serve.__all__}.keys() == set(
        loopwright_serve.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = loopwright_serve.no_such_name


def test_tools_import_no_schema_validator() -> None:
    """Importing the tool and pattern modules imports no jsonschema, referencing or fastjsonschema.

    They are imported when a schema is checked or a tool's arguments validated (the assembly's
    own validation on load still imports jsonschema: ``ls`` pays that, not every import).
    """
    code = ("import sys, loopwright._tools, loopwright._patterns, loopwright._plugins\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('jsonschema', 'referencing', 'fastjsonschema')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_a_tool_still_checks_and_validates_its_schema() -> None:
    """The schema validators, imported late, still refuse a bad schema and explain bad arguments."""
    import jsonschema  # noqa: PLC0415 - kept out of this module's imports, as the test above checks in a subprocess

    from loopwright._tools import Tool  # noqa: PLC0415

    with pytest.raises(jsonschema.SchemaError, match="is not valid"):
        Tool(name="bad", description="d", parameters={"type": "object", "properties": {"a": {"type": 7}}},
             function=lambda: "x")
    good = Tool(name="good", description="d", function=lambda a: a,
                parameters={"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}},
                            "required": ["a"]})
    assert good.validation_errors({"a": "xy"}) == []
    assert good.validation_errors({"a": "yy"}) != []
    assert good.validation_errors({}) != []


def test_plugins_lists_every_entry_point(project: tuple[Path, str]) -> None:
    """Listing needs them all: ``plugins`` loads every installed entry point, each with its value."""
    cwd, _ = project
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", "--json", "plugins"], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=True)
    listed = {p["name"]: p for p in json.loads(done.stdout)}
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="loopwright")}
    assert {name: listed[name]["value"] for name in installed} == installed
    assert {listed[name]["source"] for name in installed} == {"entrypoint"}


#: Imports ``_commands``, then asks it for ``ls``; prints the families of commands imported after each step.
FAMILIES = """
import importlib, sys
from loopwright.cli import _commands
families = set(_commands._LAZY.values())
def loaded():
    return sorted(name for name in (m.removeprefix("loopwright.cli.") for m in sys.modules) if name in families)
print(loaded())
assert _commands.ls is importlib.import_module("loopwright.cli._inspect").ls
print(loaded())
"""


def test_each_command_imports_its_own_work_only() -> None:
    """``_commands.NAME`` imports NAME's module on first access, and no other, and is that module's function."""
    done = subprocess.run([sys.executable, "-c", FAMILIES], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "['_inspect']"]
    from loopwright.cli import _commands  # noqa: PLC0415 - the module under test, imported in this process too

    assert sorted(_commands._LAZY) == _commands.__all__
    for name, module in _commands._LAZY.items():
        assert getattr(_commands, name) is getattr(sys.modules[f"loopwright.cli.{module}"], name), name
    with pytest.raises(AttributeError, match="no_such_command"):
        _ = _commands.no_such_command


def test_help_imports_no_runtime(tmp_path: Path) -> None:
    """``--help`` imports click and the CLI's wiring only: no runtime, no YAML loader, no plugin."""
    modules = imported(tmp_path, "--help")
    assert matching(modules, ("loopwright._runtime", "loopwright._config", "ruamel", "loopwright_")) == []


# ---------------------------------------------------------------------------------------------
# Entry points load when named (in-process, with entry points of our own)
# ---------------------------------------------------------------------------------------------

STORE_PLUGIN = """
from loopwright import hookimpl
from loopwright.builtins.file_store import FileStore

@hookimpl
def loopwright_register_stores(register):
    register("{name}", FileStore)
"""

TOOL_PLUGIN = """
from loopwright import hookimpl, tool

@tool
def {name}() -> str:
    "Answer."
    return "{name}"

@hookimpl
def loopwright_register_tools(register):
    register({name})
"""


@pytest.fixture
def entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Three entry points (``lwstore``, ``lwtool``, ``lwbroken``), their modules not imported; name -> module."""
    sources = {"lw_ep_store": STORE_PLUGIN.format(name="lwstore"), "lw_ep_tool": TOOL_PLUGIN.format(name="lw_tool"),
               "lw_ep_broken": "raise RuntimeError('this plugin cannot load')\n"}
    for module, source in sources.items():
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    names = {"lwstore": "lw_ep_store", "lwtool": "lw_ep_tool", "lwbroken": "lw_ep_broken"}
    eps = {name: importlib.metadata.EntryPoint(name=name, value=module, group="loopwright")
           for name, module in names.items()}
    monkeypatch.setattr(_plugins, "_entry_points", lambda: dict(eps))
    monkeypatch.delenv("LOOPWRIGHT_DISABLE_PLUGINS", raising=False)
    return names


def runtime(tmp_path: Path, **assembly: Any) -> loopwright.Runtime:
    store = assembly.pop("store", StoreConfig(options={"path": str(tmp_path / "store")}))
    return loopwright.Runtime(Assembly(store=store, path=tmp_path / "loopwright.yaml", **assembly), autoload=True)


@pytest.mark.anyio
async def test_opening_a_runtime_imports_no_entry_point(tmp_path: Path, entry_points: dict[str, str]) -> None:
    """A runtime on a built-in store opens, and lists its instances, without importing any entry point."""
    async with runtime(tmp_path) as rt:
        assert await rt.list_instances() == []
        assert [m for m in entry_points.values() if m in sys.modules] == []


@pytest.mark.anyio
async def test_a_store_kind_loads_its_namesake_entry_point_only(tmp_path: Path, entry_points: dict[str, str]) -> None:
    """``store: {kind: lwstore}`` imports the entry point named ``lwstore`` and no other."""
    async with runtime(tmp_path, store=StoreConfig(kind="lwstore", options={"path": str(tmp_path / "s")})) as rt:
        assert rt.plugins.stores.plugin_of("lwstore") == "lwstore"
        assert [m for m in entry_points.values() if m in sys.modules] == ["lw_ep_store"]


@pytest.mark.anyio
async def test_a_lookup_loads_entry_points_until_one_answers(tmp_path: Path, entry_points: dict[str, str]) -> None:
    """A name no namesake offers loads the pending entry points in name order until one registers it.

    ``lwbroken`` sorts first and cannot load: the lookup raises PluginError naming it, and
    ``ls`` (which looks nothing up) was unaffected by it.
    """
    async with runtime(tmp_path, disable_plugins=("lwbroken",)) as rt:
        assert "lw_tool" in rt.plugins.tools
        assert rt.plugins.tools.plugin_of("lw_tool") == "lwtool"
        assert "lw_ep_broken" not in sys.modules
    async with runtime(tmp_path) as rt:
        assert await rt.list_instances() == []
        with pytest.raises(PluginError, match="lw_ep_broken"):
            _ = "lw_tool" in rt.plugins.tools


@pytest.mark.anyio
async def test_the_first_hook_call_loads_every_entry_point(
        tmp_path: Path, entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Hooks of every installed plugin take part in a run: asking for a hook's implementations loads them all.

    Closing a runtime asks for ``loopwright_on_runtime_close`` only of what was loaded.
    """
    (tmp_path / "lw_ep_hook.py").write_text("from loopwright import hookimpl\n\n"
                                            "@hookimpl\ndef loopwright_before_inference(request):\n    return None\n")
    monkeypatch.delitem(sys.modules, "lw_ep_hook", raising=False)
    eps = {**_plugins._entry_points(),  # the fixture's entry points, and one with a hook only
           "lwhook": importlib.metadata.EntryPoint(name="lwhook", value="lw_ep_hook", group="loopwright")}
    monkeypatch.setattr(_plugins, "_entry_points", lambda: dict(eps))
    async with runtime(tmp_path, disable_plugins=("lwbroken",)) as rt:
        assert rt.plugins.impls("loopwright_on_runtime_close") == ()
        assert "lw_ep_hook" not in sys.modules
        (impl,) = rt.plugins.impls("loopwright_before_inference")
        assert impl[0] == "lwhook"
        assert {entry_points["lwstore"], entry_points["lwtool"], "lw_ep_hook"} <= set(sys.modules)


@pytest.mark.anyio
async def test_entry_points_loaded_late_keep_their_place(tmp_path: Path, entry_points: dict[str, str]) -> None:
    """Listing loads every entry point, each after the built-ins and before the assembly's plugins (hook order)."""
    (tmp_path / "local_plugin.py").write_text(TOOL_PLUGIN.format(name="local_tool"))
    async with runtime(tmp_path, plugins=("local_plugin.py",), disable_plugins=("lwbroken",)) as rt:
        assert "local_tool" in rt.plugins.tools
        assert "lw_ep_tool" not in sys.modules
        names = rt.plugins.plugin_names()
        assert names[-3:] == ["lwstore", "lwtool", "local_plugin.py"]
        assert names[: len(_plugins.BUILTIN_PLUGINS)] == list(_plugins.BUILTIN_PLUGINS)
        assert "lwbroken" not in names


@pytest.mark.anyio
async def test_a_plugin_that_cannot_load_fails_a_run_before_its_instance_exists(
        tmp_path: Path, entry_points: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the store ignores a broken entry point; starting a run raises PluginError naming it, saving nothing."""
    testing = importlib.metadata.EntryPoint(name="testing", value="loopwright_testing", group="loopwright")
    eps = {**_plugins._entry_points(), "testing": testing}
    monkeypatch.setattr(_plugins, "_entry_points", lambda: dict(eps))
    async with loopwright.Runtime(Assembly(store=StoreConfig(options={"path": str(tmp_path / "store")}),
                                           default_model="test:any"), autoload=True) as rt:
        assert await rt.list_instances() == []
        with pytest.raises(PluginError, match="lw_ep_broken"):
            await rt.start_agent(Definition(name="a", system_prompt="You answer."), {}, "hello")
        assert await rt.list_instances() == []
