"""The JSON Schemas of ``specs/``, their validators, and problems placed at file:line:column.

The schemas (shipped inside the package as ``loopwright/_specs``) are the single source of truth
for which keys a definition, an assembly, an instance header or a record may have.
:func:`validator` compiles one on first use and keeps it: importing this module compiles nothing
and does not import :mod:`jsonschema` (the CLI starts without it; only a command that reads a
file pays for it). :class:`Reporter` turns schema errors and the loader's own findings into
:class:`~loopwright.errors.ConfigProblem` s with file, line, column and JSON path.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loopwright._yaml import PathKey, Positions, load_yaml, plain_data
from loopwright.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    import jsonschema
    import referencing
    from jsonschema.exceptions import ValidationError

__all__ = [
    "KINDS",
    "SPECS_DIR",
    "TYPE_WORDS",
    "Kind",
    "Reporter",
    "compiled_source",
    "fast_valid",
    "locate",
    "meta_validator",
    "option_problems",
    "placed",
    "schema",
    "sorted_problems",
    "type_word",
    "validator",
    "write_compiled",
]

#: Where the JSON Schemas live: a symlink to the repository's ``specs/`` folder.
SPECS_DIR = Path(__file__).parent / "_specs"

#: What a file can describe; each has a schema ``specs/<kind>.schema.json``.
Kind = Literal["definition", "assembly", "instance", "record"]
KINDS: tuple[Kind, ...] = ("definition", "assembly", "instance", "record")


@functools.cache
def schema(kind: Kind) -> Mapping[str, Any]:
    """Return the JSON Schema of ``kind`` (``definition``, ``assembly``, ``instance`` or ``record``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    with (SPECS_DIR / f"{kind}.schema.json").open(encoding="utf-8") as f:
        loaded: dict[str, Any] = json.load(f)
    return loaded


@functools.cache
def _registry() -> referencing.Registry[Any]:
    import referencing  # noqa: PLC0415 - the schemas' machinery only when a file is checked (start-up)

    resources = [referencing.Resource.from_contents(schema(k)) for k in KINDS]
    return referencing.Registry().with_resources((r.id(), r) for r in resources)  # type: ignore[misc]


@functools.cache
def validator(kind: Kind) -> jsonschema.Draft202012Validator:
    """Return the validator of ``kind``'s schema, compiled on first use. Cross-file ``$ref`` s resolve offline."""
    import jsonschema  # noqa: PLC0415 - jsonschema only when a file is checked (CLI start-up)

    return jsonschema.Draft202012Validator(schema(kind), registry=_registry())


#: The kinds whose schema is also compiled ahead of time (every command loads one of them).
_COMPILED: tuple[Kind, ...] = ("assembly", "definition")
_COMPILED_HEADER = (
    '"""Generated from specs/{kind}.schema.json by ``loopwright._schemas.write_compiled()``: do not edit.\n\n'
    "A fastjsonschema validator: :func:`loopwright._schemas.fast_valid` uses it to pass valid data\n"
    "without importing jsonschema; jsonschema still words every problem. A test checks that this\n"
    'file is what the schema compiles to.\n"""\n'
    "# ruff: noqa: RUF100, ANN001, ANN202, ANN204, ARG001, B006, B007, C401, C402, C405, C901, E402, E501, E701, F841, "
    "I001, N806, N818, PLR0912, PLR0915, PLR2004, Q000, RUF021, RUF060, SIM102, TRY301\n"
    "# mypy: ignore-errors\n"
)


_FASTJSONSCHEMA_IMPORT = "from fastjsonschema import JsonSchemaValueException, JsonSchemaValuesException\n"
_LOCAL_EXCEPTIONS = (
    "\n\nclass JsonSchemaValueException(ValueError):\n"
    '    """The data is invalid (fastjsonschema\'s exception of this name, without importing fastjsonschema)."""\n\n'
    "    def __init__(self, message, value=None, name=None, definition=None, rule=None):\n"
    "        super().__init__(message)\n"
    "        self.message, self.value, self.name, self.definition, self.rule = message, value, name, definition, rule\n"
    "\n\nJsonSchemaValuesException = JsonSchemaValueException\n"
)


def _compiled_path(kind: Kind) -> Path:
    return Path(__file__).parent / f"_schema_{kind}.py"


def compiled_source(kind: Kind) -> str:
    """Return the source of ``kind``'s validator compiled ahead of time (``fastjsonschema.compile_to_code``).

    The module it is saved as (``loopwright/_schema_<kind>.py``) defines ``validate(data)``.
    """
    import fastjsonschema  # noqa: PLC0415 - only to generate the modules

    # Without fastjsonschema's version line: a release that compiles the same code changes nothing.
    source = fastjsonschema.compile_to_code(copy.deepcopy(dict(schema(kind))))
    code = re.sub(r'^VERSION = "[^"]*"\n', "", source, flags=re.MULTILINE)
    # Its exceptions defined in the module itself: importing fastjsonschema (its code generator,
    # drafts and resolver) would cost every start-up more than checking the data does.
    code = code.replace(_FASTJSONSCHEMA_IMPORT, _LOCAL_EXCEPTIONS, 1)
    entry = re.search(r"^def (validate_\w+)\(", code, re.MULTILINE)
    if entry is None:  # pragma: no cover - fastjsonschema's layout changed
        raise RuntimeError(f"no validate function in the code fastjsonschema compiled from the {kind} schema")
    return f"{_COMPILED_HEADER.format(kind=kind)}{code.rstrip()}\n\n\nvalidate = {entry.group(1)}\n"


def write_compiled() -> list[Path]:
    """Write the validators compiled ahead of time (run after editing a schema); return their files."""
    written = []
    for kind in _COMPILED:
        path = _compiled_path(kind)
        path.write_text(compiled_source(kind), encoding="utf-8")
        written.append(path)
    return written


def fast_valid(kind: Kind, data: Any) -> bool:
    """Return whether ``data`` is valid by ``kind``'s schema compiled ahead of time, importing no jsonschema.

    ``True`` means valid (the compiled validator and jsonschema agree on every example of
    ``specs/``, a test checks); ``False`` means invalid, or no compiled validator: ask
    :func:`validator`, which also words the problems.
    """
    if kind not in _COMPILED:
        return False
    import importlib  # noqa: PLC0415

    module = importlib.import_module(f"loopwright._schema_{kind}")
    try:
        module.validate(data)
    except module.JsonSchemaValueException:
        return False
    except Exception:  # noqa: BLE001 - data the compiled code cannot handle: jsonschema decides
        return False
    return True


TYPE_WORDS = {
    "object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
    "number": "a number", "boolean": "a boolean (true or false)", "null": "null",
}


_WORDS_BY_TYPE: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
    (Mapping, "a mapping"), (list, "a list"),
)


