"""Load, validate and convert the YAML files loopwright reads: definitions and assemblies.

A file goes through four steps, and every step reports *all* its problems at once, each as a
:class:`~loopwright.errors.ConfigProblem` with file, line, column and JSON path:

1. :func:`load_yaml` parses it with ruamel's round-trip loader, which keeps the position of every
   key and item (:class:`Positions`); a syntax error names the file, line and column.
2. The data is validated against the JSON Schema in ``specs/`` (shipped inside the package as
   ``loopwright/_specs``): the schemas are the single source of truth for which keys exist.
3. Checks a schema cannot express: template variables that name no input, malformed templates,
   input defaults of the wrong type, an ``output`` that is not a valid JSON Schema.
4. The data is structured into the frozen classes of :mod:`loopwright._definition` with a cattrs
   converter (camelCase keys, durations parsed to seconds, ``{kind, ...options}`` split).

:func:`load_definition` and :func:`load_assembly` raise :class:`~loopwright.errors.ConfigError`
carrying the problems; :func:`validate_file` returns them (``loopwright validate``).
"""

from __future__ import annotations

import bisect
import datetime as dt
import difflib
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import cattrs
import jsonschema
import referencing
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.composer import Composer, MaxDepthExceededError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode
from ruamel.yaml.scalarbool import ScalarBoolean

from loopwright._capabilities import capabilities_to_dict
from loopwright._convert import camel, make_converter
from loopwright._definition import (
    Assembly,
    Capabilities,
    Definition,
    EngineConfig,
    FileGrants,
    InputSpec,
    Limits,
    PluginSpec,
    ProviderConfig,
    StoreConfig,
)
from loopwright._duration import parse_duration  # the one grammar, re-exported for the loader's callers
from loopwright._patterns import pattern_problems
from loopwright._template import TemplateError, compile_template, matches_type
from loopwright.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

__all__ = [
    "ASSEMBLY_FILE_NAMES",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "SPECS_DIR",
    "Kind",
    "Positions",
    "definition_from_dict",
    "definition_to_dict",
    "detect_kind",
    "load_assembly",
    "load_definition",
    "load_yaml",
    "locate",
    "option_problems",
    "parse_duration",
    "placed",
    "read_yaml",
    "schema",
    "validate_data",
    "validate_file",
    "validator",
]

#: Where the JSON Schemas live: a symlink to the repository's ``specs/`` folder.
SPECS_DIR = Path(__file__).parent / "_specs"

#: File names that are always read as assemblies.
ASSEMBLY_FILE_NAMES = frozenset({"loopwright.yaml", "loopwright.yml"})

#: What a file can describe; each has a schema ``specs/<kind>.schema.json``.
Kind = Literal["definition", "assembly", "instance", "record"]
_KINDS: tuple[Kind, ...] = ("definition", "assembly", "instance", "record")

_PathKey = tuple[str | int, ...]


# ---------------------------------------------------------------------------------------------
# YAML with positions
# ---------------------------------------------------------------------------------------------


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
        self._keys: dict[_PathKey, tuple[int, int]] = {}
        self._values: dict[_PathKey, tuple[int, int]] = {}
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
        raise ConfigError(f"cannot read {file}: {reason}", path=file, problems=[problem]) from exc
    if len(data) > MAX_YAML_BYTES:
        message = f"the file is larger than {MAX_YAML_BYTES:,} bytes, the most loopwright reads"
        problem = ConfigProblem(message, file=file, line=1, column=1)
        raise ConfigError(f"{file}:1:1: {message}", path=file, problems=[problem])
    return _parse_yaml(text, file)


def read_yaml(path: str | Path) -> Any:
    """Read a YAML (or JSON) file the way the loader does, and return its plain data.

    For plugins that read files of their own (scripts, server lists): the same limits and tags as
    :func:`load_yaml` (at most :data:`MAX_YAML_BYTES`, :data:`MAX_YAML_NODES` and
    :data:`MAX_YAML_DEPTH`; YAML's plain values only), so no such file can cost without bound.

    :raises ConfigError: as :func:`load_yaml`, naming the file, line and column.
    """
    return load_yaml(path)[0]


