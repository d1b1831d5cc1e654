r"""JSON Schema validation whose regular expressions run in linear time, with RE2.

A schema's ``pattern`` and ``patternProperties`` come from files a model may write (a
definition's ``output``) or from tool providers (MCP servers). Python's :mod:`re` backtracks:
``^(a+)+$`` against 34 characters runs for hours, and it would run inside the loop. Here every
pattern is compiled with RE2 (the ``google-re2`` package), which matches in time linear in the
text and refuses what it cannot do that way: backreferences (``\1``) and lookarounds
(``(?=...)``, ``(?<!...)``).

* :func:`pattern_problems` lists the patterns of a schema RE2 cannot compile; the loader reports
  them as errors of the definition (``output``), at load time.
* :func:`schema_validator` returns a Draft 2020-12 validator whose ``pattern``,
  ``patternProperties`` and ``additionalProperties`` keywords use RE2. Given ``lenient=True``
  (for tool schemas a host or an MCP server registered), a pattern RE2 cannot compile is not
  enforced (the tool sees the value unchecked), and ``unevaluatedProperties`` next to
  ``patternProperties`` is not enforced either (jsonschema would run those patterns with
  :mod:`re`); without it such schemas are refused by :func:`pattern_problems` first.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema
    from jsonschema.exceptions import ValidationError

__all__ = ["has_pattern_properties", "has_patterns", "pattern_problems", "schema_validator"]


@functools.cache
def _options() -> Any:
    import re2  # noqa: PLC0415 - RE2 only when a pattern is checked: ls and show compile none (issue 30)

    options = re2.Options()
    options.log_errors = False  # errors are reported as problems, not printed to stderr
    return options


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    """Return the RE2 program of ``pattern``, or ``None`` when RE2 cannot compile it."""
    import re2  # noqa: PLC0415 - see _options

    try:
        return re2.compile(pattern, _options())
    except re2.error:
        return None


def _why(pattern: str) -> str:
    import re2  # noqa: PLC0415 - see _options

    try:
        re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    return "it compiles"  # pragma: no cover - only asked about patterns that failed


def _walk(schema: Any) -> Iterator[tuple[tuple[str | int, ...], Mapping[str, Any]]]:
    """Yield every mapping in ``schema`` with its path, without recursion."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, Mapping):
            yield path, node
            stack.extend(((*path, str(k)), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node))


