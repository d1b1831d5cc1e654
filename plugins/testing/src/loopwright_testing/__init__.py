"""Deterministic providers and pytest fixtures for testing loopwright agents and plugins.

This distribution is itself a loopwright plugin (entry point ``testing``). It registers two
provider kinds, so ``test:any`` and ``scripted`` providers work without any assembly entry:

* ``test`` (:class:`TestProvider`): offline and deterministic; calls every tool once with
  arguments generated from its JSON Schema, then summarises the results.
* ``scripted`` (:class:`ScriptedProvider`): replays replies written in the assembly or a YAML file.

For Python tests there is :class:`FakeProvider` (``enqueue()`` and ``history``), the reply
helpers :func:`text`, :func:`reply`, :func:`tool_call` and :func:`error`,
:func:`register_plugin`, and the pytest fixtures ``fake_provider``, ``runtime`` and ``pm``
(module :mod:`loopwright_testing.pytest_plugin`, loaded by pytest automatically).
Third-party providers check themselves with :class:`loopwright_testing.contract.ProviderContract`,
and stores with :class:`loopwright_testing.store_contract.StoreContract`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwright_testing._helpers import register_plugin
    from loopwright_testing._schema import generate_arguments, generate_value
    from loopwright_testing._scripted import (
        FakeProvider,
        Reply,
        ScriptedError,
        ScriptedProvider,
        error,
        load_script,
        reply,
        text,
        tool_call,
    )
    from loopwright_testing._test_provider import COMPLETION_TOOLS, TestProvider

__all__ = [
    "COMPLETION_TOOLS",
    "FakeProvider",
    "Reply",
    "ScriptedError",
    "ScriptedProvider",
    "TestProvider",
    "error",
    "generate_arguments",
    "generate_value",
    "load_script",
    "register_plugin",
    "reply",
    "text",
    "tool_call",
]

# The names are imported on first use. pytest imports this package for the ``pytest11`` entry
# point in every session of an environment that has it installed, and importing loopwright costs
# about 0.3 s; a suite that never touches loopwright must not pay for it.
_LAZY: dict[str, str] = {
    "COMPLETION_TOOLS": "_test_provider",
    "FakeProvider": "_scripted",
    "Reply": "_scripted",
    "ScriptedError": "_scripted",
    "ScriptedProvider": "_scripted",
    "TestProvider": "_test_provider",
    "error": "_scripted",
    "generate_arguments": "_schema",
    "generate_value": "_schema",
    "load_script": "_scripted",
    "register_plugin": "_helpers",
    "reply": "_scripted",
    "text": "_scripted",
    "tool_call": "_scripted",
}

# Equivalent to ``loopwright.hookimpl``: pluggy markers are identified by the project name
# (``loopwright.hookspecs.PROJECT``), and this one does not import loopwright.
_hookimpl = pluggy.HookimplMarker("loopwright")


@_hookimpl
def loopwright_register_providers(register: Callable[..., None]) -> None:
    """Register the provider kinds ``test`` and ``scripted``."""
    from loopwright_testing._scripted import ScriptedProvider  # noqa: PLC0415
    from loopwright_testing._test_provider import TestProvider  # noqa: PLC0415

    register("test", TestProvider)
    register("scripted", ScriptedProvider)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"loopwright_testing.{module}"), name)
        globals()[name] = value
        return value
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415

        return version("loopwright-testing")
    raise AttributeError(f"module 'loopwright_testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
