"""What every surface gets: the open runtime, the settings, and who may do what."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import attrs

from loopwright_serve._auth import LOCAL, Principal, Scope
from loopwright_serve._deltas import LiveChannel
from loopwright_serve._problems import ProblemError
from loopwright_serve._settings import ServerSettings, is_loopback

if TYPE_CHECKING:
    from starlette.requests import Request

    from loopwright import Runtime

__all__ = ["ServeContext", "StreamGate"]

_CHALLENGE = 'Bearer realm="loopwright"'


class StreamGate:
    """Bounds the long-lived streams (SSE) open at once, and ends them all at shutdown.

    Attributes:
        limit: The most streams open at once.
        closing: Set when the server shuts down; every stream ends when it is set.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.closing = anyio.Event()

    def enter(self) -> None:
        """Count one more stream open.

        :raises ProblemError: 503 when ``limit`` streams are open already, or the server is closing.
        """
        if self.closing.is_set():
            raise ProblemError(503, "Shutting down", "the server is shutting down")
        if self.open >= self.limit:
            raise ProblemError(503, "Too many event streams",
                               f"{self.open} event streams are open, the most this server allows "
                               "(server.maxEventStreams); retry later", headers={"Retry-After": "5"})
        self.open += 1

    def leave(self) -> None:
        """Count one stream closed."""
        self.open -= 1


@attrs.frozen
class ServeContext:
    """The server's state, handed to every surface.

    Attributes:
        runtime: The runtime over the assembly's store, opened and closed by the app's lifespan.
        settings: The assembly's ``server:`` key.
        streams: The bound on SSE connections, and the signal that ends them at shutdown.
        live: The stream deltas of instances running here (registered on the runtime by the app's lifespan).
    """

    runtime: Runtime
    settings: ServerSettings
    streams: StreamGate = attrs.field(default=attrs.Factory(
        lambda self: StreamGate(self.settings.max_event_streams), takes_self=True))
    live: LiveChannel = attrs.field(factory=LiveChannel)

    async def authorize(self, request: Request, scope: Scope) -> Principal:
        """Return who makes ``request``, if they may act with ``scope``.

        With ``server.tokens``, the request must carry ``Authorization: Bearer TOKEN``, compared in
        constant time with every configured token. Without tokens, every request from loopback is
        the principal ``local`` with every scope (a request from elsewhere is refused: the server
        was exposed by other means than ``loopwright serve``).

        :raises ProblemError: 401 (with ``WWW-Authenticate: Bearer``) for a missing or wrong token,
            403 for a token without ``scope``.
        """
        if not self.settings.tokens:
            self._check_local(request)
            return LOCAL
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise ProblemError(401, "Unauthorized", "this request needs an Authorization: Bearer token",
                               headers={"WWW-Authenticate": _CHALLENGE})
        given = token.strip().encode()
        found = None
        for spec in self.settings.tokens:  # every token, so the time taken does not say which matched
            if hmac.compare_digest(given, spec.secret.encode()) and found is None:
                found = spec
        if found is None:
            raise ProblemError(401, "Unauthorized", "the bearer token is not valid",
                               headers={"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'})
        principal = Principal(found.name, found.scopes)
        if not principal.allows(scope):
            raise ProblemError(403, "Forbidden", f"token {found.name!r} lacks the scope {scope.value!r}",
                               headers={"WWW-Authenticate": f'{_CHALLENGE}, error="insufficient_scope", '
                                                            f'scope="{scope.value}"'})
        return principal

    def _check_local(self, request: Request) -> None:
        """Refuse what reaches a server without tokens from beyond this machine's own programs.

        Besides a client that is not on loopback: a ``Host`` that is not a loopback name (a DNS
        rebinding page talks to 127.0.0.1 under its own name), and a browser's ``Origin`` that
        is neither loopback nor in ``server.cors.origins`` (a page elsewhere posting to this
        machine's port, which needs no preflight for a plain POST).
        """
        client = request.client.host if request.client else ""
        if client and not is_loopback(client):
            raise ProblemError(403, "Forbidden", "this server has no tokens and answers loopback only")
        host = urlsplit(f"//{request.headers.get('host', '')}").hostname or ""
        if not is_loopback(host):
            raise ProblemError(403, "Forbidden", f"this server has no tokens and answers only to a loopback Host, "
                                                 f"not {host[:100]!r}")
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.settings.cors_origins and \
                not is_loopback(urlsplit(origin).hostname or ""):
            raise ProblemError(403, "Forbidden", f"this server has no tokens and refuses requests from pages on "
                                                 f"other origins ({origin[:100]!r})")