def _parse_yaml(text: str, file: str | None, *, line_offset: int = 0) -> tuple[Any, Positions]:
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
        raise ConfigError(f"{file or '<text>'}:{line}:{column}: invalid {language}: {what}",
                          path=file, problems=[problem]) from None
    except YAMLError as exc:
        problem = ConfigProblem(f"invalid YAML: {exc}", file=file, line=1, column=1)
        raise ConfigError(f"{file}: invalid YAML: {exc}", path=file, problems=[problem]) from None
    if isinstance(node, (CommentedMap, CommentedSeq)):
        positions.record((), (node.lc.line + 1 + line_offset, node.lc.col + 1),
                       (node.lc.line + 1 + line_offset, node.lc.col + 1))
    return _plain(node, (), positions, line_offset), positions


def _plain(node: Any, path: _PathKey, positions: Positions, line_offset: int) -> Any:
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


def _plain_data(value: Any) -> Any:
    """Copy Python data into the plain JSON shape the validator expects (dicts, lists, str keys)."""
    if isinstance(value, Mapping):
        return {_key_text(k): _plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_data(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


# ---------------------------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------------------------


@functools.cache
def schema(kind: Kind) -> Mapping[str, Any]:
    """Return the JSON Schema of ``kind`` (``definition``, ``assembly``, ``instance`` or ``record``)."""
    if kind not in _KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(_KINDS)}")
    with (SPECS_DIR / f"{kind}.schema.json").open(encoding="utf-8") as f:
        loaded: dict[str, Any] = json.load(f)
    return loaded


@functools.cache
def _registry() -> referencing.Registry[Any]:
    resources = [referencing.Resource.from_contents(schema(k)) for k in _KINDS]
    return referencing.Registry().with_resources((r.id(), r) for r in resources)  # type: ignore[misc]


@functools.cache
def validator(kind: Kind) -> jsonschema.Draft202012Validator:
    """Return the (cached) validator of ``kind``'s schema. Cross-file ``$ref`` s resolve offline."""
    return jsonschema.Draft202012Validator(schema(kind), registry=_registry())


_TYPE_WORDS = {
    "object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
    "number": "a number", "boolean": "a boolean (true or false)", "null": "null",
}


_WORDS_BY_TYPE: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
    (Mapping, "a mapping"), (list, "a list"),
)


def _type_word(value: Any) -> str:
    if value is None:
        return "null"
    return next((word for t, word in _WORDS_BY_TYPE if isinstance(value, t)), type(value).__name__)


def _json_path(path: Sequence[str | int]) -> str:
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _lower_first(text: str) -> str:
    """Fit a schema description into a sentence: lower-case first letter, no final full stop."""
    text = text.rstrip(".")
    return text[:1].lower() + text[1:] if text[:1].isupper() and not text[1:2].isupper() else text


