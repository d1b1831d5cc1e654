"""The provider conformance kit, run against OpenAIProvider over a local Chat Completions server."""

from __future__ import annotations

from loopwright_openai import OpenAIProvider
from loopwright_testing.conformance import OpenAIChatDialect, ProviderConformance


class TestOpenAIConformance(ProviderConformance):
    """OpenAIProvider passes every conformance scenario, under asyncio and trio."""

    dialect = OpenAIChatDialect()
    provider_kind = "openai"
    provider_name = "oa"
    model = "gpt-conformance"

    def make_provider(self, settings):
        return OpenAIProvider(settings)
