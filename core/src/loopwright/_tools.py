"""Tools: the :func:`tool` decorator, the :class:`Tool` object and JSON Schemas from type hints.

A tool is a plain or ``async`` function. Its JSON Schema comes from its signature's type hints,
and its description and per-argument descriptions from its docstring (Google ``Args:`` sections
or Sphinx ``:param x:`` lines). The schema and its validator are built once, when the tool is
made, never per call.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import inspect
import re
import threading
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs

from loopwright._definition import Capabilities
from loopwright._patterns import has_patterns, schema_validator
from loopwright._types import ToolSpec

__all__ = ["Tool", "ToolContext", "run_in_daemon_thread", "schema_for_function", "tool"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@attrs.frozen(kw_only=True)
class ToolContext:
    """What a tool may know about the call it serves, passed to tools that ask for it.

    A tool asks by declaring a parameter annotated ``ToolContext`` (imported at run time, not
    under ``TYPE_CHECKING``): that parameter is left out of the JSON Schema and the loop fills it
    in. The same object is given to the tool's ``hold`` check.

    Attributes:
        instance_id: The calling instance.
        tool_call_id: The call being served.
        grants: The instance's grants (already narrowed to the runtime's).
        base_dir: The folder relative file roots in ``grants`` are resolved against.
        store_locations: Where the runtime's store keeps data; no tool should touch them.
        sink_locations: Where the runtime's record sinks write; no tool should touch them either.
        timeout: Seconds the loop waits for this call before giving up on it.
        shell_approver: The host's approver for ``shell: approval`` (``Runtime(shell_approver=...)``),
            called as ``approver(command, context)`` (sync or async); it returns True to run the
            command, False or a reason (a string) to refuse it. ``None`` when the host gave none.
        agents: What the agent tools use to start, reach and wait for other instances on behalf
            of the caller (:class:`loopwright._agents.Agents`); ``None`` outside a run.
        memory: The caller's long-term memory, limited to its grant
            (:class:`loopwright._memory.MemoryAccess`); ``None`` when it has none.
    """

    instance_id: str
    tool_call_id: str
    grants: Capabilities
    base_dir: Path
    store_locations: tuple[Path, ...] = ()
    sink_locations: tuple[Path, ...] = ()
    timeout: float = 60.0
    shell_approver: Callable[..., Any] | None = None
    agents: Any = None
    memory: Any = None


@attrs.frozen(kw_only=True)
class Tool:
    """A tool the model can call.

    Attributes:
        name: What the model calls it (1-64 of ``A-Za-z0-9_-``).
        description: What it does, for the model.
        parameters: The JSON Schema of its arguments.
        function: The callable; ``async def`` is awaited, a plain function runs in a worker thread.
        parallel_safe: Whether it may run at the same time as other calls of the same turn.
        requires_approval: Whether each call is held until someone approves it.
        ends_loop: Whether a successful call ends the run as ``completed``.
        idempotent: Whether a call interrupted by a crash may simply run again on resume.
        timeout: Seconds before the run stops waiting for it; ``None`` uses the definition's limit.
        is_async: Whether ``function`` is a coroutine function.
        plugin: The plugin that registered it, filled in by the registrar.
        available: A check of the calling instance's grants; when it returns False the tool is
            neither offered to the model nor callable (``unknown_tool``). ``None``: always offered.
        hold: Asked with ``(arguments, context)`` after the before_tool_call hooks; a string it
            returns holds the call for approval with that reason (shown to the approver).
        context_param: The parameter annotated :class:`ToolContext`, filled in by the loop.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    function: Callable[..., Any]
    parallel_safe: bool = True
    requires_approval: bool = False
    ends_loop: bool = False
    idempotent: bool = False
    timeout: float | None = None
    is_async: bool = attrs.field(default=attrs.Factory(
        lambda self: inspect.iscoroutinefunction(self.function), takes_self=True))
    plugin: str | None = None
    available: Callable[[Capabilities], bool] | None = None
    hold: Callable[[Mapping[str, Any], ToolContext], str | None] | None = None
    context_param: str | None = None
    _validator: Any = attrs.field(default=None, repr=False, eq=False, alias="_validator")
    _fast: Any = attrs.field(default=None, repr=False, eq=False, alias="_fast")
    _spec: ToolSpec | None = attrs.field(default=None, repr=False, eq=False, alias="_spec")
    _generated: bool = attrs.field(default=False, repr=False, eq=False, alias="_generated")

    def __attrs_post_init__(self) -> None:
        if self._spec is not None:
            return  # a copy made by replace() that kept the schema: validators are reused
        if not _NAME_RE.match(self.name):
            raise ValueError(f"tool name {self.name!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
        if not self._generated:
            # A schema :func:`tool` made from type hints is valid by construction; one given as
            # ``parameters`` is checked against the metaschema (a few ms each: not at every start).
            import jsonschema  # noqa: PLC0415 - jsonschema only once a schema is checked (start-up)

            jsonschema.Draft202012Validator.check_schema(self.parameters)
        # The validators are compiled at the first call's validation (see _validators): a
        # runtime registers every tool at start, and most are never called in a given process.
        object.__setattr__(self, "_spec", ToolSpec(
            name=self.name, description=self.description, parameters=self.parameters))

    def _validators(self) -> tuple[Any, Any]:
        """Return ``(validator, fast)``, compiled once, on first use (two threads may both compile: harmless)."""
        validator = self._validator
        if validator is None:
            # Patterns run on RE2, in linear time; one RE2 cannot compile is not enforced (lenient).
            validator = schema_validator(self.parameters, lenient=True)
            fast = None
            if not has_patterns(self.parameters):  # fastjsonschema would match patterns with re
                import fastjsonschema  # noqa: PLC0415 - compiled on a tool's first call only (start-up)

                try:
                    # Compiled to Python once: about 1 µs per call against 13 µs for jsonschema, which
                    # is kept to explain failures (and for schemas fastjsonschema cannot compile).
                    fast = fastjsonschema.compile(dict(self.parameters), use_default=False)
                except (fastjsonschema.JsonSchemaDefinitionException, TypeError, ValueError):
                    fast = None
            object.__setattr__(self, "_fast", fast)
            object.__setattr__(self, "_validator", validator)
        return validator, self._fast

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return self._spec  # type: ignore[return-value]

    def validation_errors(self, arguments: Mapping[str, Any]) -> list[str]:
        """Return the problems with ``arguments`` (empty when they are valid), e.g. ``a: required``."""
        validator, fast = self._validators()
        if fast is not None:
            import fastjsonschema  # noqa: PLC0415 - imported by _validators already (start-up)

            try:
                fast(arguments)
            except fastjsonschema.JsonSchemaException:
                pass
            else:
                return []
        if validator.is_valid(arguments):
            return []
        problems: list[str] = []
        for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path)):
            where = ".".join(str(p) for p in error.path)
            if error.validator == "required":
                missing = re.findall(r"'([^']+)' is a required property", error.message)
                problems.extend(f"{where}.{name}: required" if where else f"{name}: required" for name in missing)
                continue
            if error.validator == "additionalProperties":
                problems.append(f"{where or '(arguments)'}: {error.message}")
                continue
            problems.append(f"{where or '(arguments)'}: {error.message}")
        return problems

    def replace(self, **changes: Any) -> Tool:
        """Return a copy with some fields changed; the schema is checked again only if it changed."""
        if {"name", "description", "parameters"} & set(changes):
            changes.update(_validator=None, _fast=None, _spec=None)
            if "parameters" in changes:
                changes["_generated"] = False
        return attrs.evolve(self, **changes)


