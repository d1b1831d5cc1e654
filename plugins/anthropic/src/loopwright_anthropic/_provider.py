"""The Anthropic Messages API provider (``kind: anthropic``), over httpx."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import httpx

from loopwright._retry import parse_retry_after, retry_transient
from loopwright._types import StreamDelta
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ConfigError, ConfigProblem, ProviderError
from loopwright_anthropic import _wire
from loopwright_anthropic._pool import ShardedTransport, environment_proxy, ssl_context
from loopwright_anthropic._sse import SSEDecoder

if TYPE_CHECKING:
    from loopwright._types import ModelRequest, ModelResponse

__all__ = ["API_VERSION", "DEFAULT_BASE_URL", "AnthropicProvider"]

#: The base URL used when the assembly sets no ``baseUrl``.
DEFAULT_BASE_URL = "https://api.anthropic.com"

#: The ``anthropic-version`` header sent unless ``anthropicVersion`` says otherwise.
API_VERSION = "2023-06-01"

# HTTP statuses a retry may fix; 529 is Anthropic's "overloaded". Any other 5xx is transient too.
_TRANSIENT_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# Error types of a stream's ``error`` event that a retry may fix.
_TRANSIENT_ERROR_TYPES = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})
_OUTPUT_MODES = ("tool", "native")
_CACHE_PARTS = ("system", "tools", "messages")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@attrs.frozen(kw_only=True)
class _Options:
    """The provider's options, read from the assembly's provider mapping (camelCase keys).

    Attributes:
        max_retries: ``maxRetries``: retries of a transient failure (default 2).
        retry_base_delay: ``retryBaseDelay``: first backoff delay (default 0.5 s).
        retry_max_delay: ``retryMaxDelay``: longest backoff delay (default 30 s).
        timeout: ``timeout``: read/write/pool timeout, ``None`` for none (default 600 s).
        connect_timeout: ``connectTimeout``: connect timeout (default 5 s).
        headers: ``headers``: extra request headers.
        anthropic_version: ``anthropicVersion``: the ``anthropic-version`` header.
        beta: ``beta``: ``anthropic-beta`` feature names (a string or a list).
        default_max_tokens: ``defaultMaxTokens``: ``max_tokens`` when ``maxTokens`` is unset
            (default 4096).
        caching: ``promptCaching``: where ``cache_control`` markers go.
        native_output: ``structuredOutput: native``: send the output schema as
            ``output_config.format`` instead of through a tool.
        max_connections: ``maxConnections``: most open connections (default 1000).
        max_keepalive_connections: ``maxKeepaliveConnections``: most idle connections kept
            (default: ``maxConnections``).
        keepalive_expiry: ``keepaliveExpiry``: how long an idle connection is kept (default 5 s).
        pool_shards: ``poolShards``: most connection pools to spread requests over (default 64).
        proxy: ``proxy``: a proxy URL; by default the environment's (``HTTPS_PROXY`` ...).
        price_provider: ``priceProvider``: the genai-prices provider id for costs.
        timeout_set: Whether ``timeout`` or ``connectTimeout`` was given (they then apply to
            an injected client too).
    """

    max_retries: int = 2
    retry_base_delay: float = 0.5
    retry_max_delay: float = 30.0
    timeout: float | None = 600.0
    connect_timeout: float | None = 5.0
    headers: Mapping[str, str] = attrs.field(factory=dict)
    anthropic_version: str = API_VERSION
    beta: tuple[str, ...] = ()
    default_max_tokens: int = 4096
    caching: _wire.CachePlan = attrs.field(factory=_wire.CachePlan)
    native_output: bool = False
    max_connections: int | None = 1000
    max_keepalive_connections: int | None = None
    keepalive_expiry: float | None = 5.0
    pool_shards: int = 64
    proxy: str | None = None
    price_provider: str | None = None
    timeout_set: bool = False

    @classmethod
    def parse(cls, settings: ProviderSettings) -> _Options:  # noqa: C901 - one flat list of options
        """Read and check the options; every problem found is reported in one ConfigError."""
        opts = settings.options
        problems: list[ConfigProblem] = []

        def where(key: str) -> str:
            return f"$.providers.{settings.name}.{key}"

        def integer(key: str, default: int | None, minimum: int, *, nullable: bool = False) -> int | None:
            value = opts.get(key, default)
            if value is None and nullable:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                null = " or null" if nullable else ""
                problems.append(ConfigProblem(f"must be an integer >= {minimum}{null}, not {value!r}",
                                              path=where(key)))
                return default
            return value

        def duration(key: str, default: float | None, *, nullable: bool = False) -> float | None:
            value = opts.get(key, default)
            if value is None and nullable:
                return None
            seconds = _seconds(value)
            if seconds is None:
                problems.append(ConfigProblem(
                    f"must be a duration (seconds, or a string such as '500ms', '30s', '2m'), "
                    f"not {value!r}", path=where(key)))
                return default
            return seconds

        def text(key: str, default: str | None = None) -> str | None:
            value = opts.get(key, default)
            if value is not None and not isinstance(value, str):
                problems.append(ConfigProblem(f"must be a string, not {value!r}", path=where(key)))
                return default
            return value

        headers = opts.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            problems.append(ConfigProblem("must map header names to strings", path=where("headers")))
            headers = {}
        beta = opts.get("beta") or ()
        if isinstance(beta, str):
            beta = (beta,)
        if not isinstance(beta, (list, tuple)) or not all(isinstance(b, str) for b in beta):
            problems.append(ConfigProblem("must be a string or a list of strings", path=where("beta")))
            beta = ()
        caching = _cache_plan(opts.get("promptCaching", False))
        if caching is None:
            problems.append(ConfigProblem(
                f"must be true, false or a mapping of {', '.join(_CACHE_PARTS)} to booleans, "
                f"not {opts.get('promptCaching')!r}", path=where("promptCaching")))
            caching = _wire.CachePlan()
        output_mode = opts.get("structuredOutput", "tool")
        if output_mode not in _OUTPUT_MODES:
            problems.append(ConfigProblem(f"must be one of {', '.join(_OUTPUT_MODES)}, not {output_mode!r}",
                                          path=where("structuredOutput")))
        max_connections = integer("maxConnections", 1000, 1, nullable=True)
        options = cls(
            max_retries=integer("maxRetries", 2, 0) or 0,
            retry_base_delay=duration("retryBaseDelay", 0.5) or 0.0,
            retry_max_delay=duration("retryMaxDelay", 30.0) or 0.0,
            timeout=duration("timeout", 600.0, nullable=True),
            connect_timeout=duration("connectTimeout", 5.0, nullable=True),
            headers=dict(headers),
            anthropic_version=text("anthropicVersion", API_VERSION) or API_VERSION,
            beta=tuple(beta),
            default_max_tokens=integer("defaultMaxTokens", 4096, 1) or 4096,
            caching=caching,
            native_output=output_mode == "native",
            max_connections=max_connections,
            max_keepalive_connections=integer("maxKeepaliveConnections", max_connections, 0, nullable=True),
            keepalive_expiry=duration("keepaliveExpiry", 5.0, nullable=True),
            pool_shards=integer("poolShards", 64, 1) or 1,
            proxy=text("proxy"),
            price_provider=text("priceProvider"),
            timeout_set="timeout" in opts or "connectTimeout" in opts,
        )
        if problems:
            raise ConfigError(f"invalid options for provider {settings.name!r}", problems=problems)
        return options


def _cache_plan(value: Any) -> _wire.CachePlan | None:
    if isinstance(value, bool):
        return _wire.CachePlan(system=value, tools=value, messages=value)
    if value is None:
        return _wire.CachePlan()
    if isinstance(value, Mapping) and set(value) <= set(_CACHE_PARTS) and all(
        isinstance(v, bool) for v in value.values()
    ):
        return _wire.CachePlan(**{k: value.get(k, True) for k in _CACHE_PARTS})
    return None


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2)]
    return None


def _base_url(settings: ProviderSettings) -> str:
    base_url = (settings.base_url or DEFAULT_BASE_URL).rstrip("/")
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


def _headers(settings: ProviderSettings, options: _Options) -> dict[str, str]:
    api_key = settings.api_key
    if api_key is None and settings.base_url is None:
        # Only towards Anthropic itself: never send this key to another server.
        api_key = os.environ.get("ANTHROPIC_API_KEY") or None
    headers = {
        "content-type": "application/json",
        "accept": "application/json",
        "anthropic-version": options.anthropic_version,
    }
    if api_key:
        headers["x-api-key"] = api_key
    if options.beta:
        headers["anthropic-beta"] = ",".join(options.beta)
    for name, value in options.headers.items():  # header names are case-insensitive
        for existing in [k for k in headers if k.lower() == name.lower()]:
            del headers[existing]
        headers[name] = value
    return headers


class AnthropicProvider(Provider):
    """Calls ``POST {baseUrl}/v1/messages``; one instance serves every model of its provider.

    Settings (:class:`~loopwright.abc.ProviderSettings`): ``base_url`` (default
    :data:`DEFAULT_BASE_URL`), ``api_key`` (sent as ``x-api-key``; when neither it nor
    ``base_url`` is set, ``ANTHROPIC_API_KEY`` from the environment), ``http_client`` (an
    ``httpx.AsyncClient`` to use and leave open) and ``options``:

    ===========================  ===============================================================
    ``maxRetries``               retries of a transient failure, default 2
    ``retryBaseDelay``           first backoff delay, default 0.5 s (``retryMaxDelay``: 30 s)
    ``timeout``                  read/write/pool timeout, default 600 s; ``connectTimeout`` 5 s
    ``defaultMaxTokens``         ``max_tokens`` when the definition sets no ``maxTokens``, 4096
    ``promptCaching``            ``true``: ``cache_control`` on the system prompt, the last tool
                                 and the last user turn; or ``{system, tools, messages}``
    ``structuredOutput``         ``tool`` (default: an output tool) or ``native``
                                 (``output_config.format``, on models that support it)
    ``anthropicVersion``         the ``anthropic-version`` header, default ``2023-06-01``
    ``beta``                     ``anthropic-beta`` feature names (string or list)
    ``headers``                  extra request headers
    ``maxConnections``           most open connections, default 1000
    ``maxKeepaliveConnections``  most idle connections kept, default ``maxConnections``
    ``keepaliveExpiry``          idle connection lifetime, default 5 s
    ``poolShards``               connection pools to spread load over, default 64
    ``proxy``                    proxy URL, default from the environment
    ``priceProvider``            genai-prices provider id for costs (default ``anthropic``
                                 towards api.anthropic.com, else none: prices unknown unless
                                 overridden)
    ===========================  ===============================================================

    Durations are seconds or strings such as ``500ms``, ``30s``, ``2m``. Bad options raise
    :class:`~loopwright.errors.ConfigError` when the provider is built.

    :meth:`complete` retries transient failures (HTTP 408, 409, 429, 5xx including 529
    ``overloaded_error``, timeouts, connection errors; an ``x-should-retry`` header overrides)
    with :func:`~loopwright._retry.retry_transient`, honouring ``retry-after-ms`` and
    ``Retry-After``, and raises :class:`~loopwright.errors.ProviderError` when it gives up or the
    failure is final. :meth:`stream` retries the same way until the stream has started; a
    stream that breaks off later raises a transient ``ProviderError`` for the loop to handle.

    Attributes:
        settings: The settings it was built from.
        url: The endpoint it posts to.
        price_provider_id: The genai-prices provider id the runtime prices calls with.
    """

    def __init__(self, settings: ProviderSettings) -> None:
        """Check the options and prepare the headers; the HTTP client is built on first use."""
        self.settings = settings
        self._options = options = _Options.parse(settings)
        base_url = _base_url(settings)
        self.url = f"{base_url}/v1/messages"
        self.price_provider_id = options.price_provider or (
            "anthropic" if httpx.URL(base_url).host == "api.anthropic.com" else None)
        self._headers = headers = _headers(settings, options)
        self._owns_client = settings.http_client is None
        self._client: httpx.AsyncClient | None = settings.http_client
        # Keyword arguments of each request: none with our own client (it carries headers and
        # timeouts), the headers (and any configured timeout) with an injected one.
        self._request_kwargs: dict[str, Any] = {}
        if not self._owns_client:
            self._request_kwargs["headers"] = headers
            if options.timeout_set:
                self._request_kwargs["timeout"] = self._timeout()
        self._tools = _wire.ToolsCache()
        self._thinking = _wire.ThinkingStash()
        self._encoder = _wire.MessageEncoder(self._thinking)
        self._retry = functools.partial(
            retry_transient, max_retries=options.max_retries,
            base_delay=options.retry_base_delay, max_delay=options.retry_max_delay,
        )

    def __repr__(self) -> str:
        return f"AnthropicProvider(name={self.settings.name!r}, url={self.url!r})"

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self._options.timeout, connect=self._options.connect_timeout)

    def _build_client(self) -> httpx.AsyncClient:
        options = self._options
        limits = httpx.Limits(
            max_connections=options.max_connections,
            max_keepalive_connections=options.max_keepalive_connections,
            keepalive_expiry=options.keepalive_expiry,
        )
        proxy = options.proxy or environment_proxy(self.url)
        # Plain http without a proxy never uses TLS: skip loading the CA bundle.
        plain = proxy is None and self.url.startswith("http://")
        transport = ShardedTransport(
            shards=options.pool_shards, limits=limits, proxy=proxy,
            verify=ssl_context(verify=False) if plain else ssl_context(),
        )
        self._client = httpx.AsyncClient(transport=transport, headers=self._headers, timeout=self._timeout())
        return self._client

    def _body(self, request: ModelRequest, *, stream: bool) -> tuple[bytes, _wire.OutputTool | None]:
        options = self._options
        return _wire.build_body(
            request, encoder=self._encoder, tools_cache=self._tools,
            default_max_tokens=options.default_max_tokens, caching=options.caching,
            native_output=options.native_output, stream=stream,
        )

    # -- plain calls -------------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` to the Messages API and return the decoded answer.

        See the class docstring for retries and errors. Never raises for what the model wrote:
        unparseable tool input lands in ``ToolCall.raw_arguments``.
        """
        body, output = self._body(request, stream=False)
        return await self._retry(functools.partial(self._post, request, body, output))

    async def _post(self, request: ModelRequest, body: bytes, output: _wire.OutputTool | None) -> ModelResponse:
        client = self._client or self._build_client()
        try:
            response = await client.post(self.url, content=body, **self._request_kwargs)
        except httpx.HTTPError as exc:
            raise self._transport_error(request, exc) from exc
        if not 200 <= response.status_code < 300:  # noqa: PLR2004 - the success range
            raise self._status_error(request, response)
        return self._decode_body(request, response, output)

    def _decode_body(
        self, request: ModelRequest, response: httpx.Response, output: _wire.OutputTool | None,
    ) -> ModelResponse:
        try:
            data = json.loads(response.content)
        except ValueError as exc:
            raise ProviderError(
                "the response body is not JSON", provider=self.settings.name, model=request.model,
                status=response.status_code, body=response.text, request=response.request,
            ) from exc
        try:
            return _wire.decode_response(data, model=request.model, output=output, thinking=self._thinking)
        except _wire.MalformedResponseError as exc:
            raise ProviderError(
                str(exc), provider=self.settings.name, model=request.model, status=response.status_code,
                body=response.text, request=response.request,
            ) from exc

    # -- streaming ---------------------------------------------------------------------------

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamDelta]:
        """Send ``request`` with ``stream: true`` and yield the answer as it arrives.

        Yields ``text`` pieces, a ``tool_call`` delta when a tool call starts, ``arguments``
        pieces of its input JSON, and finally ``done`` with the whole answer (input pieces
        joined and parsed; unparseable ones in ``raw_arguments``). Opening the stream is retried
        like :meth:`complete`. Afterwards, a stream cut before ``message_stop`` raises a
        transient :class:`~loopwright.errors.ProviderError`; an ``error`` event raises one that
        is transient for ``overloaded_error``, ``api_error``, ``rate_limit_error`` and
        ``timeout_error`` and final for any other type. A server that answers with plain JSON
        instead of a stream is read as a plain answer.
        """
        body, output = self._body(request, stream=True)
        response = await self._retry(functools.partial(self._open_stream, request, body))
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            async for delta in self._plain_deltas(request, response, output):
                yield delta
            return
        accumulator = _wire.StreamAccumulator(model=request.model, output=output, thinking=self._thinking)
        try:
            decoder = SSEDecoder()
            try:
                async for line in response.aiter_lines():
                    event = decoder.decode(line)
                    if event is None:
                        continue
                    for delta in accumulator.feed(event[0], self._event_data(request, response, event[1])):
                        yield delta
                    if accumulator.finished:
                        break
            except httpx.HTTPError as exc:
                raise self._transport_error(request, exc, what="the stream broke off") from exc
            except _wire.StreamError as exc:
                raise self._stream_error(request, response, exc) from exc
        finally:
            await response.aclose()
        try:
            answer = accumulator.response()
        except _wire.StreamError as exc:
            raise ProviderError(
                f"{exc} (the stream was cut)", provider=self.settings.name, model=request.model,
                status=response.status_code, transient=True, request=response.request,
            ) from exc
        yield StreamDelta(kind="done", response=answer)

    async def _plain_deltas(
        self, request: ModelRequest, response: httpx.Response, output: _wire.OutputTool | None,
    ) -> AsyncIterator[StreamDelta]:
        """Read a plain JSON answer given to a stream request, as :meth:`Provider.stream` does."""
        try:
            await response.aread()
        except httpx.HTTPError as exc:
            raise self._transport_error(request, exc) from exc
        finally:
            await response.aclose()
        answer = self._decode_body(request, response, output)
        if answer.message.content:
            yield StreamDelta(kind="text", text=answer.message.content)
        for call in answer.message.tool_calls:
            yield StreamDelta(kind="tool_call", tool_call_id=call.id, name=call.name)
        yield StreamDelta(kind="done", response=answer)

    async def _open_stream(self, request: ModelRequest, body: bytes) -> httpx.Response:
        client = self._client or self._build_client()
        http_request = client.build_request("POST", self.url, content=body, **self._request_kwargs)
        try:
            response = await client.send(http_request, stream=True)
        except httpx.HTTPError as exc:
            raise self._transport_error(request, exc) from exc
        if not 200 <= response.status_code < 300:  # noqa: PLR2004 - the success range
            try:
                await response.aread()
            except httpx.HTTPError as exc:
                raise self._transport_error(request, exc) from exc
            finally:
                await response.aclose()
            raise self._status_error(request, response)
        return response

    def _event_data(self, request: ModelRequest, response: httpx.Response, data: str) -> Any:
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise ProviderError(
                "a stream event's data is not JSON", provider=self.settings.name, model=request.model,
                status=response.status_code, body=data, request=response.request,
            ) from exc

    def _stream_error(self, request: ModelRequest, response: httpx.Response, exc: _wire.StreamError) -> ProviderError:
        kind = exc.error_type
        message = f"{exc} [{kind}]" if kind and kind != str(exc) else str(exc)
        request_id = response.headers.get("request-id")
        if request_id:
            message += f" (request {request_id})"
        return ProviderError(
            f"stream error: {message}", provider=self.settings.name, model=request.model,
            status=response.status_code, transient=kind in _TRANSIENT_ERROR_TYPES, request=response.request,
        )

    # -- errors ------------------------------------------------------------------------------

    def _transport_error(self, request: ModelRequest, exc: httpx.HTTPError, *, what: str | None = None,
                         ) -> ProviderError:
        if isinstance(exc, httpx.TimeoutException):
            what, transient = what or "the request timed out", True
        elif isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
            what, transient = what or "the request could not be sent", False
        elif isinstance(exc, httpx.TransportError):  # network errors, resets, RemoteProtocolError, proxies
            what, transient = what or "the connection failed", True
        else:
            what, transient = what or "the request failed", False
        detail = str(exc)
        detail = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        try:
            http_request = exc.request
        except RuntimeError:  # httpx raises RuntimeError when it has none
            http_request = None
        return ProviderError(
            f"{what} ({detail})", provider=self.settings.name, model=request.model,
            transient=transient, request=http_request,
        )

    def _status_error(self, request: ModelRequest, response: httpx.Response) -> ProviderError:
        status = response.status_code
        text = response.text
        try:
            detail = _wire.error_detail(json.loads(text)) if text else None
        except ValueError:
            detail = None
        if detail is None:
            message = text.strip()[:300] or response.reason_phrase or "request failed"
        else:
            message = f"{detail[0]} [{detail[1]}]" if detail[1] and detail[1] != detail[0] else detail[0]
        request_id = response.headers.get("request-id")
        if request_id:
            message += f" (request {request_id})"
        transient = status in _TRANSIENT_STATUSES or status >= 500  # noqa: PLR2004 - server errors
        should_retry = response.headers.get("x-should-retry")
        if should_retry in ("true", "false"):
            transient = should_retry == "true"
        return ProviderError(
            message, provider=self.settings.name, model=request.model, status=status, body=text,
            retry_after=parse_retry_after(response.headers), transient=transient, request=response.request,
        )

    async def aclose(self) -> None:
        """Close the HTTP client if this provider built it; an injected one stays open."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.aclose()
        elif client is not None:
            self._client = client
