"""Tests of loopwright.http.AiohttpTransport against real local HTTP servers, and of choosing it.

The transport's own tests run under asyncio only; those that compare it with the httpcore one,
or check what ``transport: auto`` picks, run under trio too. The server is the stdlib
``ThreadingHTTPServer`` on 127.0.0.1, HTTP/1.1 with keep-alive; each path is one behaviour (see
:class:`_Handler`), and it records the client port of each request, one per connection. The
proxy is a second such server that relays what it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import gzip
import http.client
import json
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio
import attrs
import httpx
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from loopwright.errors import ProviderError
from loopwright.http import (
    AiohttpTransport,
    Endpoint,
    HTTPOptions,
    ShardedTransport,
    _httpx_error,
    make_client,
    ssl_context,
)

pytestmark = pytest.mark.anyio

T = TypeVar("T")


@pytest.fixture
def anyio_backend() -> str:
    """aiohttp runs on asyncio only."""
    return "asyncio"


@attrs.frozen(kw_only=True)
class Seen:
    """One request a server received."""

    target: str
    peer: int
    headers: list[tuple[str, str]]
    body: bytes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:
        body = self._body()
        self.server.seen.append(Seen(target=self.path, peer=self.client_address[1],
                                     headers=list(self.headers.items()), body=body))
        path = self.path.rsplit("/", 1)[-1]
        getattr(self, f"_{path}", self._echo)(body)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") == "chunked":
            out = b""
            while size := int(self.rfile.readline().strip(), 16):
                out += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return out
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, body: bytes, *headers: tuple[str, str], status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _echo(self, body: bytes) -> None:
        self._send(json.dumps({"body": body.decode(), "peer": self.client_address[1]}).encode(),
                   ("Content-Type", "application/json"))

    def _sse(self, body: bytes) -> None:
        """Two events, the second only once the test has seen the first (or after 5 s)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (b"data: one\n\n", b"data: two\n\n"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            self.server.release.wait(5)
        self.wfile.write(b"0\r\n\r\n")

    def _slow(self, body: bytes) -> None:
        time.sleep(0.5)
        self._echo(body)

    def _cut(self, body: bytes) -> None:
        """Promise 100 bytes, send 10, hang up."""
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b"data: 1\n\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _gzip(self, body: bytes) -> None:
        self._send(gzip.compress(b'{"zipped": true}'), ("Content-Type", "application/json"),
                   ("Content-Encoding", "gzip"))

    def _redirect(self, body: bytes) -> None:
        self._send(b"moved", ("Location", "/v1/echo"), status=302)

    def _reason(self, body: bytes) -> None:
        self.send_response(418, "Short And Stout")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


class _Proxy(BaseHTTPRequestHandler):
    """Relays an absolute-form request to its target, as an HTTP proxy does."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(Seen(target=self.path, peer=self.client_address[1],
                                     headers=list(self.headers.items()), body=body))
        url = httpx.URL(self.path)
        upstream = http.client.HTTPConnection(url.host, url.port)
        upstream.request("POST", url.raw_path.decode(), body=body,
                         headers={k: v for k, v in self.headers.items() if k.lower() != "proxy-connection"})
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        upstream.close()

    def do_CONNECT(self) -> None:
        """Open a tunnel to ``host:port`` and pipe bytes both ways until either side hangs up."""
        self.server.seen.append(Seen(target=self.path, peer=self.client_address[1],
                                     headers=list(self.headers.items()), body=b""))
        host, port = self.path.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as upstream:
            self.send_response(200, "Connection established")
            self.end_headers()
            ends = {self.connection: upstream, upstream: self.connection}
            while True:
                readable, _, _ = select.select(list(ends), [], [], 5)
                chunks = [(sock, sock.recv(65536)) for sock in readable]
                if not readable or not all(data for _, data in chunks):
                    break
                for sock, data in chunks:
                    ends[sock].sendall(data)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    seen: list[Seen]
    release: threading.Event

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up on purpose


def _serve(handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None) -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.seen = []
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    yield from _serve(_Handler)


@pytest.fixture
def proxy() -> Iterator[_Server]:
    yield from _serve(_Proxy)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made with the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", str(key),
                    "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_server(certificate: tuple[Path, Path]) -> Iterator[_Server]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    yield from _serve(_Handler, tls=context)


@pytest.fixture
def trusting(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    """A client SSL context that trusts the test certificate."""
    return ssl.create_default_context(cafile=str(certificate[0]))


def url(server: _Server, path: str = "echo", scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{server.server_address[1]}/v1/{path}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[T], T]]:
    """Return ``register(x)``: ``x.aclose()`` is awaited at the end of the test, passed or failed."""
    opened: list[Any] = []

    def register(thing: T) -> T:
        opened.append(thing)
        return thing

    yield register
    for thing in reversed(opened):
        await thing.aclose()


def endpoint(target: str, **options: Any) -> Endpoint:
    options.setdefault("max_retries", 0)
    return Endpoint(target, provider="p", options=HTTPOptions(transport="aiohttp", **options), headers={})


def in_use(transport: AiohttpTransport) -> int:
    """The connections the transport's pool has handed out and not had back."""
    assert transport._session is not None
    return len(transport._session.connector._acquired)


# -- requests and responses ------------------------------------------------------------------------


async def test_the_server_sees_the_headers_httpcore_would_send(server):
    """aiohttp adds, drops and duplicates no header: the server sees what it sees over httpcore."""
    headers = {"Authorization": "Bearer k", "Content-Type": "application/json", "X-Trace": "1"}
    clients = [httpx.AsyncClient(transport=AiohttpTransport(), headers=headers),
               httpx.AsyncClient(transport=ShardedTransport(shards=1, limits=httpx.Limits()), headers=headers)]
    for client in clients:
        async with client:
            response = await client.post(url(server), content=b'{"a": 1}')
            assert response.json()["body"] == '{"a": 1}'
    over_aiohttp, over_httpcore = (sorted((k.lower(), v) for k, v in s.headers) for s in server.seen)
    assert over_aiohttp == over_httpcore
    assert ("user-agent", f"python-httpx/{httpx.__version__}") in over_aiohttp
    assert [k for k, _ in over_aiohttp].count("content-type") == 1


async def test_a_bare_request_goes_out_as_built(server, closing):
    """Without a client's default headers, aiohttp adds no User-Agent, Accept or Content-Type of its own."""
    transport = closing(AiohttpTransport())
    response = await transport.handle_async_request(httpx.Request("POST", url(server), content=b"x"))
    await response.aread()
    await transport.aclose()
    names = sorted(k.lower() for k, _ in server.seen[0].headers)
    assert names == ["content-length", "host"]
    assert response.request.content == b"x"


async def test_sequential_requests_reuse_one_kept_alive_connection(server):
    """One request at a time goes over the same connection, handed back after each body."""
    async with httpx.AsyncClient(transport=AiohttpTransport()) as client:
        for i in range(4):
            response = await client.post(url(server), content=str(i).encode())
            assert response.json()["body"] == str(i)
        assert in_use(client._transport) == 0
    assert len({s.peer for s in server.seen}) == 1


async def test_keepalive_expiry_closes_idle_connections(server):
    """An idle connection older than keepalive_expiry is not reused."""
    transport = AiohttpTransport(limits=httpx.Limits(keepalive_expiry=0.05))
    async with httpx.AsyncClient(transport=transport) as client:
        await client.post(url(server), content=b"1")
        await anyio.sleep(0.2)
        await client.post(url(server), content=b"2")
    first, second = (s.peer for s in server.seen)
    assert first != second


async def test_server_sent_events_arrive_as_they_are_sent(server):
    """The first event reaches the caller while the server still holds back the second."""
    with anyio.fail_after(60):  # a hang guard: the server sends the second event only once released
        async with httpx.AsyncClient(transport=AiohttpTransport()) as client:
            ep = Endpoint(url(server, "sse"), provider="p", options=HTTPOptions(), headers={}, client=client)
            response = await ep.send(b"{}", model="m", stream=True)
            events = ep.events(response, model="m")
            first = await anext(events)
            assert not server.release.is_set()
            server.release.set()
            rest = [event async for event in events]
            await response.aclose()
    assert [first.data, *(e.data for e in rest)] == ["one", "two"]


async def test_gzip_bodies_are_decoded_by_httpx(server, closing):
    """aiohttp leaves the body encoded; httpx decodes the gzip."""
    ep = closing(endpoint(url(server, "gzip")))
    response = await ep.send(b"{}", model="m")
    await ep.aclose()
    assert response.json() == {"zipped": True}
    assert response.headers["content-encoding"] == "gzip"


async def test_a_redirect_is_returned_not_followed(server):
    """A 302 comes back as it is; nothing is sent to its Location."""
    async with httpx.AsyncClient(transport=AiohttpTransport()) as client:
        response = await client.post(url(server, "redirect"), content=b"{}")
    assert (response.status_code, response.headers["location"], len(server.seen)) == (302, "/v1/echo", 1)


async def test_status_reason_and_version_reach_the_response(server):
    """The reason phrase and HTTP version are httpx's extensions, as httpcore sets them."""
    async with httpx.AsyncClient(transport=AiohttpTransport()) as client:
        response = await client.post(url(server, "reason"), content=b"{}")
    assert (response.status_code, response.reason_phrase, response.http_version) == (
        418, "Short And Stout", "HTTP/1.1")


async def test_a_streaming_request_body_is_sent_chunked(server):
    """A request body from an async iterator goes out with chunked framing."""

    async def pieces():
        for piece in (b'{"a": ', b"1}"):
            yield piece

    async with httpx.AsyncClient(transport=AiohttpTransport()) as client:
        response = await client.post(url(server), content=pieces())
    assert response.json()["body"] == '{"a": 1}'
    assert ("Transfer-Encoding", "chunked") in server.seen[0].headers


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_endpoint_fast_path_response(server, anyio_backend):
    """Over its own client (either transport), Endpoint.send returns what AsyncClient.send would."""
    ep = Endpoint(url(server), provider="p", options=HTTPOptions(), headers={"X-Key": "k"})
    response = await ep.send(b'{"q": 1}', model="m")
    streamed = await ep.send(b"{}", model="m", stream=True)
    assert not streamed.is_closed
    await ep.read(streamed, model="m")
    teapot = Endpoint(url(server, "reason"), provider="p", options=HTTPOptions(), headers={})
    with pytest.raises(ProviderError, match=r"\(HTTP 418\): Short And Stout") as info:
        await teapot.send(b"{}", model="m", stream=True)
    await teapot.aclose()
    client = ep.client
    await ep.aclose()
    assert isinstance(client._transport, AiohttpTransport if anyio_backend == "asyncio" else ShardedTransport)
    assert (response.is_closed, response.json()["body"], response.request.url) == (True, '{"q": 1}', url(server))
    assert (response.encoding, streamed.json()["body"], streamed.request.content) == ("utf-8", "{}", b"{}")
    assert (info.value.status, info.value.request.url) == (418, url(server, "reason"))
    headers = {k.lower(): v for k, v in server.seen[0].headers}
    assert (headers["x-key"], headers["user-agent"]) == ("k", f"python-httpx/{httpx.__version__}")
    assert client.is_closed


# -- failures ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_refused_connection_is_a_transient_connection_failure(closing):
    """Nothing listening (over either transport): ConnectError, 'the connection failed', transient."""
    ep = closing(Endpoint(f"http://127.0.0.1:{free_port()}/v1", provider="p", options=HTTPOptions(max_retries=0),
                          headers={}))
    with pytest.raises(ProviderError, match=r"the connection failed \(ConnectError: ") as info:
        await ep.send(b"{}", model="m")
    await ep.aclose()
    assert info.value.transient
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert info.value.request is not None


async def test_an_unknown_host_is_a_connection_failure():
    """A name that does not resolve is a ConnectError too."""
    transport = AiohttpTransport()
    with pytest.raises(httpx.ConnectError):
        await transport.handle_async_request(httpx.Request("POST", "http://no-such-host.invalid/v1"))
    await transport.aclose()


async def test_a_slow_answer_is_a_transient_timeout(server, closing):
    """No answer within the read timeout: ReadTimeout, 'the request timed out', transient."""
    ep = closing(endpoint(url(server, "slow"), timeout=0.1))
    with pytest.raises(ProviderError, match=r"the request timed out \(ReadTimeout") as info:
        await ep.send(b"{}", model="m")
    await ep.aclose()
    assert info.value.transient


async def test_a_body_cut_short_is_a_stream_that_broke_off(server, closing):
    """The server hangs up mid-body: RemoteProtocolError, 'the stream broke off', transient."""
    ep = closing(endpoint(url(server, "cut")))
    response = await ep.send(b"{}", model="m", stream=True)
    with pytest.raises(ProviderError, match=r"the stream broke off \(RemoteProtocolError: ") as info:
        async for _ in ep.events(response, model="m"):
            pass
    await response.aclose()
    await ep.aclose()
    assert info.value.transient
    assert isinstance(info.value.__cause__.__cause__, Exception)  # aiohttp's own, kept as the cause


async def test_waiting_too_long_for_a_free_connection_is_a_pool_timeout(server, closing):
    """With every connection in use, the pool timeout gives PoolTimeout; the connect timeout does not apply."""
    transport = closing(AiohttpTransport(limits=httpx.Limits(max_connections=1)))
    timeout = httpx.Timeout(5.0, pool=0.1).as_dict()
    held = closing(await transport.handle_async_request(
        httpx.Request("POST", url(server, "sse"), extensions={"timeout": timeout})))
    with pytest.raises(httpx.PoolTimeout):
        await transport.handle_async_request(httpx.Request("POST", url(server), extensions={"timeout": timeout}))
    await held.aclose()
    response = await transport.handle_async_request(httpx.Request("POST", url(server)))
    await response.aread()
    await transport.aclose()
    assert len(server.seen) == 2


async def test_a_connection_that_is_never_accepted_is_a_connect_timeout():
    """A listener whose backlog is full never completes the handshake: ConnectTimeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        pending = []
        for _ in range(8):  # fill the backlog; further SYNs are dropped
            sock = socket.socket()
            sock.setblocking(False)  # noqa: FBT003 - the stdlib's signature
            with contextlib.suppress(BlockingIOError):
                sock.connect(listener.getsockname())
            pending.append(sock)
        transport = AiohttpTransport()
        timeout = httpx.Timeout(5.0, connect=0.2).as_dict()
        try:
            with pytest.raises(httpx.ConnectTimeout):
                await transport.handle_async_request(httpx.Request(
                    "POST", f"http://127.0.0.1:{listener.getsockname()[1]}/", extensions={"timeout": timeout}))
        finally:
            await transport.aclose()
            for sock in pending:
                sock.close()


async def test_a_url_that_is_not_http_is_refused_before_sending(closing):
    """ftp:// is UnsupportedProtocol: 'could not be sent', final."""
    transport = closing(AiohttpTransport())
    with pytest.raises(httpx.UnsupportedProtocol):
        await transport.handle_async_request(httpx.Request("POST", "ftp://127.0.0.1/x"))
    ep = closing(endpoint("ftp://127.0.0.1/x"))
    with pytest.raises(ProviderError, match="the request could not be sent") as info:
        await ep.send(b"{}", model="m")
    assert not info.value.transient


def _proxy_refusal() -> Exception:
    info = aiohttp.RequestInfo(URL("http://h"), "CONNECT", CIMultiDictProxy(CIMultiDict()), URL("http://h"))
    return aiohttp.ClientHttpProxyError(info, (), status=407, message="Proxy Authentication Required")


@pytest.mark.parametrize(("failure", "reading", "expected"), [
    (aiohttp.ServerDisconnectedError(), False, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError("not complete"), True, httpx.RemoteProtocolError),
    (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), True, httpx.ReadTimeout),
    (TimeoutError(), False, httpx.ReadTimeout),
    (aiohttp.ClientOSError(104, "Connection reset by peer"), True, httpx.ReadError),
    (aiohttp.ClientConnectionError("Connection closed"), True, httpx.ReadError),
    (_proxy_refusal(), False, httpx.ProxyError),
    (aiohttp.InvalidURL("http://[x"), False, httpx.UnsupportedProtocol),
    (ValueError("Newline or carriage return character detected in HTTP header"), False, httpx.LocalProtocolError),
    (RuntimeError("?"), False, httpx.TransportError),
], ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None)
def test_aiohttp_failures_map_to_httpx_exceptions(failure, reading, expected):
    """Each aiohttp (or OS) failure becomes the httpx exception transport_error reads the same way."""
    request = httpx.Request("POST", "http://h/v1")
    mapped = _httpx_error(failure, request, reading=reading)
    assert type(mapped) is expected
    assert mapped.request is request


