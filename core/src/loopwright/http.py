r"""HTTP scaffolding for provider plugins that talk to a model API over httpx.

**Requires httpx** (``httpx>=0.28``), which the core does not depend on: a provider distribution
that uses this module lists httpx among its own dependencies, and aiohttp (``aiohttp>=3.10``) too
for the faster transport under asyncio. ``import loopwright`` never imports this module; a
provider imports it, ideally only when it first builds a provider, so that loading the plugin
stays cheap; aiohttp is imported only when an :class:`AiohttpTransport` is built. The OpenAI and
Anthropic providers are built on it.

What it holds, each usable on its own:

- Two ``httpx.AsyncBaseTransport`` s: :class:`AiohttpTransport` (asyncio only, the default there)
  and :class:`ShardedTransport` (httpcore pools; any event loop), both holding up under
  hundreds of concurrent requests (httpx 0.28's own pool does not; the sections below say why),
  and :func:`make_client`, which builds an ``httpx.AsyncClient`` on one from :class:`HTTPOptions`.
- :class:`OptionReader` and :class:`HTTPOptions`: reading and checking a provider's options
  (``timeout``, ``connectTimeout``, ``maxConnections``, ``maxKeepaliveConnections``,
  ``keepaliveExpiry``, ``transport``, ``poolShards``, ``proxy``, ``headers``, ``maxRetries``,
  ``retryBaseDelay``, ``retryMaxDelay``), every problem reported in one :class:`~loopwright.errors.ConfigError` with
  its JSON path (``$.providers.NAME.KEY``); durations are seconds or ``500ms``/``30s``/``2m``/``2h``.
- :func:`status_error` and :func:`transport_error`: an error status or an httpx exception turned
  into a :class:`~loopwright.errors.ProviderError`, transient where a retry may help (408, 409,
  429, every 5xx including Anthropic's 529, timeouts, refused or reset connections; an
  ``x-should-retry`` header overrides), with ``retry_after`` from ``retry-after-ms`` or
  ``Retry-After``. Reading the API's own message out of an error body is vendor-specific: pass
  a ``describe`` callback.
- :class:`SSEDecoder`: server-sent events, from the bytes of a body to :class:`SSEEvent` s.
- :class:`Endpoint`: all of the above for one URL a provider POSTs to, with the client's
  lifetime (an injected ``settings.http_client`` is used and left open; one it builds is closed
  by :meth:`Endpoint.aclose`), the choice of transport (made at the first request, by the event
  loop running it) and retries (:meth:`Endpoint.retry`, :meth:`Endpoint.post`).

A provider's wire format (encoding requests, decoding answers and stream events) stays in the
provider. A minimal provider on this module::

    from loopwright.http import Endpoint, HTTPOptions, OptionReader, check_base_url

    class MyProvider(Provider):
        def __init__(self, settings: ProviderSettings) -> None:
            self.settings = settings
            reader = OptionReader(settings)
            options = HTTPOptions.read(reader)
            reader.check()  # raises one ConfigError listing every bad option
            url = check_base_url(settings, default="https://api.example.com") + "/v1/complete"
            self._http = Endpoint(url, provider=settings.name, options=options,
                                  headers={"Authorization": f"Bearer {settings.api_key}"},
                                  client=settings.http_client, describe_error=my_error_message)

        async def complete(self, request: ModelRequest) -> ModelResponse:
            response = await self._http.post(encode(request), model=request.model)
            return decode(response.json())  # retried transient failures, raised the others

        async def aclose(self) -> None:
            await self._http.aclose()

The transports
--------------

The ``transport`` option chooses what carries httpx's requests: ``auto`` (the default) is an
:class:`AiohttpTransport` when the first request runs under asyncio and aiohttp is installed,
and a :class:`ShardedTransport` otherwise (under trio, or without aiohttp); ``aiohttp`` insists
on the first (under trio the first request fails with a final ``ProviderError`` saying so) and
``httpcore`` on the second. Either way the provider sees an ``httpx.AsyncClient`` and
``httpx.Response`` s, and failures as httpx's exceptions, so :func:`transport_error` reports them
alike. The reason is CPU per request, measured against a local fake OpenAI server (CPython 3.11):

==========================================================================  ============
client                                                                      CPU/request
==========================================================================  ============
``httpx.AsyncClient`` over httpcore                                          ~610 µs
httpcore's connection pool alone                                             ~420 µs
``httpx.AsyncClient`` over an aiohttp-backed transport                       ~390 µs
``aiohttp.ClientSession`` alone                                              ~190 µs
==========================================================================  ============

and handing a prebuilt ``httpx.Request`` to the transport's ``handle_async_request`` (skipping
``AsyncClient.build_request`` and ``send``) saves another 70-150 µs, which is what
:class:`Endpoint` does with a client it built itself: ``Endpoint.send`` then costs about 250 µs
over aiohttp and 480 µs over the sharded httpcore pools. In a burst of 200 concurrent runs (the
shared benchmark below), an httpx client over an aiohttp transport took 0.56 s, over
:class:`ShardedTransport` 0.95 s, and ``httpx2`` 1.3 s.

Differences that remain between the two: aiohttp caps the connections *in use*
(``maxConnections``) but keeps every idle one until ``keepaliveExpiry``, so
``maxKeepaliveConnections`` and ``poolShards`` apply to httpcore only; aiohttp has no write
timeout, its connect timeout covers the TCP (and TLS) handshake but not the DNS lookup (the
``timeout`` covers that, as the wait for a connection), and it caches DNS answers for 10 s;
neither transport keeps cookies when used by :class:`Endpoint` (an ``httpx.AsyncClient`` used
directly does, over either). The aiohttp session belongs to one event loop: a request from
another loop builds a new session and drops the old one without awaiting anything (its idle
sockets close when collected, with a ``ResourceWarning`` if those are shown).

The sharded transport
---------------------

httpx 0.28 runs on httpcore 1.0, whose connection pool re-examines *every* connection on every
request and every release (``AsyncConnectionPool._assign_requests_to_connections``), and for
each idle connection also builds a list of all connections (a quadratic step;
encode/httpcore#1035) and polls its socket (``has_expired``). The cost of one request thus grows
with the square of the number of open connections. Measured with the shared benchmark's fake
server (200 concurrent runs of 6 turns, 50 ms server latency, 127.0.0.1, CPython 3.11):

========================================================================  ======
client                                                                    wall
========================================================================  ======
raw ``httpx.AsyncClient`` loop, 1000 connections / 100 kept alive          13.2 s
same, 1000 / 1000 (no keep-alive eviction churn, see below)                9.5 s
same, 100 / 100 (requests queue for connections)                           13.0 s
raw ``httpx2`` loop, 1000 / 100                                            1.5 s
raw ``httpx.AsyncClient`` loop over this transport, 64 shards              1.05 s
``OpenAIProvider`` loop, defaults (64 shards)                              1.1 s
``OpenAIProvider`` loop, ``poolShards: 1`` (one plain pool)                8.2 s
========================================================================  ======

No choice of ``httpx.Limits`` alone avoids it: a higher ``max_connections`` stops requests
queueing but the per-request cost still grows with the pool. So the pool is split into
*shards*: independent ``httpx.AsyncHTTPTransport`` s, each with ``1/shards`` of the limits, and a
request goes to the shard with the fewest requests in flight. Each shard's pool stays small, so
its bookkeeping stays cheap. Shards are built on demand (a new one only when every built one is
busy), so a sequential caller uses one shard and one warm connection, as before; the default is
64 shards at most. The shards share one SSL context, so building them costs no certificate
loading. The price: loads are balanced only approximately, so a burst opens somewhat more
connections than its peak concurrency (about 260 for the 200 runs above), which then stay alive
for reuse.

Keep-alive: httpcore 1.0 compares ``max_keepalive_connections`` with the number of *all*
connections, not the idle ones (encode/httpcore#1035, bug 1), so a pool holding more connections
than that limit closes every connection that falls idle, and the next request reconnects. The
default therefore keeps as many connections alive as it may open (``maxKeepaliveConnections``
defaults to ``maxConnections``); idle ones still close after ``keepalive_expiry``.

.. versionadded:: 0.1
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, Self, TypeVar, overload

import attrs
import httpx

from loopwright._arguments import argument_problem, dumps_for_raw, loads_arguments
from loopwright._duration import parse_duration as _parse_duration
from loopwright._retry import parse_retry_after, retry_transient
from loopwright.errors import ConfigError, ConfigProblem, ProviderError

if TYPE_CHECKING:
    import ssl
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

    import aiohttp
    from yarl import URL

    from loopwright.abc import ProviderSettings

__all__ = [
    "DEFAULT_POOL_SHARDS",
    "TRANSIENT_STATUSES",
    "TRANSPORTS",
    "AiohttpTransport",
    "Endpoint",
    "HTTPOptions",
    "OptionReader",
    "SSEDecoder",
    "SSEEvent",
    "ShardedTransport",
    "ToolsCache",
    "check_base_url",
    "environment_proxy",
    "is_transient_status",
    "make_client",
    "override_headers",
    "parse_duration",
    "parse_tool_arguments",
    "require_api_key",
    "resolve_api_key",
    "ssl_context",
    "status_error",
    "transport_error",
]

#: The most connection pools a :class:`ShardedTransport` builds unless ``poolShards`` says otherwise.
DEFAULT_POOL_SHARDS = 64

#: The values of the ``transport`` option: ``auto`` picks ``aiohttp`` under asyncio (when aiohttp is
#: installed), ``httpcore`` otherwise (see the module docstring).
TRANSPORTS = ("auto", "aiohttp", "httpcore")

#: HTTP statuses below 500 that a retry may fix (every 5xx may too, see :func:`is_transient_status`).
TRANSIENT_STATUSES = frozenset({408, 409, 429})

T = TypeVar("T")

_SERVER_ERROR = 500
_logger = logging.getLogger("httpx")  # the fast path of Endpoint.send logs what AsyncClient.send would


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
            raise _httpx_error(exc, request) from exc
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
                raise _httpx_error(exc, self._request, reading=True) from exc
            raise
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self._response.close()  # a no-op for a body read to its end: aiohttp released it then


def _httpx_error(exc: Exception, request: httpx.Request, *, reading: bool = False) -> httpx.HTTPError:  # noqa: PLR0911
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


# -- options -------------------------------------------------------------------------------------


def parse_duration(value: Any) -> float | None:
    """Return ``value`` as seconds, or ``None`` if it is not a duration.

    The grammar is loopwright's one duration grammar (:func:`loopwright.parse_duration`): a finite
    number of seconds (>= 0, not a boolean), a numeric string, or number-unit pairs with units
    ``ms``, ``s``, ``m`` and ``h`` (``"500ms"``, ``"30s"``, ``"2m"``, ``"1m30s"``).
    """
    try:
        return _parse_duration(value)
    except ValueError:
        return None


class OptionReader:
    """Reads a provider's options, collecting every problem for one :class:`ConfigError`.

    Each reader method returns the value, or its default after recording a problem at the
    option's JSON path (``$.providers.NAME.KEY``); :meth:`check` raises them all at once::

        reader = OptionReader(settings)
        api = reader.choice("api", ("chat", "responses"), "chat")
        options = HTTPOptions.read(reader)
        reader.check()

    Attributes:
        name: The provider's name in the assembly.
        options: The options as written (``ProviderSettings.options``).
        problems: The problems found so far.

    """

    def __init__(self, settings: ProviderSettings) -> None:
        """Read the options of ``settings``."""
        self.name = settings.name
        self.options: Mapping[str, Any] = settings.options
        self.problems: list[ConfigProblem] = []

    def path(self, key: str) -> str:
        """Return the JSON path of option ``key``."""
        return f"$.providers.{self.name}.{key}"

    def problem(self, key: str, message: str) -> None:
        """Record a problem with option ``key``."""
        self.problems.append(ConfigProblem(message, path=self.path(key)))

    def check(self) -> None:
        """Raise the problems found, if any.

        :raises ConfigError: Naming the provider and listing every problem.
        """
        if self.problems:
            raise ConfigError(f"invalid options for provider {self.name!r}", problems=self.problems)

    @overload
    def integer(self, key: str, default: int, minimum: int, *, nullable: Literal[False] = False) -> int: ...

    @overload
    def integer(self, key: str, default: int | None, minimum: int, *, nullable: bool) -> int | None: ...

    def integer(self, key: str, default: int | None, minimum: int, *, nullable: bool = False) -> int | None:
        """Return option ``key``, an integer >= ``minimum`` (or ``None`` when ``nullable``)."""
        value = self.options.get(key, default)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            null = " or null" if nullable else ""
            self.problem(key, f"must be an integer >= {minimum}{null}, not {value!r}")
            return default
        return value

    @overload
    def duration(self, key: str, default: float, *, nullable: Literal[False] = False) -> float: ...

    @overload
    def duration(self, key: str, default: float | None, *, nullable: bool) -> float | None: ...

    def duration(self, key: str, default: float | None, *, nullable: bool = False) -> float | None:
        """Return option ``key`` in seconds (see :func:`parse_duration`), or ``None`` when ``nullable``."""
        value = self.options.get(key, default)
        if value is None and nullable:
            return None
        seconds = parse_duration(value)
        if seconds is None:
            self.problem(key, f"must be a duration (seconds, or a string such as '500ms', '30s', '2m'), "
                              f"not {value!r}")
            return default
        return seconds

    def text(self, key: str, default: str | None = None) -> str | None:
        """Return option ``key``, a string, or ``default`` when it is absent."""
        value = self.options.get(key, default)
        if value is not None and not isinstance(value, str):
            self.problem(key, f"must be a string, not {value!r}")
            return default
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        """Return option ``key``, one of ``choices``."""
        value = self.options.get(key, default)
        if value not in choices:
            self.problem(key, f"must be one of {', '.join(choices)}, not {value!r}")
            return default
        return str(value)

    def headers(self, key: str = "headers") -> dict[str, str]:
        """Return option ``key``, a mapping of header names to strings (``{}`` when absent)."""
        headers = self.options.get(key) or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            self.problem(key, "must map header names to strings")
            return {}
        return dict(headers)


@attrs.frozen(kw_only=True)
class HTTPOptions:
    """The options every HTTP provider takes (camelCase keys in the assembly).

    A provider with more options subclasses it (``@attrs.frozen(kw_only=True)``) and passes its
    own to :meth:`read`.

    Attributes:
        max_retries: ``maxRetries``: retries of a transient failure (default 2).
        retry_base_delay: ``retryBaseDelay``: first backoff delay (default 0.5 s).
        retry_max_delay: ``retryMaxDelay``: longest backoff delay (default 30 s).
        timeout: ``timeout``: read/write/pool timeout, ``None`` for none (default 600 s).
        connect_timeout: ``connectTimeout``: connect timeout (default 5 s).
        headers: ``headers``: extra request headers.
        max_connections: ``maxConnections``: most open connections (default 1000).
        max_keepalive_connections: ``maxKeepaliveConnections``: most idle connections kept
            (default: ``maxConnections``; see the module docstring for why); httpcore only
            (aiohttp keeps every idle connection until ``keepaliveExpiry``).
        keepalive_expiry: ``keepaliveExpiry``: how long an idle connection is kept (default 5 s).
        pool_shards: ``poolShards``: most connection pools to spread requests over (default 64;
            1 for a single plain pool); httpcore only.
        transport: ``transport``: the HTTP stack under httpx, one of :data:`TRANSPORTS`: ``auto``
            (default: :class:`AiohttpTransport` under asyncio when aiohttp is installed, else
            :class:`ShardedTransport`), ``aiohttp`` or ``httpcore``.
        proxy: ``proxy``: a proxy URL; by default the environment's (``HTTPS_PROXY`` ...).
        timeout_set: Whether ``timeout`` or ``connectTimeout`` was given (they then apply to
            an injected client too).

    """

    max_retries: int = 2
    retry_base_delay: float = 0.5
    retry_max_delay: float = 30.0
    timeout: float | None = 600.0
    connect_timeout: float | None = 5.0
    headers: Mapping[str, str] = attrs.field(factory=dict)
    max_connections: int | None = 1000
    max_keepalive_connections: int | None = None
    keepalive_expiry: float | None = 5.0
    pool_shards: int = DEFAULT_POOL_SHARDS
    transport: str = "auto"
    proxy: str | None = None
    timeout_set: bool = False

    @classmethod
    def read(cls, reader: OptionReader, **fields: Any) -> Self:
        """Read the shared options with ``reader`` and return them with ``fields`` (a subclass's own).

        Problems are recorded on ``reader``; call :meth:`OptionReader.check` afterwards.
        """
        opts = reader.options
        headers = reader.headers()
        max_connections = reader.integer("maxConnections", 1000, 1, nullable=True)
        return cls(
            max_retries=reader.integer("maxRetries", 2, 0),
            retry_base_delay=reader.duration("retryBaseDelay", 0.5),
            retry_max_delay=reader.duration("retryMaxDelay", 30.0),
            timeout=reader.duration("timeout", 600.0, nullable=True),
            connect_timeout=reader.duration("connectTimeout", 5.0, nullable=True),
            headers=headers,
            max_connections=max_connections,
            max_keepalive_connections=reader.integer("maxKeepaliveConnections", max_connections, 0, nullable=True),
            keepalive_expiry=reader.duration("keepaliveExpiry", 5.0, nullable=True),
            pool_shards=reader.integer("poolShards", DEFAULT_POOL_SHARDS, 1),
            transport=reader.choice("transport", TRANSPORTS, "auto"),
            proxy=reader.text("proxy"),
            timeout_set="timeout" in opts or "connectTimeout" in opts,
            **fields,
        )

    def httpx_timeout(self) -> httpx.Timeout:
        """Return ``timeout`` and ``connectTimeout`` as an ``httpx.Timeout``."""
        return httpx.Timeout(self.timeout, connect=self.connect_timeout)

    def httpx_limits(self) -> httpx.Limits:
        """Return the connection limits as an ``httpx.Limits`` (for the whole transport)."""
        return httpx.Limits(
            max_connections=self.max_connections,
            max_keepalive_connections=self.max_keepalive_connections,
            keepalive_expiry=self.keepalive_expiry,
        )


def check_base_url(settings: ProviderSettings, *, default: str) -> str:
    """Return ``settings.base_url`` (or ``default``) without a trailing slash, checked.

    :raises ConfigError: If it is not an ``http://`` or ``https://`` URL with a host; the
        problem's path is ``$.providers.NAME.baseUrl``.
    """
    base_url = (settings.base_url or default).rstrip("/")
    try:
        parsed = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        reason = str(exc)
    else:
        if parsed.scheme in ("http", "https") and parsed.host:
            return base_url
        reason = "must be an http:// or https:// URL"
    raise ConfigError(f"invalid baseUrl for provider {settings.name!r}", problems=[ConfigProblem(
        f"{reason}, not {base_url!r}", path=f"$.providers.{settings.name}.baseUrl")])


def resolve_api_key(settings: ProviderSettings, env: str) -> str | None:
    """Return ``settings.api_key``; without one, the variable ``env`` if no ``baseUrl`` is set.

    The environment's key is for the vendor's own server only: it is never sent to a ``baseUrl``
    the assembly chose. An empty variable counts as unset.
    """
    if settings.api_key is None and settings.base_url is None:
        return os.environ.get(env) or None
    return settings.api_key


def require_api_key(settings: ProviderSettings, env: str, headers: Mapping[str, str], *,
                    url: str, auth_headers: Sequence[str] = ("authorization",)) -> None:
    """Refuse to call the vendor's own server without a key: raise a ConfigError naming ``env``.

    Call it when the provider is built, so that nothing is dialled: with no ``baseUrl``, no
    ``apiKey``/``apiKeyEnv``, ``env`` unset (or empty) and none of ``auth_headers`` among the
    configured ``headers``, every request would be refused (or, offline, fail on the network).

    :param url: The vendor's endpoint, for the message.
    :raises ConfigError: The key is missing.
    """
    if settings.base_url is not None or settings.api_key is not None or os.environ.get(env):
        return
    wanted = {h.lower() for h in auth_headers}
    if any(name.lower() in wanted for name in headers):
        return
    raise ConfigError(
        f"provider {settings.name!r}: the environment variable {env} is not set",
        problems=[ConfigProblem(
            f"{url} needs an API key: set {env}, or give the provider apiKeyEnv (or a baseUrl for a "
            f"server that needs no key)", path=f"$.providers.{settings.name}")])


def override_headers(headers: dict[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """Add ``extra`` to ``headers`` (in place), each replacing any header of the same name in any case."""
    for name, value in extra.items():
        for existing in [k for k in headers if k.lower() == name.lower()]:
            del headers[existing]
        headers[name] = value
    return headers


def make_client(
    options: HTTPOptions, *, url: str, headers: Mapping[str, str], transport: str | None = None,
) -> httpx.AsyncClient:
    """Return an ``httpx.AsyncClient`` for requests to ``url``, over the transport the options choose.

    :param options: Limits, shards, proxy (by default the environment's for ``url``), timeouts
        and the transport.
    :param url: The endpoint: it chooses the environment's proxy, and plain ``http://`` without a
        proxy skips loading the CA bundle.
    :param headers: Headers sent with every request.
    :param transport: One of :data:`TRANSPORTS`, instead of ``options.transport``. ``auto`` gives an
        :class:`AiohttpTransport` when called under asyncio with aiohttp installed, a
        :class:`ShardedTransport` otherwise (under trio, or outside any event loop).
    :raises RuntimeError: For ``aiohttp`` under another event loop than asyncio's, or without aiohttp.
    """
    kind = _transport_kind(options.transport if transport is None else transport)
    return httpx.AsyncClient(transport=_build_transport(options, url=url, kind=kind), headers=headers,
                             timeout=options.httpx_timeout())


def _transport_kind(choice: str) -> Literal["aiohttp", "httpcore"]:
    """Return the transport ``choice`` (one of :data:`TRANSPORTS`) means here and now.

    :raises RuntimeError: If ``choice`` is ``aiohttp`` and aiohttp cannot serve.
    """
    if choice == "httpcore":
        return "httpcore"
    if choice not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {choice!r}")
    library = _async_library()
    if library not in ("asyncio", None):
        if choice == "auto":
            return "httpcore"
        raise RuntimeError(f"the aiohttp transport needs asyncio, not {library} (use transport: auto or httpcore)")
    try:
        import aiohttp  # noqa: F401, PLC0415 - the transport's own import, made here to choose
    except ImportError as exc:
        if choice == "auto":
            return "httpcore"
        raise RuntimeError(f"the aiohttp transport needs the aiohttp package ({exc})") from exc
    if library is None and choice == "auto":
        return "httpcore"  # no event loop to judge by: the transport that serves both
    return "aiohttp"


def _async_library() -> str | None:
    """Return the async library running this code (``asyncio``, ``trio`` ...), or ``None``."""
    try:
        import sniffio  # noqa: PLC0415 - a dependency of trio: without it, only asyncio can run
    except ImportError:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return "asyncio"
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def _build_transport(options: HTTPOptions, *, url: str, kind: str) -> httpx.AsyncBaseTransport:
    """Return the transport of kind ``aiohttp`` or ``httpcore`` for requests to ``url``."""
    proxy = options.proxy or environment_proxy(url)
    # Plain http without a proxy never uses TLS: skip loading the CA bundle.
    plain = proxy is None and url.startswith("http://")
    verify = ssl_context(verify=False) if plain else ssl_context()
    if kind == "aiohttp":
        return AiohttpTransport(limits=options.httpx_limits(), proxy=proxy, verify=verify)
    return ShardedTransport(shards=options.pool_shards, limits=options.httpx_limits(), proxy=proxy, verify=verify)


# -- errors --------------------------------------------------------------------------------------


def is_transient_status(status: int) -> bool:
    """Return whether a retry may fix a response with HTTP ``status`` (408, 409, 429, any 5xx)."""
    return status in TRANSIENT_STATUSES or status >= _SERVER_ERROR


def status_error(
    response: httpx.Response, *, provider: str, model: str | None,
    describe: Callable[[Any], str | None] | None = None, request_id_header: str | None = None,
) -> ProviderError:
    """Return the :class:`ProviderError` for an error status; the response must have been read.

    The message is what ``describe`` finds in the JSON body (the vendor's error format), else the
    body's first 300 characters, else the reason phrase; ``request_id_header`` names a response
    header whose value is appended as ``(request ID)``. The error is transient as
    :func:`is_transient_status` says, unless the server sent ``x-should-retry: true|false``, and
    carries the server's ``retry-after-ms``/``Retry-After`` and the whole body (cut to 2,000
    characters by ``ProviderError``).

    :param describe: Called with the parsed JSON body; returns the API's message, or ``None``.
    """
    status = response.status_code
    text = response.text
    message = None
    if describe is not None and text:
        try:
            message = describe(json.loads(text))
        except ValueError:
            message = None
    if message is None:
        message = text.strip()[:300] or response.reason_phrase or "request failed"
    request_id = response.headers.get(request_id_header) if request_id_header else None
    if request_id:
        message += f" (request {request_id})"
    transient = is_transient_status(status)
    should_retry = response.headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        transient = should_retry == "true"
    return ProviderError(
        message, provider=provider, model=model, status=status, body=text,
        retry_after=parse_retry_after(response.headers), transient=transient, request=response.request,
    )


def transport_error(exc: Exception, *, provider: str, model: str | None, stream: bool = False) -> ProviderError:
    """Return the :class:`ProviderError` for an httpx exception raised while sending or reading.

    Timeouts and transport failures (refused, reset or dropped connections, protocol errors from
    the server, proxies) are transient; a request that could not be built or sent as asked
    (``UnsupportedProtocol``, ``LocalProtocolError``, ``InvalidURL``) and any other httpx error
    are final. The message says what failed and names the exception.

    :param stream: Whether the failure came while reading a streamed body: the message then
        says the stream timed out or broke off.
    """
    if isinstance(exc, httpx.TimeoutException):
        what, transient = ("the stream timed out" if stream else "the request timed out"), True
    elif isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL)):
        what, transient = "the request could not be sent", False
    elif isinstance(exc, httpx.TransportError):  # network errors, resets, RemoteProtocolError, proxies
        what, transient = ("the stream broke off" if stream else "the connection failed"), True
    else:
        what, transient = ("the stream failed" if stream else "the request failed"), False
    detail = str(exc)
    detail = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    try:
        request = exc.request  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when it has none
        request = None
    return ProviderError(f"{what} ({detail})", provider=provider, model=model, transient=transient, request=request)


def _has_request(exc: httpx.RequestError) -> bool:
    try:
        exc.request  # noqa: B018 - httpx raises RuntimeError when it has none
    except RuntimeError:
        return False
    return True


def _body_text(response: httpx.Response) -> str | None:
    try:
        return response.text
    except httpx.ResponseNotRead:
        return None


# -- server-sent events --------------------------------------------------------------------------


class SSEEvent(NamedTuple):
    r"""One server-sent event.

    Attributes:
        event: Its ``event:`` name, ``None`` when the stream gave none.
        data: Its ``data:`` lines, joined with ``\n``.
    """

    event: str | None
    data: str


_new_event = tuple.__new__  # SSEEvent(...) without the generated __new__'s Python call
_LF, _CR = 10, 13


class SSEDecoder:
    r"""Turns the body of one ``text/event-stream`` response into events; keep one per response.

    Follows the WHATWG "event stream interpretation": lines end with ``\r\n``, ``\n`` or ``\r``
    (also when a network read splits them, or splits a UTF-8 character); a blank line ends an
    event; ``event:`` names it; ``data:`` lines join with ``\n``; one space after the colon is
    dropped; lines starting with ``:`` are comments (keep-alives); ``id:``, ``retry:`` and unknown
    fields are ignored; an event without data is dropped; so is an event the body ends before
    its blank line. :meth:`feed` takes bytes, :meth:`decode` one line already split off.

    With ``is_whole``, the decoder also copes with servers that leave out the blank lines: a
    ``data:`` line arriving while the pending data is already whole (as ``is_whole`` judges it,
    for example "parses as JSON") first dispatches the pending event, and a whole event pending
    at the end of the body is kept. With well-formed streams the pending data is empty at that
    point, so this costs nothing.
    """

    __slots__ = ("_data", "_event", "_is_whole", "_skip_lf", "_started", "_tail")

    def __init__(self, *, is_whole: Callable[[str], bool] | None = None) -> None:
        """Start with no pending event.

        :param is_whole: Whether pending data is a whole event, for streams without blank lines.
        """
        self._is_whole = is_whole
        self._event: str | None = None
        self._data: list[str] = []
        self._tail = b""
        self._skip_lf = False
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next piece of the body; return the events it completes."""
        if not chunk:
            return []
        if self._skip_lf:  # the previous piece ended with \r: a \n now is the same line break
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._tail:
            chunk = self._tail + chunk
        end = chunk[-1]
        if end in (_LF, _CR):
            self._tail = b""
            self._skip_lf = end == _CR
        else:  # keep the unfinished last line for the next piece
            cut = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1
            self._tail = chunk[cut:]
            if not cut:
                return []
            chunk = chunk[:cut]
        # Whole lines only, so no UTF-8 character is cut (\r and \n never occur inside one).
        return self._lines(chunk.decode("utf-8", "replace"))

    def finish(self) -> list[SSEEvent]:
        """Take the end of the body; return the events still due (only with ``is_whole``)."""
        tail, self._tail = self._tail, b""
        events = self._lines(tail.decode("utf-8", "replace") + "\n") if tail else []  # a last line without a break
        if self._data and self._pending_is_whole():
            events.append(self._dispatch())
        return events

    def _lines(self, text: str) -> list[SSEEvent]:
        """Decode ``text``, whole lines each ending with a line break."""
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")  # a byte order mark may open the stream
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        events = []
        decode = self.decode
        for line in text[:-1].split("\n"):
            event = decode(line)
            if event is not None:
                events.append(event)
        return events

    def decode(self, line: str) -> SSEEvent | None:
        """Take one line (without its line break); return the event it completes, if any."""
        if not line:
            if not self._data:
                self._event = None
                return None
            return self._dispatch()
        if line[0] == ":":  # a comment (keep-alive)
            return None
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "data":
            event = self._dispatch() if self._data and self._pending_is_whole() else None
            self._data.append(value)
            return event
        if field == "event":
            self._event = value
        return None

    def _pending_is_whole(self) -> bool:
        return self._is_whole is not None and self._is_whole("\n".join(self._data))

    def _dispatch(self) -> SSEEvent:
        event = _new_event(SSEEvent, (self._event, "\n".join(self._data)))
        self._event = None
        self._data = []
        return event


# -- one endpoint --------------------------------------------------------------------------------

_UNSET: Any = object()


class Endpoint:
    """One URL a provider POSTs to, with the HTTP client, headers, options and retries it needs.

    The client is ``client`` when one was injected (``settings.http_client``), used with this
    endpoint's headers (and timeouts, when the options set them) on each request and never closed
    here; otherwise one is built at the first request, as :func:`make_client` builds it (the
    ``transport`` option is decided then, by the event loop running it), and :meth:`aclose`
    closes it. Requests over a client built here skip ``AsyncClient.send``: each is built from
    the client's headers and timeouts, computed once, and handed to its transport directly (the
    client would add only cookie handling, which an API client does not need, and event hooks,
    which it has none of). Every failure comes out as a :class:`~loopwright.errors.ProviderError`.

    Attributes:
        url: The URL requests go to.
        provider: The provider's name, for errors.
        options: The HTTP options.
        client: The client in use: the injected one, or the one built on first use (``None``
            before that and after :meth:`aclose`).

    """

    def __init__(
        self, url: str, *, provider: str, options: HTTPOptions, headers: Mapping[str, str],
        client: httpx.AsyncClient | None = None, describe_error: Callable[[Any], str | None] | None = None,
        request_id_header: str | None = None,
    ) -> None:
        """Prepare the endpoint; nothing is connected or built yet.

        :param url: Where :meth:`send` posts.
        :param provider: The provider's name in the assembly (``settings.name``).
        :param options: Timeouts, limits, proxy and retries.
        :param headers: Headers for every request.
        :param client: An injected client to use and leave open, or ``None`` to build one.
        :param describe_error: Finds the API's message in a parsed error body (see :func:`status_error`).
        :param request_id_header: A response header whose value error messages quote.
        """
        self.url = url
        self.provider = provider
        self.options = options
        self.client = client
        self._headers = dict(headers)
        self._owns_client = client is None
        self._describe = describe_error
        self._request_id_header = request_id_header
        # Keyword arguments of each request: none with our own client (it carries headers and
        # timeouts), the headers (and any configured timeout) with an injected one.
        self._request_kwargs: dict[str, Any] = {}
        if not self._owns_client:
            self._request_kwargs["headers"] = self._headers
            if options.timeout_set:
                self._request_kwargs["timeout"] = options.httpx_timeout()
        # With our own client: its transport, and what each request is built from.
        self._transport: httpx.AsyncBaseTransport | None = None
        self._target = httpx.URL()
        self._send_headers = httpx.Headers()
        self._extensions: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Endpoint({self.url!r}, provider={self.provider!r})"

    async def send(self, content: bytes, *, model: str | None, stream: bool = False, check: bool = True,
                   ) -> httpx.Response:
        """POST ``content`` once and return the response.

        An error status comes back with its body read (and, with ``stream``, the response
        closed); with ``check`` it raises :meth:`status_error` instead. A success with
        ``stream`` comes back unread: read it with :meth:`read` or :meth:`events`, or close it.

        :raises ProviderError: For transport failures (see :func:`transport_error`), and with
            ``check`` for an error status.
        """
        transport = self._transport
        if transport is None:
            client = self.client
            if client is not None and not self._owns_client:
                return await self._send_through(client, content, model=model, stream=stream, check=check)
            transport = self._open(model)
        request = httpx.Request("POST", self._target, headers=self._send_headers, content=content,
                                extensions=self._extensions)
        try:
            response = await transport.handle_async_request(request)
            response.request = request
            if _logger.isEnabledFor(logging.INFO):  # the line AsyncClient.send logs
                _logger.info('HTTP Request: %s %s "%s %d %s"', request.method, request.url, response.http_version,
                             response.status_code, response.reason_phrase)
            if not stream:
                try:
                    await response.aread()  # closes it
                except BaseException:
                    await response.aclose()
                    raise
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            if isinstance(exc, httpx.RequestError) and not _has_request(exc):
                exc.request = request  # as AsyncClient.send does for httpcore's exceptions
            raise self.transport_error(exc, model=model) from exc
        return await self._checked(response, model=model, stream=stream, check=check)

    async def _send_through(
        self, client: httpx.AsyncClient, content: bytes, *, model: str | None, stream: bool, check: bool,
    ) -> httpx.Response:
        """:meth:`send` over an injected client, through ``client.send``."""
        request = client.build_request("POST", self.url, content=content, **self._request_kwargs)
        try:
            response = await client.send(request, stream=stream)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise self.transport_error(exc, model=model) from exc
        return await self._checked(response, model=model, stream=stream, check=check)

    async def _checked(self, response: httpx.Response, *, model: str | None, stream: bool, check: bool,
                       ) -> httpx.Response:
        """Return ``response``; an error status read (closed, with ``stream``), or raised with ``check``."""
        if not response.is_success:
            if stream:
                await self.read(response, model=model)
            if check:
                raise self.status_error(response, model=model)
        return response

    def _open(self, model: str | None) -> httpx.AsyncBaseTransport:
        """Build this endpoint's own client, and what the requests over its transport are built from.

        :raises ProviderError: If the ``transport`` option cannot be served here (``aiohttp``
            under trio, or without aiohttp), or the URL is invalid.
        """
        options = self.options
        try:
            target = httpx.URL(self.url)
            kind = _transport_kind(options.transport)
        except httpx.InvalidURL as exc:
            raise self.transport_error(exc, model=model) from exc
        except RuntimeError as exc:
            raise self.error(str(exc), model=model) from exc
        transport = _build_transport(options, url=self.url, kind=kind)
        client = httpx.AsyncClient(transport=transport, headers=self._headers, timeout=options.httpx_timeout())
        self.client, self._transport, self._target = client, transport, target
        self._send_headers = client.headers  # httpx's defaults (User-Agent ...) and ours
        self._extensions = {"timeout": client.timeout.as_dict()}
        return transport

    async def post(self, content: bytes, *, model: str | None, stream: bool = False) -> httpx.Response:
        """:meth:`send` with ``check``, retried as :meth:`retry` says."""
        return await self.retry(functools.partial(self.send, content, model=model, stream=stream))

    async def retry(self, call: Callable[[], Awaitable[T]]) -> T:
        """Return ``await call()``, called again after each transient ``ProviderError``.

        Uses :func:`~loopwright._retry.retry_transient` with the options' ``maxRetries``,
        ``retryBaseDelay`` and ``retryMaxDelay``, honouring the server's ``Retry-After``.
        """
        options = self.options
        return await retry_transient(call, max_retries=options.max_retries,
                                     base_delay=options.retry_base_delay, max_delay=options.retry_max_delay)

    async def read(self, response: httpx.Response, *, model: str | None) -> None:
        """Read the rest of a streamed response's body, then close it.

        :raises ProviderError: If reading fails (see :func:`transport_error`).
        """
        try:
            await response.aread()
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, model=model) from exc
        finally:
            await response.aclose()

    async def events(
        self, response: httpx.Response, *, model: str | None, decoder: SSEDecoder | None = None,
    ) -> AsyncGenerator[SSEEvent, None]:
        """Yield the server-sent events of a streamed response as they arrive.

        Does not close the response; close it, and this iterator when leaving it early
        (``contextlib.aclosing``).

        :param decoder: The decoder to use (for example one with ``is_whole``); a plain one by default.
        :raises ProviderError: Transient, if the stream times out or breaks off.
        """
        if decoder is None:
            decoder = SSEDecoder()
        try:
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    yield event
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, model=model, stream=True) from exc
        for event in decoder.finish():
            yield event

    def error(
        self, message: str, *, model: str | None, response: httpx.Response | None = None,
        transient: bool = False, body: str | None = _UNSET,
    ) -> ProviderError:
        """Return a :class:`ProviderError` about ``response`` (its status, body and request).

        :param body: The body to report; by default the response's, if it has been read.
        """
        if response is None:
            return ProviderError(message, provider=self.provider, model=model, transient=transient)
        return ProviderError(
            message, provider=self.provider, model=model, status=response.status_code,
            body=_body_text(response) if body is _UNSET else body, transient=transient, request=response.request,
        )

    def status_error(self, response: httpx.Response, *, model: str | None) -> ProviderError:
        """Return :func:`status_error` for ``response``, with this endpoint's ``describe_error``."""
        return status_error(response, provider=self.provider, model=model, describe=self._describe,
                            request_id_header=self._request_id_header)

    def transport_error(self, exc: Exception, *, model: str | None, stream: bool = False) -> ProviderError:
        """Return :func:`transport_error` for ``exc``."""
        return transport_error(exc, provider=self.provider, model=model, stream=stream)

    async def aclose(self) -> None:
        """Close the client if this endpoint built it; an injected one stays open."""
        client = self.client
        if client is not None and self._owns_client:
            self.client = self._transport = None
            await client.aclose()


