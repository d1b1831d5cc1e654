"""A TCP proxy in front of the test server's unix socket that can lose one reply after a commit.

Clients connect to :attr:`Proxy.dsn` (``127.0.0.1`` and a free port); every connection is
relayed, byte for byte, to the server the DSN given to :class:`Proxy` names. After
:meth:`Proxy.lose_commit_reply`, the next transaction whose statements contain the marker is let
through up to its ``COMMIT``, which the server carries out; the server's answer to it is thrown
away and the connection is cut on both sides. The client sees a connection that broke, not
knowing whether its transaction committed: it did. :attr:`Proxy.lost` is set then.

The marker must be in the statement's text, which psycopg sends on a connection's first
executions of a statement (before it prepares it), so use it on a fresh store.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self

import psycopg.conninfo

__all__ = ["Proxy"]

_CHUNK = 65536
# The server's CommandComplete message for COMMIT: type 'C', length 11, the tag "COMMIT\0".
_COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"


class _Pair:
    """One client connection and its server connection, and where its transaction stands."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.marked = False  # the marker was seen in this connection's transaction
        self.committing = False  # that transaction's COMMIT went to the server

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class Proxy:
    """Relays connections to the server of ``dsn`` (a unix socket) from a local TCP port (see the module)."""

    def __init__(self, dsn: str) -> None:
        """Start listening; connections are relayed until :meth:`close`."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        self._socket_path = f"{params['host']}/.s.PGSQL.{params.get('port', 5432)}"
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        params.update(host="127.0.0.1", port=str(port), sslmode="disable", gssencmode="disable")
        self.dsn: str = psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
        self.lost = threading.Event()
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_commit_reply(self, marker: bytes) -> None:
        """Lose the answer to the COMMIT of the next transaction that sends ``marker`` (once)."""
        with self._lock:
            self._marker = marker
            self.lost.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self._socket_path)
            except OSError:
                client.close()
                server.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                if self._closed:
                    pair.close()
                    return
                self._pairs.append(pair)
            threading.Thread(target=self._upstream, args=(pair,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(pair,), daemon=True).start()

    def _upstream(self, pair: _Pair) -> None:
        """Client to server: watch for the marker, then for its transaction's COMMIT."""
        try:
            while data := pair.client.recv(_CHUNK):
                with self._lock:
                    if self._marker is not None and self._marker in data:
                        pair.marked = True
                        self._marker = None
                    if pair.marked and b"COMMIT" in data:
                        pair.committing = True
                pair.server.sendall(data)
        except OSError:
            pass
        pair.close()

    def _downstream(self, pair: _Pair) -> None:
        """Server to client: forward everything but the answer to a marked COMMIT, which cuts the pair."""
        try:
            while data := pair.server.recv(_CHUNK):
                with self._lock:
                    cut = pair.committing and _COMMIT_DONE in data
                if cut:
                    self.lost.set()
                    break
                pair.client.sendall(data)
        except OSError:
            pass
        pair.close()

    def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        with self._lock:
            self._closed = True
            pairs, self._pairs = self._pairs, []
        with contextlib.suppress(OSError):
            self._listener.close()
        for pair in pairs:
            pair.close()

    def __enter__(self) -> Self:
        """Return the proxy itself."""
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close the proxy."""
        self.close()
