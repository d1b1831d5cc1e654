"""The ``echo`` provider: loopwright's model interface over the echo protocol, with httpx.

The echo protocol is one endpoint, ``POST {baseUrl}/complete``. The request body is
``{"messages": [...], "model": ..., "tools": [...], "options": {...}}`` and the answer is
``{"text": ..., "toolCalls": [...], "usage": {"input": N, "output": N}, "finish": ...}``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import httpx

import loopwright
from loopwright import Message, ModelRequest, ModelResponse, ProviderSettings, ToolCall, Transcript, Usage
from loopwright.abc import Provider
from loopwright.errors import ConfigError, ProviderError

__all__ = ["CACHE_KEY", "DEFAULT_BASE_URL", "EchoProvider", "decode_response", "encode_message", "encode_request"]

#: Where the echo API listens when the assembly sets no ``baseUrl``.
DEFAULT_BASE_URL = "http://127.0.0.1:8765"
#: The name under which a transcript caches this provider's encoding of its messages.
CACHE_KEY = "echo-json"

# The echo protocol's finish reasons, and the normalised ones loopwright uses.
_FINISH = {"done": "stop", "tool": "tool_calls", "max_tokens": "length", "filtered": "content_filter"}
# modelSettings keys named differently in the echo protocol; other keys pass through unchanged.
_OPTIONS = {"maxTokens": "maxOutputTokens"}
# HTTP statuses a retry may fix, besides every 5xx.
_TRANSIENT = frozenset({408, 429})


class EchoProvider(Provider):
    """Provider kind ``echo``: calls ``POST {baseUrl}/complete``.

    Settings: ``base_url`` (default :data:`DEFAULT_BASE_URL`), ``api_key`` (sent as
    ``Authorization: Bearer``), ``http_client`` (an ``httpx.AsyncClient`` to use and leave open),
    and these ``options``:

    * ``maxRetries``: retries of a transient failure (default 2);
    * ``timeout``: seconds to wait for an answer (default 60);
    * ``free``: whether calls cost nothing (default false: the price is unknown unless the
      assembly's ``pricing:`` names it).

    Attributes:
        settings: The settings it was built from.
        url: The endpoint it posts to.
        free: Whether the runtime prices its calls at 0.
        price_provider_id: The genai-prices provider id: none, the echo API is not in that table.
    """

    price_provider_id: str | None = None

    def __init__(self, settings: ProviderSettings) -> None:
        """Check the options and prepare the HTTP client.

        :raises ConfigError: An option is unknown or has the wrong type.
        """
        self.settings = settings
        options = dict(settings.options)
        self.max_retries = options.pop("maxRetries", 2)
        timeout = options.pop("timeout", 60)
        self.free = options.pop("free", False)
        options.pop("stream", None)  # the runtime's option; Provider.stream answers in one piece
        if options:
            raise ConfigError(f"provider {settings.name!r}: unknown options {sorted(options)} "
                              "(known: free, maxRetries, timeout)")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"provider {settings.name!r}: maxRetries must be an integer >= 0")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"provider {settings.name!r}: timeout must be a number of seconds > 0")
        if not isinstance(self.free, bool):
            raise ConfigError(f"provider {settings.name!r}: free must be true or false")
        self.url = (settings.base_url or DEFAULT_BASE_URL).rstrip("/") + "/complete"
        self._headers = {"Content-Type": "application/json"}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        self._owns_client = settings.http_client is None
        # Room for many runs at once: httpx's default pool (100 connections, 20 kept alive) makes
        # concurrent runs queue for connections and reconnect.
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        self._client: httpx.AsyncClient = settings.http_client or httpx.AsyncClient(timeout=timeout, limits=limits)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` and return the answer, retrying transient failures.

        :raises ProviderError: The call failed for good (``transient`` says whether a later
            retry may help).
        """
        body = encode_request(request)
        return await loopwright.retry_transient(
            functools.partial(self._post, request, body), max_retries=self.max_retries)

    async def _post(self, request: ModelRequest, body: bytes) -> ModelResponse:
        name, model = self.settings.name, request.model
        try:
            response = await self._client.post(self.url, content=body, headers=self._headers)
        except httpx.TransportError as exc:  # timeouts, refused and reset connections
            raise ProviderError(f"the request failed: {exc!r}", provider=name, model=model,
                                transient=True, request=exc.request) from exc
        status = response.status_code
        if status != 200:  # noqa: PLR2004 - the echo API answers 200 or an error
            raise ProviderError(
                _error_text(response), provider=name, model=model, status=status, body=response.text,
                retry_after=_retry_after(response), transient=status in _TRANSIENT or status >= 500,  # noqa: PLR2004
                request=response.request)
        try:
            return decode_response(response.json(), model=model)
        except ValueError as exc:  # not JSON, or not an answer of the echo protocol
            raise ProviderError(f"unusable answer: {exc}", provider=name, model=model, status=status,
                                body=response.text, request=response.request) from exc

    async def aclose(self) -> None:
        """Close the HTTP client, unless it was injected (its owner closes it)."""
        if self._owns_client:
            await self._client.aclose()


# -- encoding ----------------------------------------------------------------------------------


def encode_message(message: Message) -> str:
    """Return the JSON text of one message. Pure, because a transcript caches what it returns."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["toolCalls"] = [
            {"id": call.provider_id, "name": call.name,
             # What the model wrote, when it was not valid JSON: the model sees its own mistake.
             "arguments": call.raw_arguments if call.raw_arguments is not None else _json(call.arguments)}
            for call in message.tool_calls]
    if message.role == "tool":
        out["toolCallId"] = message.provider_call_id
        out["name"] = message.name
    return _json(out)


def encode_request(request: ModelRequest) -> bytes:
    """Return the body of ``POST /complete`` for ``request``."""
    messages = request.messages
    if isinstance(messages, Transcript):
        encoded = messages.encoded(CACHE_KEY, encode_message)  # encodes only the new messages
    else:
        encoded = [encode_message(m) for m in messages]
    rest = {
        "model": request.model,
        "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                  for t in request.tools],
        "options": encode_options(request.settings),
    }
    # '{"messages":[...],' followed by the rest of the object without its opening brace.
    return ('{"messages":[' + ",".join(encoded) + "]," + _json(rest)[1:]).encode()


def encode_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Return the echo protocol's ``options`` for a definition's ``modelSettings``."""
    options: dict[str, Any] = {}
    for key, value in settings.items():
        if value is None or key == "toolChoice":  # the echo protocol cannot force a tool call
            continue
        if key == "stop":
            options["stopSequences"] = [value] if isinstance(value, str) else list(value)
        else:
            options[_OPTIONS.get(key, key)] = value
    return options


# -- decoding ----------------------------------------------------------------------------------


def decode_response(data: Any, *, model: str) -> ModelResponse:
    """Turn an answer of the echo protocol into a :class:`ModelResponse`.

    Never raises for what the model wrote; raises :class:`ValueError` when the API's answer is
    not an answer at all (not an object, ``toolCalls`` not a list, ``usage`` not an object).
    """
    if not isinstance(data, dict):
        raise ValueError(f"the answer is a JSON {type(data).__name__}, not an object")  # noqa: TRY004 - caught with the JSON errors
    text, raw_calls, usage = data.get("text"), data.get("toolCalls") or [], data.get("usage") or {}
    if not isinstance(raw_calls, list) or not isinstance(usage, dict):
        raise ValueError("toolCalls must be a list and usage an object")  # noqa: TRY004 - as above
    calls = tuple(_decode_call(raw) for raw in raw_calls if isinstance(raw, dict))
    input_tokens, output_tokens = _count(usage.get("input")), _count(usage.get("output"))
    raw_finish = data.get("finish") if isinstance(data.get("finish"), str) else None
    return ModelResponse(
        message=Message(role="assistant", content=text if isinstance(text, str) else None, tool_calls=calls),
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                    total_tokens=input_tokens + output_tokens, requests=1),
        # Unknown (newer) finish reasons count as a normal end; the raw one is kept for records.
        finish_reason=_FINISH.get(raw_finish or "", "tool_calls" if calls else "stop"),
        model=model,
        raw_finish_reason=raw_finish,
    )


def _decode_call(raw: Mapping[str, Any]) -> ToolCall:
    # An empty id is fine: the loop gives such calls (and repeated ids) an id of its own.
    call_id, name = str(raw.get("id") or ""), str(raw.get("name") or "")
    arguments = raw.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(id=call_id, name=name, arguments=parsed)
    # Not a JSON object: keep what the model wrote; the loop answers the call with invalid_arguments.
    return ToolCall(id=call_id, name=name, raw_arguments=arguments if isinstance(arguments, str) else _json(arguments))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300] or response.reason_phrase


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):  # absent, or an HTTP date: the backoff decides
        return None


def _json(value: Any) -> str:
    # default=dict: settings and schemas may hold read-only mappings, which json cannot encode.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=dict)
