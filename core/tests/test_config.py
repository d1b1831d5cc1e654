"""Loading YAML definitions and assemblies: positions, problems, structuring, snapshots, validate_file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from loopwright._config import (
    ASSEMBLY_FILE_NAMES,
    SPECS_DIR,
    definition_from_dict,
    definition_to_dict,
    detect_kind,
    load_assembly,
    load_definition,
    load_yaml,
    parse_duration,
    schema,
    validate_data,
    validate_file,
)
from loopwright._definition import (
    Assembly,
    Capabilities,
    Completion,
    FileGrants,
    InitialPrompt,
    InitialToolCall,
    InputSpec,
    Limits,
    PluginSpec,
    ProviderConfig,
    StoreConfig,
)
from loopwright._duration import DURATION_PATTERN
from loopwright.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

EXAMPLES = SPECS_DIR / "examples"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# load_yaml
# ---------------------------------------------------------------------------------------------


def test_load_yaml_returns_plain_data_and_positions(tmp_path: Path) -> None:
    """Keys, values and list items get 1-based positions; the data is plain dicts, lists and scalars."""
    path = write(tmp_path, "a.yaml", """
        name: x
        limits:
          toolCalls: 3
        tools:
          - a
          - b
        when: 2024-01-02
    """)
    data, positions = load_yaml(path)
    assert data == {"name": "x", "limits": {"toolCalls": 3}, "tools": ["a", "b"], "when": "2024-01-02"}
    assert type(data) is dict
    assert type(data["tools"]) is list
    assert type(data["limits"]["toolCalls"]) is int
    assert positions.key(["limits", "toolCalls"]) == (3, 3)
    assert positions.value(["limits", "toolCalls"]) == (3, 14)
    assert positions.key(["tools", 1]) == (6, 5)
    assert positions.value(["name"]) == (1, 7)
    assert positions.locate(["limits", "missing"]) == (3, 3)


def test_load_yaml_resolves_anchors_and_merge_keys(tmp_path: Path) -> None:
    """Anchors, aliases and ``<<`` merge keys load as the values they stand for."""
    path = write(tmp_path, "a.yaml", """
        base: &base {temperature: 0.1, seed: 1}
        modelSettings:
          <<: *base
          seed: 2
    """)
    data, _ = load_yaml(path)
    assert data["modelSettings"] == {"temperature": 0.1, "seed": 2}


def test_malformed_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    """A syntax error becomes a ConfigError whose message and problem carry file, line and column."""
    path = write(tmp_path, "bad.yaml", """
        name: x
        tools: [a, b
        model: test:any
    """)
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.column) == (str(path), 3, 6)
    assert str(info.value).startswith(f"{path}:3:6: invalid YAML")
    assert info.value.path == str(path)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing file is a ConfigError naming it, not an OSError."""
    with pytest.raises(ConfigError, match=r"cannot read .*missing\.yaml"):
        load_yaml(tmp_path / "missing.yaml")


# ---------------------------------------------------------------------------------------------
# Durations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [
    ("500ms", 0.5), ("1s", 1.0), ("30m", 1800.0), ("2h", 7200.0), ("1m30s", 90.0), ("1.5s", 1.5),
    ("1h 30m", 5400.0), (45, 45.0), (0.25, 0.25), ("12", 12.0), ("30d", 2592000.0), ("1d 12h", 129600.0),
])
def test_parse_duration(value: str | float, seconds: float) -> None:
    """Durations are seconds, or number-unit pairs with units ms, s, m, h and d."""
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "1w", "", "ms", "-3s", -1, True, "1h-30m", "d"])
def test_parse_duration_rejects_other_values(value: object) -> None:
    """Anything else is a ValueError that quotes the value."""
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(value)  # type: ignore[arg-type]


def test_the_schemas_duration_pattern_is_the_grammars() -> None:
    """Both schemas' ``$defs/duration`` pattern is ``_duration.DURATION_PATTERN``, the grammar's own text."""
    for kind in ("definition", "assembly"):
        branches = schema(kind)["$defs"]["duration"]["oneOf"]
        assert [b["pattern"] for b in branches if "pattern" in b] == [DURATION_PATTERN], kind


