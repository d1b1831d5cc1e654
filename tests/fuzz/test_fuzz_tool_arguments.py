"""Fuzzing tool arguments: whatever a model sends as a call's arguments, it gets a tool result back.

A host runtime (in-process, a file store, the ``scripted`` provider of ``loopwright-testing``) runs
one agent per example. The model calls one of several tools with schemas (integers, an enum, lists,
an optional mapping, the built-in ``todowrite`` with its nested objects) or a name that is no tool,
with random JSON arguments or raw text that is not a JSON object, then answers. Each call must come
back as exactly one tool result with a :class:`ToolStatus` the model sees; arguments that break the
tool's schema never come back ``success``; and the instance rests (``waiting``), never ``error``.

Non-finite numbers (NaN, infinity, as Python floats and as JSON literals in raw text) and
arguments nested far deeper than the 64 levels a tool call may hold are generated too: both must
give ``invalid_arguments``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, Literal

import anyio
import anyio.from_thread
import jsonschema
import pytest
from fuzzing import HANG_GUARD, fuzz
from hypothesis import given
from hypothesis import strategies as st

import loopwright
from loopwright import ToolCall, ToolStatus, hookimpl
from loopwright._definition import Assembly, StoreConfig
from loopwright.abc import ProviderSettings
from loopwright_testing import ScriptedProvider, reply


@loopwright.tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@loopwright.tool
def greet(name: str, times: int = 1, loud: bool = False) -> str:
    """Greet someone.

    Args:
        name: Who.
        times: How often.
        loud: Shout.
    """
    text = f"hello {name}" * max(0, min(times, 3))
    return text.upper() if loud else text


@loopwright.tool
def pick(choice: Literal["a", "b"], tags: list[str], meta: dict[str, int] | None = None) -> str:
    """Pick one.

    Args:
        choice: a or b.
        tags: Labels.
        meta: Counts by name.
    """
    return f"{choice} {len(tags)} {sorted(meta or {})}"


TOOLS = ("add", "greet", "pick", "todowrite")
RUNTIME_ID = re.compile(r"^lw-\d+-\d+-[0-9a-f]{6}$")
"""The shape of the runtime's own id for a tool call: ``lw-TURN-INDEX-RANDOM6HEX``."""


class _Plugin:
    def __init__(self, provider: ScriptedProvider) -> None:
        self.provider = provider

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        register("fz", lambda _settings: self.provider)

    @hookimpl
    def loopwright_register_tools(self, register: Callable[..., None]) -> None:
        register(add, greet, pick)


