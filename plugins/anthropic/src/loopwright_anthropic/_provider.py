"""The Anthropic Messages API provider (``kind: anthropic``), over httpx."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import httpx

from loopwright import StreamDelta
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ConfigError
from loopwright.http import (
    Endpoint,
    HTTPOptions,
    OptionReader,
    ToolsCache,
    check_base_url,
    override_headers,
    require_api_key,
    resolve_api_key,
)
from loopwright_anthropic import _wire

if TYPE_CHECKING:
    from loopwright import ModelRequest, ModelResponse
    from loopwright.errors import ProviderError

__all__ = ["API_VERSION", "CONTEXT_MANAGEMENT_BETA", "DEFAULT_BASE_URL", "AnthropicProvider"]

#: The base URL used when the assembly sets no ``baseUrl``.
DEFAULT_BASE_URL = "https://api.anthropic.com"

#: The ``anthropic-version`` header sent unless ``anthropicVersion`` says otherwise.
API_VERSION = "2023-06-01"
#: The ``anthropic-beta`` feature that ``contextStrategy: {kind: providerNative}`` (context editing) needs.
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"

# Error types of a stream's ``error`` event that a retry may fix.
_TRANSIENT_ERROR_TYPES = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})
_OUTPUT_MODES = ("tool", "native")
_CACHE_PARTS = ("system", "tools", "messages")


@attrs.frozen(kw_only=True)
class _Options(HTTPOptions):
    """The provider's options, read from the assembly's provider mapping (camelCase keys).

    The HTTP ones (timeouts, connections, ``transport``, ``poolShards``, ``proxy``, ``headers``,
    retries) are those of :class:`~loopwright.http.HTTPOptions`; these are the provider's own.

    Attributes:
        anthropic_version: ``anthropicVersion``: the ``anthropic-version`` header.
        beta: ``beta``: ``anthropic-beta`` feature names (a string or a list).
        default_max_tokens: ``defaultMaxTokens``: ``max_tokens`` when ``maxTokens`` is unset
            (default 4096).
        caching: ``promptCaching``: where ``cache_control`` markers go.
        native_output: ``structuredOutput: native``: send the output schema as
            ``output_config.format`` instead of through a tool.
        price_provider: ``priceProvider``: the genai-prices provider id for costs.
    """

    anthropic_version: str = API_VERSION
    beta: tuple[str, ...] = ()
    default_max_tokens: int = 4096
    caching: _wire.CachePlan = attrs.field(factory=_wire.CachePlan)
    native_output: bool = False
    price_provider: str | None = None

    @classmethod
    def parse(cls, settings: ProviderSettings) -> _Options:
        """Read and check the options; every problem found is reported in one ConfigError."""
        reader = OptionReader(settings)
        options = cls.read(
            reader,
            beta=_beta(reader),
            caching=_caching(reader),
            native_output=reader.choice("structuredOutput", _OUTPUT_MODES, "tool") == "native",
            anthropic_version=reader.text("anthropicVersion", API_VERSION) or API_VERSION,
            default_max_tokens=reader.integer("defaultMaxTokens", 4096, 1),
            price_provider=reader.text("priceProvider"),
        )
        reader.check()
        return options


def _beta(reader: OptionReader) -> tuple[str, ...]:
    beta = reader.options.get("beta") or ()
    if isinstance(beta, str):
        beta = (beta,)
    if not isinstance(beta, (list, tuple)) or not all(isinstance(b, str) for b in beta):
        reader.problem("beta", "must be a string or a list of strings")
        return ()
    return tuple(beta)


def _caching(reader: OptionReader) -> _wire.CachePlan:
    value = reader.options.get("promptCaching", False)
    caching = _cache_plan(value)
    if caching is None:
        reader.problem("promptCaching", f"must be true, false or a mapping of {', '.join(_CACHE_PARTS)} to "
                                        f"booleans, not {value!r}")
        return _wire.CachePlan()
    return caching


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


def _headers(settings: ProviderSettings, options: _Options) -> dict[str, str]:
    # Only towards Anthropic itself: never send ANTHROPIC_API_KEY to another server.
    api_key = resolve_api_key(settings, "ANTHROPIC_API_KEY")
    headers = {
        "content-type": "application/json",
        "accept": "application/json",
        "anthropic-version": options.anthropic_version,
    }
    if api_key:
        headers["x-api-key"] = api_key
    if options.beta:
        headers["anthropic-beta"] = ",".join(options.beta)
    return override_headers(headers, options.headers)


def _describe_error(data: Any) -> str | None:
    """Return the message of an API error body, its type in brackets."""
    detail = _wire.error_detail(data)
    if detail is None:
        return None
    message, kind = detail
    return f"{message} [{kind}]" if kind and kind != message else message


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
    ``maxKeepaliveConnections``  most idle connections kept, default ``maxConnections`` (httpcore)
    ``keepaliveExpiry``          idle connection lifetime, default 5 s
    ``transport``                ``auto`` (aiohttp under asyncio, httpcore under trio),
                                 ``aiohttp`` or ``httpcore``
    ``poolShards``               httpcore pools to spread load over, default 64
    ``proxy``                    proxy URL, default from the environment
    ``priceProvider``            genai-prices provider id for costs (default ``anthropic``
                                 towards api.anthropic.com, else none: prices unknown unless
                                 overridden)
    ===========================  ===============================================================

    Durations are seconds or strings such as ``500ms``, ``30s``, ``2m``. Bad options raise
    :class:`~loopwright.errors.ConfigError` when the provider is built.

    ``contextStrategy: {kind: providerNative, edits?: [...]}`` sends ``context_management:
    {edits}`` (default one ``clear_tool_uses_20250919`` edit with the API's defaults). It is a
    beta: without :data:`CONTEXT_MANAGEMENT_BETA` in ``beta`` a request raises ``ConfigError``.

    :meth:`complete` retries transient failures (HTTP 408, 409, 429, 5xx including 529
    ``overloaded_error``, timeouts, connection errors; an ``x-should-retry`` header overrides)
    with :func:`~loopwright.retry_transient`, honouring ``retry-after-ms`` and
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
        base_url = check_base_url(settings, default=DEFAULT_BASE_URL)
        self.url = f"{base_url}/v1/messages"
        self.price_provider_id = options.price_provider or (
            "anthropic" if httpx.URL(base_url).host == "api.anthropic.com" else None)
        self._headers = headers = _headers(settings, options)
        require_api_key(settings, "ANTHROPIC_API_KEY", headers, url=base_url,
                        auth_headers=("x-api-key", "authorization"))
        self._http = Endpoint(self.url, provider=settings.name, options=options, headers=headers,
                              client=settings.http_client, describe_error=_describe_error,
                              request_id_header="request-id")
        self._tools = ToolsCache(_wire.encode_tools)
        self._thinking = _wire.ThinkingStash()
        self._encoder = _wire.MessageEncoder(self._thinking)

    def __repr__(self) -> str:
        return f"AnthropicProvider(name={self.settings.name!r}, url={self.url!r})"

    @property
    def _client(self) -> httpx.AsyncClient | None:
        """The HTTP client in use, once there is one (tests look into its pools)."""
        return self._http.client

    def _body(self, request: ModelRequest, *, stream: bool) -> tuple[bytes, _wire.OutputTool | None]:
        options = self._options
        if request.context_management is not None and not any(
                b.startswith("context-management") for b in options.beta):
            raise ConfigError(
                f"provider {self.settings.name!r}: contextStrategy providerNative uses Anthropic's context "
                f"editing, a beta: add 'beta: {CONTEXT_MANAGEMENT_BETA}' to the provider's options")
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
        return await self._http.retry(functools.partial(self._post, request, body, output))

    async def _post(self, request: ModelRequest, body: bytes, output: _wire.OutputTool | None) -> ModelResponse:
        response = await self._http.send(body, model=request.model)
        return self._decode_body(request, response, output)

    def _decode_body(
        self, request: ModelRequest, response: httpx.Response, output: _wire.OutputTool | None,
    ) -> ModelResponse:
        try:
            data = json.loads(response.content)
        except ValueError as exc:
            raise self._http.error("the response body is not JSON", model=request.model, response=response) from exc
        try:
            return _wire.decode_response(data, model=request.model, output=output, thinking=self._thinking)
        except _wire.MalformedResponseError as exc:
            raise self._http.error(str(exc), model=request.model, response=response) from exc

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
        response = await self._http.post(body, model=request.model, stream=True)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            async for delta in self._plain_deltas(request, response, output):
                yield delta
            return
        accumulator = _wire.StreamAccumulator(model=request.model, output=output, thinking=self._thinking)
        try:
            async with contextlib.aclosing(self._http.events(response, model=request.model)) as events:
                async for event in events:
                    for delta in accumulator.feed(event.event, self._event_data(request, response, event.data)):
                        yield delta
                    if accumulator.finished:
                        break
        except _wire.StreamError as exc:
            raise self._stream_error(request, response, exc) from exc
        finally:
            await response.aclose()
        try:
            answer = accumulator.response()
        except _wire.StreamError as exc:
            raise self._http.error(f"{exc} (the stream was cut)", model=request.model, response=response,
                                   transient=True) from exc
        yield StreamDelta(kind="done", response=answer)

    async def _plain_deltas(
        self, request: ModelRequest, response: httpx.Response, output: _wire.OutputTool | None,
    ) -> AsyncIterator[StreamDelta]:
        """Read a plain JSON answer given to a stream request, as :meth:`Provider.stream` does."""
        await self._http.read(response, model=request.model)
        answer = self._decode_body(request, response, output)
        if answer.message.content:
            yield StreamDelta(kind="text", text=answer.message.content)
        for call in answer.message.tool_calls:
            yield StreamDelta(kind="tool_call", tool_call_id=call.id, name=call.name)
        yield StreamDelta(kind="done", response=answer)

    def _event_data(self, request: ModelRequest, response: httpx.Response, data: str) -> Any:
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise self._http.error("a stream event's data is not JSON", model=request.model, response=response,
                                   body=data) from exc

    def _stream_error(self, request: ModelRequest, response: httpx.Response, exc: _wire.StreamError) -> ProviderError:
        kind = exc.error_type
        message = f"{exc} [{kind}]" if kind and kind != str(exc) else str(exc)
        request_id = response.headers.get("request-id")
        if request_id:
            message += f" (request {request_id})"
        return self._http.error(f"stream error: {message}", model=request.model, response=response,
                                transient=kind in _TRANSIENT_ERROR_TYPES)

    async def aclose(self) -> None:
        """Close the HTTP client if this provider built it; an injected one stays open."""
        await self._http.aclose()
