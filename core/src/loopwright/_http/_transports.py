"""The two ``httpx.AsyncBaseTransport`` s of :mod:`loopwright.http` and the SSL context they share.

:class:`ShardedTransport` spreads requests over httpcore pools (any event loop);
:class:`AiohttpTransport` sends them over one ``aiohttp.ClientSession`` (asyncio only). The
module docstring of :mod:`loopwright.http` says why each exists and what they cost.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self

import httpx

if TYPE_CHECKING:
    import ssl
    from collections.abc import AsyncIterator

    import aiohttp
    from yarl import URL

__all__ = [
    "DEFAULT_POOL_SHARDS",
    "AiohttpTransport",
    "ShardedTransport",
    "environment_proxy",
    "httpx_error",
    "ssl_context",
]

#: The most connection pools a :class:`ShardedTransport` builds unless ``poolShards`` says otherwise.
DEFAULT_POOL_SHARDS = 64


# -- the sharded transport -------------------------------------------------------------------------


class ShardedTransport(httpx.AsyncBaseTransport):
    """Spreads requests over up to ``shards`` connection pools, least busy first.

    See the module docstring for why one httpx pool is not enough.

    Attributes:
        shards: The most pools it will build.

    """

    def __init__(
        self, *, shards: int, limits: httpx.Limits, verify: ssl.SSLContext | bool = True,
        proxy: str | None = None, trust_env: bool = True,
    ) -> None:
        """Prepare the transport; pools are built as concurrency needs them.

        :param shards: The most pools to build (1 behaves like a plain ``AsyncHTTPTransport``).
        :param limits: The limits of the whole transport; each pool gets ``1/shards`` of the
            connection counts (rounded up) and the same keep-alive expiry.
        :param verify: An SSL context shared by all pools, or a bool as httpx takes it.
        :param proxy: A proxy URL for every request, or ``None``.
        :param trust_env: Whether the SSL context may read ``SSL_CERT_FILE``/``SSL_CERT_DIR``.
        :raises ValueError: If ``shards`` is below 1.
        """
        if shards < 1:
            raise ValueError(f"shards must be >= 1, not {shards}")
        self.shards = shards
        self._limits = httpx.Limits(
            max_connections=_share(limits.max_connections, shards),
            max_keepalive_connections=_share(limits.max_keepalive_connections, shards),
            keepalive_expiry=limits.keepalive_expiry,
        )
        self._verify = verify
        self._proxy = proxy
        self._trust_env = trust_env
        self._pools: list[httpx.AsyncHTTPTransport] = []
        self._in_flight: list[int] = []

    def _add_pool(self) -> int:
        if isinstance(self._verify, bool):
            # One context for all pools: httpx would load the CA bundle (40 ms) per transport.
            self._verify = ssl_context(verify=self._verify, trust_env=self._trust_env)
        self._pools.append(httpx.AsyncHTTPTransport(
            verify=self._verify, limits=self._limits, proxy=self._proxy, trust_env=self._trust_env,
        ))
        self._in_flight.append(0)
        return len(self._pools) - 1

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the least busy pool.

        The request counts as in flight on its pool until the response body is closed.
        """
        loads = self._in_flight
        if loads and loads[0] == 0:
            index = 0  # the common case of a caller without concurrency
        else:
            least = min(loads, default=1)
            # Every pool busy and room for another: a new pool beats a busier one.
            index = self._add_pool() if least and len(loads) < self.shards else loads.index(least)
        loads[index] += 1
        try:
            response = await self._pools[index].handle_async_request(request)
        except BaseException:
            loads[index] -= 1
            raise
        response.stream = _CountedStream(response.stream, loads, index)
        return response

    async def aclose(self) -> None:
        """Close every pool."""
        pools, self._pools, self._in_flight = self._pools, [], []
        for pool in pools:
            await pool.aclose()


class _CountedStream(httpx.AsyncByteStream):
    """A response body that marks its pool's request finished when it is closed."""

    __slots__ = ("_index", "_loads", "_stream")

    def __init__(self, stream: Any, loads: list[int], index: int) -> None:
        self._stream = stream
        self._loads: list[int] | None = loads  # the transport's list at the time of the request
        self._index = index

    def __aiter__(self) -> AsyncIterator[bytes]:
        # The pool's own iterator, not a generator around it: one less frame per chunk.
        return self._stream.__aiter__()  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        loads, self._loads = self._loads, None
        if loads is not None:
            loads[self._index] -= 1
        await self._stream.aclose()


