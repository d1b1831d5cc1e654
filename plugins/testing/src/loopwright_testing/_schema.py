"""Deterministic values from JSON Schemas, for the ``test`` provider's tool arguments.

The generator is not random: the same schema always gives the same value. Integers count up
from 1 and strings from ``"a"`` within one value, so ``add(a, b)`` gets ``{"a": 1, "b": 2}``.
Objects get their required properties only (optional ones, with or without defaults, are left
out, so the tool's own defaults apply). ``anyOf``/``oneOf`` take the first option that is not
``null``; ``allOf`` is merged; local ``$ref`` (``#/$defs/...``) is followed. Bounds are
respected: ``minimum``/``maximum`` (and the exclusive forms), ``multipleOf``,
``minLength``/``maxLength``, ``minItems``/``maxItems``, ``enum`` and ``const``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["generate_arguments", "generate_value"]

_MAX_DEPTH = 8

#: Values for string formats; ``{s}`` is the running letter (a, b ...) and ``{n}`` the running
#: number (1, 2 ...), so that items of a ``uniqueItems`` array differ.
_FORMATS: Mapping[str, str] = {
    "date-time": "2024-01-{d:02d}T00:00:00Z",
    "date": "2024-01-{d:02d}",
    "time": "00:00:{d:02d}Z",
    "duration": "P{n}D",
    "email": "{s}@example.com",
    "idn-email": "{s}@example.com",
    "hostname": "{s}.example.com",
    "idn-hostname": "{s}.example.com",
    "ipv4": "192.0.2.{d}",
    "ipv6": "2001:db8::{d}",
    "uri": "https://example.com/{s}",
    "iri": "https://example.com/{s}",
    "uri-reference": "/{s}",
    "iri-reference": "/{s}",
    "url": "https://example.com/{s}",
    "uuid": "00000000-0000-4000-8000-{n:012d}",
    "json-pointer": "/{s}",
    "regex": "{s}",
}


def generate_value(schema: Mapping[str, Any] | bool, *, root: Mapping[str, Any] | None = None) -> Any:
    """Return a value that ``schema`` accepts, the same one every time.

    :param schema: A JSON Schema (draft 2020-12 or 7 keywords).
    :param root: The document local ``$ref`` pointers resolve against; default ``schema``.
    :return: A JSON-ready value. Schemas the generator cannot satisfy (``pattern``, ``not``)
        get a best effort.
    """
    doc = root if root is not None else (schema if isinstance(schema, Mapping) else {})
    return _Generator(doc).value(schema, 0)


def generate_arguments(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Return arguments for a tool whose JSON Schema is ``parameters`` (an object schema).

    :return: A new dict; ``{}`` when the schema does not describe an object.
    """
    value = generate_value(parameters)
    return value if isinstance(value, dict) else {}


