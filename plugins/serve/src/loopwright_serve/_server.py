"""Serving the app with uvicorn: the socket, the start line, and a shutdown that ends event streams first."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import uvicorn

from loopwright.errors import LoopwrightError
from loopwright_serve._connections import bounded_protocol

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from loopwright_serve._context import StreamGate
    from loopwright_serve._settings import ServerSettings

__all__ = ["bind", "run_server", "ui_lines"]

#: Seconds open requests may take to finish after SIGTERM or Ctrl-C (event streams end at once).
GRACE = 10.0
#: Seconds an idle kept-alive connection stays open (uvicorn's 5 s races busy clients' reuse).
KEEP_ALIVE = 30


class _Server(uvicorn.Server):
    """uvicorn's server, which ends the event streams when it starts shutting down.

    uvicorn waits for open connections before it runs the app's lifespan shutdown, and an
    event stream never ends by itself: the gate is closed first, so each stream says goodbye
    and the connections drain. SIGTERM and SIGINT end the server cleanly (exit 0).
    """

    def __init__(self, config: uvicorn.Config, gate: StreamGate) -> None:
        super().__init__(config)
        self.gate = gate

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.gate.closing.set()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def ui_lines(url: str, settings: ServerSettings) -> list[str]:
    """Return the lines ``serve`` prints after its URL: where the control plane is, and how to sign in.

    The token values are never printed: only the names of the tokens and the environment
    variables that hold them, and the scopes each one has.
    """
    lines = [f"loopwright serve: the control plane is at {url}/ui/ (open it in a browser)"]
    if not settings.tokens:
        lines.append("loopwright serve: no sign-in needed: the server has no tokens and answers loopback only")
        return lines
    lines.append("loopwright serve: sign in with the value of one of the assembly's server.tokens:")
    lines.extend(f"  {spec.name}: ${spec.token_env} ({', '.join(sorted(s.value for s in spec.scopes))})"
                 for spec in settings.tokens)
    return lines


def bind(host: str, port: int) -> socket.socket:
    """Return a listening TCP socket on ``host:port`` (port 0: one the system picks).

    :raises LoopwrightError: The address cannot be resolved or is taken.
    """
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise LoopwrightError(f"cannot listen on {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise LoopwrightError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def run_server(app: Starlette, host: str, port: int, *, announce: Callable[[str], Any]) -> None:
    """Serve ``app`` (from :func:`~loopwright_serve.build_app`) on ``host:port`` until SIGTERM or Ctrl-C.

    :param announce: Called with the URL the server listens on (the real port when ``port`` is 0),
        once the socket is bound and before the first request is served.
    :raises LoopwrightError: The address cannot be bound, or the app failed to start (its lifespan
        raised: uvicorn has logged why).
    """
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    announce(f"http://{shown}:{bound_port}")
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False,
                            http=bounded_protocol(app.state.ctx.settings),
                            timeout_graceful_shutdown=int(GRACE), timeout_keep_alive=KEEP_ALIVE)
    server = _Server(config, app.state.ctx.streams)
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn exits (3) when the app's startup failed
        raise LoopwrightError("the server did not start: its start-up failed (the log above says why)") from exc
    finally:
        sock.close()