def ssl_context(*, verify: bool = True, trust_env: bool = True) -> ssl.SSLContext:
    """Return an SSL context as httpx builds it, made once per process and then shared.

    Loading the CA bundle takes about 40 ms; an SSL context may serve any number of
    connections, clients and threads.
    """
    return _ssl_context(verify, trust_env)  # one cache entry per value, however it is passed


@functools.cache
def _ssl_context(verify: bool, trust_env: bool) -> ssl.SSLContext:
    return httpx.create_ssl_context(verify=verify, trust_env=trust_env)


def _share(total: int | None, shards: int) -> int | None:
    return None if total is None else max(1, math.ceil(total / shards))


def environment_proxy(url: str) -> str | None:
    """Return the proxy the environment names for ``url``, or ``None``.

    Reads ``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY`` and ``NO_PROXY`` (either case), as
    httpx does; httpx applies them itself only when it builds the transport.
    """
    parsed = httpx.URL(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parsed.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parsed.host):
        return None
    return proxy


# -- the aiohttp transport -------------------------------------------------------------------------

#: Headers aiohttp would add to a request on its own. An ``httpx.Request`` already carries what
#: it should send (a client's ``Accept``, ``Accept-Encoding`` and ``User-Agent``; the caller's
#: ``Content-Type``), and a bare one must go out as built, as it does over httpcore.
_AIOHTTP_SKIP_HEADERS = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
_HTTP_SCHEMES = frozenset({"http", "https"})
_HTTP_VERSIONS: dict[Any, bytes] = {(1, 1): b"HTTP/1.1", (1, 0): b"HTTP/1.0"}
#: Frames of aiohttp that open a connection (a timeout inside one is a connect timeout).
_CONNECTING = frozenset({"_create_connection", "_create_direct_connection", "_create_proxy_connection",
                         "_wrap_create_connection"})