class _Reporter:
    """Turns validation errors and semantic findings into positioned problems."""

    def __init__(self, positions: Positions, prefix: Sequence[str | int] = ()) -> None:
        self.positions = positions
        self.prefix = tuple(prefix)
        self.problems: list[ConfigProblem] = []

    def add(self, message: str, path: Sequence[str | int], *, key: bool = False,
            where: tuple[int | None, int | None] | None = None) -> None:
        path = (*self.prefix, *path)
        line, column = where if where is not None else self.positions.locate(path, key=key)
        self.problems.append(ConfigProblem(message, file=self.positions.file, line=line,
                                           column=column, path=_json_path(path)))

    def schema_errors(self, errors: Iterator[ValidationError]) -> None:
        for error in errors:
            self._error(error, None)

    def _error(self, error: ValidationError, hint: str | None) -> None:
        """Report one schema error; ``hint`` describes the value when the error's own schema does not."""
        path = tuple(error.absolute_path)
        keyword = str(error.validator)
        here = error.schema if isinstance(error.schema, Mapping) else {}
        described = here.get("description") or hint
        custom = (here.get("errorMessage") or {}).get(keyword)
        if "propertyNames" in error.absolute_schema_path:
            expected = f": expected {_lower_first(described)}" if described else ""
            self.add(f"invalid name {error.instance!r}{expected}", (*path, error.instance), key=True)
        elif keyword == "additionalProperties" and error.validator_value is False:
            self._unknown_keys(error, path, here)
        elif custom and keyword == "not":
            # `not: {required: [a, b]}` means "not both": point at the last of them. On a value that
            # is not a mapping the rule says nothing (its type is reported on its own).
            if isinstance(error.instance, Mapping):
                negated = error.validator_value if isinstance(error.validator_value, Mapping) else {}
                present = [k for k in negated.get("required", ()) if k in error.instance]
                self.add(custom, (*path, present[-1]) if present else path, key=bool(present))
        elif custom:
            self.add(custom, path, key=keyword == "required")
        elif keyword in {"oneOf", "anyOf"} and error.context:
            self._alternatives(error, path, described)
        elif keyword == "required":
            for name in error.validator_value:
                if name not in error.instance:
                    self.add(f"missing required key {name!r}", path, key=True)
        else:
            formatter = _FORMATTERS.get(keyword)
            self.add(formatter(error, described) if formatter else error.message, path)

    def _unknown_keys(self, error: ValidationError, path: _PathKey, here: Mapping[str, Any]) -> None:
        allowed = list(here.get("properties", {}))
        patterns = list(here.get("patternProperties", {}))
        for name in error.instance:
            if name in allowed or any(re.search(p, name) for p in patterns):
                continue
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (allowed: {', '.join(allowed)})"
            self.add(f"unknown key {name!r}{hint}", (*path, name), key=True)

    def _alternatives(self, error: ValidationError, path: _PathKey, described: str | None) -> None:
        """Report a failed ``oneOf``/``anyOf`` through the branch the value was meant for."""
        branches: dict[int, list[ValidationError]] = {}
        for sub in error.context or ():
            branches.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
        fitting = [
            errs for errs in branches.values()
            if not any(e.validator == "type" and not e.relative_path for e in errs)
        ]
        if len(fitting) == 1:
            for sub in fitting[0]:
                self._error(sub, described)
            return
        types = [
            sub.validator_value for errs in branches.values() for sub in errs
            if sub.validator == "type" and not sub.relative_path
        ]
        if described:
            self.add(f"invalid value {json.dumps(error.instance)}: expected {_lower_first(described)}", path)
        elif types and len(types) == len(branches):
            words = " or ".join(_TYPE_WORDS.get(t, str(t)) for t in types if isinstance(t, str))
            self.add(f"must be {words}, got {_type_word(error.instance)}", path)
        else:
            self.add(error.message, path)


def _type_message(error: ValidationError, _described: str | None) -> str:
    expected = error.validator_value
    options = [expected] if isinstance(expected, str) else list(expected)
    words = " or ".join(_TYPE_WORDS.get(t, t) for t in options)
    if error.instance is None and not error.absolute_path:
        return f"the document is empty; expected {words}"
    return f"must be {words}, got {_type_word(error.instance)}"


def _enum_message(error: ValidationError, _described: str | None) -> str:
    choices = [str(c) for c in error.validator_value if c is not None]
    close = difflib.get_close_matches(str(error.instance), choices, n=1)
    suggestion = f"; did you mean {close[0]!r}?" if close and isinstance(error.instance, str) else ""
    return f"{json.dumps(error.instance)} is not one of: {', '.join(choices)}{suggestion}"


def _pattern_message(error: ValidationError, described: str | None) -> str:
    expected = _lower_first(described) if described else f"a string matching {error.validator_value}"
    return f"invalid value {error.instance!r}: expected {expected}"


def _bound_message(words: str) -> Callable[[ValidationError, str | None], str]:
    return lambda error, _described: f"must be {words} {error.validator_value}, got {error.instance}"


_FORMATTERS: Mapping[str, Callable[[ValidationError, str | None], str]] = {
    "type": _type_message,
    "enum": _enum_message,
    "pattern": _pattern_message,
    "const": lambda e, _d: f"must be {json.dumps(e.validator_value)}, got {json.dumps(e.instance)}",
    "minLength": lambda e, _d: "must not be empty" if e.validator_value == 1 else e.message,
    "minimum": _bound_message("at least"),
    "exclusiveMinimum": _bound_message("greater than"),
    "maximum": _bound_message("at most"),
    "exclusiveMaximum": _bound_message("less than"),
}


