"""The bounded YAML reader: plain data with the position of every key, and errors at file:line:column.

Every YAML or JSON file loopwright reads goes through :func:`load_yaml` (definitions, assemblies,
and plugins' own files through :func:`read_yaml`). It parses with ruamel's round-trip loader,
which keeps where each key and item sits (:class:`Positions`), and refuses, at the position
where it happens, a file over :data:`MAX_YAML_BYTES`, a document that expands (aliases counted
in full) to more than :data:`MAX_YAML_NODES` values or nests deeper than :data:`MAX_YAML_DEPTH`,
and any tag but YAML's plain ones. Every refusal is a :class:`~loopwright.errors.ConfigError`
whose problem names the file, line and column.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.composer import Composer, MaxDepthExceededError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode
from ruamel.yaml.scalarbool import ScalarBoolean

from loopwright.errors import ConfigError, ConfigProblem, shown_path

__all__ = [
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "PathKey",
    "Positions",
    "load_yaml",
    "parse_yaml",
    "plain_data",
    "read_yaml",
]

#: A key path into a document: keys and list indexes (``("initialPrompts", 0, "content")``).
PathKey = tuple[str | int, ...]


class Positions:
    """Where each key and value of a loaded document sits, as 1-based ``(line, column)``.

    Paths are tuples of keys and list indexes: ``("providers", "default", "baseUrl")``,
    ``("initialPrompts", 0, "content")``. The empty path is the document itself. Data that came
    from Python has an empty :class:`Positions`, whose lookups all return ``None``.

    Attributes:
        file: The file's path as given, or ``None``.
        text: The document's text (used to place problems inside multi-line strings).
    """

    __slots__ = ("_keys", "_line_starts", "_values", "file", "text")

    def __init__(self, file: str | None = None, text: str = "") -> None:
        self.file = file
        self.text = text
        self._keys: dict[PathKey, tuple[int, int]] = {}
        self._values: dict[PathKey, tuple[int, int]] = {}
        self._line_starts: list[int] | None = None

    def key(self, path: Sequence[str | int]) -> tuple[int, int] | None:
        """Return where the key at ``path`` is written (for list items: where the item starts)."""
        return self._keys.get(tuple(path))

    def value(self, path: Sequence[str | int]) -> tuple[int, int] | None:
        """Return where the value at ``path`` starts."""
        return self._values.get(tuple(path))

    def locate(self, path: Sequence[str | int], *, key: bool = False) -> tuple[int | None, int | None]:
        """Return the position of ``path``'s key (or value), else of its nearest located ancestor."""
        path = tuple(path)
        table = self._keys if key else self._values
        for end in range(len(path), -1, -1):
            found = table.get(path[:end]) or self._values.get(path[:end])
            if found:
                return found
        # A file without positions is empty: point at its start.
        return (1, 1) if self.file else (None, None)

    def find(self, path: Sequence[str | int], needle: str,
             occurrence: int = 0) -> tuple[int | None, int | None]:
        """Return the position of the ``occurrence``-th ``needle`` in the source of the value at ``path``.

        Used to point inside a (possibly multi-line) string; falls back to the value's position
        when the needle cannot be found in the text as written (escapes, folding).
        """
        start = self.value(path)
        if start is None or not self.text:
            return self.locate(path)
        index = self._offset(*start)
        for _ in range(occurrence + 1):
            found = self.text.find(needle, index)
            if found == -1:
                return start
            index = found + 1
        return self._position(found)

    def _offsets(self) -> list[int]:
        if self._line_starts is None:
            starts = [0]
            starts.extend(i + 1 for i, ch in enumerate(self.text) if ch == "\n")
            self._line_starts = starts
        return self._line_starts

    def _offset(self, line: int, column: int) -> int:
        starts = self._offsets()
        return starts[min(line, len(starts)) - 1] + column - 1

    def _position(self, offset: int) -> tuple[int, int]:
        starts = self._offsets()
        line = bisect.bisect_right(starts, offset)
        return line, offset - starts[line - 1] + 1

    def record(self, path: Sequence[str | int], key: tuple[int, int], value: tuple[int, int]) -> None:
        """Note where the key (or list item) at ``path`` and its value start. Used by the loader."""
        path = tuple(path)
        self._keys[path] = key
        self._values[path] = value

    def __repr__(self) -> str:
        return f"<Positions {self.file or '<data>'}: {len(self._values)} values>"


#: The largest YAML or JSON file the loader reads (definitions, assemblies, scripts, MCP server files).
MAX_YAML_BYTES = 1024 * 1024
#: The most nodes (scalars, mappings, sequences) one document may stand for, counting every use of
#: an alias as a copy of what it names: a few hundred bytes of aliases can stand for billions.
MAX_YAML_NODES = 100_000
#: The deepest nesting of mappings and sequences in one document.
MAX_YAML_DEPTH = 64