async def test_timeouts_are_built_once_per_set_of_values(closing):
    """The same timeout values give the same aiohttp ClientTimeout: one per set, not per request."""
    transport = closing(AiohttpTransport())
    first = transport._timeout(httpx.Timeout(3.0, connect=1.0).as_dict())
    assert transport._timeout(httpx.Timeout(3.0, connect=1.0).as_dict()) is first
    assert (first.sock_read, first.sock_connect, first.connect, first.total) == (3.0, 1.0, 3.0, None)
    assert transport._timeout(httpx.Timeout(4.0).as_dict()) is not first
    assert transport._timeout(None) is transport._timeout({})


# -- concurrency, cancellation, event loops ---------------------------------------------------------


async def test_200_concurrent_requests_all_succeed(server):
    """A burst of 200 concurrent requests completes over many connections, all handed back."""
    bodies: list[str] = []
    async with httpx.AsyncClient(transport=AiohttpTransport(limits=httpx.Limits(max_connections=1000))) as client:

        async def one(i: int) -> None:
            response = await client.post(url(server), content=str(i).encode())
            bodies.append(response.json()["body"])

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(one, i)
        assert in_use(client._transport) == 0
    assert sorted(bodies, key=int) == [str(i) for i in range(200)]
    assert len({s.peer for s in server.seen}) > 1


