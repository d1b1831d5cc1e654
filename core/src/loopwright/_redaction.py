"""Redaction (seed 002's second step): secrets and personal data cut from what leaves the runtime.

An assembly's ``redaction:`` (:class:`~loopwright._definition.Redaction`) turns it on. A
:class:`Redactor` built from it replaces every match of its patterns with ``[REDACTED:NAME]``
(or the pattern's own replacement):

* in each model request, after long-term memory is recalled and before ``before_inference``
  runs (:meth:`Redactor.request`): message texts, tool-call arguments and tool results, in the
  request only; the transcript in the store keeps what was said;
* in each record the record sinks (OpenTelemetry's among them) and the ``on_record`` observers
  receive (:meth:`Redactor.data`); the store's own record log keeps them as they were.

Every pattern is compiled with RE2 (``google-re2``), which matches in time linear in the text:
a pattern it cannot run that way (backreferences, lookarounds) is refused when the assembly
loads (:func:`pattern_problems`), so no text, however long or strange, can stall a turn.

The built-in sets (:data:`BUILTINS`):

``apiKeys``
    OpenAI/Anthropic-style ``sk-...`` keys, AWS access key ids, Google API keys, GitHub and
    Slack tokens.
``tokens``
    ``Bearer ...`` credentials and JSON Web Tokens.
``emails``
    E-mail addresses.
``cards``
    Payment card numbers: 13 to 19 digits, spaces or dashes between them allowed, that pass
    the Luhn check (so an order number of the same length stays).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from loopwright._definition import Redaction
    from loopwright._types import Message, ModelRequest, ToolCall

__all__ = ["BUILTINS", "Redactor", "pattern_problems", "redactor_of"]

#: The built-in pattern sets, by the name ``redaction.builtins`` gives them: ``(name, RE2 pattern)``.
BUILTINS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "apiKeys": (
        ("apiKey", r"\bsk-[A-Za-z0-9_-]{20,}"),
        ("apiKey", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
        ("apiKey", r"\bAIza[0-9A-Za-z_-]{35}"),
        ("apiKey", r"\bgh[pousr]_[A-Za-z0-9]{36,}"),
        ("apiKey", r"\bgithub_pat_[A-Za-z0-9_]{22,}"),
        ("apiKey", r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    ),
    "tokens": (
        ("token", r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{8,}=*"),
        ("token", r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"),
    ),
    "emails": (
        ("email", r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    ),
    "cards": (
        ("card", r"\b\d(?:[ -]?\d){12,18}\b"),
    ),
}


def _luhn(digits: str) -> bool:
    """Return whether a string of digits passes the Luhn check (payment card numbers do)."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        n = int(char)
        if index % 2:
            n = n * 2 - 9 if n > 4 else n * 2  # noqa: PLR2004 - the Luhn rule
        total += n
    return total % 10 == 0


@functools.cache
def _options() -> Any:
    import re2  # noqa: PLC0415 - RE2 only when redaction is configured

    options = re2.Options()
    options.log_errors = False  # a bad pattern is a problem reported at load, not stderr noise
    return options


def _compile(pattern: str) -> Any:
    import re2  # noqa: PLC0415 - as above

    return re2.compile(pattern, options=_options())


def pattern_problems(patterns: Sequence[str]) -> list[tuple[int, str]]:
    """Return ``(index, message)`` for each pattern RE2 cannot compile (so it cannot run in linear time)."""
    problems = []
    for index, pattern in enumerate(patterns):
        try:
            _compile(pattern)
        except Exception as exc:  # noqa: BLE001 - re2.error, whose message says what RE2 refused
            problems.append((index, f"not a pattern RE2 can run in linear time: {exc}"))
    return problems


@attrs.frozen
class _Rule:
    name: str
    regex: Any
    replacement: str | None
    card: bool = False

    def apply(self, text: str) -> str:
        shown = self.replacement if self.replacement is not None else f"[REDACTED:{self.name}]"
        if not self.card:
            return str(self.regex.sub(lambda _m: shown, text))

        def card(match: Any) -> str:
            digits = "".join(c for c in match.group(0) if c.isdigit())
            return shown if _luhn(digits) else str(match.group(0))

        return str(self.regex.sub(card, text))


class Redactor:
    """The patterns of an assembly's ``redaction:``, compiled once; cuts them from texts, requests and records.

    Every method returns its argument itself when nothing matched (no copy), and never raises
    on any text: the patterns were checked when the assembly loaded.
    """

    def __init__(self, config: Redaction) -> None:
        """Compile ``config``'s built-in sets (in :data:`BUILTINS`' order) and its own patterns, in that order.

        :raises ValueError: ``config`` names a set that does not exist, or a pattern RE2 cannot run
            (the loader reports both at their position first; this is for assemblies built in Python).
        """
        unknown = sorted(set(config.builtins) - set(BUILTINS))
        if unknown:
            raise ValueError(f"redaction.builtins: unknown set(s) {', '.join(unknown)} "
                             f"(the sets: {', '.join(BUILTINS)})")
        rules = [_Rule(name, _compile(pattern), None, card=(set_name == "cards"))
                 for set_name, entries in BUILTINS.items() if set_name in config.builtins
                 for name, pattern in entries]
        problems = pattern_problems([p.pattern for p in config.patterns])
        if problems:
            index, message = problems[0]
            raise ValueError(f"redaction.patterns[{index}] ({config.patterns[index].name}): {message}")
        rules.extend(_Rule(p.name, _compile(p.pattern), p.replacement) for p in config.patterns)
        self._rules = tuple(rules)
        self.model = config.model
        self.records = config.records

    def text(self, text: str) -> str:
        """Return ``text`` with every match replaced."""
        for rule in self._rules:
            text = rule.apply(text)
        return text

    def data(self, value: Any) -> Any:
        """Return JSON-like ``value`` (mappings, sequences, strings) with every string redacted; keys stay."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            items = {k: self.data(v) for k, v in value.items()}
            return value if all(items[k] is v for k, v in value.items()) else items
        if isinstance(value, (list, tuple)):
            out = [self.data(v) for v in value]
            return value if all(a is b for a, b in zip(out, value, strict=True)) else type(value)(out)
        return value

    def request(self, request: ModelRequest) -> ModelRequest:
        """Return ``request`` with its messages' texts, tool-call arguments and tool results redacted."""
        messages = [self._message(m) for m in request.messages]
        if all(a is b for a, b in zip(messages, request.messages, strict=True)):
            return request
        return attrs.evolve(request, messages=messages)

    def _message(self, message: Message) -> Message:
        content = self.text(message.content) if message.content is not None else None
        calls = tuple(self._call(c) for c in message.tool_calls)
        if content == message.content and all(a is b for a, b in zip(calls, message.tool_calls, strict=True)):
            return message
        return attrs.evolve(message, content=content, tool_calls=calls)

    def _call(self, call: ToolCall) -> ToolCall:
        arguments = self.data(call.arguments)
        return call if arguments is call.arguments else attrs.evolve(call, arguments=arguments)


def redactor_of(config: Redaction | None) -> Redactor | None:
    """Return the :class:`Redactor` of an assembly's ``redaction:``, or ``None`` when it has none."""
    return None if config is None else Redactor(config)

