"""Error statuses and httpx exceptions as :class:`~loopwright.errors.ProviderError` s."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from loopwright._retry import parse_retry_after
from loopwright.errors import ProviderError

__all__ = ["TRANSIENT_STATUSES", "body_text", "is_transient_status", "status_error", "transport_error"]

#: HTTP statuses below 500 that a retry may fix (every 5xx may too, see :func:`is_transient_status`).
TRANSIENT_STATUSES = frozenset({408, 409, 429})

_SERVER_ERROR = 500


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


def body_text(response: httpx.Response) -> str | None:
    try:
        return response.text
    except httpx.ResponseNotRead:
        return None
