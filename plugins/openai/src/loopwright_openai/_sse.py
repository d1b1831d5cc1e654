r"""Server-sent events as the OpenAI APIs and compatible servers send them.

The framing itself (lines, ``data:``, ``event:``, comments) is :class:`loopwright.http.SSEDecoder`;
this module adds what is OpenAI's own. An event without an ``event:`` line (every Chat
Completions event) has the type ``""``, and Chat Completions ends with ``data: [DONE]``.

One tolerance beyond the spec: some compatible servers write one ``data:`` line per event
without the blank line between them. A ``data:`` line arriving while the pending data is
already a whole JSON value (or ``[DONE]``) therefore dispatches the pending event first, and a
whole event left pending at the end of the body is kept (some servers end without the last
blank line); a cut one is dropped, so that a truncated stream reads as truncated. With
well-formed streams the pending data is always empty at that point, so this costs nothing.
"""

from __future__ import annotations

import json

from loopwright.http import SSEDecoder, SSEEvent

__all__ = ["DONE", "Decoder", "Event"]

#: The data of Chat Completions' last event.
DONE = "[DONE]"

#: One event: its type (``""`` when the stream names none) and its data.
Event = tuple[str, str]


class Decoder(SSEDecoder):
    """An :class:`~loopwright.http.SSEDecoder` with the tolerance above; one per response."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(is_whole=_whole)

    def line(self, line: str) -> Event | None:
        """Take one line (without its line break); return the event it completes, if any."""
        return _typed(self.decode(line))

    def flush(self) -> Event | None:
        """Return the event left pending at the end of the body, if its data is whole."""
        events = self.finish()
        return _typed(events[-1]) if events else None


def _typed(event: SSEEvent | None) -> Event | None:
    return None if event is None else (event.event or "", event.data)


def _whole(data: str) -> bool:
    if data.strip() == DONE:
        return True
    try:
        json.loads(data)
    except ValueError:
        return False
    return True
