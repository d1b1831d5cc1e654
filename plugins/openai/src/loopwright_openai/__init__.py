"""loopwright's OpenAI provider plugin: the ``openai`` provider kind.

It speaks Chat Completions (OpenAI and the many compatible servers) or the Responses API, plain
and streamed. Found through the entry point ``openai = "loopwright_openai"`` of group
``loopwright``. An assembly uses it as::

    providers:
      default: {kind: openai, apiKeyEnv: OPENAI_API_KEY}
      gpt5:    {kind: openai, api: responses, stream: true}
      local:   {kind: openai, baseUrl: "http://127.0.0.1:8000/v1", quirks: [toolChoiceAuto]}

``docs/providers/openai.md`` describes every option, both modes, streaming, and what each
compatible server does differently.

Importing this module is cheap: it imports neither httpx nor the provider code, which load
when a runtime first builds an ``openai`` provider. See
:class:`~loopwright_openai._provider.OpenAIProvider` for the settings and options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwright import hookimpl
from loopwright.options import HTTP_OPTIONS, options_schema

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwright.abc import ProviderSettings
    from loopwright_openai._provider import OpenAIProvider

__all__ = ["OpenAIProvider", "loopwright_register_providers", "make_provider"]


def make_provider(settings: ProviderSettings) -> OpenAIProvider:
    """Build an :class:`OpenAIProvider` from ``settings`` (the factory registered as ``openai``).

    :raises loopwright.errors.ConfigError: If an option is invalid.
    """
    from loopwright_openai._provider import OpenAIProvider  # noqa: PLC0415 - keeps import cheap

    return OpenAIProvider(settings)


#: The options the provider takes (checked by the runtime at their place in the assembly).
OPTIONS = options_schema({
    **HTTP_OPTIONS,
    "api": {"enum": ["chat", "responses"]},
    "maxTokensField": {"enum": ["max_tokens", "max_completion_tokens"]},
    "quirks": {"type": ["array", "string", "null"], "items": {"type": "string"}},
    "organization": {"type": ["string", "null"]},
    "project": {"type": ["string", "null"]},
    "priceProvider": {"type": ["string", "null"]},
})


@hookimpl
def loopwright_register_providers(register: Callable[..., None]) -> None:
    """Register the provider kind ``openai``."""
    register("openai", make_provider, options=OPTIONS)


def __getattr__(name: str) -> Any:
    # ``loopwright_openai.OpenAIProvider`` works, but imports httpx only when asked for.
    if name == "OpenAIProvider":
        from loopwright_openai._provider import OpenAIProvider  # noqa: PLC0415

        return OpenAIProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
