"""Fixtures: the echo API on a local port, and both anyio backends for every async test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loopwright_example_echo.server import EchoServer


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each ``@pytest.mark.anyio`` test under asyncio and under trio."""
    return str(request.param)


@pytest.fixture
def echo_server() -> Iterator[EchoServer]:
    """Serve the echo API from a thread for one test."""
    with EchoServer() as server:
        yield server