class _Generator:
    """One generation: holds the counters that make successive values differ."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.ints = 0
        self.strings = 0

    def value(self, schema: Mapping[str, Any] | bool, depth: int) -> Any:  # noqa: C901, PLR0911
        if schema is True or schema is False or not isinstance(schema, Mapping):
            return self._string({})
        schema = self._resolve(schema, depth)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, Sequence) and not isinstance(enum, str) and enum:
            return enum[0]
        if "default" in schema and depth > 0 and schema.get("default") is not None:
            return schema["default"]
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, Sequence) and options:
                base = {k: v for k, v in schema.items() if k != key}
                return self.value({**base, **_first_non_null(options)}, depth)
        kind = _type_of(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer":
            return self._number(schema, integer=True)
        if kind == "number":
            return self._number(schema, integer=False)
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema)

    def _resolve(self, schema: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
        """Follow ``$ref`` and merge ``allOf`` so that the rest sees one flat schema."""
        for _ in range(_MAX_DEPTH):
            ref = schema.get("$ref")
            if not isinstance(ref, str) or not ref.startswith("#"):
                break
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**rest, **self._pointer(ref[1:])}
        parts = schema.get("allOf")
        if not isinstance(parts, Sequence) or not parts:
            return schema
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        properties = dict(merged.get("properties") or {})
        required = list(merged.get("required") or ())
        for raw in parts:
            if not isinstance(raw, Mapping):
                continue
            sub = self._resolve(raw, depth)
            properties.update(sub.get("properties") or {})
            required.extend(sub.get("required") or ())
            merged.update({k: v for k, v in sub.items() if k not in ("properties", "required")})
        if properties:
            merged["properties"] = properties
        if required:
            merged["required"] = required
        return merged

    def _pointer(self, pointer: str) -> Mapping[str, Any]:
        """Return what a JSON pointer (``/$defs/Point``) designates in the root, or ``{}``."""
        target: Any = self.root
        for token in pointer.lstrip("/").split("/") if pointer else ():
            key = token.replace("~1", "/").replace("~0", "~")
            target = target.get(key, {}) if isinstance(target, Mapping) else {}
        return target if isinstance(target, Mapping) else {}

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        if depth >= _MAX_DEPTH:
            return {}
        properties = schema.get("properties") or {}
        out: dict[str, Any] = {}
        for name in schema.get("required") or ():
            if name not in out:
                out[name] = self.value(properties.get(name, {}), depth + 1)
        return out

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        items = schema.get("items", {})
        if isinstance(items, Sequence) and not isinstance(items, str):  # draft 7 tuple form
            prefix, items = items, schema.get("additionalItems", {})
        low = int(schema.get("minItems", 1))
        high = schema.get("maxItems")
        count = max(low, len(prefix or ()) if prefix else 0, 0)
        if high is not None:
            count = min(count, int(high))
        if depth >= _MAX_DEPTH:
            count = min(count, low)
        out = []
        for i in range(count):
            item = prefix[i] if prefix and i < len(prefix) else items
            out.append(self.value(item if item is not None else {}, depth + 1))
        return out

    def _number(self, schema: Mapping[str, Any], *, integer: bool) -> int | float:
        self.ints += 1
        value: float = self.ints
        low = schema.get("minimum")
        xlow = schema.get("exclusiveMinimum")
        high = schema.get("maximum")
        xhigh = schema.get("exclusiveMaximum")
        step = schema.get("multipleOf")
        if isinstance(xlow, bool):  # draft 4: a flag on minimum
            xlow, low = (low if xlow else None), (None if xlow else low)
        if isinstance(xhigh, bool):
            xhigh, high = (high if xhigh else None), (None if xhigh else high)
        delta = 1 if integer else 0.5
        if xlow is not None:
            low = max(low, xlow + delta) if low is not None else xlow + delta
        if xhigh is not None:
            high = min(high, xhigh - delta) if high is not None else xhigh - delta
        if low is not None and value < low:
            value = low
        if high is not None and value > high:
            value = high
        if step:
            value = math.ceil(value / step) * step
            if high is not None and value > high:
                value = math.floor(high / step) * step
        if integer:
            up = math.ceil(value)
            return up if high is None or up <= high else math.floor(value)
        return float(value)

    def _string(self, schema: Mapping[str, Any]) -> str:
        self.strings += 1
        fmt = schema.get("format")
        template = _FORMATS.get(fmt, "{s}") if isinstance(fmt, str) else "{s}"
        n = self.strings
        text = template.format(s=_letters(n), n=n, d=(n - 1) % 28 + 1)
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if len(text) < low:
            text = (text * (low // len(text) + 1))[:low]
        if high is not None and len(text) > int(high):
            text = text[: int(high)]
        return text


def _letters(n: int) -> str:
    """Return ``a``, ``b`` ... ``z``, ``aa``, ``ab`` ... for 1, 2, ... (spreadsheet columns)."""
    out = ""
    while n > 0:
        n, rem = divmod(n - 1, 26)
        out = chr(ord("a") + rem) + out
    return out


def _type_of(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        kind = non_null[0] if non_null else (kind[0] if kind else None)
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return None


def _first_non_null(options: Sequence[Any]) -> Mapping[str, Any]:
    for option in options:
        if isinstance(option, Mapping) and option.get("type") != "null" and option.get("const", 0) is not None:
            return option
    first = options[0]
    return first if isinstance(first, Mapping) else {}
