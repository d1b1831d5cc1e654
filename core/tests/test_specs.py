"""The JSON Schemas in ``specs/``: well-formed, documented, in step with the classes, and their examples."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import jsonschema
import pytest

from loopwright import _config, _definition, _types
from loopwright._config import (
    SPECS_DIR,
    definition_from_dict,
    load_assembly,
    load_definition,
    schema,
    validate_file,
    validator,
)
from loopwright._convert import camel

if TYPE_CHECKING:
    from collections.abc import Iterator

KINDS = ("definition", "assembly", "instance", "record")
EXAMPLES = SPECS_DIR / "examples"
_EXPECT_RE = re.compile(r"^# expect: (\d+):(\d+) (\S+) :: (.+)$")


def _examples(kind: str, validity: str) -> list[Path]:
    return sorted(p for p in (EXAMPLES / kind / validity).iterdir() if p.suffix != ".why")


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.parent.name}/{p.name}" for p in paths]


VALID = [p for kind in KINDS for p in _examples(kind, "valid")]
INVALID = [p for kind in KINDS for p in _examples(kind, "invalid")]


def _notes(path: Path) -> str:
    """Return the text holding an invalid example's reason and expectations (itself or its sidecar)."""
    if path.suffix in {".yaml", ".yml"}:
        return path.read_text(encoding="utf-8")
    return path.with_suffix(".why").read_text(encoding="utf-8")


def _walk(node: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield every subschema with its JSON pointer."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{where}/{i}")


# ---------------------------------------------------------------------------------------------
# The schemas themselves
# ---------------------------------------------------------------------------------------------


def test_specs_ship_inside_the_package() -> None:
    """The package reaches the schemas through its ``_specs`` symlink to the repository's ``specs/``."""
    assert (SPECS_DIR / "definition.schema.json").is_file()
    repo_specs = Path(__file__).resolve().parents[2] / "specs"
    assert SPECS_DIR.resolve() == repo_specs.resolve()


@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_a_valid_draft_2020_12_schema(kind: str) -> None:
    """Each schema passes the draft 2020-12 meta-schema."""
    jsonschema.Draft202012Validator.check_schema(schema(kind))  # type: ignore[arg-type]
    assert schema(kind)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("kind", KINDS)
def test_schema_has_an_id_and_anchored_definitions(kind: str) -> None:
    """Each schema has an ``$id`` named after its file, and every ``$defs`` entry an ``$anchor``."""
    s = schema(kind)
    assert s["$id"] == f"https://loopwright.dev/specs/{kind}.schema.json"
    for name, sub in s.get("$defs", {}).items():
        assert sub.get("$anchor") == name, f"{kind}: $defs/{name} lacks $anchor"


@pytest.mark.parametrize("kind", KINDS)
def test_every_property_has_a_description(kind: str) -> None:
    """Every property of every schema says what it is for."""
    missing = [
        f"{where}/properties/{name}"
        for where, sub in _walk(schema(kind))
        for name, prop in (sub.get("properties") or {}).items()
        if isinstance(prop, dict) and "description" not in prop and where.rsplit("/", 1)[-1] != "if"
    ]
    assert not missing, f"{kind}: properties without a description: {missing}"


@pytest.mark.parametrize("kind", KINDS)
def test_fixed_objects_reject_unknown_keys(kind: str) -> None:
    """Every object schema with ``properties`` says whether other keys are allowed (no silent default)."""
    silent = [where for where, sub in _walk(schema(kind))
              if "properties" in sub and "additionalProperties" not in sub
              and not where.endswith(("/if", "/then")) and sub.get("type") in ("object", ["object", "null"])]
    assert not silent, f"{kind}: objects without additionalProperties: {silent}"


def test_definition_and_assembly_share_their_common_definitions() -> None:
    """Limits, durations, model references and plugin specs are the same in both schemas."""
    definition, assembly = schema("definition")["$defs"], schema("assembly")["$defs"]
    for name in ("limits", "duration", "modelRef", "pluginSpec"):
        hint = f"$defs/{name} differs: copy it from definition.schema.json"
        assert definition[name] == assembly[name], hint


