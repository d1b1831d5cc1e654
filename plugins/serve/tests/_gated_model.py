"""A fake OpenAI Chat Completions server that streams slowly, held at gates the test opens (issue 27).

Each request takes the next :class:`Streamed` reply of the queue: a list of steps, each a
piece of text, a :class:`Piece` of tool call, or a :class:`Gate`. The server writes and flushes
each chunk on its own (chunked transfer encoding, the vendor's SSE wire format); at a gate it
says so (:attr:`Gate.reached`) and writes nothing more until the test opens it. So a test knows,
by events and never by sleeping, that the model has not yet sent what comes after a gate when it
checks what its client received.

The server is the stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (a free port), run in a thread of
the test process; ``loopwright serve`` (a subprocess) reaches it as an ``openai`` provider with
``stream: true``.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

#: Seconds a gate or a request may be waited for before the test counts as hung (a guard only).
GUARD = 30.0


class Gate:
    """A point in a streamed reply where the server stops until the test opens it.

    Attributes:
        reached: Set once the server has written everything before the gate.
        opened: Set by :meth:`open`; the server writes the rest then.
    """

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def wait_reached(self) -> None:
        """Block until the server is held at this gate (fails after :data:`GUARD` seconds)."""
        assert self.reached.wait(GUARD), "the model server never reached the gate"

    def open(self) -> None:
        """Let the server write what follows the gate."""
        self.opened.set()


@attrs.frozen
class Piece:
    """A piece of a tool call: its start (``name`` and ``id``), or a piece of its JSON ``arguments``."""

    index: int
    arguments: str = ""
    name: str | None = None
    id: str | None = None


@attrs.frozen
class Streamed:
    """One streamed answer: its steps (text, :class:`Piece`, :class:`Gate`), then its finish and usage."""

    steps: Sequence[str | Piece | Gate]
    finish: str = "stop"


class GatedModel:
    """The server's state: the replies to give, and the request bodies received.

    Attributes:
        url: The ``baseUrl`` to give the provider (``http://127.0.0.1:PORT/v1``).
        bodies: Every request body received, in order.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.bodies: list[dict[str, Any]] = []
        self.replies: queue.Queue[Streamed] = queue.Queue()
        self.requested = threading.Semaphore(0)

    def enqueue(self, *replies: Streamed) -> None:
        """Give these replies to the next requests, in order."""
        for reply in replies:
            self.replies.put(reply)

    def wait_request(self) -> None:
        """Block until one more request arrived (fails after :data:`GUARD` seconds)."""
        assert self.requested.acquire(timeout=GUARD), "no request reached the model server"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-gated", "object": "chat.completion.chunk", "created": 1, "model": "gated-1",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _events(reply: Streamed) -> Iterator[dict[str, Any] | Gate]:
    yield _chunk({"role": "assistant", "content": ""})
    for step in reply.steps:
        if isinstance(step, Gate):
            yield step
        elif isinstance(step, Piece):
            call: dict[str, Any] = {"index": step.index, "function": {"arguments": step.arguments}}
            if step.name is not None:
                call.update(id=step.id or f"call_{step.index}", type="function")
                call["function"]["name"] = step.name
            yield _chunk({"tool_calls": [call]})
        else:
            yield _chunk({"content": step})
    yield _chunk({}, reply.finish)
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    yield {"id": "chatcmpl-gated", "object": "chat.completion.chunk", "created": 1, "model": "gated-1",
           "choices": [], "usage": usage}


def _handler(model: GatedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            model.bodies.append(body)
            model.requested.release()
            try:
                reply = model.replies.get(timeout=GUARD)
            except queue.Empty:
                reply = Streamed(["(no reply was scripted)"])
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for event in _events(reply):
                if isinstance(event, Gate):
                    event.reached.set()
                    if not event.opened.wait(GUARD):
                        break
                    continue
                self._write(f"data: {json.dumps(event)}\n\n".encode())
            self._write(b"data: [DONE]\n\n")
            self._write(b"")

        def _write(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


@contextmanager
def gated_model() -> Iterator[GatedModel]:
    """Run the fake model server until the block ends; yield its state."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(GatedModel("")))
    model = GatedModel(f"http://127.0.0.1:{server.server_address[1]}/v1")
    server.RequestHandlerClass = _handler(model)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield model
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