def _patterns(node: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Yield ``(keyword, pattern)`` for the patterns ``node`` holds as a schema."""
    if isinstance(node.get("pattern"), str):
        yield "pattern", node["pattern"]
    if isinstance(node.get("patternProperties"), Mapping):
        for key in node["patternProperties"]:
            yield "patternProperties", str(key)


def has_patterns(schema: Any) -> bool:
    """Return whether ``schema`` holds any ``pattern`` or ``patternProperties``."""
    return any(True for _, node in _walk(schema) for _ in _patterns(node))


def pattern_problems(schema: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """Return ``(path, message)`` for each pattern of ``schema`` that cannot be checked in linear time.

    A pattern RE2 cannot compile (a backreference, a lookaround, invalid syntax), and
    ``unevaluatedProperties`` in a schema that also has ``patternProperties`` anywhere.
    """
    problems: list[tuple[tuple[str | int, ...], str]] = []
    any_pattern_properties = False
    unevaluated: list[tuple[str | int, ...]] = []
    for path, node in _walk(schema):
        for keyword, pattern in _patterns(node):
            any_pattern_properties |= keyword == "patternProperties"
            if _compiled(pattern) is None:
                where = (*path, keyword) if keyword == "pattern" else (*path, keyword, pattern)
                message = (f"the pattern {pattern!r} is not RE2 syntax ({_why(pattern)}); patterns are "
                           "matched with RE2, which has no backreferences or lookarounds")
                problems.append((where, message))
        if "unevaluatedProperties" in node:
            unevaluated.append((*path, "unevaluatedProperties"))
    if any_pattern_properties:
        message = ("unevaluatedProperties cannot be combined with patternProperties "
                   "(their patterns would not be matched with RE2)")
        problems.extend((where, message) for where in unevaluated)
    return sorted(problems, key=lambda p: [str(x) for x in p[0]])


def _search(pattern: str, text: str, *, lenient: bool) -> bool | None:
    """Whether ``pattern`` is found in ``text``; ``None`` when it is not enforced (``lenient``)."""
    program = _compiled(pattern)
    if program is None:
        if lenient:
            return None
        raise ValueError(f"the pattern {pattern!r} is not RE2 syntax")
    return program.search(text) is not None


def _pattern(validator: Any, patrn: str, instance: Any, _schema: Any, *,
             lenient: bool) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and _search(patrn, instance, lenient=lenient) is False:
        from jsonschema.exceptions import ValidationError  # noqa: PLC0415 - jsonschema only once a schema is validated (start-up)

        shown = instance if len(instance) <= 80 else f"{instance[:77]}..."  # noqa: PLR2004
        yield ValidationError(f"{shown!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any, _schema: Any, *,
                        lenient: bool) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for key, value in instance.items():
            if _search(patrn, key, lenient=lenient):
                yield from validator.descend(value, subschema, path=key, schema_path=patrn)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any], *,
                           lenient: bool) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    # An unenforced pattern (lenient) lets every key through, as matching it would.
    extras = sorted((k for k in instance if k not in properties
                     and not any(_search(p, k, lenient=lenient) is not False for p in patterns)), key=str)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        from jsonschema.exceptions import ValidationError  # noqa: PLC0415 - jsonschema only once a schema is validated (start-up)

        joined = ", ".join(repr(each) for each in extras)
        verb = "was" if len(extras) == 1 else "were"
        yield ValidationError(f"Additional properties are not allowed ({joined} {verb} unexpected)")


def _unevaluated_properties(validator: Any, unevaluated: Any, instance: Any,
                            schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if has_pattern_properties(validator.schema):
        return  # not enforced: jsonschema would match the patternProperties with re
    import jsonschema  # noqa: PLC0415 - jsonschema only once a schema is validated (start-up)

    yield from jsonschema.Draft202012Validator.VALIDATORS["unevaluatedProperties"](
        validator, unevaluated, instance, schema)


@functools.cache
def _validator_class(*, lenient: bool) -> type[jsonschema.Draft202012Validator]:
    """Return the validator class, built once, on the first schema validated.

    Importing jsonschema costs tens of milliseconds that commands which validate nothing
    (``ls``, ``show``) do not pay.
    """
    import jsonschema  # noqa: PLC0415 - jsonschema only once a schema is validated (start-up)

    keywords: dict[str, Any] = {
        "pattern": functools.partial(_pattern, lenient=lenient),
        "patternProperties": functools.partial(_pattern_properties, lenient=lenient),
        "additionalProperties": functools.partial(_additional_properties, lenient=lenient),
    }
    if lenient:
        keywords["unevaluatedProperties"] = _unevaluated_properties
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, keywords)  # type: ignore[no-any-return]


def has_pattern_properties(schema: Any) -> bool:
    """Return whether ``schema`` holds ``patternProperties`` anywhere."""
    return any(keyword == "patternProperties" for _, node in _walk(schema) for keyword, _ in _patterns(node))


def schema_validator(schema: Mapping[str, Any], *, lenient: bool = False) -> jsonschema.Draft202012Validator:
    """Return a validator of ``schema`` whose patterns run on RE2 (see the module docstring).

    :param lenient: For tool schemas from hosts and MCP servers: patterns RE2 cannot compile, and
        ``unevaluatedProperties`` beside ``patternProperties``, are not enforced. Without it, check
        the schema with :func:`pattern_problems` first: validating against a pattern RE2 cannot
        compile raises :class:`ValueError`.
    """
    cls = _validator_class(lenient=lenient)
    return cls(dict(schema))
