"""Tests of loopwright._retry: retry_transient and parse_retry_after."""

from __future__ import annotations

import email.utils

import anyio
import pytest

from loopwright._retry import MAX_RETRY_AFTER, parse_retry_after, retry_transient
from loopwright.errors import ProviderError

pytestmark = pytest.mark.anyio


def _err(*, transient: bool = True, retry_after: float | None = None) -> ProviderError:
    return ProviderError("boom", provider="p", model="m", status=503 if transient else 400,
                         transient=transient, retry_after=retry_after)


class Script:
    """A call that raises the scripted errors in turn, then returns "ok"; it records sleeps."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.sleeps: list[float] = []

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


async def test_success_first_time_does_not_sleep():
    """A call that succeeds at once is made once and never sleeps."""
    script = Script()
    assert await retry_transient(script, max_retries=3, sleep=script.sleep) == "ok"
    assert (script.calls, script.sleeps) == (1, [])


async def test_transient_errors_are_retried_with_growing_backoff():
    """Transient failures are retried with exponential backoff shortened by at most 25 % jitter."""
    script = Script(_err(), _err(), _err())
    assert await retry_transient(script, max_retries=3, base_delay=1.0, max_delay=100.0,
                                 sleep=script.sleep) == "ok"
    assert script.calls == 4
    for n, slept in enumerate(script.sleeps):
        assert 0.75 * 2**n <= slept <= 2**n


async def test_backoff_is_capped_by_max_delay():
    """The backoff never exceeds max_delay."""
    script = Script(*[_err() for _ in range(6)])
    await retry_transient(script, max_retries=6, base_delay=1.0, max_delay=3.0, sleep=script.sleep)
    assert max(script.sleeps) <= 3.0
    assert script.sleeps[-1] >= 0.75 * 3.0


async def test_retry_after_is_honoured_exactly():
    """A server's retry_after replaces the backoff, without jitter."""
    script = Script(_err(retry_after=7.5), _err(retry_after=0.0))
    await retry_transient(script, max_retries=2, sleep=script.sleep)
    assert script.sleeps == [7.5, 0.0]


async def test_retry_after_is_capped():
    """A Retry-After beyond MAX_RETRY_AFTER is cut to it."""
    script = Script(_err(retry_after=3600.0))
    await retry_transient(script, max_retries=1, sleep=script.sleep)
    assert script.sleeps == [MAX_RETRY_AFTER]


async def test_gives_up_after_max_retries_with_the_last_error():
    """When retries run out the last transient error propagates, noting the attempt count."""
    last = _err()
    script = Script(_err(), _err(), last)
    with pytest.raises(ProviderError) as info:
        await retry_transient(script, max_retries=2, sleep=script.sleep)
    assert info.value is last
    assert script.calls == 3
    assert "gave up after 3 attempts" in getattr(info.value, "__notes__", [])


async def test_final_errors_are_not_retried():
    """A ProviderError with transient=False propagates on the first attempt."""
    script = Script(_err(transient=False))
    with pytest.raises(ProviderError):
        await retry_transient(script, max_retries=5, sleep=script.sleep)
    assert (script.calls, script.sleeps) == (1, [])


async def test_other_exceptions_are_not_retried():
    """Exceptions other than ProviderError propagate at once."""
    script = Script(KeyError("x"))
    with pytest.raises(KeyError):
        await retry_transient(script, max_retries=5, sleep=script.sleep)
    assert script.calls == 1


async def test_zero_retries_means_one_attempt():
    """max_retries=0 makes exactly one attempt."""
    script = Script(_err())
    with pytest.raises(ProviderError):
        await retry_transient(script, max_retries=0, sleep=script.sleep)
    assert script.calls == 1


async def test_negative_max_retries_is_rejected():
    """A negative max_retries is a programming error."""
    with pytest.raises(ValueError, match="max_retries"):
        await retry_transient(Script(), max_retries=-1)


async def test_real_sleep_works_under_the_backend():
    """With the default anyio sleep the retry really waits, under asyncio and trio alike."""
    script = Script(_err(retry_after=0.02))
    start = anyio.current_time()
    assert await retry_transient(script, max_retries=1) == "ok"
    assert anyio.current_time() - start >= 0.015


async def test_cancellation_during_backoff_propagates():
    """Cancelling while the retry sleeps stops it; no further attempt is made."""
    script = Script(_err(retry_after=10.0))
    with anyio.move_on_after(0.05):
        await retry_transient(script, max_retries=1)
    assert script.calls == 1


# -- parse_retry_after --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After-Ms": "250"}, 0.25),
        ({"retry-after-ms": "100", "retry-after": "9"}, 0.1),
        ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "soon"}, None),
    ],
)
def test_parse_retry_after_values(headers, expected):
    """retry-after-ms wins over Retry-After; names are case-insensitive; junk counts as absent."""
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date():
    """An HTTP-date Retry-After gives the seconds until that date, and 0 for a past date."""
    now = 1_700_000_000.0
    future = email.utils.formatdate(now + 30, usegmt=True)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"Retry-After": future}, now=now) == pytest.approx(30.0)
    assert parse_retry_after({"Retry-After": past}, now=now) == 0.0


def test_parse_retry_after_reads_httpx_headers():
    """httpx.Headers work as input."""
    httpx = pytest.importorskip("httpx")
    assert parse_retry_after(httpx.Headers({"Retry-After-MS": "20"})) == 0.02
