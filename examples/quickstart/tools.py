"""The quickstart's tools, as a plugin file listed in loopwright.yaml's `plugins:`."""

from collections.abc import Callable

import loopwright


@loopwright.tool
def count_words(text: str) -> int:
    """Count the words of a text (runs of characters between white space).

    Args:
        text: The text to count.
    """
    return len(text.split())


@loopwright.tool
def count_letters(text: str) -> dict[str, int]:
    """Count the letters of a text, in total and per letter.

    Args:
        text: The text to count.
    """
    letters = [c.lower() for c in text if c.isalpha()]
    counts: dict[str, int] = {}
    for c in letters:
        counts[c] = counts.get(c, 0) + 1
    return {"total": len(letters), **dict(sorted(counts.items()))}


@loopwright.hookimpl
def loopwright_register_tools(register: Callable[..., None]) -> None:
    register(count_words, count_letters)