async def test_max_connections_caps_the_connections_in_use(server):
    """With max_connections 2, ten concurrent requests queue for two connections."""
    client = httpx.AsyncClient(transport=AiohttpTransport(limits=httpx.Limits(max_connections=2)))
    async with client, anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(functools.partial(client.post, url(server), content=str(i).encode()))
    assert len(server.seen) == 10
    assert len({s.peer for s in server.seen}) == 2


async def test_cancelling_mid_body_closes_the_connection_and_leaves_the_pool_usable(server):
    """A task cancelled while reading a body closes that connection; the next request gets a fresh one."""
    transport = AiohttpTransport()
    got_first = anyio.Event()

    async def read_stream() -> None:
        response = await transport.handle_async_request(httpx.Request("POST", url(server, "sse")))
        async for _ in response.stream:
            got_first.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_stream)
        await got_first.wait()
        assert in_use(transport) == 1
        tg.cancel_scope.cancel()
    assert in_use(transport) == 0
    response = await transport.handle_async_request(httpx.Request("POST", url(server)))
    await response.aread()
    await transport.aclose()
    cancelled, after = server.seen
    assert after.peer != cancelled.peer  # the half-read connection did not go back to the pool


async def test_cancelling_before_the_answer_leaves_the_pool_usable(server, closing):
    """A task cancelled while waiting for the response headers frees its connection."""
    transport = closing(AiohttpTransport())
    with anyio.move_on_after(0.1):
        await transport.handle_async_request(httpx.Request("POST", url(server, "slow")))
    assert in_use(transport) == 0
    response = await transport.handle_async_request(httpx.Request("POST", url(server)))
    await response.aread()
    await transport.aclose()
    assert response.status_code == 200