def test_validators_are_built_once() -> None:
    """The validator of a kind is built once and cached."""
    assert validator("definition") is validator("definition")


# ---------------------------------------------------------------------------------------------
# Freshness: the schemas and the classes cannot drift apart
# ---------------------------------------------------------------------------------------------

_D = _definition
#: (class, schema kind, JSON pointer of its object schema, {field: key} renames, fields not in YAML,
#: keys not fields)
_PAIRS: list[tuple[type, str, str, dict[str, str], set[str], set[str]]] = [
    (_D.Definition, "definition", "", {}, {"source"}, set()),
    (_D.InputSpec, "definition", "/$defs/input/oneOf/1", {}, set(), set()),
    (_D.InitialPrompt, "definition", "/$defs/initialPrompt", {}, set(), set()),
    (_D.InitialToolCall, "definition", "/$defs/initialToolCall", {}, set(), set()),
    (_D.Limits, "definition", "/$defs/limits", {}, set(), set()),
    (_D.Completion, "definition", "/properties/completion", {}, set(), set()),
    (_D.Assembly, "assembly", "", {}, {"path"}, set()),
    (_D.Limits, "assembly", "/$defs/limits", {}, set(), set()),
    (_D.ProviderConfig, "assembly", "/$defs/provider", {}, {"options"}, {"stream"}),
    (_D.StoreConfig, "assembly", "/properties/store", {}, {"options"}, set()),
    (_D.PluginSpec, "assembly", "/$defs/pluginSpec", {}, {"options"}, set()),
    (_D.AgentRetry, "assembly", "/properties/agentRetry", {}, set(), set()),
    (_D.FileGrants, "assembly", "/$defs/capabilities/properties/files", {}, set(), set()),
    (_D.Capabilities, "assembly", "/$defs/capabilities",
     {"agents_spawn": "agents", "agents_max_depth": "agents", "agents_max_agents": "agents"}, set(), set()),
    # instance_id and path belong to a tree's list of approvals (AgentRun.pending_approvals), never to a header.
    (_types.PendingApproval, "instance", "/$defs/pendingApproval", {}, {"instance_id", "path"}, set()),
    (_types.Usage, "instance", "/$defs/usage", {}, set(), set()),
    (_types.Record, "record", "", {}, set(), set()),
]


def _at(kind: str, pointer: str) -> dict[str, Any]:
    node: Any = schema(kind)
    for part in filter(None, pointer.split("/")):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node  # type: ignore[no-any-return]


@pytest.mark.parametrize("pair", _PAIRS, ids=[f"{p[1]}:{p[0].__name__}" for p in _PAIRS])
def test_schema_keys_match_class_fields(
    pair: tuple[type, str, str, dict[str, str], set[str], set[str]],
) -> None:
    """Every field of the class is a key of its schema (camelCase) and every key is a field."""
    cls, kind, pointer, renames, not_keys, not_fields = pair
    keys = set(_at(kind, pointer)["properties"]) - not_fields
    fields = {renames.get(f.name, camel(f.name)) for f in attrs.fields(cls) if f.name not in not_keys}
    assert fields - keys == set(), f"fields missing from {kind}.schema.json#{pointer}"
    assert keys - fields == set(), f"keys of {kind}.schema.json#{pointer} that {cls.__name__} lacks"


def test_capabilities_agents_keys_match_class_fields() -> None:
    """``capabilities.agents`` has exactly the keys behind the ``agents_*`` fields of Capabilities."""
    agents = _at("assembly", "/$defs/capabilities/properties/agents")
    assert set(agents["properties"]) == {"spawn", "maxDepth", "maxAgents"}
    assert {f.name for f in attrs.fields(_D.Capabilities)} >= {"agents_spawn", "agents_max_depth", "agents_max_agents"}


@pytest.mark.parametrize(("pointer", "enum"), [
    ("/properties/state", _types.State),
    ("/properties/stopReason", _types.StopReason),
])
def test_instance_enums_match_python(pointer: str, enum: type) -> None:
    """The instance schema's states and stop reasons are exactly the Python enums' values."""
    values = {v for v in _at("instance", pointer)["enum"] if v is not None}
    assert values == {e.value for e in enum}  # type: ignore[attr-defined]


