"""The echo provider passes loopwright's generic provider contract."""

from __future__ import annotations

import pytest

from loopwright import ProviderSettings
from loopwright_example_echo import make_provider
from loopwright_example_echo.server import EchoServer
from loopwright_testing.contract import ProviderContract


class TestEchoContract(ProviderContract):
    """Every check of ProviderContract, against the echo API on a local port."""

    model = "echo-1"

    @pytest.fixture(autouse=True)
    def _server(self, echo_server: EchoServer) -> None:
        self.base_url = echo_server.url

    def make_provider(self):
        return make_provider(ProviderSettings(name="echo", kind="echo", base_url=self.base_url))
