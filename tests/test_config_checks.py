"""``validate -c`` checks what ``run`` checks, and configuration mistakes are bad input (issue 10).

Every test drives the CLI as a subprocess, as an operator would: a mistake in the assembly or
a definition is reported by ``validate`` before anything runs, with file, line and column; and
``run`` refuses it with exit 2 before an instance exists. The examples under
``specs/examples/*/valid`` and the assemblies in ``docs/`` all open a runtime.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "specs" / "examples"
DOCS = ROOT / "docs"
QUICKSTART = ROOT / "examples" / "quickstart"


def lw(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m loopwright.cli ARGS`` in ``cwd``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def instances(cwd: Path) -> list[dict[str, object]]:
    """Return the instances the store of ``cwd``'s ``loopwright.yaml`` holds."""
    out = lw(cwd, "--json", "ls")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


ASSEMBLY = """\
store: {kind: file, path: ./store}
providers:
  local:
    kind: openai
    baseUrl: http://127.0.0.1:9/v1
    apiKey: not-needed
  keyed:
    kind: openai
    baseUrl: http://127.0.0.1:9/v1
    apiKeyEnv: LOOPWRIGHT_TEST_UNSET_KEY
defaultModel: test:any
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path, "loopwright.yaml", ASSEMBLY)
    return tmp_path


# ---------------------------------------------------------------------------------------------
# validate -c
# ---------------------------------------------------------------------------------------------


def test_validate_reports_a_tool_no_plugin_registers_at_its_line(project: Path) -> None:
    """A definition naming a missing tool is invalid under ``-c``, placed at the tool's entry."""
    write(project, "agent.yaml", "name: a\ntools:\n  - read-file\n  - no_such_tool\n")
    out = lw(project, "-c", "loopwright.yaml", "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"agent\.yaml:4:5: .*'no_such_tool'.* @ \$\.tools\[1\]", out.stdout), out.stdout


def test_validate_reports_a_model_whose_provider_is_unknown(project: Path) -> None:
    """Every model reference resolves: ``model``, ``fallbackModels`` and a compaction model."""
    write(project, "agent.yaml", "name: a\nmodel: nowhere:m\nfallbackModels: ['local:m', 'elsewhere:m']\n"
                                 "contextStrategy: {kind: compact, trigger: 80%, contextWindow: 8000, "
                                 "model: 'gone:m'}\n")
    out = lw(project, "-c", "loopwright.yaml", "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"agent\.yaml:2:8: .*unknown provider 'nowhere'", out.stdout), out.stdout
    assert re.search(r"agent\.yaml:3:29: .*unknown provider 'elsewhere'", out.stdout), out.stdout
    assert re.search(r"agent\.yaml:4:\d+: .*unknown provider 'gone'", out.stdout), out.stdout
    assert "'local'" not in out.stdout


def test_a_kind_typo_names_the_kind_and_the_registered_kinds(project: Path) -> None:
    """``kind: opnai`` is an unknown provider *kind*, not an unknown provider ``local``."""
    write(project, "loopwright.yaml", ASSEMBLY.replace("kind: openai\n    baseUrl: http://127.0.0.1:9/v1\n"
                                                       "    apiKey", "kind: opnai\n    baseUrl: "
                                                       "http://127.0.0.1:9/v1\n    apiKey", 1))
    write(project, "agent.yaml", "name: a\nmodel: local:m\n")
    out = lw(project, "-c", "loopwright.yaml", "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"loopwright\.yaml:4:11: provider 'local': unknown provider kind 'opnai' "
                     r"\(did you mean 'openai'\?\); "
                     r"registered provider kinds: .*openai", out.stdout), out.stdout
    assert "unknown provider 'local'" not in out.stdout


def test_unknown_and_mistyped_provider_options_are_placed(project: Path) -> None:
    """``timout: 5`` is unknown (did you mean timeout?), ``maxRetries: "3"`` ill-typed, both at their line."""
    write(project, "loopwright.yaml", ASSEMBLY.replace("    apiKey: not-needed\n",
                                                       "    apiKey: not-needed\n    timout: 5\n"
                                                       "    maxRetries: '3'\n", 1))
    write(project, "agent.yaml", "name: a\nmodel: local:m\n")
    out = lw(project, "-c", "loopwright.yaml", "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"loopwright\.yaml:7:5: unknown key 'timout'; did you mean 'timeout'\?", out.stdout), out.stdout
    assert re.search(r"loopwright\.yaml:8:17: must be an integer.* @ \$\.providers\.local\.maxRetries",
                     out.stdout), out.stdout


def test_validate_reports_an_unknown_store_option(project: Path) -> None:
    """``store: {kind: file, pth: x}`` is refused by validate as by run."""
    write(project, "loopwright.yaml", ASSEMBLY.replace("path: ./store", "pth: ./store"))
    write(project, "agent.yaml", "name: a\n")
    out = lw(project, "-c", "loopwright.yaml", "validate", "agent.yaml", "loopwright.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"loopwright\.yaml:1:\d+: unknown option 'pth' of the file store", out.stdout), out.stdout
    assert lw(project, "run", "agent.yaml", "-p", "hi").returncode == 2


@pytest.mark.parametrize("where", ["store", "records"])
def test_validate_reports_a_store_or_sink_inside_a_granted_root(project: Path, where: str) -> None:
    """The store and the record sinks lie outside every granted root, as the runtime requires at open."""
    text = ASSEMBLY + "capabilities: {files: {write: [./work]}}\n"
    text = (text.replace("path: ./store", "path: ./work/store") if where == "store"
            else text + "records: [{kind: jsonl, path: ./work/records.jsonl}]\n")
    (project / "work").mkdir()  # the granted root exists, as the store's folder must
    write(project, "loopwright.yaml", text)
    write(project, "agent.yaml", "name: a\n")
    out = lw(project, "-c", "loopwright.yaml", "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "lies within the granted file root" in out.stdout, out.stdout


@pytest.mark.parametrize(("mistake", "said"), [
    ("store", "lies within the granted file root"),
    ("option", "unknown option 'colour' of the sqlite store"),
])
def test_validate_of_the_assembly_itself_checks_what_run_checks(project: Path, mistake: str, said: str) -> None:
    """Issue 31, point 1: ``validate loopwright.yaml`` (no ``-c``) opens the runtime ``run`` would open.

    A store inside a granted root, or an unknown store option, made the assembly "valid" before.
    Nothing is left behind: no store folder, no database file.
    """
    text = (ASSEMBLY.replace("path: ./store", "path: ./work/store") + "capabilities: {files: {write: [./work]}}\n"
            if mistake == "store" else ASSEMBLY.replace("{kind: file, path: ./store}",
                                                        "{kind: sqlite, path: ./lw.db, colour: red}"))
    if mistake == "store":
        (project / "work").mkdir()  # the granted root exists, as the store's folder must
    write(project, "loopwright.yaml", text)
    out = lw(project, "validate", "loopwright.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert said in out.stdout, out.stdout
    assert "valid assembly" not in out.stdout
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == (
        ["loopwright.yaml", "work"] if mistake == "store" else ["loopwright.yaml"])


def test_validate_of_a_definition_uses_the_assembly_in_the_folder(project: Path) -> None:
    """Issue 31, point 1: with ``./loopwright.yaml`` beside it (no ``-c``), or none, an unregistered tool is found.

    As ``run`` finds it.
    """
    write(project, "agent.yaml", "name: a\ntools: [no_such_tool]\n")
    out = lw(project, "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"agent\.yaml:2:\d+: definition 'a' names the tool 'no_such_tool'", out.stdout), out.stdout
    assert lw(project, "run", "agent.yaml", "-p", "hi").returncode == 2
    # Without any assembly, the defaults run would use judge it, and nothing is left behind.
    alone = project / "alone"
    write(alone, "agent.yaml", "name: a\nmodel: test:any\ntools: [no_such_tool]\n")
    out = lw(alone, "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(r"agent\.yaml:3:\d+: definition 'a' names the tool 'no_such_tool'", out.stdout), out.stdout
    assert sorted(p.name for p in alone.iterdir()) == ["agent.yaml"]
    assert lw(alone, "run", "agent.yaml", "-p", "hi").returncode == 2
    write(alone, "agent.yaml", "name: a\nmodel: test:any\ntools: [task_complete]\n")
    out = lw(alone, "validate", "agent.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(p.name for p in alone.iterdir()) == ["agent.yaml"]


def test_a_mistyped_tool_provider_or_store_kind_gets_a_suggestion(project: Path) -> None:
    """Issue 31, point 6: a near miss is answered with the registered name it is near."""
    write(project, "agent.yaml", "name: a\nmodel: tset:any\ntools: [task_complet]\n")
    out = lw(project, "validate", "agent.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "names the tool 'task_complet', which no plugin registers (did you mean 'task_complete'?)" in out.stdout
    assert "unknown provider 'tset' (did you mean 'test'?)" in out.stdout, out.stdout
    write(project, "loopwright.yaml", ASSEMBLY.replace("kind: file", "kind: fiel"))
    out = lw(project, "validate", "loopwright.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "unknown store kind 'fiel' (did you mean 'file'?)" in out.stdout, out.stdout
    # Nothing near: no suggestion, only the list.
    write(project, "loopwright.yaml", ASSEMBLY)
    write(project, "agent.yaml", "name: a\ntools: [zzzzzz]\n")
    out = lw(project, "validate", "agent.yaml")
    assert "did you mean" not in out.stdout, out.stdout
    assert "registered tools: " in out.stdout, out.stdout


def test_an_unset_key_exits_as_the_quickstart_says(project: Path) -> None:
    """Issue 31, point 6: the quickstart's exit code for an unset key is the one ``run`` returns (2, no instance)."""
    write(project, "agent.yaml", "name: a\nmodel: keyed:m\n")
    done = lw(project, "run", "agent.yaml", "-p", "hi")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "LOOPWRIGHT_TEST_UNSET_KEY" in done.stderr
    assert instances(project) == []
    quickstart = " ".join((DOCS / "quickstart.md").read_text(encoding="utf-8").split())
    assert "is a configuration error: `run` names the variable and the assembly's line, exits 2" in quickstart


@pytest.mark.parametrize(("source", "said"), [
    ("def f(:\n    pass\n", r"plugin 'bad\.py': cannot import .*bad\.py:1:7: SyntaxError: invalid syntax\n\s+def f\(:"),
    ("x = 1\nraise RuntimeError('no config here')\n", r"cannot import .*bad\.py:2: RuntimeError: no config here"),
])
def test_a_broken_plugin_file_is_named_at_its_line(project: Path, source: str, said: str) -> None:
    """Issue 31, point 6: a plugin's SyntaxError (or any error at import) is file:line and the message, not a repr."""
    write(project, "loopwright.yaml", ASSEMBLY + "plugins: [bad.py]\n")
    write(project, "bad.py", source)
    write(project, "agent.yaml", "name: a\n")
    done = lw(project, "run", "agent.yaml", "-p", "hi")
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(said, done.stderr), done.stderr
    assert "SyntaxError(" not in done.stderr
    assert "RuntimeError(" not in done.stderr


def test_validate_passes_what_run_accepts(project: Path) -> None:
    """A definition ``run`` accepts is valid under ``-c`` too (no model is called)."""
    write(project, "agent.yaml", "name: a\nmodel: local:m\ntools: [task_complete]\nfallbackModels: [test:any]\n")
    out = lw(project, "-c", "loopwright.yaml", "validate", "agent.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "agent.yaml: valid definition" in out.stdout


# ---------------------------------------------------------------------------------------------
# run: bad configuration is bad input, and leaves no instance
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("definition", "expected"), [
    ("name: a\nmodel: nowhere:m\n", r"agent\.yaml:2:8: .*unknown provider 'nowhere'"),
    ("name: a\nmodel: keyed:m\n", (r"loopwright\.yaml:10:16: provider 'keyed': the environment variable "
                                  r"LOOPWRIGHT_TEST_UNSET_KEY \(its apiKeyEnv\) is not set")),
    ("name: a\ninputs: {cfg: {type: object}}\nsystemPrompt: 'Use {{ cfg.colour }}'\n",
     r"agent\.yaml:3:\d+: 'cfg' has no key 'colour'"),
    ("name: a\ntools: [no_such_tool]\n", r"agent\.yaml:2:9: .*'no_such_tool'"),
])
def test_run_refuses_a_configuration_mistake_before_the_instance_exists(
        project: Path, definition: str, expected: str) -> None:
    """Exit 2, the file, line and column, and no instance left in the store."""
    write(project, "agent.yaml", definition)
    args = ["run", "agent.yaml", "-p", "hi"]
    if "cfg" in definition:
        args += ["-i", 'cfg={"size": 1}']
    out = lw(project, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(expected, out.stderr), out.stderr
    assert instances(project) == []


def test_a_bad_provider_option_at_run_is_placed_and_leaves_no_instance(project: Path) -> None:
    """``maxRetries: "3"`` is reported at its line (not at ``<data>``), exit 2, nothing saved."""
    write(project, "loopwright.yaml", ASSEMBLY.replace("    apiKey: not-needed\n",
                                                       "    apiKey: not-needed\n    maxRetries: '3'\n", 1))
    write(project, "agent.yaml", "name: a\nmodel: local:m\n")
    out = lw(project, "run", "agent.yaml", "-p", "hi")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "<data>" not in out.stderr
    assert re.search(r"loopwright\.yaml:7:17: must be an integer", out.stderr), out.stderr
    assert instances(project) == []


# ---------------------------------------------------------------------------------------------
# The examples and the docs' assemblies open a runtime
# ---------------------------------------------------------------------------------------------

#: What the complete examples name from the reader's own project: their plugin file (it registers
#: the tool, the hook set and the guardrail the complete definition names), their package, their agents.
AUDIT_PLUGIN = """\
from loopwright import hookimpl


def web_search(query: str) -> str:
    \"\"\"Search the web.\"\"\"
    return ""


@hookimpl
def loopwright_register_tools(register):
    register(web_search)


class Redaction:
    @hookimpl
    def loopwright_on_message(self, message):
        pass


def no_shell_rm(call):
    return None


@hookimpl
def loopwright_register_hooks(register):
    register("redaction", Redaction())


@hookimpl
def loopwright_register_guardrails(register):
    register("no_shell_rm", no_shell_rm)
"""

#: The MCP servers the examples name stand for the reader's; offline, the MCP plugin's own test
#: server stands in for each (the environment's server file overrides the assembly's servers).
MCP_SERVER = ROOT / "plugins" / "mcp" / "tests" / "mcp_test_server.py"
MCP_STAND_INS = {"mcpServers": {name: {"command": sys.executable, "args": [str(MCP_SERVER)]}
                                for name in ("files", "tickets", "served")}}


def _sandbox(tmp_path: Path, assembly_text: str) -> tuple[Path, dict[str, str]]:
    """Return a project folder holding ``assembly_text`` as its assembly and what it names."""
    folder = tmp_path / "project"
    shutil.copytree(QUICKSTART, folder)  # the project the docs walk through (its tools.py, its agents)
    write(folder, "loopwright.yaml", assembly_text)
    write(folder, "plugins/audit.py", AUDIT_PLUGIN)
    write(folder, "my_company/__init__.py", "")
    write(folder, "my_company/loopwright_hooks.py", '"""The reader\'s own hooks (none here)."""\n')
    for name in ("researcher", "writer"):
        write(folder, f"agents/{name}.yaml", f"name: {name}\n")
    write(folder, "mcp-servers.json", json.dumps(MCP_STAND_INS))
    env = {"OPENAI_API_KEY": "sk-test", "LOOPWRIGHT_DSN": "postgresql://loopwright@localhost/loopwright",
           "PYTHONPATH": str(folder),
           "LOOPWRIGHT_MCP_CONFIG": str(folder / "mcp-servers.json")}
    return folder, env


def _needs_missing_extra(text: str) -> None:
    """Skip an assembly whose OpenTelemetry sink sends to an endpoint, when the ``otlp`` extra is absent.

    Without it such an assembly is refused by design (docs/records/otel.md), naming the extra.
    """
    import importlib.util  # noqa: PLC0415

    if "kind: otel" in text and "endpoint:" in text and importlib.util.find_spec("opentelemetry.exporter") is None:
        pytest.skip('the otel sink with an endpoint needs pip install "loopwright-otel[otlp]"')


def _assembly_examples() -> list[Path]:
    return sorted((EXAMPLES / "assembly" / "valid").glob("*.yaml"))


def _yaml_blocks() -> list[tuple[str, str]]:
    blocks = []
    for doc in sorted(DOCS.rglob("*.md")):
        text = doc.read_text(encoding="utf-8")
        for match in re.finditer(r"^```yaml\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{doc.relative_to(ROOT)}:{line}", match.group(1)))
    return blocks


def _is_assembly(text: str) -> bool:
    from loopwright import read_yaml  # noqa: PLC0415
    from loopwright._config import detect_kind  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        block = Path(tmp) / "block.yaml"
        block.write_text(text, encoding="utf-8")
        try:
            data = read_yaml(block)
        except Exception:  # noqa: BLE001 - a block that is not YAML on its own is not an assembly
            return False
    return isinstance(data, dict) and detect_kind("x.yaml", data) == "assembly"


DOC_ASSEMBLIES = [(where, text) for where, text in _yaml_blocks() if _is_assembly(text)]


@pytest.mark.parametrize("example", _assembly_examples(), ids=lambda p: p.name)
def test_every_assembly_example_opens_a_runtime(tmp_path: Path, example: Path) -> None:
    """``validate -c`` opens the example's runtime (plugins, store, sinks, grants) and finds nothing."""
    _needs_missing_extra(example.read_text(encoding="utf-8"))
    folder, env = _sandbox(tmp_path, example.read_text(encoding="utf-8"))
    out = lw(folder, "-c", "loopwright.yaml", "validate", "--kind", "assembly", "loopwright.yaml", env=env)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(("where", "text"), DOC_ASSEMBLIES, ids=[w for w, _t in DOC_ASSEMBLIES])
def test_every_assembly_in_the_docs_opens_a_runtime(tmp_path: Path, where: str, text: str) -> None:
    """Each assembly the docs show opens a runtime, as ``run`` and ``ls`` would."""
    _needs_missing_extra(text)
    folder, env = _sandbox(tmp_path, text)
    out = lw(folder, "-c", "loopwright.yaml", "validate", "--kind", "assembly", "loopwright.yaml", env=env)
    assert out.returncode == 0, f"{where}\n{out.stdout}{out.stderr}"


def test_the_docs_show_the_complete_assembly() -> None:
    """The docs' assemblies include the complete one, so the test above covers it."""
    assert any("agentRetry" in text and "pluginSettings" in text for _w, text in DOC_ASSEMBLIES)


@pytest.mark.parametrize("example", sorted(p for p in (EXAMPLES / "definition" / "valid").iterdir()
                                           if p.suffix in {".yaml", ".json"}), ids=lambda p: p.name)
def test_every_definition_example_can_run_under_the_complete_assembly(tmp_path: Path, example: Path) -> None:
    """Each definition example's tools, models, hooks and guardrails resolve (no model called)."""
    import importlib.util  # noqa: PLC0415

    assembly = (EXAMPLES / "assembly" / "valid" / "full.yaml").read_text(encoding="utf-8")
    if importlib.util.find_spec("opentelemetry.exporter") is None:
        # Its OTLP sink needs an extra that is not installed; record sinks bear on no definition.
        assembly = assembly.replace("  - kind: otel\n    endpoint: http://localhost:4318\n", "")
        assert "kind: otel" not in assembly
    folder, env = _sandbox(tmp_path, assembly)
    shutil.copy(example, folder / example.name)
    out = lw(folder, "-c", "loopwright.yaml", "validate", example.name, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
