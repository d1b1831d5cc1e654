"""JSON Schemas for the options a plugin declares when it registers a component.

A store, record sink or provider kind may declare the options it takes::

    register("echo", make_provider, options=options_schema({**HTTP_OPTIONS, "free": {"type": "boolean"}}))

The runtime checks a component's options against that schema, at their place in the assembly
(an unknown key such as ``timout`` or an ill-typed value such as ``maxRetries: "3"`` is reported
with file, line and column, and ``did you mean`` for a near miss), before it calls the factory,
and ``loopwright validate -c`` does the same without building anything that dials. A kind
registered without ``options`` has its options checked by its factory alone.

This module imports nothing heavy: registration hooks run at every start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DURATION", "HTTP_OPTIONS", "options_schema"]

#: A duration as the loader reads it: seconds, or a string such as ``500ms``, ``30s``, ``1m30s``.
DURATION: Mapping[str, Any] = {"$ref": "https://loopwright.dev/specs/definition.schema.json#duration"}

_NULLABLE_DURATION: Mapping[str, Any] = {"anyOf": [{"type": "null"}, DURATION]}

#: The options :class:`loopwright.http.HTTPOptions` reads (every HTTP provider takes them).
HTTP_OPTIONS: Mapping[str, Mapping[str, Any]] = {
    "maxRetries": {"type": "integer", "minimum": 0},
    "retryBaseDelay": DURATION,
    "retryMaxDelay": DURATION,
    "timeout": _NULLABLE_DURATION,
    "connectTimeout": _NULLABLE_DURATION,
    "headers": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    "maxConnections": {"type": ["integer", "null"], "minimum": 1},
    "maxKeepaliveConnections": {"type": ["integer", "null"], "minimum": 0},
    "keepaliveExpiry": _NULLABLE_DURATION,
    "poolShards": {"type": "integer", "minimum": 1},
    "transport": {"enum": ["auto", "aiohttp", "httpcore"]},
    "proxy": {"type": ["string", "null"]},
}


def options_schema(properties: Mapping[str, Mapping[str, Any]], *,
                   required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return the schema of an options mapping with exactly these keys (any other is unknown).

    :param properties: Option name → the JSON Schema of its value.
    :param required: The options that must be given.
    """
    out: dict[str, Any] = {"type": "object", "properties": dict(properties), "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out