@pytest.mark.parametrize("text", [
    "0", "1", "1.5", ".5", "5.", " 7 ", "500ms", "30s", "2m", "1.5h", "1m30s", " 2h 5m ", "1m 30", "1h-30m",
    "nan", "inf", "1e3", "-1", "-1s", "5 days", "soon", "", "1m30", "ms", "1d", "1w", "1 s", "s1", "1..5s", "\t3s\n",
])
def test_a_string_the_schema_accepts_is_a_duration_the_parser_reads(text: str) -> None:
    """The schema's string branch and parse_duration accept the same strings (so one grammar decides)."""
    try:
        parse_duration(text)
        parsed = True
    except ValueError:
        parsed = False
    assert (re.search(DURATION_PATTERN, text) is not None) == parsed
    problems = validate_data("definition", {"name": "a", "limits": {"elapsed": text}})
    assert (problems == []) == parsed, problems


def test_durations_in_limits_become_seconds() -> None:
    """``elapsed`` and ``toolTimeout`` load as float seconds."""
    defn = load_definition({"name": "a", "limits": {"elapsed": "2h", "toolTimeout": "500ms", "toolCalls": 5}})
    assert defn.limits == Limits(elapsed=7200.0, tool_timeout=0.5, tool_calls=5)


# ---------------------------------------------------------------------------------------------
# load_definition
# ---------------------------------------------------------------------------------------------


def test_load_definition_structures_every_key() -> None:
    """The full example maps onto the attrs classes: plugin specs, inputs, prompts, gates."""
    defn = load_definition(EXAMPLES / "definition" / "valid" / "full.yaml")
    assert defn.name == "researcher"
    assert defn.model == "openai:gpt-4o-mini"
    assert defn.model_settings["reasoningEffort"] == "low"
    assert defn.inputs["topic"] == InputSpec(type="string")
    assert defn.inputs["maxWords"] == InputSpec(type="integer", default=500, required=False)
    assert defn.inputs["sources"] == InputSpec(type="array", description="Seed URLs.", required=False)
    assert defn.initial_prompts[1] == InitialPrompt(
        role="assistant", content="I will write a plan first.",
        tool_calls=(InitialToolCall(name="todowrite", id="plan-1", arguments={"todos": [
            {"id": "1", "text": "Research {{ topic }}", "completed": False},
            {"id": "2", "text": "Write the report", "completed": False}]}),))
    assert defn.context_strategy == PluginSpec(kind="clearToolResults",
                                               options={"keepLast": 3, "trigger": "80%", "contextWindow": 128000})
    assert defn.completion == Completion(verify="allTodosDone", max_attempts=3)
    assert defn.approval_policy == "holdTurn"
    assert defn.limits.elapsed == 1800.0
    assert defn.tool_names[2] == "read-file"
    assert defn.fallback_models == ("openai:gpt-4o", "local:llama3.1:8b")


def test_load_definition_from_a_relative_path_uses_base_dir(tmp_path: Path) -> None:
    """A relative path is resolved against ``base_dir`` and kept as ``source``."""
    write(tmp_path, "agents/a.yaml", "name: a\n")
    defn = load_definition("agents/a.yaml", base_dir=tmp_path)
    assert defn.source == (tmp_path / "agents" / "a.yaml").resolve()


def test_invalid_definition_raises_with_every_problem(tmp_path: Path) -> None:
    """An invalid file raises one ConfigError listing each problem with file, line, column and path."""
    path = write(tmp_path, "a.yaml", """
        name: a
        model: nomodel
        limits:
          toolTimeot: 3
          tokens: -1
    """)
    with pytest.raises(ConfigError) as info:
        load_definition(path)
    err = info.value
    assert str(err).splitlines()[0] == f"{path.resolve()} is not a valid definition"
    assert err.path == str(path.resolve())
    assert [(p.line, p.column, p.path) for p in err.problems] == [
        (2, 8, "$.model"), (4, 3, "$.limits.toolTimeot"), (5, 11, "$.limits.tokens")]
    assert "unknown key 'toolTimeot'; did you mean 'toolTimeout'?" in err.problems[1].message
    assert f"{path.resolve()}:4:3: unknown key 'toolTimeot'" in str(err)


