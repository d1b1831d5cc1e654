"""loopwright's Anthropic provider plugin: the ``anthropic`` provider kind, over the Messages API.

Found through the entry point ``anthropic = "loopwright_anthropic"`` of group ``loopwright``. An
assembly uses it as::

    providers:
      claude: {kind: anthropic, apiKeyEnv: ANTHROPIC_API_KEY, promptCaching: true}

and a definition as ``model: claude:claude-sonnet-4-5``.

Importing this module is cheap: it imports neither httpx nor the provider code, which load
when a runtime first builds an ``anthropic`` provider. See
:class:`~loopwright_anthropic._provider.AnthropicProvider` for the settings and options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwright import hookimpl
from loopwright.options import HTTP_OPTIONS, options_schema

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwright.abc import ProviderSettings
    from loopwright_anthropic._provider import AnthropicProvider

__all__ = ["AnthropicProvider", "loopwright_register_providers", "make_provider"]


def make_provider(settings: ProviderSettings) -> AnthropicProvider:
    """Build an :class:`AnthropicProvider` from ``settings`` (the factory registered as ``anthropic``).

    :raises loopwright.errors.ConfigError: If an option is invalid.
    """
    from loopwright_anthropic._provider import AnthropicProvider  # noqa: PLC0415 - keeps import cheap

    return AnthropicProvider(settings)


#: The options the provider takes (checked by the runtime at their place in the assembly).
OPTIONS = options_schema({
    **HTTP_OPTIONS,
    "anthropicVersion": {"type": ["string", "null"]},
    "beta": {"type": ["array", "string", "null"], "items": {"type": "string"}},
    "defaultMaxTokens": {"type": "integer", "minimum": 1},
    "promptCaching": {"type": ["boolean", "object"]},
    "structuredOutput": {"enum": ["tool", "native"]},
    "priceProvider": {"type": ["string", "null"]},
})


@hookimpl
def loopwright_register_providers(register: Callable[..., None]) -> None:
    """Register the provider kind ``anthropic``."""
    register("anthropic", make_provider, options=OPTIONS)


def __getattr__(name: str) -> Any:
    # ``loopwright_anthropic.AnthropicProvider`` works, but imports httpx only when asked for.
    if name == "AnthropicProvider":
        from loopwright_anthropic._provider import AnthropicProvider  # noqa: PLC0415

        return AnthropicProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