def type_word(value: Any) -> str:
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


class Reporter:
    """Turns validation errors and semantic findings into positioned problems.

    Attributes:
        positions: Where each key of the document sits (empty for data from Python).
        prefix: The key path of the checked data inside the document (a component's options).
        problems: What was reported, in order.
    """

    def __init__(self, positions: Positions, prefix: Sequence[str | int] = ()) -> None:
        self.positions = positions
        self.prefix = tuple(prefix)
        self.problems: list[ConfigProblem] = []

    def add(self, message: str, path: Sequence[str | int], *, key: bool = False,
            where: tuple[int | None, int | None] | None = None) -> None:
        """Report ``message`` at ``path`` (its key with ``key``), or at ``where`` when given."""
        path = (*self.prefix, *path)
        line, column = where if where is not None else self.positions.locate(path, key=key)
        self.problems.append(ConfigProblem(message, file=self.positions.file, line=line,
                                           column=column, path=_json_path(path)))

    def schema_errors(self, errors: Iterator[ValidationError]) -> None:
        """Report each of a validator's errors, in the loader's wording."""
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

    def _unknown_keys(self, error: ValidationError, path: PathKey, here: Mapping[str, Any]) -> None:
        allowed = list(here.get("properties", {}))
        patterns = list(here.get("patternProperties", {}))
        for name in error.instance:
            if name in allowed or any(re.search(p, name) for p in patterns):
                continue
            import difflib  # noqa: PLC0415 - only to word a problem: ls and show import none (issue 30)

            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (allowed: {', '.join(allowed)})"
            self.add(f"unknown key {name!r}{hint}", (*path, name), key=True)

    def _alternatives(self, error: ValidationError, path: PathKey, described: str | None) -> None:
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
            words = " or ".join(TYPE_WORDS.get(t, str(t)) for t in types if isinstance(t, str))
            self.add(f"must be {words}, got {type_word(error.instance)}", path)
        else:
            self.add(error.message, path)


def _type_message(error: ValidationError, _described: str | None) -> str:
    expected = error.validator_value
    options = [expected] if isinstance(expected, str) else list(expected)
    words = " or ".join(TYPE_WORDS.get(t, t) for t in options)
    if error.instance is None and not error.absolute_path:
        return f"the document is empty; expected {words}"
    return f"must be {words}, got {type_word(error.instance)}"


def _enum_message(error: ValidationError, _described: str | None) -> str:
    choices = [str(c) for c in error.validator_value if c is not None]
    import difflib  # noqa: PLC0415 - only to word a problem: ls and show import none (issue 30)

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


@functools.cache
def meta_validator() -> jsonschema.Draft202012Validator:
    """Return the validator of JSON Schema itself (draft 2020-12), compiled on first use."""
    import jsonschema  # noqa: PLC0415 - jsonschema only when a schema is checked (CLI start-up)

    return jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)