def test_unknown_key_points_at_the_key_itself(tmp_path: Path) -> None:
    """An unknown key is reported at the key's own position, named, even deep inside lists."""
    path = write(tmp_path, "a.yaml", """
        name: a
        initialPrompts:
          - role: assistant
            toolCalls:
              - name: t
                args: {x: 1}
    """)
    (problem,) = validate_file(path)
    assert (problem.line, problem.column) == (6, 9)
    assert problem.path == "$.initialPrompts[0].toolCalls[0].args"
    assert "unknown key 'args'" in problem.message


def test_definition_from_mapping_reports_paths_without_positions() -> None:
    """Data given as a mapping is checked the same way; its problems have paths but no positions."""
    with pytest.raises(ConfigError) as info:
        load_definition({"name": "a", "maxIterations": 0, "extra": True})
    assert [(p.file, p.line, p.path) for p in info.value.problems] == [
        (None, None, "$.extra"), (None, None, "$.maxIterations")]


def test_unknown_template_variable_points_inside_a_block_scalar(tmp_path: Path) -> None:
    """An unknown variable in a multi-line prompt is reported at its own line and column."""
    path = write(tmp_path, "a.yaml", """
        name: a
        inputs: {topic: string}
        systemPrompt: |
          About {{ topic }}.

            Indented {{ topic }} and {{ nope.key }}.
        initialPrompts:
          - content: "{{ topic }} {{ nope }}"
    """)
    problems = validate_file(path)
    assert [(p.line, p.column, p.path) for p in problems] == [
        (6, 30, "$.systemPrompt"), (8, 27, "$.initialPrompts[0].content")]
    assert all("unknown template variable 'nope'" in p.message for p in problems)
    assert "declared inputs: topic" in problems[0].message


def test_semantic_checks_run_on_mappings_too() -> None:
    """Template and input checks apply to data from Python, not only to files."""
    problems = validate_data("definition", {
        "name": "a", "systemPrompt": "{{ x }}", "inputs": {"n": {"type": "integer", "default": "1"}}})
    assert [p.path for p in problems] == ["$.inputs.n.default", "$.systemPrompt"]


# ---------------------------------------------------------------------------------------------
# load_assembly
# ---------------------------------------------------------------------------------------------


def test_load_assembly_none_gives_defaults() -> None:
    """No assembly means every default."""
    assert load_assembly(None) == Assembly()


def test_empty_assembly_file_gives_defaults(tmp_path: Path) -> None:
    """An empty ``loopwright.yaml`` is valid and means every default."""
    path = write(tmp_path, "loopwright.yaml", "# nothing yet\n")
    assert load_assembly(path) == Assembly(path=path.resolve())
    assert validate_file(path) == []


def test_load_assembly_maps_providers_store_capabilities_and_records() -> None:
    """Provider extras become options, the store and sinks split off ``kind``, and ``agents`` flattens."""
    asm = load_assembly(EXAMPLES / "assembly" / "valid" / "full.yaml")
    assert asm.providers["local"] == ProviderConfig(
        kind="openai", base_url="http://localhost:11434/v1", api_key="not-needed", options={"timeout": 120})
    assert asm.providers["openai"] == ProviderConfig(kind="openai", api_key_env="OPENAI_API_KEY",
                                                     options={"stream": False})
    assert asm.store == StoreConfig(kind="file", options={"path": ".loopwright/instances"})
    assert asm.capabilities == Capabilities(  # noqa: S604 - `shell` is a grant, not subprocess's flag
        files=FileGrants(read=("./src", "/usr/share/dict"), write=("./out",)), shell="loopApproval",
        network=True, agents_spawn=True, agents_max_depth=3, agents_max_agents=20)
    assert asm.records[1] == PluginSpec(kind="otel", options={"endpoint": "http://localhost:4318"})
    assert asm.limits.tool_timeout == 120.0
    assert asm.pricing["openai:gpt-4o-mini"]["cacheRead"] == 0.075
    assert asm.agent_retry.max_retries == 2
    assert asm.base_dir == (EXAMPLES / "assembly" / "valid").resolve()


