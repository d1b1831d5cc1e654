"""An httpx transport that holds up under many concurrent requests to one API.

This is the transport of ``loopwright_openai._pool``, kept as a copy so that this distribution
depends on nothing but the core and httpx (a shared home for it is a proposed core change).
The measurements below were made with the OpenAI provider; the Anthropic provider uses the
transport the same way.

Why this exists. httpx 0.28 runs on httpcore 1.0, whose connection pool re-examines *every*
connection on every request and every release
(``AsyncConnectionPool._assign_requests_to_connections``), and for each idle connection also
builds a list of all connections (a quadratic step; encode/httpcore#1035) and polls its socket
(``has_expired``). The cost of one request thus grows with the square of the number of open
connections. Measured with the shared benchmark's fake server (200 concurrent runs of 6 turns,
50 ms server latency, 127.0.0.1, CPython 3.11):

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
busy), so a sequential caller uses one shard and one warm connection, as before. The shards
share one SSL context, so building them costs no certificate loading. The price: loads are
balanced only approximately, so a burst opens somewhat more connections than its peak
concurrency (about 260 for the 200 runs above), which then stay alive for reuse.

Keep-alive: httpcore 1.0 compares ``max_keepalive_connections`` with the number of *all*
connections, not the idle ones (encode/httpcore#1035, bug 1), so a pool holding more connections
than that limit closes every connection that falls idle, and the next request reconnects. The
default therefore keeps as many connections alive as it may open; idle ones still close after
``keepalive_expiry``.
"""

from __future__ import annotations

import functools
import math
import urllib.request
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import ssl
    from collections.abc import AsyncIterator

__all__ = ["ShardedTransport", "environment_proxy", "ssl_context"]


class ShardedTransport(httpx.AsyncBaseTransport):
    """Spreads requests over up to ``shards`` connection pools, least busy first.

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

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        loads, self._loads = self._loads, None
        if loads is not None:
            loads[self._index] -= 1
        await self._stream.aclose()


@functools.cache
def ssl_context(*, verify: bool = True, trust_env: bool = True) -> ssl.SSLContext:
    """Return an SSL context as httpx builds it, made once per process and then shared.

    Loading the CA bundle takes about 40 ms; an SSL context may serve any number of
    connections, clients and threads.
    """
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
