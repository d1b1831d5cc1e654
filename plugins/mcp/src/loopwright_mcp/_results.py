"""MCP call results and tool descriptions as loopwright sees them.

Works on the ``mcp`` package's pydantic objects by attribute, so this module does not import it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from loopwright.errors import ToolError

__all__ = ["result_value", "schema_of", "tool_name"]

_BAD = re.compile(r"[^A-Za-z0-9_-]")
_MAX = 64


def tool_name(server: str, tool: str) -> str:
    """Return the loopwright name of the server's tool ``tool``: ``SERVER__TOOL``.

    When the tool's name has characters outside ``A-Za-z0-9_-`` (they become ``_``) or the
    whole is longer than 64 characters, the name keeps its first 55 characters and ends with
    ``-`` and 8 hex digits of the SHA-1 of the original ``SERVER__TOOL``.
    """
    name = f"{server}__{_BAD.sub('_', tool)}"
    if len(name) <= _MAX and name == f"{server}__{tool}":
        return name
    # A replaced character or a cut could make two names equal: the hash keeps them apart.
    return f"{name[:_MAX - 9]}-{_digest(server, tool)}"


def _digest(server: str, tool: str) -> str:
    return hashlib.sha1(f"{server}__{tool}".encode(), usedforsecurity=False).hexdigest()[:8]


def schema_of(input_schema: Any) -> dict[str, Any]:
    """Return an MCP tool's input schema as a JSON Schema of an object (``{}`` means any object)."""
    schema = dict(input_schema) if isinstance(input_schema, Mapping) else {}
    schema.setdefault("type", "object")
    return schema


def result_value(result: Any) -> Any:
    """Map a ``CallToolResult`` to what the loop turns into the model's text.

    The text of the content blocks is joined with newlines; images, audio and binary resources
    are described in one line each. ``is_error`` raises :class:`~loopwright.errors.ToolError`
    with that text (status ``tool_error``). Structured content is returned as data (the model
    reads its JSON, and the result's ``data`` keeps it) when the text is its JSON or there is
    no text; when the text says something else (an SDK that wraps a plain return value as
    ``{"result": ...}``), the model reads the text.
    """
    blocks = getattr(result, "content", None) or ()
    text = "\n".join(_describe(block) for block in blocks)
    if getattr(result, "is_error", False):
        raise ToolError(text or "the MCP server reported an error without a message")
    structured = getattr(result, "structured_content", None)
    if structured is not None and (not text or _json_equal(text, structured)):
        return dict(structured) if isinstance(structured, Mapping) else structured
    return text


def _json_equal(text: str, value: Any) -> bool:
    """Whether ``text`` is the JSON of ``value`` (servers repeat structured content as text)."""
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


def _describe(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if kind == "resource_link":
        extra = ", ".join(str(v) for v in (block.name, block.mime_type) if v)
        return f"[resource link: {block.uri}{f' ({extra})' if extra else ''}]"
    if kind == "resource":
        res = block.resource
        text = getattr(res, "text", None)
        if text is not None:
            return f"[resource: {res.uri}]\n{text}"
        return f"[resource: {res.uri}, {res.mime_type or 'binary'}, {_decoded_size(getattr(res, 'blob', ''))} bytes]"
    return f"[{kind or 'unknown'} content]"


def _decoded_size(data: Any) -> int:
    """Return how many bytes a base64 string decodes to, without decoding it."""
    s = str(data or "")
    return len(s) * 3 // 4 - s[-2:].count("=")