def test_each_event_loop_gets_its_own_session(server, caplog):
    """Used from a second asyncio.run, the transport builds a new session and quietly drops the old one."""
    transport = AiohttpTransport()

    async def one() -> Any:
        response = await transport.handle_async_request(httpx.Request("POST", url(server), content=b"x"))
        await response.aread()
        assert response.json()["body"] == "x"
        return transport._session

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = asyncio.run(one())
        second = asyncio.run(one())
        assert second is not first
        assert first.closed  # so neither it nor its connector complains when collected
        asyncio.run(transport.aclose())  # from a third loop: dropped, not awaited
        assert second.closed
        del first, second
        gc.collect()  # the dropped sessions, and their idle sockets (closed now, with asyncio's ResourceWarning)
    assert not [w for w in caught if "Unclosed" in str(w.message)]  # aiohttp's own, about sessions and connectors
    assert "Unclosed" not in caplog.text  # nor its error log
    assert len(server.seen) == 2


async def test_aclose_closes_the_session_and_a_later_request_opens_another(server, closing):
    """aclose closes the session; the transport still serves a later request."""
    transport = closing(AiohttpTransport())
    response = await transport.handle_async_request(httpx.Request("POST", url(server)))
    await response.aread()
    session = transport._session
    await transport.aclose()
    assert session.closed
    response = await transport.handle_async_request(httpx.Request("POST", url(server)))
    await response.aread()
    await transport.aclose()
    assert response.status_code == 200


