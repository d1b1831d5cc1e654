"""The OpenAI provider (``kind: openai``): Chat Completions or the Responses API, over httpx.

Works with OpenAI and with the many servers that speak the same wire format (vLLM, llama.cpp,
Ollama, LM Studio, LiteLLM, OpenRouter ...) through ``baseUrl``; see ``docs/providers/openai.md``
for what each of them does differently and how the provider copes.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import httpx

from loopwright import StreamDelta
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ConfigError
from loopwright.http import (
    Endpoint,
    HTTPOptions,
    OptionReader,
    SSEEvent,
    ToolsCache,
    check_base_url,
    override_headers,
    require_api_key,
    resolve_api_key,
)
from loopwright_openai import _responses, _sse, _wire

if TYPE_CHECKING:
    from loopwright import ModelRequest, ModelResponse
    from loopwright.errors import ProviderError

__all__ = ["DEFAULT_BASE_URL", "OpenAIProvider"]

#: The base URL used when the assembly sets no ``baseUrl``.
DEFAULT_BASE_URL = "https://api.openai.com/v1"

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
# A server refusing ``content: ""`` beside tool calls (gateways in front of Anthropic or Gemini:
# 400 "text content blocks must be non-empty", "... text: Field required").
_EMPTY_REFUSED = re.compile(
    r"non-empty|must not be empty|cannot be empty|can't be empty|empty (?:text|content)|text\W+field required",
    re.IGNORECASE)


@attrs.frozen(kw_only=True)
class _Options(HTTPOptions):
    """The provider's options, read from the assembly's provider mapping (camelCase keys).

    The HTTP ones (timeouts, connections, ``transport``, ``poolShards``, ``proxy``, ``headers``,
    retries) are those of :class:`~loopwright.http.HTTPOptions`; these are the provider's own.

    Attributes:
        organization: ``organization``: sent as ``OpenAI-Organization``.
        project: ``project``: sent as ``OpenAI-Project``.
        max_tokens_field: ``maxTokensField``: wire name of ``maxTokens``, ``max_tokens``
            (default) or ``max_completion_tokens`` (o-series and newer models).
        price_provider: ``priceProvider``: the genai-prices provider id for costs.
        api: ``api``: ``chat`` (Chat Completions, default) or ``responses`` (the Responses API).
        quirks: ``quirks``: names from :data:`~loopwright_openai._wire.QUIRKS`.

    """

    organization: str | None = None
    project: str | None = None
    max_tokens_field: str = "max_tokens"
    price_provider: str | None = None
    api: str = "chat"
    quirks: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, settings: ProviderSettings) -> _Options:
        """Read and check the options; every problem found is reported in one ConfigError."""
        reader = OptionReader(settings)
        options = cls.read(
            reader,
            max_tokens_field=reader.choice("maxTokensField", _MAX_TOKENS_FIELDS, "max_tokens"),
            api=reader.choice("api", _APIS, "chat"),
            quirks=_quirks(reader),
            organization=reader.text("organization"),
            project=reader.text("project"),
            price_provider=reader.text("priceProvider"),
        )
        reader.check()
        return options


def _quirks(reader: OptionReader) -> frozenset[str]:
    quirks = reader.options.get("quirks") or []
    if isinstance(quirks, str):
        quirks = [quirks]
    if not isinstance(quirks, list) or not all(isinstance(q, str) for q in quirks):
        reader.problem("quirks", "must be a list of quirk names")
        return frozenset()
    unknown = [q for q in quirks if q not in _wire.QUIRKS]
    if unknown:
        reader.problem("quirks", f"unknown quirk {', '.join(map(repr, unknown))}; known: {', '.join(_wire.QUIRKS)}")
    return frozenset(q for q in quirks if q in _wire.QUIRKS)


def _headers(settings: ProviderSettings, options: _Options) -> dict[str, str]:
    # Only towards OpenAI itself: never send OPENAI_API_KEY to another server.
    api_key = resolve_api_key(settings, "OPENAI_API_KEY")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if options.organization:
        headers["OpenAI-Organization"] = options.organization
    if options.project:
        headers["OpenAI-Project"] = options.project
    return override_headers(headers, options.headers)


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
    events: AsyncGenerator[SSEEvent, None] | None
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
    ``maxKeepaliveConnections`` most idle connections kept, default ``maxConnections`` (httpcore)
    ``keepaliveExpiry``         idle connection lifetime, default 5 s
    ``transport``               ``auto`` (aiohttp under asyncio, httpcore under trio),
                                ``aiohttp`` or ``httpcore``
    ``poolShards``              httpcore pools to spread load over, default 64
    ``proxy``                   proxy URL, default from the environment
    ``priceProvider``           genai-prices provider id for costs (default ``openai`` towards
                                api.openai.com, else none: prices unknown unless overridden)
    ==========================  ================================================================

    Durations are seconds or strings such as ``500ms``, ``30s``, ``2m``. Bad options raise
    :class:`~loopwright.errors.ConfigError` when the provider is built.

    ``contextStrategy: {kind: providerNative}`` sends ``truncation: auto`` (or the strategy's
    ``truncation``) to the Responses API. Chat Completions has nothing like it: a request
    asking for it raises :class:`~loopwright.errors.ConfigError` instead of ignoring it.

    :meth:`complete` retries transient failures (HTTP 408, 409, 429, 5xx, timeouts, connection
    errors; an ``x-should-retry`` header overrides) with :func:`~loopwright.retry_transient`,
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
    with tools (or an empty stream answering a request with tools), ``nullToolCallContent``
    from an error about an empty ``content`` beside tool calls (``""`` is the default, which
    every known server accepts), ``emptyToolCallContent`` from an error about a null one when
    ``nullToolCallContent`` was configured, ``jsonObjectFormat`` from an error about
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
        base_url = check_base_url(settings, default=DEFAULT_BASE_URL)
        self._responses_api = options.api == "responses"
        self.url = f"{base_url}/responses" if self._responses_api else f"{base_url}/chat/completions"
        self.price_provider_id = options.price_provider or (
            "openai" if httpx.URL(base_url).host == "api.openai.com" else None)
        self._headers = headers = _headers(settings, options)
        require_api_key(settings, "OPENAI_API_KEY", headers, url=base_url)
        self._http = Endpoint(self.url, provider=settings.name, options=options, headers=headers,
                              client=settings.http_client, describe_error=_wire.error_message)
        self._tools = ToolsCache(_responses.encode_tools if self._responses_api else _wire.encode_tools)
        self.quirks: frozenset[str] = options.quirks

    def __repr__(self) -> str:
        return f"OpenAIProvider(name={self.settings.name!r}, url={self.url!r})"

    @property
    def _client(self) -> httpx.AsyncClient | None:
        """The HTTP client in use, once there is one (tests look into its pools)."""
        return self._http.client

    # -- bodies and decoding ---------------------------------------------------------------------

    def _body(self, request: ModelRequest, *, stream: bool) -> bytes:
        tools = request.tools
        tools_json = self._tools.get(tools) if tools else None
        if self._responses_api:
            return _responses.build_body(request, tools_json=tools_json, stream=stream)
        if request.context_management is not None:
            raise ConfigError(
                f"provider {self.settings.name!r}: contextStrategy providerNative asks the API to manage the "
                "context, and the Chat Completions API cannot; set 'api: responses' on the provider "
                "(it sends truncation: auto) or use the compact or clearToolResults strategy")
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
        return await self._http.retry(functools.partial(self._post, request))

    async def _post(self, request: ModelRequest) -> ModelResponse:
        response = await self._send(request, self._body(request, stream=False), stream=False)
        if not response.is_success:
            if self._learn(request, response, stream=False):
                return await self._post(request)
            raise self._http.status_error(response, model=request.model)
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
        # An error status comes back read (and closed), for _learn and the status error.
        return await self._http.send(body, model=request.model, stream=stream, check=False)

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
            opened = await self._http.retry(functools.partial(self._open_stream, request))
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
        if not response.is_success:
            return await self._stream_refused(request, response)
        if response.headers.get("content-type", "").startswith("application/json"):
            # The server ignored ``stream: true`` and answered in one piece.
            await self._http.read(response, model=request.model)
            answer = self._decode_body(request, response)
            return _Opened(response=None, events=None, assembler=_Whole(answer), first=_pieces(answer))
        assembler: _Assembler = (_responses.ResponsesStream(model=request.model) if self._responses_api
                                 else _wire.ChatStream(model=request.model))
        events = self._http.events(response, model=request.model, decoder=_sse.Decoder())
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

    async def _stream_refused(self, request: ModelRequest, response: httpx.Response) -> _Opened:
        """Handle an error status in answer to a stream request: adapt and try again, or raise."""
        if self._learn(request, response, stream=True):
            return await self._open_stream(request)
        if request.tools and not self._responses_api and _NO_STREAM_WITH_TOOLS.search(response.text):
            raise _StreamWithToolsUnsupported
        raise self._http.status_error(response, model=request.model)

    def _learn(self, request: ModelRequest, response: httpx.Response, *, stream: bool) -> bool:
        """Turn on the quirk an error status shows the server needs; return whether it did."""
        if self._responses_api:
            return False
        quirks = self.quirks
        text = response.text
        lower = text.lower()
        learnt = None
        status = response.status_code
        # Whether the request holds an assistant turn of tool calls without text, and the error is about content.
        bare_calls = "content" in lower and any(
            m.role == "assistant" and m.tool_calls and not m.content for m in request.messages)
        if stream and "noStreamOptions" not in quirks and status in (400, 422) and "stream_options" in lower:
            learnt = "noStreamOptions"  # Groq, Mistral, some gateways
        elif (bare_calls and "nullToolCallContent" in quirks and "emptyToolCallContent" not in quirks
              and _NULL_REFUSED.search(text)):
            learnt = "emptyToolCallContent"  # llama-cpp-python, configured to get null
        elif bare_calls and "nullToolCallContent" not in quirks and _EMPTY_REFUSED.search(text):
            learnt = "nullToolCallContent"  # gateways to Anthropic or Gemini
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

    def _feed(
        self, request: ModelRequest, assembler: _Assembler, event: SSEEvent, response: httpx.Response | None,
    ) -> list[StreamDelta]:
        try:
            return assembler.feed(event.data, event.event or "")
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
        return self._http.error(message, model=request.model, response=response, transient=transient)

    async def aclose(self) -> None:
        """Close the HTTP client if this provider built it; an injected one stays open."""
        await self._http.aclose()


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
        await events.aclose()
    if opened.response is not None:
        await opened.response.aclose()