def parse_tool_arguments(value: Any) -> tuple[dict[str, Any], str | None]:  # noqa: PLR0911 - one per case
    """Return ``(arguments, raw_arguments)`` for the arguments of a tool call as a model sent them.

    An object gives itself and ``None``. Text that parses to a JSON object gives that object;
    any other text (invalid JSON, or JSON that is not an object) gives ``{}`` and the text as
    written, so the loop can report ``invalid_arguments`` to the model. Absent or blank
    arguments mean ``{}``. Never raises: a malformed model reply is the model's to correct.

    Strict JSON only: ``NaN`` and ``Infinity`` literals, and objects or arrays nested more than
    ``MAX_ARGUMENT_DEPTH`` (64) deep, count as invalid, as text and as an object alike.
    """
    if value is None:
        return {}, None
    if isinstance(value, dict):
        return (value, None) if argument_problem(value) is None else ({}, dumps_for_raw(value))
    if not isinstance(value, str):
        return {}, dumps_for_raw(value)
    if not value.strip():
        return {}, None
    try:
        parsed = loads_arguments(value)
    except ValueError:
        return {}, value
    if isinstance(parsed, dict):
        return parsed, None
    return {}, value


class ToolsCache(Generic[T]):
    """Encoded tool lists, keyed by the identity of the tuple that holds the ``ToolSpec`` s.

    The loop passes the same tuple every turn, so each definition's tools are encoded once.
    Only tuples are cached (a list could change under the cache); an entry keeps its tuple alive,
    so an id is never reused while cached. At most ``size`` entries, oldest dropped first.

    :param encode: The provider's encoding of a tool list (to JSON text, say).
    """

    __slots__ = ("_encode", "_items", "_size")

    def __init__(self, encode: Callable[[Sequence[Any]], T], size: int = 32) -> None:
        """Cache ``encode``'s results for at most ``size`` tool lists."""
        self._encode = encode
        self._items: dict[int, tuple[Sequence[Any], T]] = {}
        self._size = size

    def get(self, tools: Sequence[Any]) -> T:
        """Return ``encode(tools)``, from the cache when ``tools`` is a cached tuple."""
        if type(tools) is not tuple:
            return self._encode(tools)
        key = id(tools)
        hit = self._items.get(key)
        if hit is not None and hit[0] is tools:
            return hit[1]
        encoded = self._encode(tools)
        if len(self._items) >= self._size:
            del self._items[next(iter(self._items))]
        self._items[key] = (tools, encoded)
        return encoded
