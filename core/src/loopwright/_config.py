"""Load, validate and convert the YAML files loopwright reads: definitions and assemblies.

A file goes through four steps, and every step reports *all* its problems at once, each as a
:class:`~loopwright.errors.ConfigProblem` with file, line, column and JSON path:

1. :func:`load_yaml` (:mod:`loopwright._yaml`) parses it with ruamel's round-trip loader, which
   keeps the position of every key and item (:class:`Positions`); a syntax error names the file,
   line and column.
2. The data is validated against the JSON Schema in ``specs/`` (:mod:`loopwright._schemas`, which
   compiles each validator on first use): the schemas are the single source of truth for which
   keys exist.
3. Checks a schema cannot express: template variables that name no input, malformed templates,
   input defaults of the wrong type, an ``output`` that is not a valid JSON Schema.
4. The data is structured into the frozen classes of :mod:`loopwright._definition` with a cattrs
   converter (camelCase keys, durations parsed to seconds, ``{kind, ...options}`` split).

:func:`load_definition` and :func:`load_assembly` raise :class:`~loopwright.errors.ConfigError`
carrying the problems; :func:`validate_file` returns them (``loopwright validate``). This module
is the loader's front: the names of :mod:`loopwright._yaml` and :mod:`loopwright._schemas` that
callers use are re-exported here.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs

from loopwright._capabilities import capabilities_from_dict, capabilities_to_dict
from loopwright._convert import camel, make_converter
from loopwright._definition import (
    Assembly,
    Capabilities,
    Definition,
    EngineConfig,
    InputSpec,
    Limits,
    MemoryConfig,
    PluginSpec,
    ProviderConfig,
    Retention,
    StoreConfig,
)
from loopwright._duration import parse_duration  # the one grammar, re-exported for the loader's callers
from loopwright._patterns import pattern_problems
from loopwright._schemas import (
    SPECS_DIR,
    TYPE_WORDS,
    Kind,
    Reporter,
    fast_valid,
    locate,
    meta_validator,
    option_problems,
    placed,
    schema,
    sorted_problems,
    type_word,
    validator,
)
from loopwright._template import TemplateError, compile_template, matches_type
from loopwright._yaml import (
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    PathKey,
    Positions,
    load_yaml,
    parse_yaml,
    plain_data,
    read_yaml,
)
from loopwright.errors import ConfigError, ConfigProblem, shown_path

__all__ = [
    "ASSEMBLY_FILE_NAMES",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "SPECS_DIR",
    "Kind",
    "Positions",
    "assembly_from_file",
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

#: File names that are always read as assemblies.
ASSEMBLY_FILE_NAMES = frozenset({"loopwright.yaml", "loopwright.yml"})


# ---------------------------------------------------------------------------------------------
# Validation: the schema, then the checks beyond it
# ---------------------------------------------------------------------------------------------


def validate_data(kind: Kind, data: Any, *, positions: Positions | None = None) -> list[ConfigProblem]:
    """Return every problem of ``data`` as a ``kind``, sorted by position; empty when it is valid.

    Runs the schema and the checks beyond it, but does not build the objects.

    :param kind: ``definition``, ``assembly``, ``instance`` or ``record``.
    :param data: Plain data (dicts, lists, scalars), as :func:`load_yaml` returns it.
    :param positions: Where each key sits, to place the problems; ``None`` for data from Python.
    """
    reporter = Reporter(positions or Positions())
    if not fast_valid(kind, data):  # valid data needs no jsonschema (the CLI's start-up)
        reporter.schema_errors(validator(kind).iter_errors(data))
    if kind == "definition" and isinstance(data, Mapping):
        _check_definition(data, reporter)
    if kind == "assembly" and isinstance(data, Mapping):
        _check_redaction(data.get("redaction"), reporter)
    return sorted_problems(reporter.problems)


def _check_redaction(redaction: Any, reporter: Reporter) -> None:
    """Refuse a ``redaction.patterns`` entry RE2 cannot run (in linear time), at its position."""
    patterns = redaction.get("patterns") if isinstance(redaction, Mapping) else None
    if not isinstance(patterns, list):
        return
    from loopwright._redaction import pattern_problems as redaction_problems  # noqa: PLC0415 - RE2 only when set

    texts = [p.get("pattern") if isinstance(p, Mapping) else None for p in patterns]
    indexed = [(i, t) for i, t in enumerate(texts) if isinstance(t, str)]
    for index, message in redaction_problems([t for _i, t in indexed]):
        reporter.add(f"`redaction.patterns`: {message}", ("redaction", "patterns", indexed[index][0], "pattern"))


def _check_definition(data: Mapping[str, Any], reporter: Reporter) -> None:
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


def _check_output(output: Mapping[str, Any], reporter: Reporter) -> None:
    for error in meta_validator().iter_errors(output):
        reporter.add(f"`output` is not a valid JSON Schema: {error.message}",
                     ("output", *error.absolute_path))
    for where, message in pattern_problems(output):  # patterns run on RE2 (linear time)
        reporter.add(f"`output`: {message}", ("output", *where))


def _check_inputs(inputs: Mapping[str, Any], reporter: Reporter) -> None:
    for name, spec in inputs.items():
        if not isinstance(spec, Mapping) or "default" not in spec:
            continue
        json_type = spec.get("type", "string")
        default = spec["default"]
        if default is not None and isinstance(json_type, str) and not matches_type(default, json_type):
            reporter.add(f"the default of input {name!r} must be {TYPE_WORDS.get(json_type, json_type)}, "
                         f"got {type_word(default)}", ("inputs", name, "default"))
        if spec.get("required") is True:
            reporter.add(f"input {name!r} has a default, so it cannot be required; drop one of them",
                         ("inputs", name, "required"), key=True)


def _strings(value: Any, path: PathKey) -> Iterator[tuple[PathKey, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, (*path, i))


def _check_template(text: str, path: PathKey, names: set[str], reporter: Reporter) -> None:
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
            import difflib  # noqa: PLC0415 - only to word a problem: ls and show import none (issue 30)

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
    conv.register_structure_hook(Retention, lambda d, _t: Retention(
        instances=parse_duration(d["instances"]) if d.get("instances") is not None else None))
    conv.register_structure_hook(PluginSpec, lambda d, _t: PluginSpec(kind=_split_kind(d)[0],
                                                                        options=_split_kind(d)[1]))
    conv.register_structure_hook(StoreConfig, lambda d, _t: StoreConfig(kind=_split_kind(d, "file")[0],
                                                                          options=_split_kind(d, "file")[1]))
    conv.register_structure_hook(EngineConfig, lambda d, _t: EngineConfig(kind=_split_kind(d, "local")[0],
                                                                            options=_split_kind(d, "local")[1]))
    conv.register_structure_hook(MemoryConfig, lambda d, _t: MemoryConfig(kind=_split_kind(d, "sqlite")[0],
                                                                            options=_split_kind(d, "sqlite")[1]))
    conv.register_structure_hook(ProviderConfig, _structure_provider)
    conv.register_structure_hook(Capabilities, lambda d, _t: capabilities_from_dict(d, saved=False))
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
    conv.register_unstructure_hook(MemoryConfig, lambda m: {"kind": m.kind, **m.options})
    conv.register_unstructure_hook(ProviderConfig, _unstructure_provider)
    conv.register_unstructure_hook(Capabilities, capabilities_to_dict)
    conv.register_unstructure_hook(InputSpec, _unstructure_input)
    return conv


_CATTRS_PATH_RE = re.compile(r"\$((?:\.[A-Za-z0-9_]+|\[[^\]]*\])*)$")


def _structure(cls: type[Any], data: Mapping[str, Any], reporter: Reporter) -> Any:
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
        return plain_data(source), Positions(), None
    path = Path(source)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    data, positions = load_yaml(path)
    return data, positions, path.resolve()


def _load(kind: Kind, source: str | Path | Mapping[str, Any], base_dir: str | Path | None,
          cls: type[Any]) -> tuple[Any, list[ConfigProblem], Path | None, str]:
    data, positions, path = _read(source, base_dir)
    data = _empty_assembly(kind, data)
    label = shown_path(positions.file) if positions.file else f"the {kind}"
    problems = validate_data(kind, data, positions=positions)
    if problems:
        return None, problems, path, label
    reporter = Reporter(positions)
    obj = _structure(cls, data, reporter)
    return obj, sorted_problems(reporter.problems), path, label


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


def assembly_from_file(path: str | os.PathLike[str] | None = None) -> Assembly | None:
    """Load the assembly a runtime is built from (:meth:`Runtime.from_file <loopwright.Runtime.from_file>`).

    :param path: The file; ``None`` reads ``./loopwright.yaml`` when it exists.
    :return: The assembly, or ``None`` (every default) when ``path`` is ``None`` and there is no
        ``./loopwright.yaml``.
    :raises ConfigError: There is no file at ``path``, or it is invalid (every problem with
        file, line and column).
    """
    if path is None:
        default = Path("loopwright.yaml")
        return load_assembly(default) if default.is_file() else None
    if not Path(path).is_file():
        raise ConfigError(f"no assembly file at {shown_path(path)}", path=str(path))
    return load_assembly(Path(path))


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
    return plain_data(data)  # type: ignore[no-any-return]


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
    reporter = Reporter(positions)
    _structure(Definition if kind == "definition" else Assembly, data, reporter)
    return sorted_problems(reporter.problems)


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
            data, positions = parse_yaml(line, file, line_offset=number)
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
