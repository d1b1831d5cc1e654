"""Helpers for tests that drive a :class:`~loopwright.Runtime`."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from loopwright import Runtime

__all__ = ["register_plugin"]


@contextlib.contextmanager
def register_plugin(runtime: Runtime, obj: object, name: str | None = None) -> Iterator[str]:
    """Register a plugin on ``runtime`` for the ``with`` block, and unregister it on exit.

    Its hooks and the components it registers (providers, tools ...) take effect at once and
    are gone after the block, even when the block raises::

        with register_plugin(runtime, MyHooks()) as name:
            run = await runtime.start_agent(...)
            await run.result()

    :param runtime: The runtime (open or not; registering loads its plugins first).
    :param obj: A module or object with ``loopwright_*`` hook implementations.
    :param name: The plugin's name; default: the module's name, or one made from the object.
    :return: The name it was registered under, as the ``with`` target.
    """
    registered = runtime.register_plugin(obj, name)
    try:
        yield registered
    finally:
        runtime.unregister_plugin(registered)
