"""The OpenAI Chat Completions provider (``kind: openai``), over httpx.

Works with OpenAI and with the many servers that speak the same wire format (vLLM, llama.cpp,
Ollama, LiteLLM, OpenRouter ...) through ``baseUrl``.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import httpx
from loopwright._retry import parse_retry_after, retry_transient
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ConfigError, ConfigProblem, ProviderError

from loopwright_openai import _wire
from loopwright_openai._pool import ShardedTransport, environment_proxy, ssl_context

if TYPE_CHECKING:
    from loopwright._types import ModelRequest, ModelResponse

__all__ = ["DEFAULT_BASE_URL", "OpenAIProvider"]

#: The base URL used when the assembly sets no ``baseUrl``.
DEFAULT_BASE_URL = "https://api.openai.com/v1"

_TRANSIENT_STATUSES = frozenset({408, 409, 429})
_MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")
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
        organization: ``organization``: sent as ``OpenAI-Organization``.
        project: ``project``: sent as ``OpenAI-Project``.
        max_tokens_field: ``maxTokensField``: wire name of ``maxTokens``, ``max_tokens``
            (default) or ``max_completion_tokens`` (o-series and newer models).
        max_connections: ``maxConnections``: most open connections (default 1000).
        max_keepalive_connections: ``maxKeepaliveConnections``: most idle connections kept
            (default: ``maxConnections``; see :mod:`loopwright_openai._pool` for why).
        keepalive_expiry: ``keepaliveExpiry``: how long an idle connection is kept (default 5 s).
        pool_shards: ``poolShards``: most connection pools to spread requests over (default 64;
            1 for a single plain pool).
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
    organization: str | None = None
    project: str | None = None
    max_tokens_field: str = "max_tokens"
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

        def text(key: str) -> str | None:
            value = opts.get(key)
            if value is not None and not isinstance(value, str):
                problems.append(ConfigProblem(f"must be a string, not {value!r}", path=where(key)))
                return None
            return value

        headers = opts.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            problems.append(ConfigProblem("must map header names to strings", path=where("headers")))
            headers = {}
        max_tokens_field = opts.get("maxTokensField", "max_tokens")
        if max_tokens_field not in _MAX_TOKENS_FIELDS:
            problems.append(ConfigProblem(
                f"must be one of {', '.join(_MAX_TOKENS_FIELDS)}, not {max_tokens_field!r}",
                path=where("maxTokensField")))
            max_tokens_field = "max_tokens"
        max_connections = integer("maxConnections", 1000, 1, nullable=True)
        options = cls(
            max_retries=integer("maxRetries", 2, 0) or 0,
            retry_base_delay=duration("retryBaseDelay", 0.5) or 0.0,
            retry_max_delay=duration("retryMaxDelay", 30.0) or 0.0,
            timeout=duration("timeout", 600.0, nullable=True),
            connect_timeout=duration("connectTimeout", 5.0, nullable=True),
            headers=dict(headers),
            organization=text("organization"),
            project=text("project"),
            max_tokens_field=max_tokens_field,
            max_connections=max_connections,
            max_keepalive_connections=integer(
                "maxKeepaliveConnections", max_connections, 0, nullable=True),
            keepalive_expiry=duration("keepaliveExpiry", 5.0, nullable=True),
            pool_shards=integer("poolShards", 64, 1) or 1,
            proxy=text("proxy"),
            price_provider=text("priceProvider"),
            timeout_set="timeout" in opts or "connectTimeout" in opts,
        )
        if problems:
            raise ConfigError(f"invalid options for provider {settings.name!r}", problems=problems)
        return options


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
        # Only towards OpenAI itself: never send this key to another server.
        api_key = os.environ.get("OPENAI_API_KEY") or None
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if options.organization:
        headers["OpenAI-Organization"] = options.organization
    if options.project:
        headers["OpenAI-Project"] = options.project
    for name, value in options.headers.items():  # header names are case-insensitive
        for existing in [k for k in headers if k.lower() == name.lower()]:
            del headers[existing]
        headers[name] = value
    return headers


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


class OpenAIProvider(Provider):
    """Calls ``POST {baseUrl}/chat/completions``; one instance serves every model of its provider.

    Settings (:class:`~loopwright.abc.ProviderSettings`): ``base_url`` (default
    :data:`DEFAULT_BASE_URL`), ``api_key`` (sent as ``Authorization: Bearer``; when neither it
    nor ``base_url`` is set, ``OPENAI_API_KEY`` from the environment), ``http_client`` (an
    ``httpx.AsyncClient`` to use and leave open) and ``options``:

    ==========================  ================================================================
    ``maxRetries``              retries of a transient failure, default 2
    ``retryBaseDelay``          first backoff delay, default 0.5 s (``retryMaxDelay``: 30 s)
    ``timeout``                 read/write/pool timeout, default 600 s; ``connectTimeout`` 5 s
    ``headers``                 extra request headers
    ``organization``            ``OpenAI-Organization`` header; ``project``: ``OpenAI-Project``
    ``maxTokensField``          ``max_tokens`` (default) or ``max_completion_tokens``
    ``maxConnections``          most open connections, default 1000
    ``maxKeepaliveConnections`` most idle connections kept, default ``maxConnections``
    ``keepaliveExpiry``         idle connection lifetime, default 5 s
    ``poolShards``              connection pools to spread load over, default 64
    ``proxy``                   proxy URL, default from the environment
    ``priceProvider``           genai-prices provider id for costs (default ``openai`` towards
                                api.openai.com, else none: prices unknown unless overridden)
    ==========================  ================================================================

    Durations are seconds or strings such as ``500ms``, ``30s``, ``2m``. Bad options raise
    :class:`~loopwright.errors.ConfigError` when the provider is built.

    :meth:`complete` retries transient failures (HTTP 408, 409, 429, 5xx, timeouts, connection
    errors; an ``x-should-retry`` header overrides) with :func:`~loopwright._retry.retry_transient`,
    honouring ``retry-after-ms`` and ``Retry-After``, and raises
    :class:`~loopwright.errors.ProviderError` when it gives up or the failure is final. Streaming
    is not implemented yet: a request with ``stream=True`` is answered in one piece.

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
        self.url = f"{base_url}/chat/completions"
        self.price_provider_id = options.price_provider or (
            "openai" if httpx.URL(base_url).host == "api.openai.com" else None)
        self._headers = headers = _headers(settings, options)
        self._owns_client = settings.http_client is None
        self._client: httpx.AsyncClient | None = settings.http_client
        # Keyword arguments of each post: none with our own client (it carries headers and
        # timeouts), the headers (and any configured timeout) with an injected one.
        self._post_kwargs: dict[str, Any] = {}
        if not self._owns_client:
            self._post_kwargs["headers"] = headers
            if options.timeout_set:
                self._post_kwargs["timeout"] = self._timeout()
        self._tools = _wire.ToolsCache()
        self._retry = functools.partial(
            retry_transient, max_retries=options.max_retries,
            base_delay=options.retry_base_delay, max_delay=options.retry_max_delay,
        )

    def __repr__(self) -> str:
        return f"OpenAIProvider(name={self.settings.name!r}, url={self.url!r})"

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
        self._client = httpx.AsyncClient(
            transport=transport, headers=self._headers, timeout=self._timeout(),
        )
        return self._client

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` to Chat Completions and return the decoded answer.

        See the class docstring for retries and errors. Never raises for what the model wrote:
        unparseable tool arguments land in ``ToolCall.raw_arguments``.
        """
        tools = request.tools
        body = _wire.build_body(
            request,
            tools_json=self._tools.get(tools) if tools else None,
            max_tokens_field=self._options.max_tokens_field,
        )
        return await self._retry(functools.partial(self._post, request, body))

    async def _post(self, request: ModelRequest, body: bytes) -> ModelResponse:
        client = self._client or self._build_client()
        try:
            response = await client.post(self.url, content=body, **self._post_kwargs)
        except httpx.TimeoutException as exc:
            raise self._transport_error(request, exc, "the request timed out", transient=True) from exc
        except (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL) as exc:
            raise self._transport_error(request, exc, "the request could not be sent",
                                        transient=False) from exc
        except httpx.TransportError as exc:  # network errors, resets, RemoteProtocolError, proxies
            raise self._transport_error(request, exc, "the connection failed", transient=True) from exc
        status = response.status_code
        if not 200 <= status < 300:  # noqa: PLR2004 - the success range
            raise self._status_error(request, response)
        content = response.content
        try:
            data = json.loads(content)
        except ValueError as exc:
            raise ProviderError(
                "the response body is not JSON", provider=self.settings.name, model=request.model,
                status=status, body=response.text, request=response.request,
            ) from exc
        try:
            return _wire.decode_response(data, model=request.model)
        except _wire.MalformedResponseError as exc:
            raise ProviderError(
                str(exc), provider=self.settings.name, model=request.model, status=status,
                body=response.text, request=response.request,
            ) from exc

    def _transport_error(
        self, request: ModelRequest, exc: Exception, what: str, *, transient: bool,
    ) -> ProviderError:
        detail = str(exc)
        detail = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        try:
            http_request = exc.request  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # httpx raises RuntimeError when it has none
            http_request = None
        return ProviderError(
            f"{what} ({detail})", provider=self.settings.name, model=request.model,
            transient=transient, request=http_request,
        )

    def _status_error(self, request: ModelRequest, response: httpx.Response) -> ProviderError:
        status = response.status_code
        text = response.text
        try:
            message = _wire.error_message(json.loads(text)) if text else None
        except ValueError:
            message = None
        if message is None:
            message = text.strip()[:300] or response.reason_phrase or "request failed"
        transient = status in _TRANSIENT_STATUSES or status >= 500  # noqa: PLR2004 - server errors
        should_retry = response.headers.get("x-should-retry")
        if should_retry in ("true", "false"):
            transient = should_retry == "true"
        return ProviderError(
            message, provider=self.settings.name, model=request.model, status=status, body=text,
            retry_after=parse_retry_after(response.headers), transient=transient,
            request=response.request,
        )

    async def aclose(self) -> None:
        """Close the HTTP client if this provider built it; an injected one stays open."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.aclose()
        elif client is not None:
            self._client = client
