"""Server-sent events: from the bytes of a ``text/event-stream`` body to :class:`SSEEvent` s."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["SSEDecoder", "SSEEvent"]


class SSEEvent(NamedTuple):
    r"""One server-sent event.

    Attributes:
        event: Its ``event:`` name, ``None`` when the stream gave none.
        data: Its ``data:`` lines, joined with ``\n``.
    """

    event: str | None
    data: str


_new_event = tuple.__new__  # SSEEvent(...) without the generated __new__'s Python call
_LF, _CR = 10, 13


class SSEDecoder:
    r"""Turns the body of one ``text/event-stream`` response into events; keep one per response.

    Follows the WHATWG "event stream interpretation": lines end with ``\r\n``, ``\n`` or ``\r``
    (also when a network read splits them, or splits a UTF-8 character); a blank line ends an
    event; ``event:`` names it; ``data:`` lines join with ``\n``; one space after the colon is
    dropped; lines starting with ``:`` are comments (keep-alives); ``id:``, ``retry:`` and unknown
    fields are ignored; an event without data is dropped; so is an event the body ends before
    its blank line. :meth:`feed` takes bytes, :meth:`decode` one line already split off.

    With ``is_whole``, the decoder also copes with servers that leave out the blank lines: a
    ``data:`` line arriving while the pending data is already whole (as ``is_whole`` judges it,
    for example "parses as JSON") first dispatches the pending event, and a whole event pending
    at the end of the body is kept. With well-formed streams the pending data is empty at that
    point, so this costs nothing.
    """

    __slots__ = ("_data", "_event", "_is_whole", "_skip_lf", "_started", "_tail")

    def __init__(self, *, is_whole: Callable[[str], bool] | None = None) -> None:
        """Start with no pending event.

        :param is_whole: Whether pending data is a whole event, for streams without blank lines.
        """
        self._is_whole = is_whole
        self._event: str | None = None
        self._data: list[str] = []
        self._tail = b""
        self._skip_lf = False
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next piece of the body; return the events it completes."""
        if not chunk:
            return []
        if self._skip_lf:  # the previous piece ended with \r: a \n now is the same line break
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._tail:
            chunk = self._tail + chunk
        end = chunk[-1]
        if end in (_LF, _CR):
            self._tail = b""
            self._skip_lf = end == _CR
        else:  # keep the unfinished last line for the next piece
            cut = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1
            self._tail = chunk[cut:]
            if not cut:
                return []
            chunk = chunk[:cut]
        # Whole lines only, so no UTF-8 character is cut (\r and \n never occur inside one).
        return self._lines(chunk.decode("utf-8", "replace"))

    def finish(self) -> list[SSEEvent]:
        """Take the end of the body; return the events still due (only with ``is_whole``)."""
        tail, self._tail = self._tail, b""
        events = self._lines(tail.decode("utf-8", "replace") + "\n") if tail else []  # a last line without a break
        if self._data and self._pending_is_whole():
            events.append(self._dispatch())
        return events

    def _lines(self, text: str) -> list[SSEEvent]:
        """Decode ``text``, whole lines each ending with a line break."""
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")  # a byte order mark may open the stream
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        events = []
        decode = self.decode
        for line in text[:-1].split("\n"):
            event = decode(line)
            if event is not None:
                events.append(event)
        return events

    def decode(self, line: str) -> SSEEvent | None:
        """Take one line (without its line break); return the event it completes, if any."""
        if not line:
            if not self._data:
                self._event = None
                return None
            return self._dispatch()
        if line[0] == ":":  # a comment (keep-alive)
            return None
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "data":
            event = self._dispatch() if self._data and self._pending_is_whole() else None
            self._data.append(value)
            return event
        if field == "event":
            self._event = value
        return None

    def _pending_is_whole(self) -> bool:
        return self._is_whole is not None and self._is_whole("\n".join(self._data))

    def _dispatch(self) -> SSEEvent:
        event = _new_event(SSEEvent, (self._event, "\n".join(self._data)))
        self._event = None
        self._data = []
        return event