# -- proxies -------------------------------------------------------------------------------------------


async def test_an_explicit_proxy_relays_the_requests(server, proxy, closing):
    """With the proxy option, requests go to the proxy in absolute form, and it relays them."""
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
    ep = closing(endpoint(url(server), proxy=proxy_url))
    response = await ep.send(b'{"via": "proxy"}', model="m")
    await ep.aclose()
    assert response.json()["body"] == '{"via": "proxy"}'
    assert [s.target for s in proxy.seen] == [url(server)]
    assert len(server.seen) == 1


async def test_the_environment_proxy_is_used(server, proxy, monkeypatch, closing):
    """Without the option, HTTP_PROXY from the environment is used."""
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.delenv("http_proxy", raising=False)
    ep = closing(endpoint(url(server)))
    response = await ep.send(b"{}", model="m")
    await ep.aclose()
    assert response.status_code == 200
    assert [s.target for s in proxy.seen] == [url(server)]


async def test_a_proxy_that_refuses_is_a_proxy_error(server, closing):
    """A proxy that does not answer is ProxyError: 'the connection failed', transient."""
    ep = closing(endpoint(url(server), proxy=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(ProviderError, match=r"the connection failed \(ProxyError: ") as info:
        await ep.send(b"{}", model="m")
    await ep.aclose()
    assert info.value.transient
    assert not server.seen


async def test_https_with_a_trusted_certificate(tls_server, trusting, closing):
    """TLS to the server works with an SSL context that trusts its certificate."""
    transport = closing(AiohttpTransport(verify=trusting))
    response = await transport.handle_async_request(
        httpx.Request("POST", url(tls_server, scheme="https"), content=b"x"))
    await response.aread()
    assert response.json()["body"] == "x"


async def test_https_with_an_untrusted_certificate_is_a_connect_error(tls_server, closing):
    """The default context does not trust a self-signed certificate: ConnectError, nothing sent."""
    transport = closing(AiohttpTransport())
    with pytest.raises(httpx.ConnectError, match="certificate"):
        await transport.handle_async_request(httpx.Request("POST", url(tls_server, scheme="https")))
    assert not tls_server.seen


async def test_https_through_a_proxy_is_tunnelled_with_connect(tls_server, proxy, trusting, closing):
    """An https request through an http proxy goes through a CONNECT tunnel, TLS end to end."""
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
    transport = closing(AiohttpTransport(verify=trusting, proxy=proxy_url))
    for body in (b"1", b"2"):
        response = await transport.handle_async_request(
            httpx.Request("POST", url(tls_server, scheme="https"), content=body))
        await response.aread()
        assert response.json()["body"] == body.decode()
    assert [s.target for s in proxy.seen] == [f"127.0.0.1:{tls_server.server_address[1]}"]  # one tunnel, kept alive
    assert len(tls_server.seen) == 2


def test_the_transport_uses_the_shared_ssl_context():
    """verify=True means the process-wide SSL context, loaded once."""
    transport = AiohttpTransport()
    asyncio.run(_open_and_close(transport))
    assert transport._verify is ssl_context()


async def _open_and_close(transport: AiohttpTransport) -> None:
    transport._open(asyncio.get_running_loop())
    await transport.aclose()


# -- choosing the transport --------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_httpcore_option_means_the_sharded_transport_everywhere(server, anyio_backend):
    """transport: httpcore gives a ShardedTransport under asyncio too."""
    ep = Endpoint(url(server), provider="p", options=HTTPOptions(transport="httpcore"), headers={})
    response = await ep.send(b"{}", model="m")
    transport = ep.client._transport
    await ep.aclose()
    assert isinstance(transport, ShardedTransport)
    assert response.json()["body"] == "{}"


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_aiohttp_option_under_trio_fails_at_the_first_request(server):
    """transport: aiohttp under trio is a final ProviderError saying aiohttp needs asyncio; nothing is sent."""
    ep = Endpoint(url(server), provider="p", options=HTTPOptions(transport="aiohttp"), headers={})
    with pytest.raises(ProviderError, match="the aiohttp transport needs asyncio, not trio") as info:
        await ep.send(b"{}", model="m")
    assert (info.value.transient, ep.client, server.seen) == (False, None, [])
    with pytest.raises(RuntimeError, match="needs asyncio"):
        make_client(HTTPOptions(transport="aiohttp"), url=url(server), headers={})


async def test_auto_without_aiohttp_falls_back_to_httpcore(server, monkeypatch):
    """Without aiohttp installed, auto is the sharded transport and aiohttp a final error."""
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # import aiohttp now raises ImportError
    client = make_client(HTTPOptions(), url=url(server), headers={})
    assert isinstance(client._transport, ShardedTransport)
    await client.aclose()
    ep = Endpoint(url(server), provider="p", options=HTTPOptions(transport="aiohttp"), headers={})
    with pytest.raises(ProviderError, match="the aiohttp transport needs the aiohttp package") as info:
        await ep.send(b"{}", model="m")
    assert not info.value.transient


async def test_make_client_chooses_by_the_running_loop(server):
    """make_client under asyncio gives aiohttp for auto; outside any loop auto stays on httpcore."""
    client = make_client(HTTPOptions(), url=url(server), headers={"X-A": "1"})
    assert isinstance(client._transport, AiohttpTransport)
    response = await client.post(url(server), content=b"{}")
    await client.aclose()
    assert response.json()["body"] == "{}"
    assert isinstance(make_client(HTTPOptions(), url=url(server), headers={}, transport="httpcore")._transport,
                      ShardedTransport)
    outside = await anyio.to_thread.run_sync(lambda: make_client(HTTPOptions(), url=url(server), headers={}))
    assert isinstance(outside._transport, ShardedTransport)
