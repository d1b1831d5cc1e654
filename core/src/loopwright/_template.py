"""Templates in ``systemPrompt`` and ``initialPrompts``, and the inputs that fill them.

The syntax is deliberately tiny, so it can be checked when a definition is loaded:

* ``{{ name }}`` inserts the input ``name``; whitespace inside the braces is optional
  (``{{name}}``).
* ``{{ name.key.0 }}`` walks into mappings by key and into lists by index.
* ``{{ '{{' }}`` (or ``{{ "{{" }}``) inserts the quoted text as written: this is how a literal
  ``{{`` is written. A lone ``}}`` needs no escape.
* Strings are inserted as they are, ``None`` (an optional input nobody gave) as nothing, and every
  other value as compact JSON (``true``, ``3``, ``["a", "b"]``).
* Any other ``{{`` is an error, found when the template is compiled.

In the string values of an initial tool call's ``arguments``, a string that is exactly one
placeholder (``"{{ n }}"``) takes the input's value with its JSON type (see :func:`render_value`).

Templates are compiled once and cached, so rendering costs a join.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from loopwright.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from loopwright._definition import Definition, InputSpec

__all__ = [
    "JSON_TYPES",
    "Placeholder",
    "Template",
    "TemplateError",
    "compile_template",
    "matches_type",
    "render",
    "render_value",
    "resolve_inputs",
    "variables",
]

#: A placeholder: a dotted variable path, or a quoted literal.
_TOKEN_RE = re.compile(
    r"""\{\{\s*(?:
        (?P<var>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)
        | '(?P<sq>[^']*)'
        | "(?P<dq>[^"]*)"
    )\s*\}\}""",
    re.VERBOSE,
)
_ESCAPE_HINT = "write {{ '{{' }} for a literal {{"


class TemplateError(ConfigError):
    """A template is malformed, or names a variable that is not there.

    Attributes:
        variable: The variable as written (``name`` or ``name.key``), if the error concerns one.
        offset: The character offset in the template where the problem starts, if known.
        template: The template text.
    """

    def __init__(self, message: str, *, variable: str | None = None, offset: int | None = None,
                 template: str | None = None) -> None:
        self.variable = variable
        self.offset = offset
        self.template = template
        super().__init__(message)


@attrs.frozen(kw_only=True)
class Placeholder:
    """One ``{{ ... }}`` in a template.

    Attributes:
        text: The placeholder as written, braces included.
        start: Its offset in the template.
        path: The variable path (``("user", "name")``), or ``()`` for a quoted literal.
        literal: The quoted text, for ``{{ '...' }}``.
    """

    text: str
    start: int
    path: tuple[str, ...] = ()
    literal: str | None = None

    @property
    def variable(self) -> str:
        """The dotted variable as written, or ``""`` for a literal."""
        return ".".join(self.path)


class Template:
    """A compiled template. Build one with :func:`compile_template`, which caches them.

    Attributes:
        source: The template text.
        placeholders: Its placeholders in order (literals included).
        variables: The top-level variable names it uses.
    """

    __slots__ = ("_parts", "placeholders", "source", "variables")

    def __init__(self, source: str) -> None:
        """Parse ``source``; raise :class:`TemplateError` naming the offset of a stray ``{{``."""
        self.source = source
        parts: list[str | Placeholder] = []
        placeholders: list[Placeholder] = []
        pos = 0
        for match in _TOKEN_RE.finditer(source):
            _check_literal(source, pos, match.start())
            if match.start() > pos:
                parts.append(source[pos:match.start()])
            var = match.group("var")
            if var is None:
                literal = match.group("sq") if match.group("sq") is not None else match.group("dq")
                ph = Placeholder(text=match.group(0), start=match.start(), literal=literal)
                parts.append(literal)
            else:
                ph = Placeholder(text=match.group(0), start=match.start(), path=tuple(var.split(".")))
                parts.append(ph)
            placeholders.append(ph)
            pos = match.end()
        _check_literal(source, pos, len(source))
        if pos < len(source):
            parts.append(source[pos:])
        # Merge neighbouring literal text, so rendering joins as few pieces as possible.
        merged: list[str | Placeholder] = []
        for part in parts:
            if isinstance(part, str) and merged and isinstance(merged[-1], str):
                merged[-1] += part
            else:
                merged.append(part)
        self._parts = tuple(merged)
        self.placeholders = tuple(placeholders)
        self.variables = frozenset(p.path[0] for p in placeholders if p.path)

    @property
    def is_single_placeholder(self) -> bool:
        """Whether the template is exactly one variable placeholder and nothing else."""
        return len(self._parts) == 1 and isinstance(self._parts[0], Placeholder)

    def render(self, inputs: Mapping[str, Any]) -> str:
        """Return the text with every placeholder filled from ``inputs``.

        :raises TemplateError: naming the variable when ``inputs`` lacks it (or a key on its path).
        """
        if not self.placeholders:
            return self.source
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
            else:
                out.append(_to_text(self._lookup(part, inputs)))
        return "".join(out)

    def value(self, inputs: Mapping[str, Any]) -> Any:
        """Return the value of a single-placeholder template with its own type; else :meth:`render`."""
        if self.is_single_placeholder:
            part = self._parts[0]
            assert isinstance(part, Placeholder)  # noqa: S101 - is_single_placeholder says so
            value = self._lookup(part, inputs)
            return copy.deepcopy(value) if isinstance(value, (dict, list)) else value
        return self.render(inputs)

    def _lookup(self, ph: Placeholder, inputs: Mapping[str, Any]) -> Any:
        head, *rest = ph.path
        if head not in inputs:
            raise TemplateError(
                f"unknown template variable {head!r} in {ph.text}{_suggest(head, inputs)}",
                variable=head, offset=ph.start, template=self.source,
            )
        value = inputs[head]
        walked = head
        for key in rest:
            if isinstance(value, Mapping) and key in value:
                value = value[key]
            elif isinstance(value, Sequence) and not isinstance(value, str) and key.isdigit() \
                    and int(key) < len(value):
                value = value[int(key)]
            else:
                raise TemplateError(
                    f"{walked!r} has no key {key!r} (in {ph.text}); it is {_describe(value)}",
                    variable=ph.variable, offset=ph.start, template=self.source,
                )
            walked += f".{key}"
        return value

    def __repr__(self) -> str:
        return f"Template({self.source!r})"


def _check_literal(source: str, start: int, end: int) -> None:
    at = source.find("{{", start, end)
    if at != -1:
        snippet = source[at:at + 30].split("\n", 1)[0]
        raise TemplateError(
            f"malformed placeholder at offset {at}: {snippet!r}; a placeholder is "
            f"{{{{ name }}}} or {{{{ name.key }}}}; {_ESCAPE_HINT}",
            offset=at, template=source,
        )


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        keys = ", ".join(map(str, list(value)[:10])) or "no keys"
        return f"a mapping with keys: {keys}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return f"a list of {len(value)} items"
    return f"a {_json_type(value)}"


def _suggest(name: str, choices: Mapping[str, Any] | Sequence[str]) -> str:
    names = sorted(map(str, choices))
    import difflib  # noqa: PLC0415 - only to word a problem: ls and show import none (issue 30)

    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    known = ", ".join(names) if names else "none"
    return f"{hint} (known: {known})"


@functools.lru_cache(maxsize=4096)
def compile_template(template: str) -> Template:
    """Return the compiled form of ``template``, cached by its text.

    :raises TemplateError: when a ``{{`` does not start a valid placeholder.
    """
    return Template(template)


def variables(template: str) -> set[str]:
    """Return the top-level variable names ``template`` uses (``{{ a.b }}`` gives ``a``).

    :raises TemplateError: when the template is malformed.
    """
    return set(compile_template(template).variables)


def render(template: str, inputs: Mapping[str, Any]) -> str:
    """Render ``template`` with ``inputs``.

    :raises TemplateError: naming the variable that ``inputs`` lacks, or the malformed placeholder.
    """
    return compile_template(template).render(inputs)


def render_value(value: Any, inputs: Mapping[str, Any]) -> Any:
    """Render every string inside ``value`` (mappings and lists are walked; keys are not templates).

    A string that is exactly one placeholder, such as ``"{{ count }}"``, becomes the input's
    value with its JSON type, so tool-call arguments keep integers, lists and mappings intact.
    Other values are returned as they are. Nothing is modified in place.
    """
    if isinstance(value, str):
        return compile_template(value).value(inputs)
    if isinstance(value, Mapping):
        return {k: render_value(v, inputs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [render_value(v, inputs) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

#: The JSON type names an input may declare, with the Python types that satisfy each.
JSON_TYPES: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (Mapping,),
    "array": (list, tuple),
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for name in ("string", "integer", "number", "object", "array"):
        if isinstance(value, JSON_TYPES[name]):
            return name
    return type(value).__name__


def matches_type(value: Any, json_type: str) -> bool:
    """Return whether ``value`` has the JSON type ``json_type`` (booleans are not numbers)."""
    if isinstance(value, bool):
        return json_type == "boolean"
    return isinstance(value, JSON_TYPES.get(json_type, ()))


def resolve_inputs(definition: Definition, given: Mapping[str, Any] | None = None, *,
                   from_strings: bool = False) -> dict[str, Any]:
    """Return the inputs a run of ``definition`` uses: ``given`` checked, with defaults filled in.

    Every declared input appears in the result; an optional one without a default is ``None``.
    Defaults are copied, so a run never shares a mutable default with another.

    :param definition: The agent definition whose ``inputs`` declare what is allowed.
    :param given: The caller's values, by input name.
    :param from_strings: Parse string values given for non-string inputs as JSON (for the CLI's
        ``-i KEY=VALUE``): ``"3"`` becomes ``3`` for an integer input.
    :raises ConfigError: listing every unknown input, missing required input and value of the
        wrong JSON type, each naming the input.
    """
    given = dict(given or {})
    declared: Mapping[str, InputSpec] = definition.inputs
    problems: list[ConfigProblem] = []
    resolved: dict[str, Any] = {}
    problems.extend(
        ConfigProblem(f"unknown input {name!r}{_suggest(name, list(declared))}", path=f"$.{name}")
        for name in given if name not in declared
    )
    for name, spec in declared.items():
        if name not in given:
            if spec.required:
                about = f": {spec.description}" if spec.description else ""
                problems.append(ConfigProblem(
                    f"missing required input {name!r} ({spec.type}{about})", path=f"$.{name}"))
            else:
                resolved[name] = copy.deepcopy(spec.default)
            continue
        value = given[name]
        if from_strings and isinstance(value, str) and spec.type != "string":
            try:
                value = json.loads(value)
            except ValueError:
                problems.append(ConfigProblem(
                    f"input {name!r} must be {_article(spec.type)}, got the text {value!r}",
                    path=f"$.{name}"))
                continue
        if not matches_type(value, spec.type):
            problems.append(ConfigProblem(
                f"input {name!r} must be {_article(spec.type)}, got {_article(_json_type(value))}",
                path=f"$.{name}"))
            continue
        resolved[name] = value
    if problems:
        raise ConfigError(
            f"invalid inputs for agent {definition.name!r}",
            path=str(definition.source) if definition.source else None, problems=problems,
        )
    return resolved


def _article(type_name: str) -> str:
    return f"an {type_name}" if type_name[0] in "aeiou" else f"a {type_name}"