def validate_data(kind: Kind, data: Any, *, positions: Positions | None = None) -> list[ConfigProblem]:
    """Return every problem of ``data`` as a ``kind``, sorted by position; empty when it is valid.

    Runs the schema and the checks beyond it, but does not build the objects.

    :param kind: ``definition``, ``assembly``, ``instance`` or ``record``.
    :param data: Plain data (dicts, lists, scalars), as :func:`load_yaml` returns it.
    :param positions: Where each key sits, to place the problems; ``None`` for data from Python.
    """
    reporter = _Reporter(positions or Positions())
    reporter.schema_errors(validator(kind).iter_errors(data))
    if kind == "definition" and isinstance(data, Mapping):
        _check_definition(data, reporter)
    return _sorted(reporter.problems)


def _sorted(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for p in problems:
        ident = (p.line, p.column, p.path, p.message)
        if ident not in seen:
            seen.add(ident)
            unique.append(p)
    return sorted(unique, key=lambda p: (p.line or 0, p.column or 0, p.path))


# ---------------------------------------------------------------------------------------------
# Components' options, and problems found after loading
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _positions_of(file: str, _stamp: tuple[int, int]) -> Positions:
    """Return the positions of ``file``'s keys (read again: only a problem needs them), else none."""
    try:
        return load_yaml(file)[1]
    except ConfigError:
        return Positions(file)


def _file_positions(file: str | Path | None) -> Positions:
    if file is None:
        return Positions()
    try:
        stat = Path(file).stat()
    except OSError:
        return Positions(str(file))
    return _positions_of(str(file), (stat.st_mtime_ns, stat.st_size))


def option_problems(option_schema: Mapping[str, Any], options: Mapping[str, Any], *,
                    at: Sequence[str | int], file: str | Path | None) -> list[ConfigProblem]:
    """Return every problem of a component's ``options`` against the JSON Schema its plugin declared.

    :param option_schema: The schema registered with the component (``register(kind, factory,
        options=SCHEMA)``); ``$ref`` s to the loader's schemas (``definition.schema.json#/$defs/duration``)
        resolve offline.
    :param options: The options as written (the component's mapping without ``kind``).
    :param at: Where the mapping sits in the file, as a key path (``("providers", "local")``).
    :param file: The assembly file, to place each problem at its line and column.
    """
    checker = jsonschema.Draft202012Validator(option_schema, registry=_registry())
    reporter = _Reporter(_file_positions(file), prefix=at)
    reporter.schema_errors(checker.iter_errors(_plain_data(options)))
    return _sorted(reporter.problems)


def locate(message: str, at: Sequence[str | int], file: str | Path | None, *, key: bool = False) -> ConfigProblem:
    """Return a problem found after loading (an unknown tool, provider ...), placed at ``at`` in ``file``.

    :param at: The key path of what is wrong (``("tools", 2)``, ``("providers", "local", "kind")``).
    :param key: Point at the key rather than its value.
    """
    reporter = _Reporter(_file_positions(file))
    reporter.add(message, at, key=key)
    return reporter.problems[0]


def _json_path_keys(path: str) -> list[str | int]:
    """Turn a JSON path as problems carry it (``$.providers.local["x"][0]``) back into keys."""
    keys: list[str | int] = []
    for name, quoted, index in re.findall(r'\.([^.\[]+)|\["((?:[^"\\]|\\.)*)"\]|\[(\d+)\]', path):
        keys.append(int(index) if index else json.loads(f'"{quoted}"') if quoted else name)
    return keys


def placed(problems: Sequence[ConfigProblem], file: str | Path | None) -> list[ConfigProblem]:
    """Return ``problems``, each one that names no file placed at its JSON path in ``file``."""
    if file is None:
        return list(problems)
    return [p if p.file is not None else locate(p.message, _json_path_keys(p.path), file) for p in problems]


# ---------------------------------------------------------------------------------------------
# Checks beyond the schema
# ---------------------------------------------------------------------------------------------


def _check_definition(data: Mapping[str, Any], reporter: _Reporter) -> None:
    inputs = data.get("inputs")
    inputs = inputs if isinstance(inputs, Mapping) else {}
    _check_inputs(inputs, reporter)
    names = set(inputs)
    if isinstance(data.get("systemPrompt"), str):
        _check_template(data["systemPrompt"], ("systemPrompt",), names, reporter)
    prompts = data.get("initialPrompts")
    for i, prompt in enumerate(prompts if isinstance(prompts, list) else ()):
        if not isinstance(prompt, Mapping):
            continue
        if isinstance(prompt.get("content"), str):
            _check_template(prompt["content"], ("initialPrompts", i, "content"), names, reporter)
        calls = prompt.get("toolCalls")
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            if isinstance(call, Mapping) and isinstance(call.get("arguments"), Mapping):
                where = ("initialPrompts", i, "toolCalls", j, "arguments")
                for path, text in _strings(call["arguments"], where):
                    _check_template(text, path, names, reporter)
    output = data.get("output")
    if isinstance(output, Mapping):
        _check_output(output, reporter)


def _check_output(output: Mapping[str, Any], reporter: _Reporter) -> None:
    for error in _meta_validator().iter_errors(output):
        reporter.add(f"`output` is not a valid JSON Schema: {error.message}",
                     ("output", *error.absolute_path))
    for where, message in pattern_problems(output):  # patterns run on RE2 (linear time)
        reporter.add(f"`output`: {message}", ("output", *where))


@functools.cache
def _meta_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)