_WAITING_FOR_SLOT = "_wait_for_available_connection"


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests over one ``aiohttp.ClientSession``; asyncio only.

    See the module docstring for why (a request costs about half the CPU it costs over
    httpcore) and how it differs from :class:`ShardedTransport`. Requires aiohttp
    (``aiohttp>=3.10``), imported when the transport is built.

    The session and its ``TCPConnector`` are built inside the running event loop at the first
    request. A request from another event loop (the synchronous ``run_agent`` runs a new one per
    call) gets a new session; the old one is dropped, its connections closed as far as its loop
    still allows (none are awaited on the wrong loop). :meth:`aclose` closes the session; a
    later request builds a new one.

    What it sends is the ``httpx.Request`` as built: aiohttp adds no headers of its own, follows
    no redirects, keeps no cookies and leaves the body encoded (httpx decodes ``gzip`` and the
    other content encodings itself). The request's ``timeout`` extension applies: ``connect`` to
    opening a connection, ``read`` to each wait for the response and for each piece of its body,
    ``pool`` to the whole wait for a connection (a free slot, then opening it); aiohttp has no
    write timeout. The response body arrives piece by piece, as the network delivers it.

    Its failures are httpx's exceptions, so :func:`transport_error` reads them as it reads
    httpcore's: ``ConnectError`` (refused, unreachable, unknown host, TLS), ``ConnectTimeout``,
    ``PoolTimeout``, ``ReadTimeout``, ``RemoteProtocolError`` (the server closed the connection
    or broke the body off), ``ReadError`` (other network errors), ``ProxyError``,
    ``UnsupportedProtocol`` (not an ``http``/``https`` URL with a host) and ``LocalProtocolError``
    (a request aiohttp refuses to send); the original exception is the ``__cause__``. A task
    cancelled during the request or its body closes the connection: no half-read connection goes
    back to the pool.

    Attributes:
        limits: The connection limits: ``max_connections`` caps the connections in use (``None``:
            no cap) and ``keepalive_expiry`` how long an idle one is kept; aiohttp keeps every
            idle connection, so ``max_keepalive_connections`` does not apply.
        proxy: The proxy URL every request goes through, or ``None``.

    """

    def __init__(
        self, *, limits: httpx.Limits | None = None, verify: ssl.SSLContext | bool = True, proxy: str | None = None,
        trust_env: bool = True,
    ) -> None:
        """Prepare the transport; the session is built at the first request.

        :param limits: The connection limits (httpx's defaults when ``None``).
        :param verify: The SSL context for ``https`` (and ``CONNECT`` tunnels through the proxy),
            or a bool as httpx takes it (the shared :func:`ssl_context`).
        :param proxy: A proxy URL for every request, or ``None``. An ``http://`` proxy relays plain
            requests and tunnels ``https`` ones with ``CONNECT``; credentials may be in the URL.
        :param trust_env: Whether the SSL context may read ``SSL_CERT_FILE``/``SSL_CERT_DIR``.
        :raises ImportError: If aiohttp is not installed.
        """
        import aiohttp  # noqa: PLC0415 - only a provider that uses this transport pays for the import
        from yarl import URL  # noqa: PLC0415 - aiohttp's own URL type

        self._url_type: type[URL] = URL
        self.limits = limits if limits is not None else httpx.Limits()
        self.proxy = proxy
        self._proxy: URL | None = URL(proxy) if proxy else None
        self._verify = verify
        self._trust_env = trust_env
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client_timeout = aiohttp.ClientTimeout
        self._no_timeout = aiohttp.ClientTimeout()
        self._timeouts: dict[tuple[float | None, float | None, float | None], aiohttp.ClientTimeout] = {}

    def _open(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        """Build the session for ``loop``, dropping one built for another loop."""
        import aiohttp  # noqa: PLC0415 - imported by __init__ already

        self._drop()
        if isinstance(self._verify, bool):
            self._verify = ssl_context(verify=self._verify, trust_env=self._trust_env)
        limits = self.limits
        connector = aiohttp.TCPConnector(
            limit=limits.max_connections or 0, limit_per_host=0, keepalive_timeout=limits.keepalive_expiry,
            ssl=self._verify,
        )
        self._session = session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=_AIOHTTP_SKIP_HEADERS, timeout=self._no_timeout, trust_env=False,
        )
        self._loop = loop
        return session

    def _drop(self) -> None:
        """Forget the session without awaiting anything: its loop may be closed or elsewhere."""
        session, loop, self._session, self._loop = self._session, self._loop, None, None
        connector = session.connector if session is not None else None
        if connector is None or loop is None:
            return
        # ``BaseConnector._close`` is the synchronous part of ``close()``: it marks the connector
        # (and so the session) closed, which keeps their ``__del__`` quiet, and closes the
        # connections unless the loop is closed (their sockets then close when collected).
        if loop.is_running():  # in another thread
            loop.call_soon_threadsafe(connector._close)  # noqa: SLF001
        else:
            connector._close()  # noqa: SLF001

    def _timeout(self, timeout: Mapping[str, float | None] | None) -> aiohttp.ClientTimeout:
        """Return the aiohttp timeout for httpx's ``timeout`` extension, built once per set of values."""
        if not timeout:
            return self._no_timeout
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            if len(self._timeouts) >= 64:  # noqa: PLR2004 - a bound, not a tuning knob
                self._timeouts.clear()
            connect, read, pool = key
            found = self._timeouts[key] = self._client_timeout(
                total=None, connect=pool, sock_connect=connect, sock_read=read)
        return found

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return the response, its body not read yet.

        :raises httpx.TransportError: As the class docstring says.
        :raises RuntimeError: If no asyncio event loop is running (under trio, say).
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("AiohttpTransport needs asyncio; under trio use ShardedTransport") from None
        session = self._session
        if session is None or self._loop is not loop:
            session = self._open(loop)
        url = request.url
        if url.scheme not in _HTTP_SCHEMES or not url.host:
            raise httpx.UnsupportedProtocol(f"Request URL must be http:// or https:// with a host, not {url}",
                                            request=request)
        try:  # httpx's multi_items() works out the headers' encoding anew for each request
            headers = [(name.decode(), value.decode()) for name, value in request.headers.raw]
        except UnicodeDecodeError:
            headers = request.headers.multi_items()
        try:
            body: Any = request.content
        except httpx.RequestNotRead:  # a streaming body: aiohttp frames it itself
            body = request.stream
            headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
        try:
            response = await session.request(
                request.method, self._url_type(str(url), encoded=True), data=body or None, headers=headers,
                timeout=self._timeout(request.extensions.get("timeout")), proxy=self._proxy, allow_redirects=False,
            )
        except httpx.HTTPError:  # from a streaming request body, say: already httpx's
            raise
        except Exception as exc:
            raise httpx_error(exc, request) from exc
        return httpx.Response(
            response.status, headers=response.raw_headers, stream=_AiohttpStream(response, request),
            request=request, extensions={
                "http_version": _HTTP_VERSIONS.get(response.version, b"HTTP/1.1"),
                "reason_phrase": (response.reason or "").encode("ascii", "replace"),
            },
        )

    async def aclose(self) -> None:
        """Close the session (and its connections); a later request builds a new one."""
        session = self._session
        if session is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:  # closing belongs to the session's own loop
            self._drop()
            return
        self._session = self._loop = None
        await session.close()


class _AiohttpStream(httpx.AsyncByteStream):
    """The body of an aiohttp response, piece by piece as it arrives; closing releases it.

    Read to its end, the connection has already gone back to the pool; closed before that (or
    when reading fails or is cancelled), the connection is closed.
    """

    __slots__ = ("_content", "_request", "_response")

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._content = response.content
        self._request = request

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._content.readany()
        except BaseException as exc:
            self._response.close()
            if isinstance(exc, Exception) and not isinstance(exc, httpx.HTTPError):
                raise httpx_error(exc, self._request, reading=True) from exc
            raise
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self._response.close()  # a no-op for a body read to its end: aiohttp released it then


def httpx_error(exc: Exception, request: httpx.Request, *, reading: bool = False) -> httpx.HTTPError:  # noqa: PLR0911
    """Return the httpx exception that says what the aiohttp (or OS) exception ``exc`` means.

    :param reading: Whether ``exc`` came while reading the response body.
    """
    import aiohttp  # noqa: PLC0415 - imported by the transport already

    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return _connect_timeout(exc, message, request)
    if isinstance(exc, TimeoutError):  # SocketTimeoutError, ServerTimeoutError, a bare asyncio one
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError)):
        return httpx.ProxyError(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(exc, aiohttp.ClientSSLError):
        # Refused, unreachable, DNS: say it as httpx does, without aiohttp's "ssl:default" (which
        # it prints for a plain http:// URL too, and reads as a TLS problem).
        return httpx.ConnectError(_connect_message(exc), request=request)
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerFingerprintMismatch)):  # TLS
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message, request=request)
    if isinstance(exc, (aiohttp.ClientConnectionError, OSError)):  # resets, "Connection closed"
        return httpx.ReadError(message, request=request)
    if isinstance(exc, (ValueError, TypeError)) and not reading:  # a header or method aiohttp refuses
        return httpx.LocalProtocolError(message, request=request)
    return httpx.TransportError(message, request=request)


def _connect_message(exc: Any) -> str:
    """Return "cannot connect to HOST:PORT: REASON" for an aiohttp connector error."""
    error = exc.os_error
    number = getattr(error, "errno", None)
    if isinstance(number, int) and number > 0:
        reason = os.strerror(number)
    else:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return f"cannot connect to {exc.host}:{exc.port}: {reason}"


def _connect_timeout(exc: Exception, message: str, request: httpx.Request) -> httpx.TimeoutException:
    """Tell a timeout waiting for a free connection slot from one opening a connection.

    aiohttp raises ``ConnectionTimeoutError`` for both; the frames its cause went through show
    which wait it was.
    """
    frames: set[str] = set()
    seen: BaseException | None = exc.__cause__ or exc.__context__
    for _ in range(4):  # the TimeoutError, then the CancelledError it replaced
        if seen is None:
            break
        tb = seen.__traceback__
        while tb is not None:
            frames.add(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        seen = seen.__cause__ or seen.__context__
    if _WAITING_FOR_SLOT in frames and not frames & _CONNECTING:
        return httpx.PoolTimeout(message, request=request)
    return httpx.ConnectTimeout(message, request=request)
