"""Slow clients against ``loopwright serve`` (issue 25, item 6): nobody holds the server open for free.

Before: a request head sent in part and never finished kept its connection open for as long as
the client liked (900 such connections stayed open past 40 s, bounded only by the descriptor
limit), and a body sent slowly held its request forever. Each test starts ``loopwright serve``
as a subprocess with small bounds under ``server:`` and plays the slow client on raw sockets.
A test fails if the attack succeeds: a half-sent head or body outlives its bound, a connection
beyond ``maxConnections`` is served, or the server stops answering well-behaved clients.
Timeouts are hang guards only.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "serve" / "tests"))
from _serve_testlib import clean_env, serve_command, serving

pytestmark = pytest.mark.slow

#: Seconds before a socket read counts as hung (a guard: the bounds under test are 1 s).
GUARD = 20.0


def _assembly(tmp: Path, server: str) -> Path:
    assembly = tmp / "loopwright.yaml"
    assembly.write_text("store: {kind: file, path: ./store}\nserver:\n" + server)
    return assembly


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=GUARD)
    sock.settimeout(GUARD)
    return sock


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Read until the server closes ``sock``; return what it sent and the seconds it took."""
    start, got = time.monotonic(), b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            got += chunk
    return got, time.monotonic() - start


@contextlib.contextmanager
def _sockets(url: str, count: int, first: bytes) -> Iterator[list[socket.socket]]:
    opened = []
    try:
        for _ in range(count):
            sock = _connect(url)
            if first:
                sock.sendall(first)
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _healthy(url: str) -> bool:
    return httpx.get(f"{url}/healthz", timeout=GUARD).status_code == 200


def test_a_head_never_finished_is_answered_408_and_closed_after_header_timeout(tmp_path: Path) -> None:
    with serving(_assembly(tmp_path, "  headerTimeout: 1s\n")) as server:
        sock = _connect(server.url)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the head's blank line never comes
        got, took = _read_until_closed(sock)
        assert got.startswith(b"HTTP/1.1 408"), got
        assert 0.8 < took < 6, took
        assert _healthy(server.url)


def test_dribbling_a_head_byte_by_byte_does_not_extend_the_deadline(tmp_path: Path) -> None:
    with serving(_assembly(tmp_path, "  headerTimeout: 1s\n")) as server:
        sock = _connect(server.url)
        start = time.monotonic()
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.05)  # 200 bytes at 20 a second: 10 s if each byte reset the clock
            if time.monotonic() - start > 8:
                break
        if not closed:
            got, _took = _read_until_closed(sock)
            assert got.startswith(b"HTTP/1.1 408"), got
        assert time.monotonic() - start < 6


def test_a_connection_that_sends_nothing_is_closed(tmp_path: Path) -> None:
    with serving(_assembly(tmp_path, "  headerTimeout: 1s\n")) as server:
        got, took = _read_until_closed(_connect(server.url))
        assert got.startswith(b"HTTP/1.1 408"), got
        assert took < 6


def test_hundreds_of_half_sent_heads_are_all_closed_and_the_server_keeps_serving(tmp_path: Path) -> None:
    """The attack as reported, scaled to CI: 300 half-sent heads; each is closed within its bound."""
    with serving(_assembly(tmp_path, "  headerTimeout: 1s\n")) as server, \
            _sockets(server.url, 300, b"POST /v1/instances HTTP/1.1\r\nHost: x\r\n") as slow:
        deadline = time.monotonic() + 10
        for sock in slow:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            got, _took = _read_until_closed(sock)
            assert got.startswith(b"HTTP/1.1 408"), got
        assert time.monotonic() < deadline + 1
        assert _healthy(server.url)


def test_a_connection_beyond_max_connections_is_answered_503_and_closed(tmp_path: Path) -> None:
    with serving(_assembly(tmp_path, "  maxConnections: 8\n  headerTimeout: 30s\n")) as server:
        with _sockets(server.url, 8, b"GET /healthz HTTP/1.1\r\n"):
            time.sleep(0.3)  # let the server accept them all
            extra = _connect(server.url)
            got, took = _read_until_closed(extra)
            assert got.startswith(b"HTTP/1.1 503"), got
            body = json.loads(got.split(b"\r\n\r\n", 1)[1])
            assert body["status"] == 503
            assert "maxConnections" in body["detail"]
            assert b"retry-after: 5" in got.lower()
            assert took < 5
        time.sleep(0.3)  # the slow ones are gone: room again
        assert _healthy(server.url)


def test_a_body_sent_too_slowly_is_answered_408_problem(tmp_path: Path) -> None:
    with serving(_assembly(tmp_path, "  bodyTimeout: 1s\n")) as server:
        sock = _connect(server.url)
        sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b'Content-Length: 100\r\n\r\n{"agent": ')  # 90 bytes never come
        start = time.monotonic()
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        assert got.startswith(b"HTTP/1.1 408"), got
        problem = json.loads(got.split(b"\r\n\r\n", 1)[1])
        assert problem["status"] == 408
        assert "bodyTimeout" in problem["detail"]
        assert time.monotonic() - start < 6
        sock.close()
        assert _healthy(server.url)


def test_well_behaved_slow_work_is_not_cut(tmp_path: Path) -> None:
    """Control: a client that sends its head and body in time is served, even on a kept-alive connection
    that rests longer than the head bound between requests (idle is the keep-alive bound's)."""
    with serving(_assembly(tmp_path, "  headerTimeout: 1s\n  bodyTimeout: 1s\n")) as server, \
            httpx.Client(base_url=server.url, timeout=GUARD) as client:
        assert client.get("/healthz").status_code == 200
        time.sleep(1.5)
        assert client.get("/healthz").status_code == 200
        started = client.post("/v1/instances", json={"agent": "nobody"})
        assert started.status_code in (400, 404, 422), started.text  # served, not cut: no such agent


def test_bad_bounds_are_config_errors(tmp_path: Path) -> None:
    for server, place in (("  maxConnections: 0\n", ":3:"), ("  headerTimeout: soon\n", ":3:"),
                          ("  bodyTimeout: -1\n", ":3:")):
        assembly = _assembly(tmp_path, server)
        proc = subprocess.run(serve_command(assembly), cwd=tmp_path, env=clean_env(), capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 2, (server, proc.stderr)
        assert f"  loopwright.yaml{place}" in proc.stderr, proc.stderr  # named relative to the working directory
