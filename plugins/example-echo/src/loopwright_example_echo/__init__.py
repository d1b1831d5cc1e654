"""loopwright-example-echo: the ``echo`` provider kind, an example third-party provider plugin.

loopwright finds this module through the entry point ``echo = "loopwright_example_echo"`` of
group ``loopwright``. Importing it is cheap: httpx and the provider code load only when a
runtime first builds an ``echo`` provider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import loopwright
from loopwright.options import options_schema

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwright import ProviderSettings
    from loopwright_example_echo._provider import EchoProvider

__all__ = ["OPTIONS", "loopwright_register_providers", "make_provider"]


def make_provider(settings: ProviderSettings) -> EchoProvider:
    """Build an :class:`EchoProvider` (the factory registered as ``echo``)."""
    from loopwright_example_echo._provider import EchoProvider  # noqa: PLC0415 - keeps the import cheap

    return EchoProvider(settings)


#: The options an ``echo`` provider takes: the runtime checks them at their place in the assembly
#: (an unknown key, a value of the wrong type) before it calls ``make_provider``.
OPTIONS = options_schema({
    "maxRetries": {"type": "integer", "minimum": 0},
    "timeout": {"type": "number", "exclusiveMinimum": 0},
    "free": {"type": "boolean"},
})


@loopwright.hookimpl
def loopwright_register_providers(register: Callable[..., None]) -> None:
    """Register the provider kind ``echo`` and the options it takes."""
    register("echo", make_provider, options=OPTIONS)
