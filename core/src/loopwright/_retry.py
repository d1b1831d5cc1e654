"""Retrying transient provider failures, for provider plugins.

A provider's :meth:`~loopwright.abc.Provider.complete` retries the failures a retry may fix (its
own :class:`~loopwright.errors.ProviderError` with ``transient=True``) before giving up; the loop
then moves on to the fallback models. These helpers do that part the same way for every provider:

- :func:`retry_transient` calls, and calls again after exponential backoff with jitter, or after
  the delay the server asked for in ``Retry-After`` (capped at :data:`MAX_RETRY_AFTER`);
- :func:`parse_retry_after` reads that delay from response headers.

Both work under asyncio and trio (anyio).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import math
import random
import time
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from loopwright.errors import ProviderError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

__all__ = ["MAX_RETRY_AFTER", "parse_retry_after", "retry_transient"]

T = TypeVar("T")

#: The longest wait, in seconds, that a server's ``Retry-After`` can impose. Longer requests are
#: cut to this: a run that sleeps for an hour looks hung, and the next attempt will either succeed
#: or say again how long to wait.
MAX_RETRY_AFTER = 60.0

_jitter = random.Random()  # noqa: S311 - jitter spreads retries out; it is not a secret


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    *,
    max_retries: int,
    base_delay: float = 0.5,
    max_delay: float = 30.0,
    sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
) -> T:
    """Return ``await call()``, calling again while it raises a transient ``ProviderError``.

    Each failure with ``transient=True`` is followed by a wait and another call, at most
    ``max_retries`` times (so ``call`` runs at most ``max_retries + 1`` times). The wait is the
    error's ``retry_after`` when the server gave one (capped at :data:`MAX_RETRY_AFTER`, never
    negative), otherwise ``min(max_delay, base_delay * 2**n)`` for the n-th retry (from 0),
    shortened by a random 0-25 % so that many clients do not retry in step.

    A ``ProviderError`` with ``transient=False`` and any other exception (cancellation included)
    propagate at once. When the retries run out, the last error propagates with a note saying
    how many attempts were made.

    :param call: A function of no arguments returning an awaitable; called anew for each attempt.
    :param max_retries: How many retries after the first attempt; 0 disables retrying.
    :param base_delay: The first backoff delay in seconds.
    :param max_delay: The longest backoff delay in seconds (``Retry-After`` is capped separately).
    :param sleep: The async sleep to use; tests pass a fake one.
    :return: What ``call`` returned on the first successful attempt.
    :raises ValueError: If ``max_retries`` is negative.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, not {max_retries}")
    attempt = 0
    while True:
        try:
            return await call()
        except ProviderError as err:
            if not err.transient or attempt >= max_retries:
                if attempt:
                    err.add_note(f"gave up after {attempt + 1} attempts")
                raise
            delay = _delay(attempt, err.retry_after, base_delay, max_delay)
        # Sleep outside the except block, so the handled error is not the context of whatever
        # the sleep or the next attempt raises.
        attempt += 1
        await sleep(delay)


def _delay(attempt: int, retry_after: float | None, base_delay: float, max_delay: float) -> float:
    if retry_after is not None and math.isfinite(retry_after):
        return min(max(retry_after, 0.0), MAX_RETRY_AFTER)
    nominal = min(max_delay, base_delay * (2.0**attempt))
    return max(nominal * (1.0 - 0.25 * _jitter.random()), 0.0)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Return how many seconds the server asked the client to wait, or ``None`` if it did not say.

    Reads ``retry-after-ms`` (milliseconds, as OpenAI sends it) first, then ``Retry-After`` as a
    number of seconds or as an HTTP date. Header names match case-insensitively, also in a plain
    ``dict``. Unparseable, negative or non-finite values count as absent; a date in the past gives
    ``0.0``. The value is not capped here; :func:`retry_transient` caps it.

    :param headers: Response headers, an ``httpx.Headers`` or any mapping of strings.
    :param now: The current time as a Unix timestamp, for HTTP dates; default ``time.time()``.
    :return: Seconds to wait, or ``None``.
    """
    ms = _number(_header(headers, "retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    value = _header(headers, "retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" dates come back naive; HTTP dates are always in GMT
        when = when.replace(tzinfo=dt.UTC)
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, item in headers.items():
            if key.lower() == name:
                return item
    return value


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return number
