"""A scripted HTTP/1.1 server on a real socket (127.0.0.1), run in a thread.

The provider under test reaches it through its own HTTP client, exactly as it would reach the
vendor: DNS-free, but with real connections, keep-alive, chunked streams and status codes. The
server runs in a thread, not in the test's event loop, so it serves asyncio and trio alike and a
provider that blocks the loop still gets its answers.

Each request takes the next *script* from the queue: a function of the
:class:`~loopwright_testing.conformance.CapturedRequest` that returns the
:class:`~loopwright_testing.conformance.WireReply` to write (scripts render lazily, so a reply can
follow what the request asked, such as a stream). Whatever goes wrong on the server side (a path
other than the expected one, a request the dialect finds invalid, no script left) is answered
with an error status *and* recorded in :attr:`WireServer.problems`, which the scenarios report.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Self

from loopwright_testing.conformance._model import CapturedRequest, WireFormatError, WireReply

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Script", "WireServer"]

#: A scripted reply: called with the request when it arrives, returns what to write.
Script = Callable[[CapturedRequest], WireReply]


class WireServer:
    """A local server that answers from a queue of scripts and records every request.

    Use it as a context manager (it starts on enter and stops on exit)::

        with WireServer(path="/v1/chat/completions") as server:
            server.enqueue(lambda request: WireReply.json({...}))
            ...  # point the provider at server.url
            assert server.requests[0].path == "/v1/chat/completions"

    Attributes:
        path: The only path answered; requests to others get 404 and a problem.
        requests: Every request received, in order.
        problems: What went wrong on the server side, one sentence each.
    """

    def __init__(self, *, path: str, error_reply: Callable[[int, str], WireReply] | None = None) -> None:
        """Prepare a server answering ``POST path``; it listens once entered.

        :param path: The endpoint; requests to any other path get 404.
        :param error_reply: Renders the server's own refusals (404, 400) from a status and a
            message, in the vendor's error format; by default ``{"error": {"message": ...}}``.
        """
        self.path = path
        self._error_reply = error_reply
        self.requests: list[CapturedRequest] = []
        self.problems: list[str] = []
        self._scripts: collections.deque[Script] = collections.deque()
        self._gates: list[threading.Event] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, without a trailing slash."""
        if self._server is None:
            raise RuntimeError("the server is not running; use it as a context manager")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def enqueue(self, *scripts: Script) -> None:
        """Queue scripts; each request takes the next one."""
        with self._lock:
            self._scripts.extend(scripts)

    @property
    def pending(self) -> int:
        """How many queued scripts no request has taken yet."""
        with self._lock:
            return len(self._scripts)

    def __enter__(self) -> Self:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, name="conformance-server", daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        server, self._server = self._server, None
        with self._lock:
            gates = list(self._gates)
        for gate in gates:  # let a handler held at a gate finish
            gate.set()
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- called from handler threads -----------------------------------------------------------

    def _reply(self, method: str, target: str, headers: dict[str, str], body: bytes) -> WireReply:
        path, _, query = target.partition("?")
        not_found = False
        with self._lock:  # the index and the append in one step: concurrent requests get distinct indexes
            request = CapturedRequest(index=len(self.requests), method=method, path=path, query=query,
                                      headers=headers, body=body, at=time.monotonic())
            self.requests.append(request)
            if request.method != "POST" or request.path != self.path:
                self.problems.append(
                    f"request #{request.index} went to {request.method} {request.path}; "
                    f"the dialect's endpoint is POST {self.path}")
                not_found = True
            script = self._scripts.popleft() if self._scripts and not not_found else None
        if not_found:
            return self._refusal(404, f"conformance server: no endpoint {request.method} {request.path}; "
                                      f"expected POST {self.path}")
        if script is None:
            self.report(f"request #{request.index} came after every scripted reply was used "
                        "(the provider sent more requests than the scenario expects)")
            return self._refusal(400, "conformance server: no reply is scripted for this request")
        try:
            reply = script(request)
        except WireFormatError as exc:
            self.report(f"request #{request.index} breaks the wire format: {exc}")
            return self._refusal(400, f"conformance server: invalid request: {exc}")
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
            self.report(f"rendering the reply to request #{request.index} failed: {type(exc).__name__}: {exc}")
            return self._refusal(400, f"conformance server: {type(exc).__name__}: {exc}")
        if reply.gate is not None:
            with self._lock:
                self._gates.append(reply.gate)
        return reply

    def _refusal(self, status: int, message: str) -> WireReply:
        if self._error_reply is not None:
            try:
                return self._error_reply(status, message)
            except Exception as exc:  # noqa: BLE001 - fall back to the plain form, and say why
                self.report(f"rendering the server's own error failed: {type(exc).__name__}: {exc}")
        return WireReply.json({"error": {"message": message, "type": "conformance_server"}}, status=status)

    def report(self, text: str) -> None:
        """Record a problem (scripts call this from the server's threads)."""
        with self._lock:
            self.problems.append(text)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    owner: WireServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer; the scenario reports what it saw


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no delayed-ACK stalls
    server: _Server

    def do_POST(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.owner._reply(self.command, self.path, headers, body)  # noqa: SLF001 - part of the server
        if reply.events is not None:
            self._stream(reply)
            return
        self.send_response(reply.status)
        headers = {k.lower(): v for k, v in reply.headers.items()}
        headers.setdefault("content-type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)
        self.wfile.flush()

    def _stream(self, reply: WireReply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for i, event in enumerate(reply.events or ()):
            piece = event.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            if reply.gate is not None and i == reply.gate_after and not reply.gate.wait(reply.gate_timeout):
                self.server.owner.report(
                    f"the provider had not yielded the first streamed piece {reply.gate_timeout:g} s after the "
                    "server sent it (and held the rest back): it waits for more of the body before yielding, "
                    "instead of yielding each piece as it arrives")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

