"""Built-in plugin: the ``clearToolResults``, ``compact`` and ``providerNative`` context strategies.

``contextStrategy: {kind: clearToolResults, keepLast: 3, trigger: 80%}`` replaces the content of
all but the last ``keepLast`` tool results with a short placeholder, keeping every call and
result in place so the transcript stays valid for every provider. Without a trigger, it acts
whenever more than ``keepLast`` tool results still hold their content.

``contextStrategy: {kind: compact, trigger: 80%, contextWindow: 200000, keepLast: 6, model: ..., prompt: ...}``
summarises everything between the system prompt and the last ``keepLast`` messages with one
model call (``model``, default the agent's own; ``prompt`` replaces the default instruction)
and puts one ``user`` message carrying the summary in their place. The kept tail never starts
with a tool result: it grows back to the assistant message whose calls those results answer.
``trigger`` is required.

``trigger`` is a token count (``50000``, ``400k``, ``1.5m``) or a percentage of ``contextWindow``
(required with a percentage). It is compared with the input tokens of the instance's latest
model call; before any call, and right after a compaction, with an estimate of four characters
a token.

``contextStrategy: {kind: providerNative}`` asks the provider to manage the context itself: the
options (``truncation`` for OpenAI's Responses API, ``edits`` for Anthropic's context editing)
travel on every request as ``ModelRequest.context_management``, and the transcript is left as it is.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from loopwright._types import Message, Usage
from loopwright.abc import ContextStrategy
from loopwright.errors import ConfigError
from loopwright.hookspecs import hookimpl

if TYPE_CHECKING:
    from loopwright.abc import CompactionContext

__all__ = [
    "CLEARED",
    "DEFAULT_COMPACT_PROMPT",
    "SUMMARY_PREFIX",
    "ClearToolResults",
    "Compact",
    "ProviderNative",
    "estimate_tokens",
    "render_transcript",
]

#: The content a cleared tool result keeps.
CLEARED = "[tool result cleared to save context]"
#: The start of the message that replaces what ``compact`` summarised.
SUMMARY_PREFIX = "Summary of the conversation so far:"
#: The instruction ``compact`` gives the summarising model unless ``prompt`` replaces it.
DEFAULT_COMPACT_PROMPT = (
    "You summarise the earlier part of a conversation between a user and an AI agent that uses tools, "
    "so that the agent can carry on with only your summary and the latest messages. Keep the task and "
    "its requirements, the decisions made, the facts and results the tools returned that still matter "
    "(names, paths, values, errors), what has been done and what remains to do. Be concise. Write only "
    "the summary."
)
_TRIGGER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM%]?)\s*$")
_dumps = functools.partial(json.dumps, ensure_ascii=False, default=str)


def estimate_tokens(messages: Sequence[Message]) -> float:
    """Estimate the tokens of ``messages`` at four characters a token (text and tool-call arguments)."""
    chars = 0
    for m in messages:
        chars += len(m.content or "")
        for c in m.tool_calls:
            chars += len(c.raw_arguments if c.raw_arguments is not None else _dumps(c.arguments))
    return chars / 4


def render_transcript(messages: Sequence[Message]) -> str:
    """Write messages out as plain text, for a model to summarise (tool calls and results included)."""
    parts: list[str] = []
    for m in messages:
        if m.role == "tool":
            status = m.status.value if m.status is not None else "success"
            parts.append(f"[tool result of {m.name or 'a tool'} (call {m.tool_call_id}, {status})]\n{m.content or ''}")
            continue
        if m.content:
            parts.append(f"[{m.role}]\n{m.content}")
        for c in m.tool_calls:
            args = c.raw_arguments if c.raw_arguments is not None else _dumps(c.arguments)
            parts.append(f"[{m.role} calls the tool {c.name} (call {c.id})]\n{args}")
    return "\n\n".join(parts)


@attrs.frozen
class _Trigger:
    """When a strategy acts: a token count, a fraction of the context window, or always."""

    tokens: float | None = None
    fraction: float | None = None
    window: int | None = None

    @classmethod
    def parse(cls, kind: str, options: Mapping[str, Any], *, required: bool = False) -> _Trigger:
        window = options.get("contextWindow")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigError(f"{kind}: contextWindow must be a positive integer (tokens), not {window!r}")
        trigger = options.get("trigger")
        if trigger is None:
            if required:
                raise ConfigError(f"{kind}: trigger is required (a token count such as 50000 or 400k, "
                                  "or a percentage of contextWindow such as 80%)")
            return cls(window=window)
        m = _TRIGGER.match(str(trigger)) if not isinstance(trigger, bool) else None
        if not m:
            raise ConfigError(f"{kind}: trigger {trigger!r} is not a token count or a percentage")
        value, unit = float(m.group(1)), m.group(2).lower()
        if unit == "%":
            if not window:
                raise ConfigError(f"{kind}: a percentage trigger needs contextWindow")
            if not 0 < value <= 100:  # noqa: PLR2004 - a percentage
                raise ConfigError(f"{kind}: trigger {trigger!r} must be a percentage above 0 and at most 100")
            return cls(fraction=value / 100, window=window)
        return cls(tokens=value * {"": 1, "k": 1_000, "m": 1_000_000}[unit], window=window)

    def holds(self, messages: Sequence[Message], last_usage: Usage | None, context_window: int | None) -> bool:
        limit = self.tokens
        if self.fraction is not None:
            limit = self.fraction * float(context_window or self.window or 0)
        if limit is None:
            return True
        used = last_usage.input_tokens if last_usage is not None else estimate_tokens(messages)
        return used >= limit


def _check_options(kind: str, options: Mapping[str, Any], known: set[str]) -> None:
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"{kind}: unknown options {sorted(unknown)}; known: {sorted(known)}")


def _keep_last(kind: str, options: Mapping[str, Any], default: int) -> int:
    value = options.get("keepLast", default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{kind}: keepLast must be an integer of at least 0, not {value!r}")
    return value


class ClearToolResults(ContextStrategy):
    """Clears old tool results (see the module docstring)."""

    kind = "clearToolResults"

    def __init__(self, options: Mapping[str, Any]) -> None:
        """Read ``keepLast`` (default 3), ``trigger`` and ``contextWindow`` from the options."""
        _check_options(self.kind, options, {"keepLast", "trigger", "contextWindow"})
        self.keep_last = _keep_last(self.kind, options, 3)
        self.trigger = _Trigger.parse(self.kind, options)
        self.context_window = self.trigger.window

    def _live(self, messages: Sequence[Message]) -> list[int]:
        return [i for i, m in enumerate(messages) if m.role == "tool" and m.content != CLEARED]

    def should_apply(self, messages: Sequence[Message], *, last_usage: Usage | None,
                     context_window: int | None) -> bool:
        """Return whether more than ``keepLast`` results hold content and the trigger (if any) holds."""
        if len(self._live(messages)) <= self.keep_last:
            return False
        return self.trigger.holds(messages, last_usage, context_window)

    async def apply(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Return the messages with all but the last ``keepLast`` live tool results cleared."""
        live = self._live(messages)
        clear = set(live[: max(len(live) - self.keep_last, 0)])
        return [attrs.evolve(m, content=CLEARED) if i in clear else m for i, m in enumerate(messages)]

    async def run(self, messages: Sequence[Message], context: CompactionContext) -> Sequence[Message]:
        """Clear as :meth:`apply` does; the record says how many results were cleared (``cleared``)."""
        live = self._live(messages)
        context.details["cleared"] = max(len(live) - self.keep_last, 0)
        return await self.apply(messages)