def test_provider_kind_defaults_to_its_name_and_store_kind_to_file() -> None:
    """``providers: {openai: {...}}`` needs no ``kind``; ``store: {path: ...}`` is the file store."""
    asm = load_assembly({"providers": {"openai": {"apiKeyEnv": "K"}}, "store": {"path": "x"}})
    assert asm.providers["openai"].kind == "openai"
    assert asm.store == StoreConfig(kind="file", options={"path": "x"})
    assert asm.path is None


def test_api_key_and_api_key_env_are_exclusive() -> None:
    """Giving both ``apiKey`` and ``apiKeyEnv`` is one problem, at the provider's ``apiKeyEnv``."""
    with pytest.raises(ConfigError) as info:
        load_assembly({"providers": {"p": {"apiKey": "k", "apiKeyEnv": "K"}}})
    (problem,) = info.value.problems
    assert problem.path == "$.providers.p.apiKeyEnv"
    assert "not both" in problem.message


def test_plugin_settings_load_as_plain_mappings() -> None:
    """``pluginSettings`` entries, known (``mcp``) or not, reach the Assembly as plain dicts."""
    asm = load_assembly(EXAMPLES / "assembly" / "valid" / "full.yaml")
    assert asm.plugin_settings["my_plugin"] == {"colour": "blue"}
    files = asm.plugin_settings["mcp"]["servers"]["files"]
    assert type(files) is dict
    assert files["args"][-1] == "./docs"
    assert load_assembly({}).plugin_settings == {}


def test_plugin_settings_problems_carry_file_line_and_column(tmp_path: Path) -> None:
    """A bad ``pluginSettings`` entry fails loading with the file, line, column and JSON path."""
    path = write(tmp_path, "loopwright.yaml",
                 "pluginSettings:\n  mcp:\n    servers:\n      a__b: {command: x}\n      ok: {comand: x}\n")
    with pytest.raises(ConfigError) as info:
        load_assembly(path)
    got = [(p.file, p.line, p.column, p.path) for p in info.value.problems]
    assert got == [
        (str(path.resolve()), 4, 7, "$.pluginSettings.mcp.servers.a__b"),
        (str(path.resolve()), 5, 12, "$.pluginSettings.mcp.servers.ok.comand"),
    ]
    assert "without `__`" in info.value.problems[0].message
    assert "did you mean 'command'" in info.value.problems[1].message


# ---------------------------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------------------------


def test_definition_snapshot_round_trips_through_json() -> None:
    """A definition survives ``definition_to_dict`` → JSON → ``definition_from_dict`` unchanged."""
    defn = load_definition(EXAMPLES / "definition" / "valid" / "full.yaml")
    snapshot = json.loads(json.dumps(definition_to_dict(defn)))
    assert "source" not in snapshot
    assert snapshot["limits"]["elapsed"] == 1800.0
    assert snapshot["contextStrategy"] == {"kind": "clearToolResults", "keepLast": 3, "trigger": "80%",
                                           "contextWindow": 128000}
    assert snapshot["inputs"]["topic"] == {"type": "string", "required": True}
    assert validate_data("definition", snapshot) == []
    assert definition_from_dict(snapshot, source=defn.source) == defn


def test_minimal_snapshot_is_small() -> None:
    """Defaults are left out of the snapshot, so instance headers stay small."""
    assert definition_to_dict(load_definition({"name": "a"})) == {"name": "a"}


def test_invalid_snapshot_is_a_config_error() -> None:
    """A damaged snapshot is refused with a ConfigError, like a file."""
    with pytest.raises(ConfigError, match="maxIterations"):
        definition_from_dict({"name": "a", "maxIterations": "many"})