@overload
def tool(func: F, /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None, parallel_safe: bool = True,
    requires_approval: bool = False, ends_loop: bool = False, idempotent: bool = False,
    timeout: float | None = None, available: Callable[[Capabilities], bool] | None = None,
    hold: Callable[[Mapping[str, Any], ToolContext], str | None] | None = None,
) -> Callable[[F], Tool]: ...


def tool(
    func: Callable[..., Any] | None = None, /, *, name: str | None = None,
    description: str | None = None, parallel_safe: bool = True, requires_approval: bool = False,
    ends_loop: bool = False, idempotent: bool = False, timeout: float | None = None,
    available: Callable[[Capabilities], bool] | None = None,
    hold: Callable[[Mapping[str, Any], ToolContext], str | None] | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` from a function, as ``@tool`` or ``@tool(parallel_safe=False, ...)``.

    The schema comes from the type hints (``int``, ``float``, ``str``, ``bool``, ``list[X]``,
    ``dict[str, X]``, ``X | None``, ``Literal[...]``, enums, attrs classes and TypedDicts); a
    parameter without a default is required. The description is the docstring's first
    paragraph; argument descriptions come from its ``Args:`` section or ``:param x:`` lines.
    A parameter annotated :class:`ToolContext` is not in the schema: the loop passes the call's
    context there. ``available`` and ``hold`` are described on :class:`Tool`.
    The returned :class:`Tool` is still callable through ``tool.function``.
    """

    def make(f: Callable[..., Any]) -> Tool:
        summary, params = _parse_docstring(inspect.getdoc(f) or "")
        return Tool(
            name=name or f.__name__,
            description=description if description is not None else summary,
            parameters=schema_for_function(f, params),
            _generated=True,
            function=f,
            parallel_safe=parallel_safe,
            requires_approval=requires_approval,
            ends_loop=ends_loop,
            idempotent=idempotent,
            timeout=timeout,
            available=available,
            hold=hold,
            context_param=_context_param(f),
        )

    if func is not None:
        return make(func)
    return make


async def run_in_daemon_thread(func: Callable[[], T]) -> T:
    """Run ``func`` on a new daemon thread; return what it returned, or raise what it raised.

    This is how the loop runs a plain (sync) tool. Cancelling the caller (the call's timeout, a
    cancel of the run, the end of the event loop) ends the wait at once and abandons the thread:
    Python cannot stop a thread, so it runs on to its end, but being a daemon it never keeps the
    process from exiting (``anyio.to_thread`` threads do: the interpreter joins them at exit).
    What an abandoned thread returns or raises is dropped. ``func`` runs in a copy of the
    caller's context variables, as with ``anyio.to_thread.run_sync``.
    """
    token = anyio.lowlevel.current_token()
    context = contextvars.copy_context()
    done = anyio.Event()
    outcome: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            outcome.append((True, context.run(func)))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting task, which raises it
            outcome.append((False, exc))
        # When the event loop has ended, nobody waits for this thread any more.
        with contextlib.suppress(anyio.RunFinishedError):
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=target, name="loopwright sync tool", daemon=True).start()
    await done.wait()
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def as_tool(obj: Any) -> Tool:
    """Return ``obj`` if it is a :class:`Tool`, else wrap a plain function with the defaults."""
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return tool(obj)
    raise TypeError(f"not a tool: {obj!r}")


_PARAM_SPHINX = re.compile(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.*)$")
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Example|Examples|Note|Notes):\s*$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its first paragraph and the argument descriptions."""
    lines = doc.splitlines()
    summary_lines: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()) or line.strip().startswith(":"):
            break
        summary_lines.append(line.strip())
    params: dict[str, str] = {}
    section = None
    current: str | None = None
    for raw in lines:
        line = raw.strip()
        m = _PARAM_SPHINX.match(line)
        if m:
            current = m.group(1)
            params[current] = m.group(2).strip()
            section = None
            continue
        s = _SECTION.match(line)
        if s:
            section = s.group(1)
            current = None
            continue
        if section in {"Args", "Arguments", "Parameters"} and line:
            gm = re.match(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if gm and raw.startswith(" " * 4) and not raw.startswith(" " * 8):
                current = gm.group(1)
                params[current] = gm.group(2).strip()
                continue
        if current and line and not line.startswith(":"):
            params[current] = f"{params[current]} {line}".strip()
        elif not line:
            current = None if section is None else current
    return " ".join(summary_lines), params


def _context_param(func: Callable[..., Any]) -> str | None:
    """Return the name of ``func``'s parameter annotated :class:`ToolContext`, if any."""
    hints = typing.get_type_hints(func)
    return next((n for n, tp in hints.items() if tp is ToolContext and n != "return"), None)


def schema_for_function(func: Callable[..., Any], descriptions: Mapping[str, str] | None = None,
                        ) -> dict[str, Any]:
    """Return the JSON Schema (an object schema) of ``func``'s parameters."""
    descriptions = descriptions or {}
    hints = typing.get_type_hints(func, include_extras=False)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or hints.get(pname) is ToolContext:
            continue
        schema = _schema_for_type(hints.get(pname, Any))
        if pname in descriptions:
            schema = {**schema, "description": descriptions[pname]}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        elif param.default is None or isinstance(param.default, (str, int, float, bool)):
            schema = {**schema, "default": param.default}
        properties[pname] = schema
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def _schema_for_type(tp: Any) -> dict[str, Any]:  # noqa: C901, PLR0911, PLR0912 - one branch per type
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is inspect.Parameter.empty:
        return {}
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if origin is Literal:
        return {"enum": list(args)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        options = [_schema_for_type(a) for a in non_none]
        if len(non_none) < len(args):
            options.append({"type": "null"})
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin in (list, Sequence, tuple, set, frozenset) or tp in (list, tuple, set):
        item = _schema_for_type(args[0]) if args else {}
        return {"type": "array", "items": item}
    if origin in (dict, Mapping) or tp is dict:
        value = _schema_for_type(args[1]) if len(args) == 2 else {}  # noqa: PLR2004
        return {"type": "object", "additionalProperties": value}
    if attrs.has(tp):
        fields = attrs.fields(tp)
        hints = typing.get_type_hints(tp)
        props = {f.name: _schema_for_type(hints.get(f.name, Any)) for f in fields}
        req = [f.name for f in fields if f.default is attrs.NOTHING]
        return {"type": "object", "properties": props, "required": req, "additionalProperties": False}
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp)
        props = {k: _schema_for_type(v) for k, v in hints.items()}
        return {"type": "object", "properties": props,
                "required": sorted(getattr(tp, "__required_keys__", ())), "additionalProperties": False}
    raise TypeError(f"no JSON Schema for the type {tp!r}; annotate the parameter with a JSON type")