def sorted_problems(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    """Return ``problems`` without repeats, sorted by line, column and JSON path."""
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
    if not options and _empty_is_valid(option_schema):
        return []  # no options, and nothing the schema says can refuse none: no validator to compile (issue 30)
    data = plain_data(options)
    fast = _fast_option_validator(json.dumps(option_schema, sort_keys=True))
    if fast is not None and fast(data):
        return []
    import jsonschema  # noqa: PLC0415 - jsonschema only when options are checked (start-up)

    checker = jsonschema.Draft202012Validator(option_schema, registry=_registry())
    reporter = Reporter(_file_positions(file), prefix=at)
    reporter.schema_errors(checker.iter_errors(data))
    return sorted_problems(reporter.problems)


#: Keywords an empty object satisfies whatever their values: annotations, and those about keys it has none of.
_EMPTY_SATISFIES = frozenset({"$schema", "$id", "$comment", "title", "description", "default", "examples",
                              "properties", "additionalProperties", "patternProperties", "propertyNames"})


def _empty_is_valid(option_schema: Mapping[str, Any]) -> bool:
    """Return whether ``{}`` is valid by ``option_schema`` on sight: an object schema of keywords it satisfies.

    A component registered with options, started without any (the engine's ``local``), is
    checked without compiling a validator; any other schema (``required``, ``minProperties``,
    ``allOf`` ...) is asked as before.
    """
    kind = option_schema.get("type", "object")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    return is_object and _EMPTY_SATISFIES.issuperset(k for k in option_schema if k != "type")


#: Keywords whose meaning is the same in draft 7 (fastjsonschema) and 2020-12 (jsonschema), or annotations.
_SAME_IN_DRAFT_7 = frozenset({
    "$schema", "$id", "$comment", "$anchor", "$defs", "definitions", "title", "description", "default", "examples",
    "errorMessage", "type", "enum", "const", "properties", "additionalProperties", "patternProperties", "required",
    "propertyNames", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "uniqueItems", "oneOf", "anyOf",
    "allOf", "not", "if", "then", "else", "$ref",
})
#: Keywords whose value is a mapping of names to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def _subschemas(key: str, value: Any) -> list[Any] | None:
    """Return the schemas inside keyword ``key``'s ``value``; ``None`` if its shape is not the one both drafts read."""
    if key in _SCHEMA_MAPS:
        return list(value.values()) if isinstance(value, Mapping) else None
    if key in {"oneOf", "anyOf", "allOf"}:
        return list(value) if isinstance(value, list) else None
    if key in {"items", "additionalProperties", "propertyNames", "not", "if", "then", "else"}:
        return [value]  # `items` as a list means something else in each draft: refused below
    return []


def _draft_7_safe(node: Any) -> bool:
    """Whether a schema uses only keywords that fastjsonschema (draft 7) reads as 2020-12 does.

    ``items`` must be a single schema (a list means something else in each draft) and a ``$ref``
    has no sibling rules (draft 7 ignores them).
    """
    if isinstance(node, bool):
        return True
    if not isinstance(node, Mapping) or not set(node) <= _SAME_IN_DRAFT_7 | {"items"}:
        return False
    if "$ref" in node and (set(node) - {"$ref", "$comment", "title", "description", "errorMessage", "$anchor"}
                           or not isinstance(node["$ref"], str)):
        return False
    children = [_subschemas(key, value) for key, value in node.items()]
    return all(c is not None and all(_draft_7_safe(each) for each in c) for c in children)


def _spec_of(uri: str) -> Any:
    """Resolve a ``$ref`` to a copy of one of the loader's schemas (offline), for fastjsonschema.

    A copy: fastjsonschema changes the documents it resolves, and the cached schemas are shared.
    """
    for kind in KINDS:
        if schema(kind).get("$id") == uri.split("#", 1)[0]:
            return copy.deepcopy(schema(kind))
    raise LookupError(uri)


@functools.lru_cache(maxsize=64)
def _fast_option_validator(schema_json: str) -> Callable[[Any], bool] | None:
    """Return a check that passes options valid by the schema (compiled with fastjsonschema), else ``None``.

    ``None`` when the schema uses a keyword whose meaning differs between draft 7 and 2020-12, or
    refers outside the loader's own schemas: jsonschema alone then decides. A check's ``False``
    means "ask jsonschema", which also words the problems.
    """
    option_schema = json.loads(schema_json)
    refs = re.findall(r'"\$ref": "([^"#]+)', schema_json)
    if not _draft_7_safe(option_schema) or not all(_draft_7_safe(_spec_of_or_none(r)) for r in refs):
        return None
    import fastjsonschema  # noqa: PLC0415 - light, and only when options are checked

    try:
        compiled = fastjsonschema.compile(option_schema, handlers={"https": _spec_of, "http": _spec_of})
    except Exception:  # noqa: BLE001 - a schema it cannot compile: jsonschema decides
        return None

    def check(data: Any) -> bool:
        try:
            compiled(data)
        except Exception:  # noqa: BLE001 - invalid, or data it cannot handle: jsonschema decides
            return False
        return True

    return check


def _spec_of_or_none(uri: str) -> Any:
    try:
        return _spec_of(uri)
    except LookupError:
        return None


def locate(message: str, at: Sequence[str | int], file: str | Path | None, *, key: bool = False) -> ConfigProblem:
    """Return a problem found after loading (an unknown tool, provider ...), placed at ``at`` in ``file``.

    :param at: The key path of what is wrong (``("tools", 2)``, ``("providers", "local", "kind")``).
    :param key: Point at the key rather than its value.
    """
    reporter = Reporter(_file_positions(file))
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
