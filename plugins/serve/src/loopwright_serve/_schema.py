"""Request bodies as attrs classes, their JSON Schemas, and reading a body into one.

The same class is what a handler gets, what the body is checked against, and what
``/openapi.json`` publishes: :func:`json_schema` derives the schema from the class's fields
(their types, defaults and ``metadata={"schema": {...}}``), so the document cannot drift from
the code.
"""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import attrs

from loopwright_serve._problems import ProblemError

__all__ = ["body_field", "camel", "json_schema", "load_json", "read_model", "unpaired_surrogate"]

T = TypeVar("T")

_SIMPLE: Mapping[Any, Mapping[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"}, bool: {"type": "boolean"},
    Any: {},
}


def camel(name: str) -> str:
    """``tool_call_id`` → ``toolCallId``: the JSON name of a field."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def body_field(description: str, default: Any = attrs.NOTHING, **schema: Any) -> Any:
    """Return an attrs field of a request body, with its description and extra JSON Schema keywords."""
    return attrs.field(default=default, metadata={"schema": {"description": description, **schema}})


def _type_schema(tp: Any) -> dict[str, Any]:  # noqa: PLR0911 - one return per kind of type
    origin = typing.get_origin(tp)
    if tp in _SIMPLE:
        return dict(_SIMPLE[tp])
    if tp is type(None):
        return {"type": "null"}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in {typing.Union, types.UnionType}:
        parts = [_type_schema(arg) for arg in typing.get_args(tp)]
        if all(set(p) == {"type"} for p in parts):
            return {"type": [p["type"] for p in parts]}
        return {"anyOf": parts}
    if origin in {dict, Mapping, typing.Mapping}:
        _key, value = typing.get_args(tp) or (str, Any)
        inner = _type_schema(value)
        return {"type": "object", **({"additionalProperties": inner} if inner else {})}
    if origin in {list, tuple}:
        (item, *_rest) = typing.get_args(tp) or (Any,)
        return {"type": "array", "items": _type_schema(item)}
    if attrs.has(tp):
        return json_schema(tp)
    raise TypeError(f"no JSON Schema for {tp!r}")


def json_schema(cls: type[Any]) -> dict[str, Any]:
    """Return the JSON Schema of an attrs class: camelCase properties, no other keys allowed.

    Fields without a default are required; a field's ``metadata["schema"]`` adds keywords.
    The class docstring's first line is the description.
    """
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        prop = {**_type_schema(hints[field.name]), **field.metadata.get("schema", {})}
        if field.default is not attrs.NOTHING and not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            prop.setdefault("default", field.default)
        if field.default is attrs.NOTHING:
            required.append(camel(field.name))
        properties[camel(field.name)] = prop
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        schema["required"] = required
    doc = (cls.__doc__ or "").strip().splitlines()
    if doc:
        schema["description"] = doc[0]
    return schema


def _where(error: Any) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if re.fullmatch(r"\w+", part) \
            else f"[{json.dumps(part)}]"
    return path


def load_json(raw: bytes) -> Any:
    """Parse a request body as JSON: no ``NaN`` or ``Infinity``, and only Unicode text in its strings.

    :raises ValueError: It is not JSON (a :class:`json.JSONDecodeError` has the position), or
        a string or key holds an unpaired surrogate (see :func:`unpaired_surrogate`).
    """
    data = json.loads(raw, parse_constant=_refuse_constant)
    if found := unpaired_surrogate(data):
        raise ValueError(f"a string holds the unpaired surrogate U+{ord(found):04X}, which is not text")
    return data


def unpaired_surrogate(value: Any) -> str:
    r"""Return the first unpaired surrogate in the strings and keys of decoded JSON, or ``""``.

    :func:`json.loads` turns ``"\ud800"`` (and the bytes ``ED A0 80``) into one: such a string
    is no text, and nothing can write it as UTF-8 (a store, an answer that echoes it: a 500).
    """
    todo = [value]
    while todo:  # no recursion: a body's depth is bounded, its width is not
        node = todo.pop()
        if isinstance(node, dict):
            todo.extend(node)
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
        elif isinstance(node, str) and (found := _SURROGATE.search(node)):
            return found.group()
    return ""


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def read_model(raw: bytes, cls: type[T], *, empty_ok: bool = False) -> T:
    """Parse ``raw`` as JSON and check it against ``cls``'s schema; return the instance.

    :param empty_ok: An empty body stands for ``{}`` (for bodies whose fields are all optional).
    :raises ProblemError: 400 for a body that is not JSON (with its line and column), 422 with
        ``errors: [{path, message}]`` for one that does not fit the schema.
    """
    if not raw.strip() and empty_ok:
        data: Any = {}
    else:
        try:
            data = load_json(raw)
        except (ValueError, RecursionError) as exc:
            where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or type(exc).__name__
            raise ProblemError(400, "Malformed JSON", f"the request body is not JSON{where}: {detail}") from None
    model: Any = cls
    errors = sorted(_validator(model).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        listed = [{"path": _where(e), "message": e.message[:300]} for e in errors[:20]]
        raise ProblemError(422, "Invalid request body",
                           "; ".join(f"{e['path']}: {e['message']}" for e in listed[:3]), errors=listed)
    names = {camel(f.name): f.name for f in attrs.fields(model)}
    made: T = model(**{names[key]: value for key, value in data.items()})
    return made


@functools.cache
def _validator(cls: Any) -> Any:
    """Return the checker of ``cls``'s schema, built once per class."""
    import jsonschema  # noqa: PLC0415 - only for requests with a body

    return jsonschema.Draft202012Validator(json_schema(cls))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
