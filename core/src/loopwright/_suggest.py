"""``did you mean``: the one wording of a near miss, for every name a configuration gives.

Tools, providers, store, sink and engine kinds, context strategies and keys are all looked up by
name; a mistyped one is answered with the closest registered name, when one is close enough.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'X'?)"`` for the choice closest to ``name``, or ``""`` when none is close.

    It goes right after the name it corrects, before the list of what is registered.

    :param name: What was given (anything: a non-string gets no suggestion).
    :param choices: The names that would have been accepted.
    """
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, sorted(set(choices)), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
