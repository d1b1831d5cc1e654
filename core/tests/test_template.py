"""Templates in prompts (``{{ name }}``, dotted access, escapes) and the resolution of inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopwright._definition import Definition, InputSpec
from loopwright._template import (
    TemplateError,
    compile_template,
    render,
    render_value,
    resolve_inputs,
    variables,
)
from loopwright.errors import ConfigError

# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["Hi {{ name }}!", "Hi {{name}}!", "Hi {{   name\t}}!"])
def test_whitespace_inside_braces_is_optional(template: str) -> None:
    """``{{name}}`` and ``{{ name }}`` are the same placeholder."""
    assert render(template, {"name": "Ann"}) == "Hi Ann!"


def test_dotted_access_walks_mappings_and_lists() -> None:
    """``{{ a.b }}`` reads a key of a mapping and ``{{ a.0 }}`` an item of a list."""
    inputs = {"user": {"name": "Ann", "langs": ["fr", "de"]}}
    assert render("{{ user.name }} speaks {{ user.langs.1 }}", inputs) == "Ann speaks de"


def test_non_string_values_render_as_json() -> None:
    """Numbers, booleans, lists and mappings are inserted as JSON; ``None`` as nothing."""
    inputs = {"n": 3, "ok": True, "xs": ["a", 1], "m": {"k": "é"}, "none": None}
    assert render("{{n}} {{ok}} {{xs}} {{m}} [{{none}}]", inputs) == '3 true ["a", 1] {"k": "é"} []'


@pytest.mark.parametrize(("template", "text"), [
    ("{{ '{{' }} x }}", "{{ x }}"),
    ('{{ "{{" }}', "{{"),
    ("a }} b", "a }} b"),
    ("{{{ name }}}", "{Ann}"),
    ("{{ '}}' }}", "}}"),
])
def test_quoted_literals_escape_braces(template: str, text: str) -> None:
    """A quoted string in braces is written as is, which is how a literal ``{{`` is written."""
    assert render(template, {"name": "Ann"}) == text


def test_unknown_variable_names_the_variable() -> None:
    """Rendering with a missing input raises a :class:`TemplateError` (a ConfigError) naming it."""
    with pytest.raises(TemplateError) as info:
        render("Hello {{ nmae }}", {"name": "Ann"})
    assert isinstance(info.value, ConfigError)
    assert info.value.variable == "nmae"
    assert info.value.offset == 6
    assert "'nmae'" in str(info.value)
    assert "did you mean 'name'" in str(info.value)


def test_missing_key_on_a_dotted_path_names_the_path() -> None:
    """A dotted path that leads nowhere names the variable and the key that is missing."""
    with pytest.raises(TemplateError) as info:
        render("{{ user.email }}", {"user": {"name": "Ann"}})
    assert info.value.variable == "user.email"
    assert "'email'" in str(info.value)
    assert "name" in str(info.value)


@pytest.mark.parametrize(("template", "offset"), [
    ("Write about {{ topic", 12),
    ("{{ a b }}", 0),
    ("ok {{ name }} then {{ }}", 19),
    ("{{ 'unclosed }}", 0),
])
def test_malformed_placeholder_is_an_error_with_its_offset(template: str, offset: int) -> None:
    """A ``{{`` that does not start a valid placeholder is reported with its offset and the escape hint."""
    with pytest.raises(TemplateError) as info:
        compile_template(template)
    assert info.value.offset == offset
    assert "{{ '{{' }}" in str(info.value)


def test_variables_lists_top_level_names() -> None:
    """:func:`variables` returns the top-level names, not literals or dotted keys."""
    assert variables("{{ a }} {{ b.c.d }} {{ '{{' }} {{a}}") == {"a", "b"}
    assert variables("no placeholders") == set()


def test_templates_are_compiled_once() -> None:
    """Compiling the same text twice returns the cached template."""
    text = "cached {{ x }} template"
    assert compile_template(text) is compile_template(text)


@given(st.text().filter(lambda s: "{{" not in s))
def test_text_without_placeholders_renders_to_itself(text: str) -> None:
    """Any text without ``{{`` renders unchanged."""
    assert render(text, {}) == text


def test_render_value_keeps_types_of_single_placeholders() -> None:
    """In tool-call arguments a lone placeholder keeps the input's JSON type; mixed text stays text."""
    inputs = {"n": 3, "tags": ["a", "b"], "who": {"name": "Ann"}}
    args = {"n": "{{ n }}", "tags": "{{tags}}", "label": "n={{ n }}", "nested": [{"who": "{{ who.name }}"}],
            "flag": False}
    assert render_value(args, inputs) == {
        "n": 3, "tags": ["a", "b"], "label": "n=3", "nested": [{"who": "Ann"}], "flag": False}


def test_render_value_copies_mutable_values() -> None:
    """A list or mapping taken from the inputs is copied, so a tool cannot change the inputs."""
    inputs = {"tags": ["a"]}
    out = render_value({"tags": "{{ tags }}"}, inputs)
    out["tags"].append("b")
    assert inputs == {"tags": ["a"]}


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _definition(**inputs: InputSpec) -> Definition:
    return Definition(name="agent", inputs=inputs)


def test_resolve_inputs_applies_defaults_and_copies_them() -> None:
    """Defaults fill inputs the caller omits; optional inputs without a default are ``None``."""
    default = {"level": "expert"}
    defn = _definition(topic=InputSpec(), who=InputSpec(type="object", default=default, required=False),
                       extra=InputSpec(required=False))
    resolved = resolve_inputs(defn, {"topic": "cats"})
    assert resolved == {"topic": "cats", "who": {"level": "expert"}, "extra": None}
    assert resolved["who"] is not default


def test_resolve_inputs_reports_every_problem_naming_the_input() -> None:
    """Unknown, missing and mistyped inputs are all reported in one ConfigError, each naming its input."""
    defn = _definition(topic=InputSpec(description="What to write about"), n=InputSpec(type="integer"))
    with pytest.raises(ConfigError) as info:
        resolve_inputs(defn, {"tpoic": "cats", "n": True})
    messages = [p.message for p in info.value.problems]
    assert any("unknown input 'tpoic'" in m and "did you mean 'topic'" in m for m in messages)
    assert any("missing required input 'topic'" in m and "What to write about" in m for m in messages)
    assert any("input 'n' must be an integer, got a boolean" in m for m in messages)
    assert {p.path for p in info.value.problems} == {"$.tpoic", "$.topic", "$.n"}


@pytest.mark.parametrize(("json_type", "good", "bad"), [
    ("string", "x", 1),
    ("integer", 1, 1.5),
    ("number", 1.5, "1.5"),
    ("boolean", False, 0),
    ("object", {"a": 1}, [1]),
    ("array", [1], {"a": 1}),
])
def test_resolve_inputs_checks_json_types(json_type: str, good: object, bad: object) -> None:
    """Each declared JSON type accepts its values and rejects others (booleans are not numbers)."""
    defn = _definition(x=InputSpec(type=json_type))
    assert resolve_inputs(defn, {"x": good}) == {"x": good}
    with pytest.raises(ConfigError, match="input 'x' must be"):
        resolve_inputs(defn, {"x": bad})


def test_resolve_inputs_parses_strings_for_the_cli() -> None:
    """With ``from_strings``, text given for a non-string input is parsed as JSON."""
    defn = _definition(n=InputSpec(type="integer"), tags=InputSpec(type="array"), name=InputSpec())
    assert resolve_inputs(defn, {"n": "3", "tags": '["a"]', "name": "3"}, from_strings=True) == {
        "n": 3, "tags": ["a"], "name": "3"}
    with pytest.raises(ConfigError, match="got the text 'three'"):
        resolve_inputs(defn, {"n": "three", "tags": "[]", "name": "x"}, from_strings=True)
