"""Tests of the schema-driven argument generator behind the ``test`` provider."""

from __future__ import annotations

import jsonschema
import pytest
from lwtesting_tools import add, shout

from loopwright_testing import generate_arguments, generate_value

SCHEMAS = {
    "integers": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    "bounded": {
        "type": "object",
        "required": ["n", "x", "s"],
        "properties": {
            "n": {"type": "integer", "minimum": 10, "maximum": 20, "multipleOf": 5},
            "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "s": {"type": "string", "minLength": 3, "maxLength": 5},
        },
    },
    "enum_const": {
        "type": "object",
        "required": ["mode", "version"],
        "properties": {"mode": {"enum": ["fast", "slow"]}, "version": {"const": 2}},
    },
    "nested": {
        "type": "object",
        "required": ["todos"],
        "properties": {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "text", "completed"],
                    "properties": {
                        "id": {"type": "string"},
                        "text": {"type": "string"},
                        "completed": {"type": "boolean"},
                    },
                    "additionalProperties": False,
                },
            }
        },
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "required": ["q"],
        "properties": {
            "q": {"type": "string"},
            "limit": {"type": "integer", "default": 10},
            "title": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
    },
    "refs": {
        "type": "object",
        "required": ["point"],
        "properties": {"point": {"$ref": "#/$defs/Point"}},
        "$defs": {
            "Point": {
                "type": "object",
                "required": ["x", "y"],
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            }
        },
    },
    "any_of_null_first": {
        "type": "object",
        "required": ["v"],
        "properties": {"v": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 5}]}},
    },
    "type_list": {"type": "object", "required": ["v"], "properties": {"v": {"type": ["null", "boolean"]}}},
    "min_items": {
        "type": "object",
        "required": ["tags"],
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "format": "email"},
                "minItems": 2,
                "uniqueItems": True,
            }
        },
    },
    "all_of": {
        "allOf": [
            {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}},
            {"required": ["b"], "properties": {"b": {"type": "integer", "maximum": 0}}},
        ]
    },
    "recursive": {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "required": ["child"],
                "properties": {"child": {"$ref": "#/$defs/Node"}},
            }
        },
    },
    "empty": {"type": "object"},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_generated_arguments_validate(name):
    """Arguments generated for each schema are accepted by that schema."""
    args = generate_arguments(SCHEMAS[name])
    if name != "recursive":
        jsonschema.validate(args, SCHEMAS[name])
        return
    # An endless required chain cannot be satisfied: it is cut off after 8 levels, where the
    # innermost object is left empty (the one place the schema is not met).
    node, levels = args, 0
    while node:
        assert list(node) == ["child"]
        node, levels = node["child"], levels + 1
    assert (levels, node) == (8, {})
    with pytest.raises(jsonschema.ValidationError, match="'child' is a required property"):
        jsonschema.validate(args, SCHEMAS[name])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_generation_is_deterministic(name):
    """The same schema always gives the same arguments."""
    assert generate_arguments(SCHEMAS[name]) == generate_arguments(SCHEMAS[name])


def test_integers_count_up_from_one():
    """Successive integers are 1, 2, ... so that add(a, b) gets a=1, b=2."""
    assert generate_arguments(SCHEMAS["integers"]) == {"a": 1, "b": 2}


def test_bounds_are_respected():
    """minimum, maximum, multipleOf, exclusive bounds and string lengths shape the values."""
    args = generate_arguments(SCHEMAS["bounded"])
    assert args["n"] == 10
    assert 0 < args["x"] < 1
    assert args["s"] == "aaa"


def test_enum_and_const():
    """An enum gives its first value and a const gives the constant."""
    assert generate_arguments(SCHEMAS["enum_const"]) == {"mode": "fast", "version": 2}


def test_arrays_hold_one_generated_item():
    """An array gets one item, generated from its items schema, recursively."""
    assert generate_arguments(SCHEMAS["nested"]) == {"todos": [{"id": "a", "text": "b", "completed": True}]}


def test_optional_properties_are_left_out():
    """Only required properties are generated; optional ones (with defaults) are omitted."""
    assert generate_arguments(SCHEMAS["optional"]) == {"q": "a"}


def test_refs_and_any_of():
    """Local $ref is followed and anyOf takes its first non-null option."""
    assert generate_arguments(SCHEMAS["refs"]) == {"point": {"x": 1, "y": 2}}
    assert generate_arguments(SCHEMAS["any_of_null_first"]) == {"v": 5}
    assert generate_arguments(SCHEMAS["type_list"]) == {"v": True}


def test_min_items_and_formats():
    """minItems is honoured and string formats get a well-formed value."""
    assert generate_arguments(SCHEMAS["min_items"]) == {"tags": ["a@example.com", "b@example.com"]}


def test_recursion_is_cut_off():
    """A schema that refers to itself produces a finite value."""
    value = generate_arguments(SCHEMAS["recursive"])
    depth = 0
    while value:
        value = value["child"]
        depth += 1
    assert 0 < depth < 20


def test_scalars():
    """Top-level scalar schemas give the documented values."""
    assert generate_value({"type": "string"}) == "a"
    assert generate_value({"type": "integer"}) == 1
    assert generate_value({"type": "boolean"}) is True
    assert generate_value({"type": "null"}) is None
    assert generate_value({"type": "array", "items": {"type": "integer"}, "maxItems": 0}) == []
    assert generate_arguments({"type": "string"}) == {}


def test_tool_schemas_from_type_hints():
    """Schemas that loopwright.tool builds from type hints give valid arguments."""
    for made in (add, shout):
        args = generate_arguments(made.parameters)
        jsonschema.validate(args, made.parameters)
    assert generate_arguments(shout.parameters) == {"word": "a"}
