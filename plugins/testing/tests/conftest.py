"""Shared fixtures: every anyio test runs under asyncio and trio; tools for end-to-end runs."""

from __future__ import annotations

import pytest
from lwtesting_tools import ToolsPlugin


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def tools_plugin() -> ToolsPlugin:
    return ToolsPlugin()


@pytest.fixture
def loopwright_plugins(tools_plugin: ToolsPlugin) -> list[object]:
    return [tools_plugin]
