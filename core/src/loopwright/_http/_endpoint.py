"""One URL a provider POSTs to (:class:`Endpoint`), and the tool-call helpers providers share."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from loopwright._arguments import argument_problem, dumps_for_raw, loads_arguments
from loopwright._http._errors import body_text, status_error, transport_error
from loopwright._http._options import HTTPOptions, build_transport, transport_kind
from loopwright._http._sse import SSEDecoder, SSEEvent
from loopwright._retry import retry_transient
from loopwright.errors import ProviderError

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable

__all__ = ["Endpoint", "ToolsCache", "parse_tool_arguments"]

T = TypeVar("T")

_logger = logging.getLogger("httpx")  # the fast path of Endpoint.send logs what AsyncClient.send would


def _has_request(exc: httpx.RequestError) -> bool:
    try:
        exc.request  # noqa: B018 - httpx raises RuntimeError when it has none
    except RuntimeError:
        return False
    return True


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
            kind = transport_kind(options.transport)
        except httpx.InvalidURL as exc:
            raise self.transport_error(exc, model=model) from exc
        except RuntimeError as exc:
            raise self.error(str(exc), model=model) from exc
        transport = build_transport(options, url=self.url, kind=kind)
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
            body=body_text(response) if body is _UNSET else body, transient=transient, request=response.request,
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
