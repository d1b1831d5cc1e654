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

The code lives in the private package ``loopwright._http``, one module per concern (transports,
options, errors, server-sent events, the endpoint); this module is its public face: import every
name in ``__all__`` from here.

.. versionadded:: 0.1
"""

from __future__ import annotations

from loopwright._http._endpoint import Endpoint, ToolsCache, parse_tool_arguments
from loopwright._http._errors import TRANSIENT_STATUSES, is_transient_status, status_error, transport_error
from loopwright._http._options import (
    TRANSPORTS,
    HTTPOptions,
    OptionReader,
    check_base_url,
    make_client,
    override_headers,
    parse_duration,
    require_api_key,
    resolve_api_key,
)
from loopwright._http._sse import SSEDecoder, SSEEvent
from loopwright._http._transports import (
    DEFAULT_POOL_SHARDS,
    AiohttpTransport,
    ShardedTransport,
    environment_proxy,
    ssl_context,
)
from loopwright._http._transports import httpx_error as _httpx_error  # noqa: F401 - core/tests/test_http_aiohttp.py

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
