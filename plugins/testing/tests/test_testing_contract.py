"""The provider contract, run against this distribution's own providers."""

from __future__ import annotations

import re

import pytest
from lwtesting_tools import run_pytest

from loopwright_testing import FakeProvider, TestProvider, reply, tool_call
from loopwright_testing.contract import ProviderContract


class TestTestProviderContract(ProviderContract):
    """The ``test`` provider keeps the provider contract."""

    def make_provider(self):
        return TestProvider()


class TestScriptedProviderContract(ProviderContract):
    """A scripted provider keeps the provider contract (with an async make_provider)."""

    model = "scripted-model"

    async def make_provider(self):
        return FakeProvider(reply("calling", tool_call("add", a=1, b=2)))


def test_contract_without_make_provider_fails_clearly():
    """A subclass that forgets make_provider gets a NotImplementedError naming the class."""

    class TestForgot(ProviderContract):
        pass

    with pytest.raises(NotImplementedError, match="TestForgot must implement make_provider"):
        TestForgot().make_provider()


def test_contract_is_collected_for_subclasses(tmp_path):
    """A third party's Test subclass runs every check: a good provider passes, a broken one fails clearly."""
    output = run_pytest(
        tmp_path,
        """
        from loopwright import Message, ModelResponse
        from loopwright.abc import Provider
        from loopwright_testing import ScriptedProvider
        from loopwright_testing.contract import ProviderContract

        class TestMine(ProviderContract):
            def make_provider(self):
                provider = ScriptedProvider()
                provider.enqueue("hello")
                return provider

        class UserRole(Provider):
            async def complete(self, request):
                return ModelResponse(message=Message(role="user", content="oops"))

        class TestBroken(ProviderContract):
            def make_provider(self):
                return UserRole()
        """,
    )
    for check in (
        "complete_returns_an_assistant_message",
        "usage_is_a_usage",
        "tool_specs_are_accepted",
        "tool_results_are_accepted",
        "aclose_works",
    ):
        assert re.search(rf"TestMine::test_{check}\[asyncio\] PASSED", output), output
    assert re.search(r"TestBroken::test_complete_returns_an_assistant_message\[asyncio\] FAILED", output)
    assert "assert 'user' == 'assistant'" in output  # the contract's asserts are rewritten
