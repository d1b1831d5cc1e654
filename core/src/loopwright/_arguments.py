"""What tool-call arguments from a model may hold: plain JSON, finite numbers, bounded nesting.

A model's arguments reach the loop either as text (most wire formats) or as data a provider
already decoded. Both go through the same rule before anything else touches them (validation,
hooks, the transcript): JSON values only, no ``NaN`` or ``Infinity`` (Python's :mod:`json`
accepts those literals, JSON does not), and at most :data:`MAX_ARGUMENT_DEPTH` levels of
objects and arrays. Arguments that break it are kept as text in ``ToolCall.raw_arguments`` and
answered with ``invalid_arguments``, so the model can correct them and nothing downstream recurses
into a hundred thousand levels.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["MAX_ARGUMENT_DEPTH", "argument_problem", "dumps_for_raw", "loads_arguments"]

#: The deepest nesting of objects and arrays accepted in one call's arguments.
MAX_ARGUMENT_DEPTH = 64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_arguments(text: str) -> Any:
    """Parse ``text`` as strict JSON arguments.

    :raises ValueError: for invalid JSON, ``NaN``/``Infinity`` literals, numbers that overflow to
        infinity (``1e999``), or nesting deeper than :data:`MAX_ARGUMENT_DEPTH`.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:  # the C decoder stops cleanly at the interpreter's recursion limit
        raise ValueError(f"the arguments nest objects and arrays more than {MAX_ARGUMENT_DEPTH} deep") from None
    problem = argument_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def argument_problem(value: Any) -> str | None:
    """Return why ``value`` (decoded arguments) breaks the rule above, or ``None`` when it keeps it.

    Walks without recursion, so any depth is safe to check. Strings, finite numbers, booleans and
    ``None`` are the scalars; dicts (with string keys) and lists or tuples the containers.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth >= MAX_ARGUMENT_DEPTH:
                return f"the arguments nest objects and arrays more than {MAX_ARGUMENT_DEPTH} deep"
            if isinstance(item, dict):
                if not all(isinstance(k, str) for k in item):
                    return "an object key in the arguments is not a string"
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"the arguments hold {item!r}, which is not a JSON number (NaN and infinity are refused)"
        elif item is not None and not isinstance(item, (str, int)):  # bool is an int
            return f"the arguments hold a {type(item).__name__}, which is not JSON"
    return None


def dumps_for_raw(value: Any) -> str:
    """Return ``value`` as text for ``raw_arguments``, or a description when it cannot be written."""
    try:
        return json.dumps(value, separators=(",", ":"), default=str)
    except (RecursionError, ValueError):
        return f"(arguments that cannot be shown: nested more than {MAX_ARGUMENT_DEPTH} deep, or not JSON)"
