"""A stand-in for the echo API, the made-up HTTP protocol that the ``echo`` provider speaks.

Run it with ``python -m loopwright_example_echo.server [--port 8765]``; tests start it in a
thread with :class:`EchoServer`. It answers ``POST .../complete`` as follows:

* the last message is a user message ``call NAME ARGUMENTS`` and ``NAME`` is an offered tool:
  a call of that tool, with ``ARGUMENTS`` as written (so that malformed JSON can be tried);
* the last messages are tool results: ``NAME returned CONTENT`` for each of them;
* otherwise ``echo: `` followed by the last message's text.

Usage counts words. ``options.maxOutputTokens`` cuts the answer to that many words (finish
``max_tokens``). Replies queued with :meth:`EchoServer.enqueue` go out first, as they are.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["EchoServer", "answer", "main"]


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """Return the echo API's answer to a request body."""
    messages = body.get("messages") or [{"role": "user", "content": ""}]
    tools = {tool["name"] for tool in body.get("tools") or []}
    calls: list[dict[str, Any]] = []
    text: str | None
    if messages[-1]["role"] == "tool":
        results: list[str] = []
        for message in reversed(messages):
            if message["role"] != "tool":
                break
            results.insert(0, f"{message.get('name')} returned {message.get('content')}")
        text = "; ".join(results)
    else:
        prompt = str(messages[-1].get("content") or "")
        name, _, arguments = prompt.removeprefix("call ").partition(" ")
        if prompt.startswith("call ") and name in tools:
            calls.append({"id": f"call_{len(messages)}", "name": name, "arguments": arguments or "{}"})
            text = None
        else:
            text = f"echo: {prompt}"
    finish = "tool" if calls else "done"
    limit = (body.get("options") or {}).get("maxOutputTokens")
    if text is not None and limit is not None and len(text.split()) > limit:
        text, finish = " ".join(text.split()[:limit]), "max_tokens"
    used = sum(len(str(m.get("content") or "").split()) for m in messages)
    said = len((text or "").split()) + sum(len(c["arguments"].split()) for c in calls)
    return {"text": text, "toolCalls": calls, "usage": {"input": used, "output": said}, "finish": finish}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real API server does
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.endswith("/complete"):
            self._send(404, {"error": f"no endpoint {self.path}"}, {})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": "the body is not JSON"}, {})
            return
        self._send(*self.server.echo.next_reply(body, dict(self.headers)))

    def _send(self, status: int, reply: Any, headers: dict[str, str]) -> None:
        payload = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Log nothing."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    echo: EchoServer


class EchoServer:
    """The echo API on a local port.

    Use it as a context manager, which serves from a background thread::

        with EchoServer() as server:
            ...  # point the provider at server.url

    Attributes:
        url: The base URL to give the provider (``baseUrl``).
        requests: The JSON body of every request received, in order.
        headers: The headers of every request received, with lower-case names.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Bind the port (0: any free one); nothing is served until :meth:`start`."""
        self._httpd = _Server((host, port), _Handler)
        self._httpd.echo = self
        self.url = f"http://{host}:{self._httpd.server_address[1]}"
        self.requests: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self._script: collections.deque[tuple[int, Any, dict[str, str]]] = collections.deque()
        self._lock = threading.Lock()

    def enqueue(self, reply: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> None:
        """Queue a reply, sent as it is to the next request instead of the echo answer."""
        with self._lock:
            self._script.append((status, reply, headers or {}))

    def next_reply(self, body: Any, headers: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        """Record a request and return the status, body and headers to answer it with."""
        with self._lock:
            self.requests.append(body)
            self.headers.append({name.lower(): value for name, value in headers.items()})
            if self._script:
                return self._script.popleft()
        return 200, answer(body), {}

    def start(self) -> Self:
        """Serve from a background thread."""
        # A short poll interval, so that stop() returns at once.
        threading.Thread(target=self._httpd.serve_forever, args=(0.01,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve the echo API until Ctrl-C."""
    parser = argparse.ArgumentParser(description="Serve the echo API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    server = EchoServer(args.host, args.port)
    print(f"echo API on {server.url}; Ctrl-C stops it", flush=True)  # noqa: T201 - a command-line tool
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
