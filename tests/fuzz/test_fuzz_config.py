"""Fuzzing definitions and assemblies as YAML: every file ends in a Definition/Assembly or a ConfigError.

Two kinds of input: YAML-ish text (random lines of YAML punctuation, keys of the schemas, anchors,
aliases, tags, flow collections and indentation), and structured documents built from the JSON
Schemas in ``specs/`` (the schema's own keys with values of the right shape, or of a random one),
written as YAML. The loader must return a value or raise :class:`ConfigError` whose every problem
names the file and a position (a line or a JSON path); ``loopwright validate`` must exit 0 or 2
without a traceback. Nothing may raise another exception or hang.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fuzzing import HANG_GUARD, fuzz
from hypothesis import example, given
from hypothesis import strategies as st
from ruamel.yaml import YAML

from loopwright._config import load_assembly, load_definition
from loopwright._definition import Assembly, Definition
from loopwright.errors import ConfigError

SPECS = Path(__file__).parents[2] / "specs"
DEFINITION_SCHEMA = json.loads((SPECS / "definition.schema.json").read_text())
ASSEMBLY_SCHEMA = json.loads((SPECS / "assembly.schema.json").read_text())

# -- random JSON values, and values shaped by a schema -----------------------------------------------------

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40),
    st.floats(),  # NaN and infinity included: the loader refuses them where a number is a duration or limit
    st.text(max_size=20),
    st.sampled_from(["", "s:m", "test:any", "1s", "500ms", "30m", "2h", "80%", "./work", "/", "..", "none",
                     "allow", "loopApproval", "approval", "{{ x }}", "{{", "file", "memory", "scripted"]),
)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        return _resolve({**node, **{k: v for k, v in schema.items() if k != "$ref"}}, root)
    return schema


def shaped(schema: Any, root: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values shaped like ``schema`` most of the time, and random JSON (a wrong shape) sometimes."""
    if not isinstance(schema, dict) or depth > 5:
        return JSON
    schema = _resolve(schema, root)
    options: list[st.SearchStrategy[Any]] = []
    if "enum" in schema:
        options.append(st.sampled_from(schema["enum"]))
    if "const" in schema:
        options.append(st.just(schema["const"]))
    options.extend(shaped(sub, root, depth + 1) for key in ("oneOf", "anyOf") for sub in schema.get(key, []))
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    props = schema.get("properties")
    if "object" in kinds or props:
        fields = {k: shaped(v, root, depth + 1) for k, v in (props or {}).items()}
        extra = schema.get("additionalProperties")
        values = shaped(extra, root, depth + 1) if isinstance(extra, dict) else JSON
        if fields:
            options.append(st.fixed_dictionaries({}, optional=fields))
        options.append(st.dictionaries(st.sampled_from([*fields, "x", "name"]) if fields else st.text(max_size=8),
                                       values, max_size=3))
    if "array" in kinds:
        options.append(st.lists(shaped(schema.get("items"), root, depth + 1), max_size=3))
    scalar = {"string": st.text(max_size=12), "integer": st.integers(-5, 10**6), "boolean": st.booleans(),
              "number": st.floats(-1e6, 1e6, allow_nan=False), "null": st.none()}
    options.extend(scalar[k] for k in kinds if k in scalar)
    if not options:
        return JSON
    return st.one_of(*options, JSON) if depth else st.one_of(*options)