#: The only tags a document may carry: JSON's values, timestamps (read as ISO strings) and merge keys.
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in (
    "str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge"))
_TAG = "tag:yaml.org,2002:"
#: What an explicitly tagged scalar's text must resolve to on its own for the tag to be buildable
#: (``!!float 1`` is 1.0; ``!!int x`` or ``!!bool maybe`` cannot be built). ``!!str`` takes any text.
_BUILDABLE = {f"{_TAG}int": {f"{_TAG}int"}, f"{_TAG}float": {f"{_TAG}int", f"{_TAG}float"},
              f"{_TAG}bool": {f"{_TAG}bool"}, f"{_TAG}null": {f"{_TAG}null"},
              f"{_TAG}timestamp": {f"{_TAG}timestamp"}}


class _LimitError(MarkedYAMLError):
    """A document over one of the loader's limits (or with a tag it does not read), at its position."""


class _BoundedComposer(Composer):
    """ruamel's composer, counting what the document expands to and refusing unknown tags.

    An alias is the same node object each time it is used, so a node's *size* is the size of
    everything under it with every alias counted in full; it is known as soon as the node is
    composed. The running total (one per node composed, an alias's size per use) is the size of
    the whole document once it is complete. Composing is linear in the text; only walking the
    result would not be, so the document is refused here, at the node (or alias) where the total
    passes :data:`MAX_YAML_NODES`.
    """

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self._sizes: dict[int, int] = {}
        self._total = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        node = super().compose_node(parent, index)
        size = self._sizes.get(id(node))
        if isinstance(event, AliasEvent):
            if size is None:
                raise _LimitError(None, None, f"alias *{event.anchor} refers to a node that contains it",
                                  event.start_mark)
        else:
            tag = str(node.tag)
            if tag not in _PLAIN_TAGS:
                raise _LimitError(None, None, f"unsupported tag {_shown_tag(tag)}: loopwright reads plain "
                                  "YAML values only (strings, numbers, booleans, null, mappings, lists)",
                                  node.start_mark)
            self._check_tagged(node, tag)
            children = node.value if isinstance(node, SequenceNode) else (
                [n for pair in node.value for n in pair] if isinstance(node, MappingNode) else ())
            size = 1 + sum(self._sizes[id(child)] for child in children)
            self._sizes[id(node)] = size
        self._total += size if isinstance(event, AliasEvent) else 1
        if self._total > MAX_YAML_NODES:
            raise _LimitError(None, None, f"the document expands to more than {MAX_YAML_NODES:,} values "
                              "(every use of an alias counts what it names)", event.start_mark)
        return node


    def _check_tagged(self, node: Any, tag: str) -> None:
        """Refuse an explicitly tagged node that its tag cannot build (``!!int x``, ``!!str [1]``)."""
        if tag == f"{_TAG}merge":  # the ``<<`` key itself
            return
        kind = {f"{_TAG}map": MappingNode, f"{_TAG}seq": SequenceNode}.get(tag, ScalarNode)
        if not isinstance(node, kind):
            given = ("a mapping" if isinstance(node, MappingNode)
                     else "a list" if isinstance(node, SequenceNode) else "text")
            raise _LimitError(None, None, f"the tag {_shown_tag(tag)} cannot be given to {given}", node.start_mark)
        wanted = _BUILDABLE.get(tag)
        if wanted is not None and isinstance(node, ScalarNode):
            implicit = str(self.resolver.resolve(ScalarNode, node.value, (True, False)))
            if implicit not in wanted:
                raise _LimitError(None, None, f"{node.value!r} is not a valid {_shown_tag(tag)} value",
                                  node.start_mark)


def _shown_tag(tag: str) -> str:
    short = tag.replace("tag:yaml.org,2002:", "!!", 1)
    return short if len(short) <= 80 else f"{short[:77]}..."  # noqa: PLR2004


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    yaml.Composer = _BoundedComposer
    yaml.max_depth = MAX_YAML_DEPTH
    return yaml


def load_yaml(path: str | Path) -> tuple[Any, Positions]:
    """Read a YAML (or JSON) file and return its data as plain dicts and lists, with positions.

    Keys become strings; timestamps become ISO 8601 strings.

    :raises ConfigError: when the file cannot be read, is not well-formed YAML, or is over a limit
        (:data:`MAX_YAML_BYTES`, :data:`MAX_YAML_NODES` counting aliases in full,
        :data:`MAX_YAML_DEPTH`), or carries a tag other than YAML's plain ones (``!!python/...``,
        ``!custom``): the problem names the file, line and column.
    """
    file = str(path)
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        problem = ConfigProblem(f"cannot read the file: {reason}", file=file)
        raise ConfigError(f"cannot read {shown_path(file)}: {reason}", path=file, problems=[problem]) from exc
    if len(data) > MAX_YAML_BYTES:
        message = f"the file is larger than {MAX_YAML_BYTES:,} bytes, the most loopwright reads"
        problem = ConfigProblem(message, file=file, line=1, column=1)
        raise ConfigError(f"{shown_path(file)}:1:1: {message}", path=file, problems=[problem])
    return parse_yaml(text, file)


