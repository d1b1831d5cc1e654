"""The OpenAI provider (``kind: openai``): Chat Completions or the Responses API, over httpx.

Works with OpenAI and with the many servers that speak the same wire format (vLLM, llama.cpp,
Ollama, LM Studio, LiteLLM, OpenRouter ...) through ``baseUrl``; see ``docs/providers/openai.md``
for what each of them does differently and how the provider copes.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import httpx
from loopwright._retry import parse_retry_after, retry_transient
from loopwright._types import StreamDelta
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ConfigError, ConfigProblem, ProviderError

from loopwright_openai import _responses, _sse, _wire
from loopwright_openai._pool import ShardedTransport, environment_proxy, ssl_context

if TYPE_CHECKING:
    from loopwright._types import ModelRequest, ModelResponse

__all__ = ["DEFAULT_BASE_URL", "OpenAIProvider"]

#: The base URL used when the assembly sets no ``baseUrl``.
DEFAULT_BASE_URL = "https://api.openai.com/v1"

_TRANSIENT_STATUSES = frozenset({408, 409, 429})
_MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")
_APIS = ("chat", "responses")
# A server that cannot stream when tools are given (llama.cpp's llama-server without --jinja
# answers 500 "Cannot use tools with stream"): the error names both, and says no.
_NO_STREAM_WITH_TOOLS = re.compile(
    r"(?=.*\bstream)(?=.*\btool)(?=.*(cannot|can't|not supported|unsupported|does not support|not allowed))",
    re.IGNORECASE | re.DOTALL)
# A server refusing ``content: null`` beside tool calls (llama-cpp-python: 500 "Input should be a
# valid string"; Mistral's templates ...).
_NULL_REFUSED = re.compile(
    r"valid string|must be a string|(?:not|n't) be null|null is not|none is not|expected (?:a )?string",
    re.IGNORECASE)
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
        api: ``api``: ``chat`` (Chat Completions, default) or ``responses`` (the Responses API).
        quirks: ``quirks``: names from :data:`~loopwright_openai._wire.QUIRKS`.
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
    api: str = "chat"
    quirks: frozenset[str] = frozenset()
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
        api = opts.get("api", "chat")
        if api not in _APIS:
            problems.append(ConfigProblem(f"must be one of {', '.join(_APIS)}, not {api!r}", path=where("api")))
            api = "chat"
        quirks = opts.get("quirks") or []
        if isinstance(quirks, str):
            quirks = [quirks]
        if not isinstance(quirks, list) or not all(isinstance(q, str) for q in quirks):
            problems.append(ConfigProblem("must be a list of quirk names", path=where("quirks")))
            quirks = []
        unknown = [q for q in quirks if q not in _wire.QUIRKS]
        if unknown:
            problems.append(ConfigProblem(
                f"unknown quirk {', '.join(map(repr, unknown))}; known: {', '.join(_wire.QUIRKS)}",
                path=where("quirks")))
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
            api=api,
            quirks=frozenset(q for q in quirks if q in _wire.QUIRKS),
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


class _Assembler(Protocol):
    """What :class:`OpenAIProvider` needs of a stream reassembler (``ChatStream``, ``ResponsesStream``)."""

    done: bool

    @property
    def complete(self) -> bool: ...

    def feed(self, data: str, event: str = "", /) -> list[StreamDelta]: ...

    def finish(self) -> ModelResponse: ...


class _StreamWithToolsUnsupported(Exception):  # noqa: N818 - a signal, not a failure
    """The server refused to stream a request that carries tools."""


class _Whole:
    """A stand-in assembler for a server that answered a stream request with one JSON body."""

    done = True
    complete = True

    def __init__(self, response: ModelResponse) -> None:
        self._response = response

    def feed(self, data: str, event: str = "", /) -> list[StreamDelta]:  # noqa: ARG002 - nothing to feed
        return []

    def finish(self) -> ModelResponse:
        return self._response


@attrs.define
class _Opened:
    """A stream whose first deltas have arrived."""

    response: httpx.Response | None
    events: AsyncIterator[_sse.Event] | None
    assembler: _Assembler
    first: list[StreamDelta]


class OpenAIProvider(Provider):
    """Calls ``POST {baseUrl}/chat/completions`` (or ``/responses``), for every model of its provider.

    Settings (:class:`~loopwright.abc.ProviderSettings`): ``base_url`` (default
    :data:`DEFAULT_BASE_URL`), ``api_key`` (sent as ``Authorization: Bearer``; when neither it
    nor ``base_url`` is set, ``OPENAI_API_KEY`` from the environment), ``http_client`` (an
    ``httpx.AsyncClient`` to use and leave open) and ``options``:

    ==========================  ================================================================
    ``api``                     ``chat`` (Chat Completions, default) or ``responses``
    ``quirks``                  server quirks to work around (see ``docs/providers/openai.md``)
    ``stream``                  read by the runtime: stream every call of this provider
    ``maxRetries``              retries of a transient failure, default 2
    ``retryBaseDelay``          first backoff delay, default 0.5 s (``retryMaxDelay``: 30 s)
    ``timeout``                 read/write/pool timeout, default 600 s; ``connectTimeout`` 5 s
    ``headers``                 extra request headers
    ``organization``            ``OpenAI-Organization`` header; ``project``: ``OpenAI-Project``
    ``maxTokensField``          ``max_tokens`` (default) or ``max_completion_tokens`` (chat)
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
    :class:`~loopwright.errors.ProviderError` when it gives up or the failure is final.

    :meth:`stream` reads the answer as server-sent events. Failures before the first delta are
    classified and retried as in :meth:`complete`; once a delta has been yielded nothing is
    retried here (the caller has seen part of the answer): a stream cut short raises a transient
    ``ProviderError`` and the loop decides.

    In Chat mode, a server's error can show that it needs a quirk (see
    :data:`~loopwright_openai._wire.QUIRKS`); the provider then turns that quirk on for good and
    sends the request again at once, without counting a retry. It learns ``noStreamOptions``
    from a 400/422 naming ``stream_options``, ``noStreamWithTools`` from a refusal to stream
    with tools (or an empty stream answering a request with tools), ``emptyToolCallContent``
    from an error about a null ``content``, ``jsonObjectFormat`` from an error about
    ``response_format`` and ``noToolChoiceRequired`` from one about ``tool_choice`` ``required``.

    Attributes:
        settings: The settings it was built from.
        url: The endpoint it posts to.
        price_provider_id: The genai-prices provider id the runtime prices calls with.
        quirks: The server quirks in force (those configured plus those learnt).

    """

    def __init__(self, settings: ProviderSettings) -> None:
        """Check the options and prepare the headers; the HTTP client is built on first use."""
        self.settings = settings
        self._options = options = _Options.parse(settings)
        base_url = _base_url(settings)
        self._responses_api = options.api == "responses"
        self.url = f"{base_url}/responses" if self._responses_api else f"{base_url}/chat/completions"
        self.price_provider_id = options.price_provider or (
            "openai" if httpx.URL(base_url).host == "api.openai.com" else None)
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
        self._tools: _wire.ToolsCache | _responses.ToolsCache = (
            _responses.ToolsCache() if self._responses_api else _wire.ToolsCache())
        self.quirks: frozenset[str] = options.quirks
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

    # -- bodies and decoding ---------------------------------------------------------------------

    def _body(self, request: ModelRequest, *, stream: bool) -> bytes:
        tools = request.tools
        tools_json = self._tools.get(tools) if tools else None
        if self._responses_api:
            return _responses.build_body(request, tools_json=tools_json, stream=stream)
        quirks = self.quirks
        return _wire.build_body(
            request, tools_json=tools_json, max_tokens_field=self._options.max_tokens_field,
            stream=stream, stream_options="noStreamOptions" not in quirks, quirks=quirks,
        )

    def _decode(self, data: Any, model: str) -> ModelResponse:
        if self._responses_api:
            return _responses.decode_response(data, model=model)
        return _wire.decode_response(data, model=model)

    # -- one piece -------------------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` and return the decoded answer.

        See the class docstring for retries and errors. Never raises for what the model wrote:
        unparseable tool arguments land in ``ToolCall.raw_arguments``.
        """
        return await self._retry(functools.partial(self._post, request))

    async def _post(self, request: ModelRequest) -> ModelResponse:
        response = await self._send(request, self._body(request, stream=False), stream=False)
        status = response.status_code
        if not 200 <= status < 300:  # noqa: PLR2004 - the success range
            if self._learn(request, response, stream=False):
                return await self._post(request)
            raise self._status_error(request, response)
        return self._decode_body(request, response)

    def _decode_body(self, request: ModelRequest, response: httpx.Response) -> ModelResponse:
        try:
            data = json.loads(response.content)
        except ValueError as exc:
            raise self._error(request, "the response body is not JSON", response) from exc
        try:
            return self._decode(data, request.model)
        except _wire.MalformedResponseError as exc:
            raise self._error(request, str(exc), response) from exc
        except _wire.APIReportedError as exc:
            raise self._error(request, str(exc), response, transient=exc.transient) from exc

    async def _send(self, request: ModelRequest, body: bytes, *, stream: bool) -> httpx.Response:
        client = self._client or self._build_client()
        http_request = client.build_request("POST", self.url, content=body, **self._request_kwargs)
        try:
            return await client.send(http_request, stream=stream)
        except httpx.TimeoutException as exc:
            raise self._transport_error(request, exc, "the request timed out", transient=True) from exc
        except (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL) as exc:
            raise self._transport_error(request, exc, "the request could not be sent",
                                        transient=False) from exc
        except httpx.TransportError as exc:  # network errors, resets, RemoteProtocolError, proxies
            raise self._transport_error(request, exc, "the connection failed", transient=True) from exc

    # -- streaming -------------------------------------------------------------------------------

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamDelta]:
        """Send ``request`` with ``stream: true`` and yield the answer as it arrives.

        Yields ``text``, ``tool_call`` and ``arguments`` deltas, then one ``done`` delta with
        the whole answer. See the class docstring for retries and errors.
        """
        if request.tools and "noStreamWithTools" in self.quirks:
            async for delta in super().stream(request):
                yield delta
            return
        try:
            opened = await self._retry(functools.partial(self._open_stream, request))
        except _StreamWithToolsUnsupported:
            self.quirks |= {"noStreamWithTools"}
            async for delta in super().stream(request):
                yield delta
            return
        assembler = opened.assembler
        try:
            for delta in opened.first:
                yield delta
            if opened.events is not None:
                async for event in opened.events:
                    for delta in self._feed(request, assembler, event, opened.response):
                        yield delta
            answer = self._finish(request, assembler, opened.response)
        finally:
            await _close(opened)
        yield StreamDelta(kind="done", response=answer)

    async def _open_stream(self, request: ModelRequest) -> _Opened:
        """Post a stream request and read up to its first delta (or its end).

        Everything that goes wrong here happens before the caller has seen any of the answer,
        so :meth:`stream` retries it like a failed :meth:`complete`.
        """
        body = self._body(request, stream=True)
        response = await self._send(request, body, stream=True)
        if not 200 <= response.status_code < 300:  # noqa: PLR2004 - the success range
            await self._read_whole(request, response)
            return await self._stream_refused(request, response)
        if response.headers.get("content-type", "").startswith("application/json"):
            # The server ignored ``stream: true`` and answered in one piece.
            await self._read_whole(request, response)
            answer = self._decode_body(request, response)
            return _Opened(response=None, events=None, assembler=_Whole(answer), first=_pieces(answer))
        assembler: _Assembler = (_responses.ResponsesStream(model=request.model) if self._responses_api
                                 else _wire.ChatStream(model=request.model))
        events = self._events(request, response)
        opened = _Opened(response=response, events=events, assembler=assembler, first=[])
        seen = 0
        try:
            while not opened.first:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    if not seen and request.tools and not self._responses_api:
                        # An empty 200 stream: llama-cpp-python's answer when it cannot stream
                        # the tool call the model chose (tool_choice auto).
                        raise _StreamWithToolsUnsupported from None
                    self._check_complete(request, assembler, response)
                    break
                seen += 1
                opened.first = self._feed(request, assembler, event, response)
        except BaseException:
            await _close(opened)
            raise
        return opened

    async def _read_whole(self, request: ModelRequest, response: httpx.Response) -> None:
        try:
            await response.aread()
        except httpx.TimeoutException as exc:
            raise self._transport_error(request, exc, "the request timed out", transient=True) from exc
        except httpx.TransportError as exc:
            raise self._transport_error(request, exc, "the connection failed", transient=True) from exc
        finally:
            await response.aclose()

    async def _stream_refused(self, request: ModelRequest, response: httpx.Response) -> _Opened:
        """Handle an error status in answer to a stream request: adapt and try again, or raise."""
        if self._learn(request, response, stream=True):
            return await self._open_stream(request)
        if request.tools and not self._responses_api and _NO_STREAM_WITH_TOOLS.search(response.text):
            raise _StreamWithToolsUnsupported
        raise self._status_error(request, response)

    def _learn(self, request: ModelRequest, response: httpx.Response, *, stream: bool) -> bool:
        """Turn on the quirk an error status shows the server needs; return whether it did."""
        if self._responses_api:
            return False
        quirks = self.quirks
        text = response.text
        lower = text.lower()
        learnt = None
        status = response.status_code
        if stream and "noStreamOptions" not in quirks and status in (400, 422) and "stream_options" in lower:
            learnt = "noStreamOptions"  # Groq, Mistral, some gateways
        elif ("emptyToolCallContent" not in quirks and "content" in lower and _NULL_REFUSED.search(text)
              and any(m.role == "assistant" and m.tool_calls and m.content is None for m in request.messages)):
            learnt = "emptyToolCallContent"  # llama-cpp-python
        elif ("jsonObjectFormat" not in quirks and request.output_schema is not None and "response_format" in lower
              and ("json_object" in lower or ("json_schema" in lower and "support" in lower))):
            learnt = "jsonObjectFormat"  # llama-cpp-python: "Input should be 'text' or 'json_object'"
        elif ("noToolChoiceRequired" not in quirks and request.tools and "tool_choice" in lower
              and "required" in lower and request.settings.get("toolChoice") == "required"):
            learnt = "noToolChoiceRequired"  # older vLLM
        if learnt is None:
            return False
        self.quirks = quirks | {learnt}
        return True

    async def _events(self, request: ModelRequest, response: httpx.Response) -> AsyncIterator[_sse.Event]:
        decoder = _sse.Decoder()
        try:
            async for line in response.aiter_lines():
                event = decoder.line(line)
                if event is not None:
                    yield event
        except httpx.TimeoutException as exc:
            raise self._transport_error(request, exc, "the stream timed out", transient=True) from exc
        except httpx.TransportError as exc:
            raise self._transport_error(request, exc, "the stream broke off", transient=True) from exc
        event = decoder.flush()
        if event is not None:
            yield event

    def _feed(
        self, request: ModelRequest, assembler: _Assembler, event: _sse.Event, response: httpx.Response | None,
    ) -> list[StreamDelta]:
        try:
            return assembler.feed(event[1], event[0])
        except _wire.MalformedResponseError as exc:
            raise self._error(request, str(exc), response) from exc
        except _wire.APIReportedError as exc:
            raise self._error(request, f"the stream failed: {exc}", response, transient=exc.transient) from exc

    def _check_complete(self, request: ModelRequest, assembler: _Assembler, response: httpx.Response | None) -> None:
        if not assembler.complete:  # cut short: no [DONE], no finish reason, no final response
            raise self._error(request, "the stream ended before the answer was complete", response,
                              transient=True)

    def _finish(self, request: ModelRequest, assembler: _Assembler, response: httpx.Response | None) -> ModelResponse:
        self._check_complete(request, assembler, response)
        try:
            return assembler.finish()
        except _wire.MalformedResponseError as exc:
            raise self._error(request, str(exc), response) from exc
        except _wire.APIReportedError as exc:
            raise self._error(request, str(exc), response, transient=exc.transient) from exc

    # -- errors ----------------------------------------------------------------------------------

    def _error(
        self, request: ModelRequest, message: str, response: httpx.Response | None, *, transient: bool = False,
    ) -> ProviderError:
        if response is None:
            return ProviderError(message, provider=self.settings.name, model=request.model, transient=transient)
        return ProviderError(
            message, provider=self.settings.name, model=request.model, status=response.status_code,
            body=_text(response), transient=transient, request=response.request,
        )

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


def _text(response: httpx.Response) -> str | None:
    try:
        return response.text
    except httpx.ResponseNotRead:
        return None


def _pieces(answer: ModelResponse) -> list[StreamDelta]:
    """Return the deltas of a whole answer, for a server that did not stream it."""
    message = answer.message
    out = [StreamDelta(kind="text", text=message.content)] if message.content else []
    for call in message.tool_calls:
        out.append(StreamDelta(kind="tool_call", tool_call_id=call.id, name=call.name))
        arguments = call.raw_arguments if call.raw_arguments is not None else json.dumps(dict(call.arguments))
        out.append(StreamDelta(kind="arguments", tool_call_id=call.id, text=arguments))
    return out


async def _close(opened: _Opened) -> None:
    events = opened.events
    if events is not None:
        await events.aclose()  # type: ignore[attr-defined]
    if opened.response is not None:
        await opened.response.aclose()