def document(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    fields = {k: shaped(v, schema, 1) for k, v in schema["properties"].items()}
    return st.fixed_dictionaries({}, optional=fields)


def as_yaml(data: Any) -> str:
    out = io.StringIO()
    YAML(typ="safe", pure=True).dump(data, out)
    return out.getvalue()


# -- YAML-ish text -------------------------------------------------------------------------------------------

_TOKENS = [
    "name", "model", "tools", "limits", "store", "providers", "capabilities", "files", "read", "write", "shell",
    "initialPrompts", "toolCalls", "output", "hooks", "plugins", "agentDefinitions", "kind", "s:m", "x",
    ": ", ":", "- ", "-", "[", "]", "{", "}", ",", "&a ", "*a", "&b ", "*b", "<<: ",
    "!tag ", "!!map ", "!!int ", "!!float ", "!!str ", "!!bool ", "!!seq ", "!!null ", "!!timestamp ",
    "? ", "|", ">", "'", '"', "#", "%YAML 1.2\n", "---\n", "...\n", "\t", "  ", "    ", "\n", "\r\n",
    "~", "null", "true", "1e9", "0x1F", "-.inf", "1s", "\\", "\x00", "\ufeff", "é", "{{ a }}",
]
YAMLISH = st.lists(st.one_of(st.sampled_from(_TOKENS), st.text(max_size=4)), max_size=60).map("".join)

#: Input classes the fuzzers found crashing the loader (bare ValueError/IndexError/TypeError), fixed
#: since, and kept as regression tests below:
#: 1. an explicit standard tag whose value its constructor cannot build (``!!int x``, ``!!int``, ``!!float abc``,
#:    ``!!str [1]``);
#: 2. an assembly provider entry that is not a mapping (``providers: {x: null}``), in the reporter of the
#:    ``not: {required: [apiKey, apiKeyEnv]}`` rule.
FOUND_TAG_FAILURES = ["!!int x\n", "!!int \n", "!!float abc\n", "!!str [1]\n", "a: !!bool maybe\n",
                      "name: !!int x\nmodel: s:m\n"]
FOUND_PROVIDER_FAILURES = ["providers: {x: null}\n", "providers: {x: 5}\n"]


# -- the properties -------------------------------------------------------------------------------------------


def _check_error(exc: ConfigError, file: Path) -> None:
    assert exc.problems, f"a ConfigError without problems: {exc}"
    for problem in exc.problems:
        assert problem.file is not None, f"a problem without its file: {problem}"
        assert problem.line is not None or problem.path not in (None, ""), f"a problem without a position: {problem}"
    assert str(exc)


def _load(kind: str, text: str, tmp: Path) -> None:
    file = tmp / ("agent.yaml" if kind == "definition" else "loopwright.yaml")
    file.write_text(text, encoding="utf-8")
    try:
        loaded = load_definition(file) if kind == "definition" else load_assembly(file)
    except ConfigError as exc:
        _check_error(exc, file)
    else:
        assert isinstance(loaded, Definition if kind == "definition" else Assembly)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize("kind", ["definition", "assembly"])
@fuzz(200)
@given(text=YAMLISH.filter(_encodable))
@example(text="!!float 0x1F")  # a value its tag cannot make: a ValueError inside ruamel, once a crash
def test_yamlish_text_loads_or_gives_a_config_error(tmp_path_factory: pytest.TempPathFactory, kind: str,
                                                    text: str) -> None:
    _load(kind, text, tmp_path_factory.mktemp("y"))


@fuzz(100)
@given(data=document(DEFINITION_SCHEMA))
def test_structured_definitions_load_or_give_a_config_error(tmp_path_factory: pytest.TempPathFactory,
                                                            data: dict[str, Any]) -> None:
    _load("definition", as_yaml(data), tmp_path_factory.mktemp("d"))


@fuzz(100)
@given(data=document(ASSEMBLY_SCHEMA))
def test_structured_assemblies_load_or_give_a_config_error(tmp_path_factory: pytest.TempPathFactory,
                                                           data: dict[str, Any]) -> None:
    _load("assembly", as_yaml(data), tmp_path_factory.mktemp("a"))


@fuzz(2)
@given(defs=st.lists(st.one_of(document(DEFINITION_SCHEMA).map(as_yaml),
                               YAMLISH.filter(_encodable)), min_size=20, max_size=20))
def test_validate_exits_0_or_2_and_names_each_bad_file(tmp_path_factory: pytest.TempPathFactory,
                                                       defs: list[str]) -> None:
    """``loopwright validate`` over 20 files (one process per example: processes are slow): exit 0 or 2,
    no traceback, and every file the loader refuses is named."""
    tmp = tmp_path_factory.mktemp("v")
    bad = []
    for k, text in enumerate(defs):
        (tmp / f"a{k}.yaml").write_text(text, encoding="utf-8")
        try:
            load_definition(tmp / f"a{k}.yaml")
        except ConfigError:
            bad.append(f"a{k}.yaml")
    files = [f"a{k}.yaml" for k in range(len(defs))]
    proc = subprocess.run([sys.executable, "-m", "loopwright.cli", "validate", "--kind", "definition", *files],
                          cwd=tmp, capture_output=True, text=True, timeout=HANG_GUARD * 3, check=False)
    assert proc.returncode == (2 if bad else 0), (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for file in bad:
        assert file in proc.stdout + proc.stderr, (file, proc.stdout, proc.stderr)


@pytest.mark.parametrize("text", FOUND_TAG_FAILURES)
def test_standard_tags_that_cannot_be_built_are_config_errors(tmp_path: Path, text: str) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_definition(file)
    _check_error(caught.value, file)
    assert "!!" in str(caught.value)


@pytest.mark.parametrize("text", FOUND_PROVIDER_FAILURES)
def test_provider_entries_that_are_not_mappings_are_config_errors(tmp_path: Path, text: str) -> None:
    file = tmp_path / "loopwright.yaml"
    file.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_assembly(file)
    _check_error(caught.value, file)
    assert all("not both" not in p.message for p in caught.value.problems)
