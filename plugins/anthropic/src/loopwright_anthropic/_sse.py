r"""A server-sent events decoder: lines in, ``(event, data)`` pairs out.

Follows the WHATWG "event stream interpretation" rules that the Messages API's streams need: a
blank line ends an event; ``event:`` names it; ``data:`` lines are joined with newlines; a
leading space after the colon is dropped; lines starting with ``:`` are comments; ``id:`` and
``retry:`` are read and ignored (the API resumes nothing). Lines come from
``httpx.Response.aiter_lines()``, which already reassembles lines split across network chunks
and accepts ``\n``, ``\r\n`` and ``\r`` endings.
"""

from __future__ import annotations

__all__ = ["SSEDecoder"]


class SSEDecoder:
    """Turns the lines of one event stream into events; keep one per stream."""

    __slots__ = ("_data", "_event")

    def __init__(self) -> None:
        """Start with no pending event."""
        self._event: str | None = None
        self._data: list[str] = []

    def decode(self, line: str) -> tuple[str | None, str] | None:
        """Take one line (without its ending); return ``(event, data)`` when it ends an event.

        An event with neither a name nor data (two blank lines in a row) gives nothing.
        """
        if not line:
            if self._event is None and not self._data:
                return None
            event, data = self._event, "\n".join(self._data)
            self._event = None
            self._data = []
            return event, data
        if line[0] == ":":
            return None
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None
