"""Fixtures: a real local HTTP server speaking the Anthropic Messages API, scripted per test.

Tests reach everything through the ``fake`` fixture (``fake.Reply``, ``fake.message``,
``fake.events`` ...), so nothing is imported from this file. The server is the stdlib
``ThreadingHTTPServer`` on 127.0.0.1 (a free port), HTTP/1.1 with keep-alive for JSON answers.
Each test enqueues :class:`Reply` objects; when the queue is empty the server answers a plain
``"ok"`` message. It records every request it receives (:class:`Seen`), with the client port it
came from: one per connection, so tests can tell a reused connection from a new one.

A streamed reply (``Reply(sse=[(event, data), ...])``) is written as ``text/event-stream``
without a length, then the connection is closed; ``chunk`` writes it in pieces of that many
bytes (so lines and even UTF-8 characters are split across network reads), and ``cut`` stops
after that many events, as a dropped connection would.
"""

from __future__ import annotations

import collections
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import pytest

from loopwright.abc import ProviderSettings
from loopwright_anthropic import AnthropicProvider


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted answer: a JSON body (or raw bytes), or an SSE stream, with a status and
    headers, after a delay; or, with ``close``, the connection reset without an answer."""

    body: Any = None
    sse: list[tuple[str | None, Any]] | None = None
    status: int = 200
    headers: dict[str, str] = attrs.field(factory=dict)
    delay: float = 0.0
    close: bool = False
    chunk: int | None = None
    cut: int | None = None


@attrs.frozen(kw_only=True)
class Seen:
    """One request the server received; ``peer`` is the client's port, one per connection."""

    path: str
    headers: dict[str, str]
    body: Any
    at: float
    peer: int


def text(value: str) -> dict[str, Any]:
    """Return a text content block."""
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, input: Any) -> dict[str, Any]:  # noqa: A002 - the wire's name
    """Return a tool_use content block."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": input}


def message(
    *content: dict[str, Any] | str, stop_reason: str | None = "end_turn", usage: dict[str, Any] | None = None,
    model: str = "claude-test-20250101",
) -> dict[str, Any]:
    """Return a Messages answer; plain strings are text blocks."""
    return {
        "id": "msg_01", "type": "message", "role": "assistant", "model": model,
        "content": [text(c) if isinstance(c, str) else c for c in content],
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1} if usage is None else usage,
    }


def events(answer: dict[str, Any], *, pieces: int = 3, json_pieces: dict[str, list[str]] | None = None,
           ping: bool = True) -> list[tuple[str, Any]]:
    """Return the SSE events that stream ``answer``: text and tool input split into ``pieces``.

    ``json_pieces`` gives the exact ``partial_json`` pieces of a tool_use block by id (for
    malformed input), instead of splitting the encoded input.
    """
    start = dict(answer, content=[], stop_reason=None)
    usage = dict(answer["usage"])
    output_tokens = usage.get("output_tokens", 0)
    start["usage"] = dict(usage, output_tokens=1)
    out: list[tuple[str, Any]] = [("message_start", {"type": "message_start", "message": start})]
    if ping:
        out.append(("ping", {"type": "ping"}))
    for index, block in enumerate(answer["content"]):
        if block["type"] == "text":
            out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": {"type": "text", "text": ""}}))
            out.extend(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "text_delta", "text": part}})
                       for part in _split(block["text"], pieces))
        elif block["type"] == "tool_use":
            out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
            parts = (json_pieces or {}).get(block["id"]) or _split(json.dumps(block["input"]), pieces)
            out.extend(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "input_json_delta", "partial_json": part}})
                       for part in parts)
        else:
            out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": block}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    out.append(("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": answer["stop_reason"], "stop_sequence": None}, "usage": {"output_tokens": output_tokens}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def _split(value: str, pieces: int) -> list[str]:
    size = max(1, -(-len(value) // pieces))
    return [value[i:i + size] for i in range(0, len(value), size)] or [""]


def error_body(kind: str, message: str) -> dict[str, Any]:
    """Return an API error body."""
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_test"}


class FakeAnthropic:
    """The scripted server's state, shared with its handler threads."""

    Reply = Reply
    message = staticmethod(message)
    text = staticmethod(text)
    tool_use = staticmethod(tool_use)
    events = staticmethod(events)
    error_body = staticmethod(error_body)

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.seen: list[Seen] = []
        self._script: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()

    def enqueue(self, *replies: Reply | dict[str, Any]) -> None:
        """Queue answers; a dict is a 200 JSON body."""
        with self._lock:
            self._script.extend(r if isinstance(r, Reply) else Reply(body=r) for r in replies)

    def stream(self, answer: dict[str, Any], **kwargs: Any) -> None:
        """Queue ``answer`` as an SSE stream (``Reply`` options such as ``chunk`` in ``kwargs``)."""
        reply_keys = {"status", "headers", "delay", "chunk", "cut"}
        reply = {k: v for k, v in kwargs.items() if k in reply_keys}
        self.enqueue(Reply(sse=events(answer, **{k: v for k, v in kwargs.items() if k not in reply_keys}),
                           **reply))

    def next_reply(self, seen: Seen) -> Reply:
        with self._lock:
            self.seen.append(seen)
            if self._script:
                return self._script.popleft()
        if isinstance(seen.body, dict) and seen.body.get("stream"):
            return Reply(sse=events(message("ok")))
        return Reply(body=message("ok"))

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies received, in order."""
        return [s.body for s in self.seen]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        seen = Seen(path=self.path, headers={k.lower(): v for k, v in self.headers.items()},
                    body=body, at=time.monotonic(), peer=self.client_address[1])
        reply = self.server.fake.next_reply(seen)
        if reply.delay:
            time.sleep(reply.delay)
        if reply.close:
            # SO_LINGER 0: closing sends a reset instead of an orderly end.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        if reply.sse is not None:
            self._stream(reply)
            return
        payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, reply: Reply) -> None:
        sse = reply.sse or []
        if reply.cut is not None:
            sse = sse[:reply.cut]
        payload = "".join(
            (f"event: {name}\n" if name else "") + f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
            for name, data in sse).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        step = reply.chunk or len(payload) or 1
        for i in range(0, len(payload), step):
            self.wfile.write(payload[i:i + step])
            self.wfile.flush()
            if reply.chunk:
                time.sleep(0.0005)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    fake: FakeAnthropic

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and left; nothing to report


@pytest.fixture
def fake() -> Any:
    """A running fake Messages API server."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.fake = FakeAnthropic(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield server.fake
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def make_provider(fake: FakeAnthropic) -> Any:
    """Return a factory of providers pointed at ``fake``, with tiny retry delays."""

    def make(*, api_key: str | None = "sk-ant-test", http_client: Any = None, **options: Any) -> AnthropicProvider:
        return AnthropicProvider(ProviderSettings(
            name="claude", kind="anthropic", base_url=fake.url, api_key=api_key, http_client=http_client,
            options={"retryBaseDelay": 0.001, **options},
        ))

    return make
