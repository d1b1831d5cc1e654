"""Bounds on connections, before the app sees a request: how many are open, and how long a head may take.

uvicorn bounds an idle kept-alive connection (``timeout_keep_alive``) but neither the time a
client may take to send a request's head nor the number of connections open at once: a client
that sends a few bytes of a head and then waits holds a connection, and a descriptor, for as
long as it likes (issue 25, item 6). :func:`bounded_protocol` returns uvicorn's h11 protocol with
both bounds; the time to send a body is bounded in the app (:class:`~loopwright_serve._app.BodyLimit`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    from loopwright_serve._settings import ServerSettings

__all__ = ["BoundedH11Protocol", "bounded_protocol"]

_BUSY_BODY = (b'{"type":"about:blank","title":"Service Unavailable","status":503,'
              b'"detail":"too many open connections (server.maxConnections); retry later"}')
#: What a connection beyond ``server.maxConnections`` is told before it is closed.
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 5\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))

#: What a connection that took longer than ``server.headerTimeout`` to send a head is told.
SLOW = (b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with :attr:`limit` connections at most and :attr:`head_timeout` per head."""

    limit: int = 1024
    head_timeout: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limit:
            transport.write(BUSY)
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._between_requests():
            self._arm()  # the first byte of a head starts its clock; later bytes never reset it
        super().data_received(data)
        if not self._between_requests():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.write(SLOW)
            self.transport.close()


def bounded_protocol(settings: ServerSettings) -> type[H11Protocol]:
    """Return uvicorn's h11 protocol bounded by ``settings`` (a :class:`BoundedH11Protocol`).

    - At most ``max_connections`` connections are open at once: one more is answered 503 (with
      ``Retry-After``) and closed as soon as it is accepted, before anything is read from it.
    - A request's head (request line and headers) must arrive within ``header_timeout`` seconds,
      counted from when the connection opened or, on a kept-alive connection, from the first
      byte of the next request: a connection still without a whole head then is answered 408
      and closed. A connection idle between requests is uvicorn's ``timeout_keep_alive``'s.
    """
    return type("BoundedH11Protocol", (BoundedH11Protocol,),
                {"limit": settings.max_connections, "head_timeout": settings.header_timeout})