class Compact(ContextStrategy):
    """Summarises the older part of the transcript with one model call (see the module docstring)."""

    kind = "compact"

    def __init__(self, options: Mapping[str, Any]) -> None:
        """Read ``trigger`` (required), ``contextWindow``, ``keepLast`` (default 6), ``model`` and ``prompt``."""
        _check_options(self.kind, options, {"trigger", "contextWindow", "keepLast", "model", "prompt"})
        self.trigger = _Trigger.parse(self.kind, options, required=True)
        self.keep_last = _keep_last(self.kind, options, 6)
        model = options.get("model")
        if model is not None and (not isinstance(model, str) or ":" not in model or model.startswith(":")):
            raise ConfigError(f"compact: model {model!r} is not of the form PROVIDER:MODEL")
        self.model: str | None = model
        prompt = options.get("prompt", DEFAULT_COMPACT_PROMPT)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("compact: prompt must be a non-empty string")
        self.prompt: str = prompt

    def split(self, messages: Sequence[Message]) -> tuple[int, int]:
        """Return ``(head, start)``: ``messages[head:start]`` is what a compaction summarises.

        ``head`` skips the leading system messages; ``start`` keeps the last ``keepLast``
        messages, moved back so that the kept tail does not start with a tool result.
        """
        n = len(messages)
        head = 0
        while head < n and messages[head].role == "system":
            head += 1
        start = max(head, n - self.keep_last)
        while head < start < n and messages[start].role == "tool":
            start -= 1
        return head, start

    def should_apply(self, messages: Sequence[Message], *, last_usage: Usage | None,
                     context_window: int | None) -> bool:
        """Return whether at least two messages lie before the kept tail and the trigger holds."""
        head, start = self.split(messages)
        if start - head < 2:  # noqa: PLR2004 - summarising a lone (summary) message gains nothing
            return False
        return self.trigger.holds(messages, last_usage, context_window)

    async def apply(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Not available: a summary needs a model, which the loop provides through :meth:`run`."""
        del messages
        raise NotImplementedError("compact needs a model: the loop runs it through run(messages, context)")

    async def run(self, messages: Sequence[Message], context: CompactionContext) -> Sequence[Message]:
        """Return the system prompt, one ``user`` message with the summary, then the kept tail."""
        head, start = self.split(messages)
        old = messages[head:start]
        summary = (await context.summarize(old, instruction=self.prompt, model=self.model)).strip()
        context.details.update(summarised=len(old), summaryChars=len(summary), kept=len(messages) - start)
        note = Message(role="user", content=f"{SUMMARY_PREFIX}\n\n{summary}", source="runtime")
        return [*messages[:head], note, *messages[start:]]


class ProviderNative(ContextStrategy):
    """Asks the provider to manage the context (see the module docstring)."""

    kind = "providerNative"

    def __init__(self, options: Mapping[str, Any]) -> None:
        """Read ``truncation`` (OpenAI Responses API) and ``edits`` (Anthropic context editing)."""
        _check_options(self.kind, options, {"truncation", "edits"})
        truncation = options.get("truncation")
        if truncation is not None and truncation not in ("auto", "disabled"):
            raise ConfigError(f"providerNative: truncation must be auto or disabled, not {truncation!r}")
        edits = options.get("edits")
        if edits is not None and (not isinstance(edits, list) or not all(
                isinstance(e, Mapping) and isinstance(e.get("type"), str) for e in edits)):
            raise ConfigError("providerNative: edits must be a list of mappings, each with a type "
                              "(for example {type: clear_tool_uses_20250919})")
        self.context_management = dict(options)

    def should_apply(self, messages: Sequence[Message], *, last_usage: Usage | None,
                     context_window: int | None) -> bool:
        """Return False: the provider does the work, the transcript stays whole."""
        del messages, last_usage, context_window
        return False

    async def apply(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Return the messages unchanged."""
        return messages


@hookimpl
def loopwright_register_context_strategies(register: Any) -> None:
    """Register ``clearToolResults``, ``compact`` and ``providerNative``."""
    register("clearToolResults", ClearToolResults)
    register("compact", Compact)
    register("providerNative", ProviderNative)
