r"""Showing untrusted text to a person: calls, commands, arguments and answers, made visible.

Text a model wrote (a shell command, a tool's arguments, a call id, an answer) and text a tool
returned can hold characters that change how the rest of a screen looks rather than showing
themselves: a carriage return or ``ESC [2K`` that rewrites the line, a backspace, a right-to-left
override that reverses what follows, a zero-width space. On an approval screen they let a
command show as ``ls`` while another one runs. Everything loopwright shows a person (the CLI's
live view, its summaries, ``show``, ``ls``, the approval prompts) goes through this module, and
so should any other front end (a web page, a chat bridge): the exact value stays in the JSON.

* :func:`safe_text` replaces each such character with a visible escape: ``\x1b``, ``\r``,
  ``\n``, ``\u202e``, ``\U000e0041``. The person sees that something odd is there and
  where. With ``multiline=True`` (prose: an answer, an error) line breaks and tabs stay.
* :func:`safe_json` is :func:`json.dumps` whose output is also safe to show: the same
  characters are written as JSON ``\uXXXX`` escapes, so the text parses to exactly the same
  value (``json.loads(safe_json(v)) == v``) and never carries one raw.

What is escaped (:func:`is_hidden`): the Unicode categories ``Cc`` (C0 and C1 controls, ESC,
CR, BS, DEL), ``Cf`` (format characters: the bidi embeddings, overrides and isolates
U+202A-U+202E and U+2066-U+2069, LRM and RLM, zero-width spaces and joiners, the BOM, tag
characters), ``Zl`` and ``Zp`` (U+2028, U+2029), ``Cs`` (lone surrogates), and the other
default-ignorable code points that draw nothing (U+034F, the Hangul fillers, the variation
selectors; with ``multiline=True`` the emoji and text presentation selectors U+FE0E and U+FE0F
stay, as they only choose how the character before them is drawn).

Backslashes are not doubled: ``\x1b`` on screen is either an escaped ESC or those four
characters, and both are worth a second look. The exact text is in the ``--json`` output.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

__all__ = ["is_hidden", "safe_json", "safe_text"]

#: The categories of characters that act on the screen or draw nothing.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
#: Default-ignorable code points outside those categories: they draw nothing either.
_IGNORABLE_RANGES = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xE0100, 0xE01EF),
)
_ASCII_CONTROL_END = 0x20
_DEL = 0x7F
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
#: What ``multiline=True`` keeps as it is.
_PROSE = frozenset({"\n", "\t", "\ufe0e", "\ufe0f"})
#: What JSON itself writes between values (``indent``); inside strings it escapes them.
_LAYOUT = frozenset({"\n", "\r", "\t"})
_BMP_END = 0x10000
_BYTE_END = 0x100


def is_hidden(char: str) -> bool:
    """Whether the one character ``char`` acts on the screen (or draws nothing) instead of showing itself.

    True for the categories ``Cc``, ``Cf``, ``Zl``, ``Zp`` and ``Cs`` and the other
    default-ignorable code points (see the module's docstring). Newline and tab are controls too.
    """
    code = ord(char)
    if code < _BYTE_END and (code < _ASCII_CONTROL_END or _DEL <= code < 0xA0):  # noqa: PLR2004 - C1 ends at 0x9F
        return True
    if code < 0xA0:  # noqa: PLR2004
        return False
    if unicodedata.category(char) in _HIDDEN_CATEGORIES:
        return True
    return any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def _visible(char: str) -> str:
    r"""Return the escape shown for a hidden character: ``\r``, ``\x1b``, ``\u202e`` or ``\U000e0041``."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < _BYTE_END:
        return f"\\x{code:02x}"
    if code < _BMP_END:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _json_escape(char: str) -> str:
    r"""Return the JSON escape of a character: ``\u202e``, or a surrogate pair beyond the BMP."""
    code = ord(char)
    if code < _BMP_END:
        return f"\\u{code:04x}"
    code -= _BMP_END
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def safe_text(value: Any, *, multiline: bool = False) -> str:
    r"""Return ``value`` as text a person can be shown: every hidden character escaped visibly.

    ``safe_text("rm -rf ~/x\r\x1b[2Kls")`` is ``'rm -rf ~/x\\r\\x1b[2Kls'``, shown as
    ``rm -rf ~/x\r\x1b[2Kls``. Text without such characters comes back unchanged.

    :param value: A string, or anything else (shown as ``str(value)``).
    :param multiline: Keep line breaks (``\n``, and ``\r\n`` as ``\n``), tabs and the emoji
        presentation selectors, for prose such as an answer or an error message. By default
        they are escaped too: a command, a call or an argument is shown on one line as it is.
    :return: The text, escaped. It is for showing only: the exact value is the original.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable():
        return text
    if multiline:
        text = text.replace("\r\n", "\n")
        return "".join(_visible(c) if c not in _PROSE and is_hidden(c) else c for c in text)
    return "".join(_visible(c) if is_hidden(c) else c for c in text)


def safe_json(value: Any, **dumps: Any) -> str:
    r"""Return :func:`json.dumps` of ``value`` (non-ASCII kept, ``default=str``), safe to show as it is.

    JSON escapes the C0 controls itself; this also writes every other hidden character (C1
    controls, bidi controls, zero-width characters, U+2028 ...) as a JSON ``\uXXXX`` escape.
    The text parses back to exactly ``value``.

    :param dumps: More keyword arguments for :func:`json.dumps` (``indent``, ``separators`` ...).
    """
    dumps.setdefault("ensure_ascii", False)
    dumps.setdefault("default", str)
    text = json.dumps(value, **dumps)
    if text.isascii() and "\x7f" not in text:
        return text
    # JSON escaped the C0 controls inside strings; those left are its own layout (indent).
    return "".join(_json_escape(c) if c not in _LAYOUT and is_hidden(c) else c for c in text)
