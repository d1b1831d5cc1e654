"""Tools: the decorator, JSON Schemas from type hints and docstrings, validation, and how tools run."""

from __future__ import annotations

import enum
import threading
from pathlib import Path
from typing import Any, Literal, TypedDict

import anyio
import attrs
import pytest
from helpers import Harness, call, defn, make_runtime, reply, result_for, run_to_rest

import loopwright
from loopwright import Tool, ToolStatus
from loopwright._tools import as_tool, schema_for_function


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Point(TypedDict):
    x: int
    y: int


@attrs.frozen
class Box:
    width: float
    label: str = "box"


# ------------------------------------------------------------------------------------------
# The decorator
# ------------------------------------------------------------------------------------------


def test_decorator_without_arguments_makes_a_tool_with_defaults() -> None:
    """@tool on a function returns a Tool named after it, with the default flags."""

    @loopwright.tool
    def greet(name: str) -> str:
        """Say hello."""
        return f"hello {name}"

    assert isinstance(greet, Tool)
    assert (greet.name, greet.description) == ("greet", "Say hello.")
    assert (greet.parallel_safe, greet.requires_approval, greet.ends_loop, greet.idempotent, greet.timeout) == (
        True, False, False, False, None)
    assert greet.is_async is False
    assert greet.function("Ada") == "hello Ada"


def test_decorator_with_arguments_sets_the_flags() -> None:
    """@tool(...) sets name, description, parallel_safe, requires_approval, ends_loop, idempotent and timeout."""

    @loopwright.tool(name="renamed", description="Custom.", parallel_safe=False, requires_approval=True,
                     ends_loop=True, idempotent=True, timeout=2.5)
    async def original() -> None:
        """Ignored docstring."""

    assert (original.name, original.description) == ("renamed", "Custom.")
    assert (original.parallel_safe, original.requires_approval, original.ends_loop, original.idempotent) == (
        False, True, True, True)
    assert original.timeout == 2.5
    assert original.is_async is True


def test_tool_spec_is_built_once() -> None:
    """The ToolSpec handed to the model is the same object every time (built once, not per call)."""

    @loopwright.tool
    def f(a: int) -> int:
        """F."""
        return a

    assert f.spec is f.spec
    assert (f.spec.name, f.spec.description, dict(f.spec.parameters)) == ("f", "F.", dict(f.parameters))


def test_as_tool_wraps_plain_functions() -> None:
    """A plain function registered as a tool gets the decorator's defaults; a Tool passes through."""

    def plain(a: int) -> int:
        """Plain."""
        return a

    made = as_tool(plain)
    assert made.name == "plain"
    assert as_tool(made) is made
    with pytest.raises(TypeError):
        as_tool(42)


@pytest.mark.parametrize("name", ["has space", "x" * 65, "dots.not.allowed", "slash/name"])
def test_invalid_tool_names_are_rejected(name: str) -> None:
    """Tool names must be 1-64 characters of letters, digits, '_' and '-'."""

    def f() -> None:
        """F."""

    with pytest.raises(ValueError, match="tool name"):
        loopwright.tool(name=name)(f)


def test_unsupported_annotation_is_rejected_at_definition() -> None:
    """A parameter type with no JSON Schema fails when the tool is made, not when it is called."""

    def f(x: threading.Lock) -> None:
        """F."""

    with pytest.raises(TypeError, match="JSON Schema"):
        loopwright.tool(f)


# ------------------------------------------------------------------------------------------
# Schemas
# ------------------------------------------------------------------------------------------


def test_schema_from_google_docstring() -> None:
    """Google-style Args: give the argument descriptions; the first paragraph is the description."""

    @loopwright.tool
    def search(query: str, limit: int = 10) -> list[str]:
        """Search the index
        for documents.

        Longer explanation that is not part of the summary.

        Args:
            query: What to look for.
            limit (int): At most this many results,
                counted after ranking.

        Returns:
            The matching ids.
        """
        return []

    assert search.description == "Search the index for documents."
    assert search.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "limit": {"type": "integer", "description": "At most this many results, counted after ranking.",
                      "default": 10},
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def test_schema_from_sphinx_docstring() -> None:
    """Sphinx :param x: lines give the argument descriptions."""

    @loopwright.tool
    def move(dx: float, dy: float = 0.0) -> None:
        """Move the cursor.

        :param dx: Horizontal distance.
        :param float dy: Vertical distance.
        :return: Nothing.
        """

    assert move.description == "Move the cursor."
    props = move.parameters["properties"]
    assert props["dx"] == {"type": "number", "description": "Horizontal distance."}
    assert props["dy"] == {"type": "number", "description": "Vertical distance.", "default": 0.0}
    assert move.parameters["required"] == ["dx"]


