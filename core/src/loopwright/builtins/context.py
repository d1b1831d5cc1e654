"""Built-in plugin: the ``clearToolResults`` context strategy.

``contextStrategy: {kind: clearToolResults, keepLast: 3, trigger: 80%}`` replaces the content of
all but the last ``keepLast`` tool results with a short placeholder, keeping every call and
result in place so the transcript stays valid for every provider. ``trigger`` is a token count
(``50000``, ``400k``) or a percentage of ``contextWindow`` (required with a percentage); token
use is estimated at four characters a token. Without a trigger, it acts whenever more than
``keepLast`` tool results still hold their content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from loopwright._plugins import hookimpl
from loopwright._types import Message, Usage
from loopwright.abc import ContextStrategy
from loopwright.errors import ConfigError

__all__ = ["CLEARED", "ClearToolResults"]

#: The content a cleared tool result keeps.
CLEARED = "[tool result cleared to save context]"
_TRIGGER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM%]?)\s*$")


class ClearToolResults(ContextStrategy):
    """Clears old tool results (see the module docstring)."""

    kind = "clearToolResults"

    def __init__(self, options: Mapping[str, Any]) -> None:
        """Read ``keepLast`` (default 3), ``trigger`` and ``contextWindow`` from the options."""
        unknown = set(options) - {"keepLast", "trigger", "contextWindow"}
        if unknown:
            raise ConfigError(f"clearToolResults: unknown options {sorted(unknown)}")
        self.keep_last = int(options.get("keepLast", 3))
        self.context_window = options.get("contextWindow")
        self.trigger_tokens: float | None = None
        self.trigger_fraction: float | None = None
        trigger = options.get("trigger")
        if trigger is not None:
            m = _TRIGGER.match(str(trigger))
            if not m:
                raise ConfigError(f"clearToolResults: trigger {trigger!r} is not a token count or a percentage")
            value, unit = float(m.group(1)), m.group(2).lower()
            if unit == "%":
                if not self.context_window:
                    raise ConfigError("clearToolResults: a percentage trigger needs contextWindow")
                self.trigger_fraction = value / 100
            else:
                self.trigger_tokens = value * {"": 1, "k": 1_000, "m": 1_000_000}[unit]

    def _live(self, messages: Sequence[Message]) -> list[int]:
        return [i for i, m in enumerate(messages) if m.role == "tool" and m.content != CLEARED]

    def should_apply(self, messages: Sequence[Message], *, last_usage: Usage | None,
                     context_window: int | None) -> bool:
        """Return whether more than ``keepLast`` results hold content and the trigger (if any) holds."""
        if len(self._live(messages)) <= self.keep_last:
            return False
        limit = self.trigger_tokens
        if self.trigger_fraction is not None:
            limit = self.trigger_fraction * float(context_window or self.context_window or 0)
        if limit is None:
            return True
        used = last_usage.input_tokens if last_usage else sum(len(m.content or "") for m in messages) / 4
        return used >= limit

    async def apply(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Return the messages with all but the last ``keepLast`` live tool results cleared."""
        live = self._live(messages)
        clear = set(live[: max(len(live) - self.keep_last, 0)])
        return [attrs.evolve(m, content=CLEARED) if i in clear else m for i, m in enumerate(messages)]


@hookimpl
def loopwright_register_context_strategies(register: Any) -> None:
    """Register ``clearToolResults``."""
    register("clearToolResults", ClearToolResults)
