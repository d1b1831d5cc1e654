"""The schemas compiled ahead of time (``loopwright/_schema_*.py``) cannot drift from ``specs/`` nor pass bad data.

:func:`loopwright._schemas.fast_valid` lets valid data through without importing jsonschema (the
CLI's start-up); jsonschema still decides, and words, everything else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopwright import _schemas
from loopwright._yaml import load_yaml

ROOT = Path(__file__).resolve().parents[2]


def _files(kind: str) -> list[Path]:
    """Every example of ``specs/examples/KIND``, and every YAML file of the docs, examples and tests."""
    found = sorted((ROOT / "specs" / "examples" / kind).glob("*/*"))
    for where in ("docs", "examples", "tests", "core/tests"):
        found += sorted((ROOT / where).rglob("*.yaml"))
    return found


@pytest.mark.parametrize("kind", ["assembly", "definition"])
def test_the_compiled_modules_are_what_the_schemas_compile_to(kind: str) -> None:
    """Regenerating gives the committed file (after editing a schema: ``_schemas.write_compiled()``)."""
    committed = (Path(_schemas.__file__).parent / f"_schema_{kind}.py").read_text(encoding="utf-8")
    assert committed == _schemas.compiled_source(kind), (  # type: ignore[arg-type]
        "specs/ changed: run python -c 'from loopwright._schemas import write_compiled; write_compiled()'")


@pytest.mark.parametrize("kind", ["assembly", "definition"])
def test_the_compiled_validator_agrees_with_jsonschema(kind: str) -> None:
    """On every example and YAML file of the repository, the fast check passes exactly what jsonschema passes."""
    checked = {True: 0, False: 0}
    for file in _files(kind):
        try:
            data: Any = load_yaml(file)[0]
        except Exception:  # noqa: BLE001, S112 - not YAML: nothing to compare
            continue
        valid = not list(_schemas.validator(kind).iter_errors(data))  # type: ignore[arg-type]
        assert _schemas.fast_valid(kind, data) is valid, file  # type: ignore[arg-type]
        checked[valid] += 1
    assert checked[True] > 5, checked
    assert checked[False] > 5, checked


def test_option_schemas_pass_valid_options_and_defer_the_rest() -> None:
    """An option schema passes valid options without jsonschema, and its problems are still worded by it."""
    option_schema = {"type": "object", "additionalProperties": False,
                     "properties": {"path": {"type": "string", "minLength": 1},
                                    "timeout": {"$ref": "https://loopwright.dev/specs/definition.schema.json#/$defs/duration"}}}
    assert _schemas.option_problems(option_schema, {"path": "x", "timeout": "5s"}, at=("store",), file=None) == []
    problems = _schemas.option_problems(option_schema, {"pth": "x", "timeout": -1}, at=("store",), file=None)
    assert {p.path for p in problems} >= {"$.store.pth"}, problems
    assert any("did you mean 'path'" in p.message for p in problems), problems


@pytest.mark.parametrize("option_schema", [
    {"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{"type": "string"}]}}},
    {"type": "array", "items": [{"type": "string"}]},
    {"$ref": "#/$defs/x", "minimum": 3, "$defs": {"x": {"type": "integer"}}},
    {"type": "object", "unevaluatedProperties": False},
])
def test_keywords_that_differ_between_drafts_leave_it_to_jsonschema(option_schema: dict[str, Any]) -> None:
    """A schema using a keyword draft 7 reads otherwise gets no fast check."""
    import json  # noqa: PLC0415

    assert _schemas._fast_option_validator(json.dumps(option_schema, sort_keys=True)) is None


@pytest.mark.parametrize(("option_schema", "valid"), [
    ({"type": "object", "additionalProperties": False, "properties": {}}, True),
    ({"properties": {"a": {"type": "string"}}, "patternProperties": {"^x": {}}, "description": "d"}, True),
    ({"type": ["object", "null"], "propertyNames": {"maxLength": 1}}, True),
    ({"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}}, False),
    ({"type": "object", "minProperties": 1}, False),
    ({"type": "string"}, False),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, False),
])
def test_no_options_are_checked_without_a_validator_where_the_schema_cannot_refuse_them(
    option_schema: dict[str, Any], valid: bool,
) -> None:
    """No options against a schema only about keys (issue 30): valid on sight; anything else is asked as before."""
    assert _schemas._empty_is_valid(option_schema) is valid
    problems = _schemas.option_problems(option_schema, {}, at=("engine",), file=None)
    assert (problems == []) is valid, problems
    assert (list(jsonschema_validator(option_schema).iter_errors({})) == []) is valid


def jsonschema_validator(option_schema: dict[str, Any]) -> Any:
    import jsonschema  # noqa: PLC0415 - the reference the shortcut must agree with

    return jsonschema.Draft202012Validator(option_schema)