def test_record_statuses_match_python() -> None:
    """The tool-result statuses of tool_call records are exactly :class:`ToolStatus`'s values."""
    assert set(_at("record", "/$defs/toolStatus")["enum"]) == {s.value for s in _types.ToolStatus}


def test_definition_literals_match_python() -> None:
    """Enumerations in the schemas are the ``Literal`` values of the classes."""
    assert _at("definition", "/properties/approvalPolicy")["enum"] == ["perCall", "holdTurn"]
    assert attrs.fields(_D.Definition).approval_policy.default == "perCall"
    assert _at("assembly", "/$defs/capabilities/properties/shell")["enum"] == [
        "none", "allow", "approval", "loopApproval", "sandbox", "sandboxLoopApproval"]
    assert list(typing.get_args(typing.get_type_hints(_D.Capabilities)["shell"])) == _at(
        "assembly", "/$defs/capabilities/properties/shell")["enum"]


# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", VALID, ids=_ids(VALID))
def test_valid_example_has_no_problems(path: Path) -> None:
    """Every valid example passes validation with no problem at all."""
    kind = path.parent.parent.name
    assert validate_file(path, kind) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("path", [p for p in VALID if p.parent.parent.name == "definition"],
                         ids=_ids([p for p in VALID if p.parent.parent.name == "definition"]))
def test_valid_definition_example_loads_and_round_trips(path: Path) -> None:
    """Every valid definition example loads, and its snapshot loads back to an equal definition."""
    defn = load_definition(path)
    assert defn.source == path.resolve()
    snapshot = _config.definition_to_dict(defn)
    assert _config.validate_data("definition", snapshot) == []
    assert definition_from_dict(json.loads(json.dumps(snapshot)), source=defn.source) == defn


@pytest.mark.parametrize("path", [p for p in VALID if p.parent.parent.name == "assembly"],
                         ids=_ids([p for p in VALID if p.parent.parent.name == "assembly"]))
def test_valid_assembly_example_loads(path: Path) -> None:
    """Every valid assembly example loads into an :class:`Assembly` that knows its file."""
    assert load_assembly(path).path == path.resolve()


@pytest.mark.parametrize("path", [p for p in VALID if p.parent.parent.name == "instance"],
                         ids=_ids([p for p in VALID if p.parent.parent.name == "instance"]))
def test_valid_instance_snapshot_resumes_without_the_file(path: Path) -> None:
    """The definition snapshot of every valid instance example loads on its own."""
    header = json.loads(path.read_text(encoding="utf-8"))
    assert definition_from_dict(header["definition"]).name == header["name"]


@pytest.mark.parametrize("path", INVALID, ids=_ids(INVALID))
def test_invalid_example_fails_with_the_expected_problems(path: Path) -> None:
    """Every invalid example says why, and fails with exactly the problems it expects, at their positions."""
    notes = _notes(path)
    assert re.search(r"^# invalid: \S", notes, re.MULTILINE), f"{path.name} does not say why it is invalid"
    expected = [m.groups() for line in notes.splitlines() if (m := _EXPECT_RE.match(line))]
    assert expected, f"{path.name} has no '# expect:' lines"
    problems = validate_file(path, path.parent.parent.name)  # type: ignore[arg-type]
    assert len(problems) == len(expected), "\n".join(map(str, problems))
    for (line, column, json_path, text), problem in zip(expected, problems, strict=True):
        where = (problem.line, problem.column, problem.path)
        assert where == (int(line), int(column), json_path), str(problem)
        assert text in problem.message, str(problem)
        assert problem.file == str(path)


# ---------------------------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "definitions.md"


@pytest.mark.parametrize(("kind", "pointer"), [
    ("definition", ""), ("assembly", ""), ("definition", "/$defs/limits"),
    ("definition", "/$defs/input/oneOf/1"),
])
def test_every_key_is_documented(kind: str, pointer: str) -> None:
    """Every definition, assembly, limits and input key has a row in ``docs/definitions.md``."""
    text = DOCS.read_text(encoding="utf-8")
    missing = [key for key in _at(kind, pointer)["properties"] if f"| `{key}` |" not in text]
    assert not missing, f"docs/definitions.md has no table row for {missing}"
