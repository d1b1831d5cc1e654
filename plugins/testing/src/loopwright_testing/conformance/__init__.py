"""The provider conformance kit: one scenario set, run against a local server speaking the vendor's wire format.

A provider plugin checks itself by subclassing one test class::

    from loopwright_testing.conformance import OpenAIChatDialect, ProviderConformance

    class TestMyProvider(ProviderConformance):
        dialect = OpenAIChatDialect()
        provider_kind = "my-kind"
        unsupported = {"streaming": "the backend has no streaming endpoint"}

        def make_provider(self, settings):
            return MyProvider(settings)

Every scenario (:data:`SCENARIOS`) becomes a test method of the class, run under anyio. Each
starts a :class:`WireServer` on 127.0.0.1, points the provider at it (``settings.base_url``; the
provider uses its own HTTP client, over a real socket), scripts the server's answers and checks
both what the provider returns and what it sent. The vendor-specific part is a :class:`Dialect`:
:class:`OpenAIChatDialect` and :class:`AnthropicMessagesDialect` ship here; a provider with its
own wire format writes one (see ``docs/provider-conformance.md``).
"""

from __future__ import annotations

from loopwright_testing.conformance._anthropic import AnthropicMessagesDialect
from loopwright_testing.conformance._dialect import Dialect, wire_json
from loopwright_testing.conformance._model import (
    CapturedRequest,
    ScriptedAnswer,
    ScriptedCall,
    ScriptedError,
    SSEEvent,
    UnrepresentableError,
    WireFormatError,
    WireMessage,
    WireReply,
    WireRequest,
    WireToolCall,
    split_text,
)
from loopwright_testing.conformance._openai import OpenAIChatDialect
from loopwright_testing.conformance._server import WireServer
from loopwright_testing.conformance._suite import (
    SCENARIOS,
    Conformance,
    ConformanceFailure,
    ProviderConformance,
    Scenario,
)

__all__ = [
    "SCENARIOS",
    "AnthropicMessagesDialect",
    "CapturedRequest",
    "Conformance",
    "ConformanceFailure",
    "Dialect",
    "OpenAIChatDialect",
    "ProviderConformance",
    "SSEEvent",
    "Scenario",
    "ScriptedAnswer",
    "ScriptedCall",
    "ScriptedError",
    "UnrepresentableError",
    "WireFormatError",
    "WireMessage",
    "WireReply",
    "WireRequest",
    "WireServer",
    "WireToolCall",
    "split_text",
    "wire_json",
]