def read_yaml(path: str | Path) -> Any:
    """Read a YAML (or JSON) file the way the loader does, and return its plain data.

    For plugins that read files of their own (scripts, server lists): the same limits and tags as
    :func:`load_yaml` (at most :data:`MAX_YAML_BYTES`, :data:`MAX_YAML_NODES` and
    :data:`MAX_YAML_DEPTH`; YAML's plain values only), so no such file can cost without bound.

    :raises ConfigError: as :func:`load_yaml`, naming the file, line and column.
    """
    return load_yaml(path)[0]


def parse_yaml(text: str, file: str | None, *, line_offset: int = 0) -> tuple[Any, Positions]:
    """Parse ``text`` (the contents of ``file``) as :func:`load_yaml` does, without reading a file.

    :param line_offset: Added to every line number (a line of a ``.jsonl`` file is parsed alone).
    :raises ConfigError: as :func:`load_yaml`.
    """
    positions = Positions(file, text)
    try:
        node = _yaml().load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 + line_offset if mark else None
        column = mark.column + 1 if mark else None
        what = exc.problem or exc.context or "malformed YAML"
        if isinstance(exc, MaxDepthExceededError):
            what = f"mappings and lists nest more than {MAX_YAML_DEPTH} deep"
        if exc.context and exc.problem:
            started = exc.context_mark
            at = f" at line {started.line + 1 + line_offset}, column {started.column + 1}" if started else ""
            what = f"{exc.problem} ({exc.context}{at})"
        language = "JSON" if file and file.endswith((".json", ".jsonl")) else "YAML"
        problem = ConfigProblem(f"invalid {language}: {what}", file=file, line=line, column=column)
        raise ConfigError(f"{shown_path(file) if file else '<text>'}:{line}:{column}: invalid {language}: {what}",
                          path=file, problems=[problem]) from None
    except YAMLError as exc:
        problem = ConfigProblem(f"invalid YAML: {exc}", file=file, line=1, column=1)
        raise ConfigError(f"{shown_path(file or '<text>')}: invalid YAML: {exc}", path=file,
                          problems=[problem]) from None
    except (ValueError, TypeError, OverflowError) as exc:  # a value its tag cannot make (``!!float 0x1F``)
        problem = ConfigProblem(f"invalid YAML: a value its tag cannot make ({exc})", file=file, line=1, column=1)
        raise ConfigError(f"{shown_path(file or '<text>')}: invalid YAML: a value its tag cannot make ({exc})",
                          path=file, problems=[problem]) from None
    if isinstance(node, (CommentedMap, CommentedSeq)):
        positions.record((), (node.lc.line + 1 + line_offset, node.lc.col + 1),
                       (node.lc.line + 1 + line_offset, node.lc.col + 1))
    return _plain(node, (), positions, line_offset), positions


def _plain(node: Any, path: PathKey, positions: Positions, line_offset: int) -> Any:
    """Turn ruamel's round-trip nodes into plain data, recording positions on the way."""
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        data = node.lc.data
        for key, value in node.items():
            name = _key_text(key)
            child = (*path, name)
            where = data.get(key)
            if where is not None:  # merged keys (<<: *anchor) have no position of their own
                positions.record(child, (where[0] + 1 + line_offset, where[1] + 1),
                               (where[2] + 1 + line_offset, where[3] + 1))
            out[name] = _plain(value, child, positions, line_offset)
        return out
    if isinstance(node, CommentedSeq):
        items: list[Any] = []
        for index, value in enumerate(node):
            child = (*path, index)
            where = node.lc.data.get(index) if isinstance(node.lc.data, dict) else (
                node.lc.data[index] if index < len(node.lc.data) else None)
            if where is not None:
                pos = (where[0] + 1 + line_offset, where[1] + 1)
                positions.record(child, pos, pos)
            items.append(_plain(value, child, positions, line_offset))
        return items
    return _scalar(node)


def _scalar(node: Any) -> Any:
    if isinstance(node, TaggedScalar):  # an explicit ``!!str``: its text
        return str(node.value)
    if isinstance(node, dt.date):  # datetimes too
        return node.isoformat()
    if isinstance(node, ScalarBoolean):  # an anchored boolean is an int subclass
        return bool(node)
    plain = next((t for t in (bool, int, float, str) if isinstance(node, t)), None)
    return plain(node) if plain else node


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return str(key)
    if isinstance(key, bool) or key is None:
        return json.dumps(key)
    return str(key)


def plain_data(value: Any) -> Any:
    """Copy Python data into the plain JSON shape the validator expects (dicts, lists, str keys)."""
    if isinstance(value, Mapping):
        return {_key_text(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