class Host:
    """A runtime open in a blocking portal's event loop, shared by the examples of the module."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, rt: loopwright.Runtime,
                 provider: ScriptedProvider) -> None:
        self.portal = portal
        self.rt = rt
        self.provider = provider
        self.definition = loopwright.Definition(name="fz", model="fz:m", tools=TOOLS)
        self.schemas = {s.name: s.parameters for s in rt.tool_specs(self.definition)}

    def call(self, call: ToolCall) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        """Run one agent whose model makes ``call`` and then answers.

        Return its state, its saved tool results and the saved calls of its model's messages.
        """
        self.provider.clear()
        self.provider.enqueue(reply(None, call), "done")

        async def run() -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
            agent = await self.rt.start_agent(self.definition, prompt="go")
            with anyio.fail_after(HANG_GUARD):
                result = await agent.wait()
            entries = await self.rt.store.read_entries(agent.instance_id)
            messages = [e["m"] for e in entries if e.get("t") == "msg"]
            tools = [m for m in messages if m.get("role") == "tool"]
            calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("toolCalls") or ()]
            return str(result.state), tools, calls

        return self.portal.call(run)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    store = tmp_path_factory.mktemp("fuzz-tools") / "store"
    provider = ScriptedProvider(ProviderSettings(name="fz", kind="fz"))
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(store)}))
    with anyio.from_thread.start_blocking_portal() as portal:
        rt = loopwright.Runtime(asm, plugins=(_Plugin(provider),), autoload=False)
        with portal.wrap_async_context_manager(rt):
            yield Host(portal, rt, provider)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(), st.text(max_size=10),
                    st.sampled_from(["a", "b", "", "0", "1", "true", "null", "{}", "[]"]))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=16)
KEYS = st.one_of(st.sampled_from(["a", "b", "name", "times", "loud", "choice", "tags", "meta", "todos", "id", "text",
                                  "completed", ""]), st.text(max_size=6))
ARGUMENTS = st.dictionaries(KEYS, JSON, max_size=5)
NAMES = st.one_of(st.sampled_from(TOOLS), st.sampled_from(["", "nope", "task_complete ", "ADD", "add\n"]),
                  st.text(max_size=8))
RAW = st.one_of(st.text(max_size=40), JSON.map(repr), st.sampled_from(["{", '{"a": 1', "null", "[1]",
                                                                                     '"x"', "{'a': 1}", "\x00",
                                                                                     '{"a": NaN}', '{"a": -Infinity}',
                                                                                     '{"a": 1e999}']))


def _nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = {"a": leaf}
    return leaf


def _check(host: Host, call: ToolCall) -> None:
    state, results, calls = host.call(call)
    assert state == "waiting", (state, results)
    assert len(results) == 1, results
    (result,) = results
    # The result answers the call the model made: under the runtime's own id, with the model's id
    # kept as the wire id.
    (made,) = calls
    assert RUNTIME_ID.match(made["id"]), made
    assert (made.get("wireId"), made["name"]) == (call.id, call.name)
    assert (result["toolCallId"], result.get("toolCallWireId")) == (made["id"], call.id)
    status = ToolStatus(result["status"])
    assert isinstance(result.get("content"), str)
    if call.name not in TOOLS:
        assert status is ToolStatus.UNKNOWN_TOOL, result
    elif call.raw_arguments is not None:
        assert status is ToolStatus.INVALID_ARGUMENTS, result
    elif status is ToolStatus.SUCCESS:
        jsonschema.validate(call.arguments, host.schemas[call.name])  # what broke the schema never runs


@fuzz(200)
@given(name=NAMES, arguments=ARGUMENTS)
def test_random_json_arguments_get_a_tool_result(host: Host, name: str, arguments: dict[str, Any]) -> None:
    _check(host, ToolCall(id="fz1", name=name, arguments=arguments))


@fuzz(30)
@given(name=NAMES, depth=st.integers(65, 100_000), as_text=st.booleans())
def test_arguments_nested_too_deep_get_invalid_arguments(host: Host, name: str, depth: int, as_text: bool) -> None:
    """However deep (up to 100,000 levels), as decoded arguments or as raw text: a result, never ``error``."""
    if as_text:
        raw = '{"a": ' * depth + "1" + "}" * depth
        _check(host, ToolCall(id="fz4", name=name, arguments={}, raw_arguments=raw))
    else:
        _check(host, ToolCall(id="fz4", name=name, arguments=_nested(depth, 1)))


@fuzz(100)
@given(name=st.sampled_from(TOOLS), raw=RAW)
def test_raw_arguments_that_are_no_json_object_get_invalid_arguments(host: Host, name: str, raw: str) -> None:
    _check(host, ToolCall(id="fz2", name=name, arguments={}, raw_arguments=raw))


@fuzz(100)
@given(data=st.data())
def test_arguments_shaped_like_the_schema_get_a_tool_result(host: Host, data: st.DataObject) -> None:
    """Arguments with the schema's own keys and values of the right type, often: these reach the tools."""
    name = data.draw(st.sampled_from(TOOLS), label="name")
    props = host.schemas[name].get("properties", {})
    typed = {"integer": st.integers(-5, 5), "string": st.text(max_size=5), "boolean": st.booleans(),
             "array": st.lists(st.one_of(st.text(max_size=3), st.fixed_dictionaries(
                 {"id": st.text(max_size=3), "text": st.text(max_size=3), "completed": st.booleans()})), max_size=3),
             "object": st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2)}

    def value(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
        kinds = [schema.get("type")] if isinstance(schema.get("type"), str) else list(schema.get("type") or [])
        kinds += [s.get("type") for s in schema.get("anyOf", []) if isinstance(s.get("type"), str)]
        options = [typed[k] for k in kinds if k in typed]
        if "enum" in schema:
            options.append(st.sampled_from(schema["enum"]))
        return st.one_of(*options, JSON) if options else JSON

    arguments = data.draw(st.fixed_dictionaries({}, optional={k: value(v) for k, v in props.items()}), label="args")
    _check(host, ToolCall(id="fz3", name=name, arguments=arguments))


def test_the_host_reports_a_success_and_a_refusal(host: Host) -> None:
    """The control: the check above can tell a call that ran from one that was refused."""
    assert host.call(ToolCall(id="ok", name="add", arguments={"a": 1, "b": 2}))[1][0]["status"] == "success"
    assert host.call(ToolCall(id="no", name="add", arguments={"a": "1"}))[1][0]["status"] == "invalid_arguments"