# ---------------------------------------------------------------------------------------------
# validate_file and kind detection
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "data", "kind"), [
    ("loopwright.yaml", {"name": "x"}, "assembly"),
    ("site.yaml", {"providers": {}}, "assembly"),
    ("site.yaml", {"limits": {}, "plugins": []}, "assembly"),
    ("agent.yaml", {"name": "x", "limits": {}}, "definition"),
    ("agent.yaml", None, "definition"),
    ("instance.json", {}, "instance"),
    ("h.json", {"instanceId": "i", "state": "running"}, "instance"),
    ("r.json", {"kind": "turn", "instanceId": "i", "at": "t", "data": {}}, "record"),
    ("records.jsonl", None, "record"),
])
def test_detect_kind(name: str, data: object, kind: str) -> None:
    """The kind comes from the file name, else from assembly-only or header keys; definitions otherwise."""
    assert detect_kind(name, data) == kind
    assert "loopwright.yaml" in ASSEMBLY_FILE_NAMES


def test_validate_file_detects_assemblies_by_their_keys(tmp_path: Path) -> None:
    """A file with assembly keys is validated as an assembly, so its problems are assembly problems."""
    path = write(tmp_path, "site.yaml", "providers: {p: {kind: x}}\ncapabilities: {shell: yes}\n")
    (problem,) = validate_file(path)
    assert problem.path == "$.capabilities.shell"


def test_validate_file_takes_an_explicit_kind(tmp_path: Path) -> None:
    """An explicit kind overrides detection."""
    path = write(tmp_path, "agent.yaml", "name: a\n")
    assert validate_file(path, "definition") == []
    assert [p.path for p in validate_file(path, "assembly")] == ["$.name"]


def test_validate_file_never_raises(tmp_path: Path) -> None:
    """A missing file or a syntax error comes back as problems, not exceptions."""
    (missing,) = validate_file(tmp_path / "nope.yaml")
    assert "cannot read" in missing.message
    (syntax,) = validate_file(write(tmp_path, "bad.yaml", "a: [\n"))
    assert syntax.line == 2
    assert "invalid YAML" in syntax.message


def test_json_files_get_positions_too(tmp_path: Path) -> None:
    """JSON definitions are read by the same loader, with the same positions."""
    path = write(tmp_path, "a.json", '{\n  "name": "a",\n  "tools": "x"\n}\n')
    (problem,) = validate_file(path)
    assert (problem.line, problem.column, problem.path) == (3, 12, "$.tools")


def test_validate_file_reports_every_line_of_a_record_log(tmp_path: Path) -> None:
    """Each line of a ``.jsonl`` record log is checked, with its own line number."""
    good = '{"kind": "turn", "instanceId": "i", "at": "t", "data": {}}'
    bad = '{"kind": "tool_call", "instanceId": "i", "at": "t", "data": {}}'
    path = write(tmp_path, "records.jsonl", f"{good}\n\n{bad}\n")
    (problem,) = validate_file(path)
    assert (problem.line, problem.path) == (3, "$.data")
    assert "data.status" in problem.message


# ---------------------------------------------------------------------------------------------
# The loader's modules: importing compiles no schema
# ---------------------------------------------------------------------------------------------


def test_importing_the_loader_compiles_no_validator() -> None:
    """Importing the config layer reads and compiles no schema; valid data compiles no jsonschema validator
    (the compiled modules pass it), and the first invalid data compiles its validator once."""
    code = """if True:
        from loopwright import _config, _schemas
        caches = (_schemas.schema, _schemas.validator, _schemas.meta_validator)
        sizes = lambda: [c.cache_info().currsize for c in caches]
        before = sizes()
        assert _config.validate_data("definition", {"name": "a", "output": {"type": "object"}}) == []
        _config.validate_data("definition", {"name": "b"})
        valid = sizes()
        assert _config.validate_data("definition", {"name": 3}) != []
        assert _config.validate_data("definition", {"name": 4}) != []
        print(before, valid, sizes(), _schemas.validator.cache_info().misses)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # valid: only the meta-schema's validator (for `output`); invalid: definition and every schema it
    # may $ref (the registry) loaded, its validator compiled once.
    assert done.stdout.split()[:3] == ["[0,", "0,", "0]"], done.stdout
    assert done.stdout.strip().endswith("[0, 0, 1] [4, 1, 1] 1"), done.stdout


def test_no_loader_module_is_over_600_lines() -> None:
    """The loader is split by concern (_yaml reads, _schemas validates, _config assembles): none is long."""
    for name in ("_config", "_schemas", "_yaml"):
        path = SPECS_DIR.parent / f"{name}.py"
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 600, name
