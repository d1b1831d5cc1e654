r"""Server-sent events: lines in, ``(event, data)`` pairs out.

The framing of the WHATWG EventSource spec, as far as the OpenAI APIs need it: ``data:`` lines
(several join with ``\\n``), ``event:``, comments (``:`` lines, such as OpenRouter's
``: OPENROUTER PROCESSING`` keep-alives), and a blank line ending each event. ``id:`` and
``retry:`` are read and ignored. Line splitting (``\\n``, ``\\r\\n``, ``\\r``, and lines cut
across network chunks) is httpx's ``Response.aiter_lines``; this module only frames.

One tolerance beyond the spec: some compatible servers write one ``data:`` line per event
without the blank line between them. A ``data:`` line arriving while the pending data is
already a whole JSON value (or ``[DONE]``) therefore dispatches the pending event first. With
well-formed streams the pending data is always empty at that point, so this costs nothing.

A hand-written framer rather than ``httpx-sse``: it is twenty lines, it needs that tolerance,
and the plugin then depends on httpx alone.
"""

from __future__ import annotations

import json

__all__ = ["DONE", "Decoder", "Event"]

#: The data of Chat Completions' last event.
DONE = "[DONE]"

#: One event: its type (``""`` when the stream names none) and its data.
Event = tuple[str, str]


class Decoder:
    """Turns the lines of an SSE body into events; one decoder per response."""

    __slots__ = ("_data", "_event")

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def line(self, line: str) -> Event | None:
        """Take one line (without its line break); return the event it completes, if any."""
        if not line:
            return self._dispatch()
        if line[0] == ":":  # a comment (keep-alive)
            return None
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "data":
            event = self._dispatch() if self._data and _whole(self._data) else None
            self._data.append(value)
            return event
        if field == "event":
            self._event = value
        return None

    def flush(self) -> Event | None:
        """Return the event left pending at the end of the body, if its data is whole.

        The spec drops an unterminated event; a whole one is kept (some servers end without the
        last blank line), a cut one is dropped, so that a truncated stream reads as truncated.
        """
        if self._data and _whole(self._data):
            return self._dispatch()
        return None

    def _dispatch(self) -> Event | None:
        if not self._data:
            self._event = ""
            return None
        event = (self._event, "\n".join(self._data))
        self._data = []
        self._event = ""
        return event


def _whole(data: list[str]) -> bool:
    text = "\n".join(data)
    if text.strip() == DONE:
        return True
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