def _check_inputs(inputs: Mapping[str, Any], reporter: _Reporter) -> None:
    for name, spec in inputs.items():
        if not isinstance(spec, Mapping) or "default" not in spec:
            continue
        json_type = spec.get("type", "string")
        default = spec["default"]
        if default is not None and isinstance(json_type, str) and not matches_type(default, json_type):
            reporter.add(f"the default of input {name!r} must be {_TYPE_WORDS.get(json_type, json_type)}, "
                         f"got {_type_word(default)}", ("inputs", name, "default"))
        if spec.get("required") is True:
            reporter.add(f"input {name!r} has a default, so it cannot be required; drop one of them",
                         ("inputs", name, "required"), key=True)


def _strings(value: Any, path: _PathKey) -> Iterator[tuple[_PathKey, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, (*path, i))


def _check_template(text: str, path: _PathKey, names: set[str], reporter: _Reporter) -> None:
    positions = reporter.positions
    try:
        template = compile_template(text)
    except TemplateError as exc:
        offset = exc.offset or 0
        where = positions.find(path, "{{", text.count("{{", 0, offset))
        reporter.add(str(exc), path, where=where)
        return
    for ph in template.placeholders:
        if ph.path and ph.path[0] not in names:
            declared = ", ".join(sorted(names)) or "none"
            close = difflib.get_close_matches(ph.path[0], sorted(names), n=1)
            suggestion = f"; did you mean {close[0]!r}?" if close else ""
            where = positions.find(path, ph.text, text.count(ph.text, 0, ph.start))
            reporter.add(f"unknown template variable {ph.path[0]!r} in {ph.text}{suggestion} "
                         f"(declared inputs: {declared})", path, where=where)


# ---------------------------------------------------------------------------------------------
# Structuring
# ---------------------------------------------------------------------------------------------


def _split_kind(data: Mapping[str, Any], default: str | None = None) -> tuple[str, dict[str, Any]]:
    options = dict(data)
    kind = options.pop("kind", default)
    if not isinstance(kind, str):
        raise TypeError("`kind` is required and must be a string")
    return kind, options


_PROVIDER_KEYS = {"kind": "kind", "baseUrl": "base_url", "apiKey": "api_key", "apiKeyEnv": "api_key_env"}


def _structure_provider(data: Mapping[str, Any], _t: type) -> ProviderConfig:
    known = {_PROVIDER_KEYS[k]: v for k, v in data.items() if k in _PROVIDER_KEYS}
    options = {k: v for k, v in data.items() if k not in _PROVIDER_KEYS}
    return ProviderConfig(**known, options=options)


def _unstructure_provider(provider: ProviderConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": provider.kind}
    for key, attr in _PROVIDER_KEYS.items():
        if attr != "kind" and getattr(provider, attr) is not None:
            out[key] = getattr(provider, attr)
    return {**out, **provider.options}


def _structure_capabilities(data: Mapping[str, Any], _t: type) -> Capabilities:
    files = data.get("files") or {}
    agents = data.get("agents") or {}
    defaults = Capabilities()
    return Capabilities(
        files=FileGrants(read=tuple(files.get("read", ())), write=tuple(files.get("write", ()))),
        shell=data.get("shell", defaults.shell),
        network=bool(data.get("network", defaults.network)),
        agents_spawn=bool(agents.get("spawn", defaults.agents_spawn)),
        agents_max_depth=int(agents.get("maxDepth", defaults.agents_max_depth)),
        agents_max_agents=int(agents.get("maxAgents", defaults.agents_max_agents)),
    )


def _structure_input(data: Any, _t: type) -> InputSpec:
    if isinstance(data, str):
        return InputSpec(type=data)
    spec = dict(data)
    return InputSpec(
        type=spec.get("type", "string"),
        description=spec.get("description"),
        default=spec.get("default"),
        required=spec.get("required", "default" not in spec),
    )


def _unstructure_input(spec: InputSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": spec.type}
    if spec.description is not None:
        out["description"] = spec.description
    if spec.default is not None:
        out["default"] = spec.default
    out["required"] = spec.required
    return out


@functools.cache
def _converter() -> cattrs.Converter:
    conv = make_converter(forbid_extra_keys=True)

    base_limits = conv.get_structure_hook(Limits)

    def structure_limits(data: Mapping[str, Any], t: type) -> Limits:
        data = dict(data)
        for key in ("elapsed", "toolTimeout"):
            if key in data and data[key] is not None:
                data[key] = parse_duration(data[key])
        return base_limits(data, t)  # type: ignore[no-any-return]

    conv.register_structure_hook(Limits, structure_limits)
    conv.register_structure_hook(PluginSpec, lambda d, _t: PluginSpec(kind=_split_kind(d)[0],
                                                                        options=_split_kind(d)[1]))
    conv.register_structure_hook(StoreConfig, lambda d, _t: StoreConfig(kind=_split_kind(d, "file")[0],
                                                                          options=_split_kind(d, "file")[1]))
    conv.register_structure_hook(EngineConfig, lambda d, _t: EngineConfig(kind=_split_kind(d, "local")[0],
                                                                            options=_split_kind(d, "local")[1]))
    conv.register_structure_hook(ProviderConfig, _structure_provider)
    conv.register_structure_hook(Capabilities, _structure_capabilities)
    conv.register_structure_hook(InputSpec, _structure_input)
    # Generated after the hooks above, so that its fields use them.
    base_assembly = conv.get_structure_hook(Assembly)

    def structure_assembly(data: Mapping[str, Any], t: type) -> Assembly:
        data = dict(data)
        if isinstance(data.get("providers"), Mapping):
            data["providers"] = {name: {"kind": name, **entry} for name, entry in data["providers"].items()}
        return base_assembly(data, t)  # type: ignore[no-any-return]

    conv.register_structure_hook(Assembly, structure_assembly)
    conv.register_unstructure_hook(PluginSpec, lambda p: {"kind": p.kind, **p.options})
    conv.register_unstructure_hook(StoreConfig, lambda s: {"kind": s.kind, **s.options})
    conv.register_unstructure_hook(EngineConfig, lambda e: {"kind": e.kind, **e.options})
    conv.register_unstructure_hook(ProviderConfig, _unstructure_provider)
    conv.register_unstructure_hook(Capabilities, capabilities_to_dict)
    conv.register_unstructure_hook(InputSpec, _unstructure_input)
    return conv


_CATTRS_PATH_RE = re.compile(r"\$((?:\.[A-Za-z0-9_]+|\[[^\]]*\])*)$")


def _structure(cls: type[Any], data: Mapping[str, Any], reporter: _Reporter) -> Any:
    try:
        return _converter().structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        lines = cattrs.transform_error(exc, format_exception=_cattrs_message) \
            if isinstance(exc, cattrs.BaseValidationError) else [f"{exc} @ $"]
        for line in lines:
            message, _, where = line.rpartition(" @ ")
            reporter.add(message or line, _cattrs_path(where))
        return None


def _cattrs_message(exc: BaseException, cls: type | None) -> str:
    """Return the wording of cattrs, except for a refused duration (``nan``, ``.inf``), which says why itself."""
    import cattrs.v  # noqa: PLC0415 - only when a structure fails

    return str(exc) if isinstance(exc, ValueError) and str(exc).startswith("invalid duration") \
        else cattrs.v.format_exception(exc, cls)


def _cattrs_path(where: str) -> list[str | int]:
    """Turn cattrs' ``$.limits.tool_timeout`` / ``$.tools[0]`` into a camelCase key path."""
    path: list[str | int] = []
    for name, index in re.findall(r"\.([A-Za-z0-9_]+)|\[([^\]]*)\]", where):
        if name:
            path.append(camel(name))
        else:
            path.append(int(index) if index.isdigit() else index.strip("'\""))
    return path


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _read(source: str | Path | Mapping[str, Any],
          base_dir: str | Path | None) -> tuple[Any, Positions, Path | None]:
    if isinstance(source, Mapping):
        return _plain_data(source), Positions(), None
    path = Path(source)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    data, positions = load_yaml(path)
    return data, positions, path.resolve()


def _load(kind: Kind, source: str | Path | Mapping[str, Any], base_dir: str | Path | None,
          cls: type[Any]) -> tuple[Any, list[ConfigProblem], Path | None, str]:
    data, positions, path = _read(source, base_dir)
    data = _empty_assembly(kind, data)
    label = str(positions.file) if positions.file else f"the {kind}"
    problems = validate_data(kind, data, positions=positions)
    if problems:
        return None, problems, path, label
    reporter = _Reporter(positions)
    obj = _structure(cls, data, reporter)
    return obj, _sorted(reporter.problems), path, label


def _empty_assembly(kind: Kind, data: Any) -> Any:
    """Read an empty assembly file as every default (an empty definition stays an error)."""
    return {} if kind == "assembly" and data is None else data


def load_definition(source: str | Path | Mapping[str, Any], *,
                    base_dir: str | Path | None = None) -> Definition:
    """Load and check an agent definition.

    :param source: A file path (YAML or JSON), or the definition's data as a mapping.
    :param base_dir: The folder a relative path is resolved against (default: the working folder).
    :return: The definition; ``source`` is the resolved file path when it came from a file.
    :raises ConfigError: listing every problem, each with file, line, column and JSON path.
    """
    defn, problems, path, label = _load("definition", source, base_dir, Definition)
    if problems:
        raise ConfigError(f"{label} is not a valid definition", path=str(path) if path else None,
                          problems=problems)
    return attrs.evolve(defn, source=path) if path else defn  # type: ignore[no-any-return]


def load_assembly(source: str | Path | Mapping[str, Any] | None = None) -> Assembly:
    """Load and check an assembly (``loopwright.yaml``).

    :param source: A file path, the assembly's data as a mapping, or ``None`` for the defaults.
    :return: The assembly; ``path`` is the resolved file path when it came from a file.
    :raises ConfigError: listing every problem, each with file, line, column and JSON path.
    """
    if source is None:
        return Assembly()
    assembly, problems, path, label = _load("assembly", source, None, Assembly)
    if problems:
        raise ConfigError(f"{label} is not a valid assembly", path=str(path) if path else None,
                          problems=problems)
    return attrs.evolve(assembly, path=path) if path else assembly  # type: ignore[no-any-return]


def definition_to_dict(definition: Definition) -> dict[str, Any]:
    """Return ``definition`` as JSON-ready data in the YAML's own shape (camelCase keys).

    Defaults are left out and durations are seconds. The result is what the instance header
    stores as ``definition`` (a valid definition by the schema), so another process can resume the
    instance without the file. ``source`` is not included.
    """
    data: dict[str, Any] = _converter().unstructure(attrs.evolve(definition, source=None))
    data.pop("source", None)
    return _plain_data(data)  # type: ignore[no-any-return]


def definition_from_dict(data: Mapping[str, Any], *, source: str | Path | None = None) -> Definition:
    """Return the definition :func:`definition_to_dict` wrote, checked like a file.

    :param data: The snapshot.
    :param source: The file it originally came from, kept as ``Definition.source``.
    :raises ConfigError: when the snapshot is not a valid definition.
    """
    defn = load_definition(data)
    return attrs.evolve(defn, source=Path(source)) if source is not None else defn


# ---------------------------------------------------------------------------------------------
# validate_file
# ---------------------------------------------------------------------------------------------

_KIND_BY_NAME: Mapping[str, Kind] = {
    **dict.fromkeys(ASSEMBLY_FILE_NAMES, "assembly"), "instance.json": "instance",
}
_ASSEMBLY_ONLY_KEYS = frozenset({
    "store", "engine", "providers", "defaultModel", "plugins", "disablePlugins", "capabilities",
    "agentDefinitions", "agentsMayReachAnyInstance", "records", "pricing", "agentRetry", "pluginSettings",
    "server",
})


def detect_kind(path: str | Path, data: Any = None) -> Kind:
    """Guess what ``path`` describes, from its name and (if given) its top-level keys.

    ``loopwright.yaml`` and files with assembly-only keys (``providers``, ``store``, ``plugins``
    ...) are assemblies; ``instance.json`` and mappings with ``instanceId`` and ``state`` are
    instance headers; ``*.jsonl`` files and mappings with ``kind``, ``instanceId`` and ``at`` are
    records; anything else is a definition.
    """
    name = Path(path).name
    by_name = _KIND_BY_NAME.get(name) or ("record" if name.endswith(".jsonl") else None)
    if by_name:
        return by_name
    keys = data.keys() if isinstance(data, Mapping) else frozenset()
    if {"instanceId", "state"} <= keys:
        return "instance"
    if {"kind", "instanceId", "at"} <= keys:
        return "record"
    return "assembly" if keys & _ASSEMBLY_ONLY_KEYS else "definition"


def validate_file(path: str | Path, kind: Kind | None = None) -> list[ConfigProblem]:
    """Return every problem of the file at ``path``; an empty list means it is valid. Never raises.

    :param path: A YAML or JSON file; a ``.jsonl`` file is read as one record per line.
    :param kind: ``definition``, ``assembly``, ``instance`` or ``record``; guessed by
        :func:`detect_kind` when ``None``.
    """
    file = str(path)
    if file.endswith(".jsonl") and kind in {None, "record"}:
        return _validate_lines(path)
    try:
        data, positions = load_yaml(path)
    except ConfigError as exc:
        return list(exc.problems)
    kind = kind or detect_kind(path, data)
    data = _empty_assembly(kind, data)
    problems = validate_data(kind, data, positions=positions)
    if problems or kind not in {"definition", "assembly"}:
        return problems
    reporter = _Reporter(positions)
    _structure(Definition if kind == "definition" else Assembly, data, reporter)
    return _sorted(reporter.problems)


def _validate_lines(path: str | Path) -> list[ConfigProblem]:
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [ConfigProblem(f"cannot read the file: {exc}", file=file)]
    problems: list[ConfigProblem] = []
    for number, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            data, positions = _parse_yaml(line, file, line_offset=number)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if not problems and isinstance(data, Mapping) and "t" in data and "kind" not in data:
            # An instance's entry log (entries.jsonl): one clear answer, not a problem per line.
            return [ConfigProblem(
                "this is an instance's entry log (entries.jsonl), which loopwright writes and reads back; "
                "validate checks definitions, assemblies, instance headers (instance.json) and record logs "
                "(records.jsonl)", file=file, line=number + 1)]
        problems.extend(validate_data("record", data, positions=positions))
    return problems
