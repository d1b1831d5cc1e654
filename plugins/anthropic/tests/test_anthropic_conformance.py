"""The provider conformance kit, run against AnthropicProvider over a local Messages API server."""

from __future__ import annotations

from loopwright_anthropic import AnthropicProvider
from loopwright_testing.conformance import AnthropicMessagesDialect, ProviderConformance


class TestAnthropicConformance(ProviderConformance):
    """AnthropicProvider passes every conformance scenario, under asyncio and trio."""

    dialect = AnthropicMessagesDialect()
    provider_kind = "anthropic"
    provider_name = "claude"
    model = "claude-conformance"

    def make_provider(self, settings):
        return AnthropicProvider(settings)
