"""Shared settings of the fuzzers: how many examples each property runs, and hypothesis's options.

Each property states its CI size with ``@fuzz(N)``. ``LOOPWRIGHT_FUZZ_EXAMPLES`` replaces every
CI size by one number (for example 5000 for a long local run). Examples have no deadline (a
slow machine is not a failure; hangs are caught by the hang guards inside the properties), and
no example database is written, so a run leaves no files behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings

__all__ = ["HANG_GUARD", "examples", "fuzz"]

F = TypeVar("F", bound=Callable[..., Any])

#: Seconds after which one input counts as a hang (a generous guard, not a timing claim).
HANG_GUARD = 20.0


def examples(ci: int) -> int:
    """Return the number of examples to run: ``ci``, or ``LOOPWRIGHT_FUZZ_EXAMPLES`` when it is set."""
    override = os.environ.get("LOOPWRIGHT_FUZZ_EXAMPLES")
    return int(override) if override else ci


def fuzz(ci: int) -> Callable[[F], F]:
    """Hypothesis settings for a property that runs ``ci`` examples in CI (see :func:`examples`)."""
    return settings(max_examples=examples(ci), deadline=None, database=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])
