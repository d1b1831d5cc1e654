"""Fixtures: a real local HTTP server speaking Chat Completions and Responses, scripted per test.

Tests reach everything through the ``fake`` fixture (``fake.Reply``, ``fake.completion``,
``fake.tool_call``, ``fake.sse``, ``fake.chunk``, ``fake.response`` ...), so nothing is imported
from this file. The server is the stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (a free port),
HTTP/1.1 with keep-alive. Each test enqueues :class:`Reply` objects; when the queue is empty the
server answers ``"ok"``. It records every request it receives (:class:`Seen`), with the client
port it came from: one per connection, so tests can tell a reused connection from a new one.

A reply with ``sse`` streams server-sent events: chunked transfer encoding (or, with
``framing="close"``, no length and the connection closed at the end), each piece written and
flushed on its own after a short pause so the client reads them separately. ``split`` cuts the
payload into pieces of that many bytes, mid-line; ``cut`` ends the body without its last chunk
(the client sees the connection break off).
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
from loopwright_openai import OpenAIProvider


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted answer: a JSON body (or raw bytes) with a status and headers, after a delay;
    or, with ``close``, the connection dropped (reset) without an answer."""

    body: Any = None
    status: int = 200
    headers: dict[str, str] = attrs.field(factory=dict)
    delay: float = 0.0
    close: bool = False
    sse: list[Any] | None = None
    split: int | None = None
    framing: str = "chunked"
    cut: bool = False
    pause: float = 0.001


@attrs.frozen(kw_only=True)
class Seen:
    """One request the server received; ``peer`` is the client's port, one per connection."""

    path: str
    headers: dict[str, str]
    body: Any
    at: float
    peer: int


def completion(
    content: str | None = "ok", *, tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = "stop", usage: dict[str, Any] | None = None, model: str = "gpt-test-0001",
) -> dict[str, Any]:
    """Return a Chat Completions response object."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4} if usage is None else usage,
    }


def chunk(
    content: str | None = None, *, tool_calls: list[dict[str, Any]] | None = None, finish_reason: str | None = None,
    refusal: str | None = None, usage: dict[str, Any] | None = None, choices: bool = True, model: str = "gpt-test-0001",
) -> dict[str, Any]:
    """Return a Chat Completions stream chunk (``choices=False``: the usage-only last chunk)."""
    out: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    if choices:
        delta: dict[str, Any] = {}
        if content is not None:
            delta["content"] = content
        if refusal is not None:
            delta["refusal"] = refusal
        if tool_calls is not None:
            delta["tool_calls"] = tool_calls
        out["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    else:
        out["choices"] = []
    if usage is not None:
        out["usage"] = usage
    return out


def sse(*events: Any, done: bool = True, **reply: Any) -> Reply:
    """Return a streamed reply: each event a dict (sent as JSON data) or a str (sent as written)."""
    items = list(events) + (["data: [DONE]\n\n"] if done else [])
    return Reply(sse=items, **reply)


def response(
    output: list[dict[str, Any]] | None = None, *, status: str = "completed", usage: dict[str, Any] | None = None,
    incomplete: str | None = None, error: dict[str, Any] | None = None, model: str = "gpt-test-0001",
) -> dict[str, Any]:
    """Return a Responses API response object."""
    return {
        "id": "resp_1", "object": "response", "created_at": 1, "model": model, "status": status,
        "output": [] if output is None else output,
        "incomplete_details": {"reason": incomplete} if incomplete else None, "error": error,
        "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4} if usage is None else usage,
    }


def message_item(text: str) -> dict[str, Any]:
    """Return a Responses ``message`` output item holding ``text``."""
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def function_call_item(call_id: str, name: str, arguments: str, item_id: str = "fc_1") -> dict[str, Any]:
    """Return a Responses ``function_call`` output item."""
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": "completed"}


def tool_call(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    """Return a wire tool call."""
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        out["id"] = call_id
    return out


class FakeOpenAI:
    """The scripted server's state, shared with its handler threads."""

    Reply = Reply
    completion = staticmethod(completion)
    tool_call = staticmethod(tool_call)
    chunk = staticmethod(chunk)
    sse = staticmethod(sse)
    response = staticmethod(response)
    message_item = staticmethod(message_item)
    function_call_item = staticmethod(function_call_item)

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/v1"
        self.seen: list[Seen] = []
        self._script: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()

    def enqueue(self, *replies: Reply | dict[str, Any]) -> None:
        """Queue answers; a dict is a 200 JSON body."""
        with self._lock:
            self._script.extend(r if isinstance(r, Reply) else Reply(body=r) for r in replies)

    def next_reply(self, seen: Seen) -> Reply:
        with self._lock:
            self.seen.append(seen)
            return self._script.popleft() if self._script else Reply(body=completion("ok"))

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
        text = "".join(e if isinstance(e, str) else f"data: {json.dumps(e)}\n\n" for e in reply.sse or ())
        payload = text.encode()
        if reply.split:
            pieces = [payload[i:i + reply.split] for i in range(0, len(payload), reply.split)]
        else:  # one piece per event
            pieces = [(e if isinstance(e, str) else f"data: {json.dumps(e)}\n\n").encode() for e in reply.sse or ()]
        chunked = reply.framing == "chunked"
        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        for piece in pieces:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            self.wfile.flush()
            if reply.pause:
                time.sleep(reply.pause)
        if reply.cut:
            self.close_connection = True
            return
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of 200 connections must not overflow the listen backlog
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and left; nothing to report


@pytest.fixture
def fake() -> Any:
    """A running fake Chat Completions server."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.fake = FakeOpenAI(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield server.fake
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def make_provider(fake: FakeOpenAI) -> Any:
    """Return a factory of providers pointed at ``fake``, with tiny retry delays."""

    def make(*, api_key: str | None = "sk-test", http_client: Any = None, **options: Any) -> OpenAIProvider:
        return OpenAIProvider(ProviderSettings(
            name="oa", kind="openai", base_url=fake.url, api_key=api_key, http_client=http_client,
            options={"retryBaseDelay": 0.001, **options},
        ))

    return make
