"""The one duration grammar of loopwright, and the check that a number is finite.

Every duration anyone writes or sends goes through :func:`parse_duration`: definition and assembly
keys (``limits.elapsed``, ``timeout`` ...), provider options (:meth:`loopwright.http.OptionReader.duration`),
CLI options, and the numbers a model passes to the agent tools (``monitor_agent {elapsed}``,
``await_monitor {timeout}``). A duration is:

* a number of seconds (``30``, ``1.5``), not a boolean;
* a numeric string (``"1.5"``, ``".5"``);
* one or more number-unit pairs with units ``ms``, ``s``, ``m``, ``h`` and ``d`` (days), optionally
  separated by blanks (``"500ms"``, ``"1m30s"``, ``"2h 5m"``, ``"30d"``).

It is finite and not negative: ``nan``, ``inf``, ``"1e999"`` and ``-1`` are refused.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["DURATION_PATTERN", "is_finite_number", "parse_duration"]

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PAIRS = rf"(?:{_NUMBER}\s*(?:ms|s|m|h|d)\s*)+"
_PAIRS_RE = re.compile(rf"^\s*{_PAIRS}$")
_PAIR_RE = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)")
_SECONDS_RE = re.compile(rf"^\s*{_NUMBER}\s*$")
#: The strings of the grammar as one regular expression: the ``pattern`` of ``$defs/duration`` in
#: ``specs/definition.schema.json`` and ``specs/assembly.schema.json`` is this text (a test holds
#: them equal), so the schemas accept exactly the strings :func:`parse_duration` reads.
DURATION_PATTERN = rf"^\s*(?:{_NUMBER}\s*|{_PAIRS})$"
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def is_finite_number(value: Any) -> bool:
    """Return whether ``value`` is an int or float (not a bool) that is neither NaN nor infinite.

    An int too large for a float (``10**400``) is not finite here: every use turns it into one.
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def parse_duration(value: Any) -> float:
    """Return the duration ``value`` in seconds (see the module docstring for the grammar).

    ``parse_duration(90) == parse_duration("90") == parse_duration("1m30s") == 90.0``.

    :raises ValueError: for anything else: a boolean, a negative, NaN or infinite number, a string
        outside the grammar (``"nan"``, ``"-1s"``, ``"1e3"``, ``"5 minutes"``), or a total that
        overflows to infinity.
    """
    if is_finite_number(value) or (isinstance(value, str) and _SECONDS_RE.match(value)):
        seconds = float(value)
    elif isinstance(value, str) and _PAIRS_RE.match(value):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PAIR_RE.findall(value))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"invalid duration {_shown(value)}: it must be finite")
    else:
        raise ValueError(
            f"invalid duration {_shown(value)}: expected seconds or a string like 500ms, 1s, 30m, 2h, 30d"
        )
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {_shown(value)}: it must be finite")
    if seconds < 0:
        raise ValueError(f"invalid duration {_shown(value)}: it must not be negative")
    return seconds


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: a model may send a megabyte where a duration belongs."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else "a huge integer"
    return text if len(text) <= 60 else f"{text[:57]}..."  # noqa: PLR2004
