#!/usr/bin/env python3
"""A small, fast, stateless fake OpenAI-compatible Chat Completions server for benchmarks.

    python bench/fake_server.py [--port 0] [--k 10] [--latency-ms 0]

With ``--port 0`` (the default) it binds a free port on 127.0.0.1 and prints ``PORT <n>`` on
stdout once it listens, so a parent process can read the port and start timing.

The script, per conversation, derived from the request alone (so any number of conversations
can run at once):

* ``turn`` = the number of messages with role ``tool`` in the request's ``messages``;
* ``turn < K``: an assistant message with one call of the first tool in ``tools`` (``add`` if
  there is none), arguments ``{"a":1,"b":2}``;
* otherwise: a final text containing ``FAKE_FINAL``.

K and the response latency default to the command-line values and can be set per conversation
by a marker anywhere in the body (normally in the user prompt): ``[[fake:k=5,latency_ms=50]]``.
A latency delays the response without blocking the server (other connections go on).

``GET /stats`` returns the counters and the server's own CPU seconds as JSON.

It is a bare ``asyncio.Protocol`` HTTP/1.1 server with keep-alive (on uvloop when it is
installed and ``--no-uvloop`` is not given): a request costs the server a few tens of
microseconds, and it runs as its own process so that its CPU is never counted as the client's.
Only ``Content-Length`` request bodies are supported (what httpx sends); no streaming.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time

MARKER = re.compile(rb"\[\[fake:([^\]]*)\]\]")
ARGS = '{"a":1,"b":2}'
FINAL_MARKER = "FAKE_FINAL"

STATS = {"requests": 0, "tool_call_responses": 0, "final_responses": 0, "connections": 0, "bad_requests": 0}


def _settings(body: bytes, k: int, latency: float) -> tuple[int, float]:
    m = MARKER.search(body)
    if m:
        for part in m.group(1).decode("ascii", "replace").split(","):
            key, _, value = part.partition("=")
            try:
                if key.strip() == "k":
                    k = int(value)
                elif key.strip() in ("latency_ms", "lat"):
                    latency = float(value) / 1000.0
            except ValueError:
                pass
    return k, latency


def completion(body: bytes, default_k: int, default_latency: float) -> tuple[bytes, float]:
    """Return the response body and its latency for one chat.completions request body."""
    req = json.loads(body)
    k, latency = _settings(body, default_k, default_latency)
    turn = sum(1 for m in req.get("messages") or () if isinstance(m, dict) and m.get("role") == "tool")
    tools = req.get("tools") or ()
    name = "add"
    if tools and isinstance(tools[0], dict):
        name = (tools[0].get("function") or {}).get("name") or name
    STATS["requests"] += 1
    seq = STATS["requests"]
    if turn < k:
        STATS["tool_call_responses"] += 1
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{turn}_{seq}", "type": "function", "function": {"name": name, "arguments": ARGS}}]}
        finish, out_tokens = "tool_calls", 12
    else:
        STATS["final_responses"] += 1
        message = {"role": "assistant", "content": f"{FINAL_MARKER}: the sum is 3 (after {turn} tool results)."}
        finish, out_tokens = "stop", 16
    in_tokens = max(1, len(body) // 4)
    payload = {
        "id": f"chatcmpl-fake{seq}", "object": "chat.completion", "created": int(time.time()),
        "model": req.get("model") or "fake", "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": in_tokens, "completion_tokens": out_tokens,
                  "total_tokens": in_tokens + out_tokens},
    }
    return json.dumps(payload, separators=(",", ":")).encode(), latency


def _response(status: str, payload: bytes, keep_alive: bool) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        f"connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode("latin-1") + payload


class _Protocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; responses leave in request order, each after its latency."""

    def __init__(self, k: int, latency: float) -> None:
        self.k = k
        self.latency = latency
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.pending: list[tuple[float, bytes, bool]] = []  # (ready at, bytes, close after)
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        STATS["connections"] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        del exc
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            try:
                method, target, _version = head[0].split(" ", 2)
            except ValueError:
                method, target = "?", "?"
            keep = headers.get("connection", "").lower() != "close"
            self._answer(method, target.split("?", 1)[0], body, keep)

    def _answer(self, method: str, path: str, body: bytes, keep: bool) -> None:
        latency = 0.0
        if method == "POST" and path.endswith("/chat/completions"):
            try:
                payload, latency = completion(body, self.k, self.latency)
                out = _response("200 OK", payload, keep)
            except Exception as exc:  # noqa: BLE001 - a bad request must not stop the server
                STATS["bad_requests"] += 1
                out = _response("400 Bad Request", json.dumps(
                    {"error": {"message": f"fake server: {exc!r}", "type": "invalid_request_error"}}).encode(), keep)
        elif method == "GET" and path == "/stats":
            out = _response("200 OK", json.dumps({**STATS, "cpu_s": time.process_time()}).encode(), keep)
        else:
            out = _response("404 Not Found", b'{"error":{"message":"not found"}}', keep)
        if latency <= 0 and not self.pending:
            self._write(out, not keep)
            return
        ready = self.loop.time() + latency
        if self.pending:
            ready = max(ready, self.pending[-1][0])  # keep responses in request order
        self.pending.append((ready, out, not keep))
        if self.timer is None:
            self.timer = self.loop.call_at(ready, self._flush)

    def _write(self, out: bytes, close: bool) -> None:
        if self.transport is not None:
            self.transport.write(out)
            if close:
                self.transport.close()

    def _flush(self) -> None:
        self.timer = None
        now = self.loop.time()
        while self.pending and self.pending[0][0] <= now + 1e-4:
            _, out, close = self.pending.pop(0)
            self._write(out, close)
        if self.pending:
            self.timer = self.loop.call_at(self.pending[0][0], self._flush)


async def serve(host: str, port: int, k: int, latency_ms: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(k, latency_ms / 1000.0), host, port,
                                      backlog=4096, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)
    sys.stderr.write(f"fake_server: http://{host}:{bound}/v1 (k={k}, latency_ms={latency_ms:g}, "
                     f"loop={type(loop).__module__})\n")
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = a free port (printed as 'PORT n')")
    ap.add_argument("--k", type=int, default=10, help="tool-call turns before the final answer")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="delay of every response")
    ap.add_argument("--no-uvloop", action="store_true")
    args = ap.parse_args(argv)
    if not args.no_uvloop:
        try:
            import uvloop  # noqa: PLC0415

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.k, args.latency_ms))


if __name__ == "__main__":
    main()