def test_schema_for_rich_types() -> None:
    """Optional, Literal, list, dict, TypedDict, enum and attrs classes map to JSON Schema."""

    def f(  # noqa: PLR0917 - one parameter per type under test
        maybe: str | None,
        mode: Literal["fast", "slow"],
        tags: list[str],
        counts: dict[str, int],
        point: Point,
        colour: Colour,
        box: Box,
        anything: Any,
        flag: bool = False,
        number: int | float = 1,  # noqa: PYI041 - the schema must say integer or number
    ) -> None:
        """F."""

    props = schema_for_function(f)["properties"]
    assert props["maybe"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert props["mode"] == {"enum": ["fast", "slow"]}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["point"] == {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                              "required": ["x", "y"], "additionalProperties": False}
    assert props["colour"] == {"enum": ["red", "green"]}
    assert props["box"] == {"type": "object",
                            "properties": {"width": {"type": "number"}, "label": {"type": "string"}},
                            "required": ["width"], "additionalProperties": False}
    assert props["anything"] == {}
    assert props["flag"] == {"type": "boolean", "default": False}
    assert props["number"] == {"anyOf": [{"type": "integer"}, {"type": "number"}], "default": 1}
    assert schema_for_function(f)["required"] == ["maybe", "mode", "tags", "counts", "point", "colour", "box",
                                                  "anything"]


def test_optional_with_none_default_is_not_required() -> None:
    """A parameter defaulting to None is optional and accepts null."""

    @loopwright.tool
    def f(title: str | None = None) -> None:
        """F."""

    assert "required" not in f.parameters
    assert f.parameters["properties"]["title"]["default"] is None
    assert f.validation_errors({}) == []
    assert f.validation_errors({"title": None}) == []


def test_no_parameters_gives_an_empty_object_schema() -> None:
    """A tool without parameters accepts exactly the empty object."""

    @loopwright.tool
    def ping() -> str:
        """Ping."""
        return "pong"

    assert ping.parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    assert ping.validation_errors({}) == []
    assert ping.validation_errors({"x": 1})


def test_validation_errors_are_readable() -> None:
    """Validation problems read like 'a: required' and name the path of nested fields."""

    @loopwright.tool
    def f(a: int, point: Point, mode: Literal["x", "y"] = "x") -> None:
        """F."""

    assert f.validation_errors({"a": 1, "point": {"x": 1, "y": 2}}) == []
    assert f.validation_errors({"point": {"x": 1, "y": 2}}) == ["a: required"]
    problems = f.validation_errors({"a": "1", "point": {"x": 1}, "mode": "z"})
    assert "point.y: required" in problems
    assert any(p.startswith("a: ") for p in problems)
    assert any(p.startswith("mode: ") for p in problems)


# ------------------------------------------------------------------------------------------
# Running tools
# ------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sync_tool_runs_in_a_worker_thread(tmp_path: Path) -> None:
    """A plain function tool runs in a worker thread, not on the event loop's thread."""
    threads: dict[str, int] = {}

    @loopwright.tool
    def where() -> str:
        """Report the thread."""
        threads["sync"] = threading.get_ident()
        return "here"

    @loopwright.tool
    async def where_async() -> str:
        """Report the thread."""
        threads["async"] = threading.get_ident()
        return "here"

    loop_thread = threading.get_ident()
    h = Harness(reply(None, call("where"), call("where_async")), reply("ok"), tools=[where, where_async])
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, defn(tools=[where, where_async]))
    assert set(threads) == {"sync", "async"}
    assert threads["sync"] != loop_thread
    assert threads["async"] == loop_thread


@pytest.mark.anyio
async def test_sync_tools_do_not_block_each_other(tmp_path: Path) -> None:
    """Parallel-safe plain tools run in separate threads at the same time."""
    barrier = threading.Barrier(2, timeout=5)

    @loopwright.tool
    def meet(i: int) -> int:
        """Wait for the other call."""
        barrier.wait()
        return i

    h = Harness(reply(None, call("meet", "a", i=1), call("meet", "b", i=2)), reply("ok"), tools=[meet])
    async with make_runtime(tmp_path, h) as rt:
        with anyio.fail_after(8):
            run, _ = await run_to_rest(rt, defn(tools=[meet]))
        assert result_for(run.inst.transcript, "a").status is ToolStatus.SUCCESS
        assert result_for(run.inst.transcript, "b").content == "2"


@pytest.mark.anyio
async def test_structured_return_values_become_json(tmp_path: Path) -> None:
    """A tool's dict, list, int or None return value reaches the model as JSON (or empty text)."""

    @loopwright.tool
    def shapes(kind: str) -> Any:
        """Return a shape."""
        return {"dict": {"a": 1, "é": [1, 2]}, "list": [1, "two"], "int": 7, "none": None}[kind]

    calls = [call("shapes", k, kind=k) for k in ("dict", "list", "int", "none")]
    h = Harness(reply(None, *calls), reply("ok"), tools=[shapes])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[shapes]))
        t = run.inst.transcript
        assert result_for(t, "dict").content == '{"a": 1, "é": [1, 2]}'
        assert result_for(t, "list").content == '[1, "two"]'
        assert result_for(t, "int").content == "7"
        assert result_for(t, "none").content == ""


@attrs.frozen
class Reading:
    sensor_id: str
    value: float = 0.0


@pytest.mark.anyio
async def test_attrs_return_values_keep_their_fields(tmp_path: Path) -> None:
    """An attrs return value reaches the model with every field, under its own name."""

    @loopwright.tool
    def read() -> Reading:
        """Read the sensor."""
        return Reading(sensor_id="t1", value=0.0)

    h = Harness(reply(None, call("read", "r")), reply("ok"), tools=[read])
    async with make_runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, defn(tools=[read]))
        assert result_for(run.inst.transcript, "r").content == '{"sensor_id": "t1", "value": 0.0}'


@pytest.mark.anyio
async def test_tool_specs_reach_the_model(tmp_path: Path) -> None:
    """The model request lists the definition's tools with their names, descriptions and schemas."""

    @loopwright.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    h = Harness(reply("ok"), tools=[add])
    async with make_runtime(tmp_path, h) as rt:
        await run_to_rest(rt, defn(tools=[add, "task_complete"]))
    names = [t.name for t in h.requests[0].tools]
    assert names == ["add", "task_complete"]
    assert h.requests[0].tools[0].parameters == add.parameters
    assert h.requests[0].tools[0].description == "Add two integers."
