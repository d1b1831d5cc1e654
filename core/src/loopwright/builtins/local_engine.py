"""The built-in ``local`` engine: submitted work stays in the store for ``loopwright worker``.

``engine: {kind: local}`` is the default. It takes no options. ``loopwright run`` without
``--detach`` runs the instance in the calling process (:attr:`LocalEngine.in_process` is
``True``); submitted work (``run --detach``, :meth:`loopwright.Runtime.submit`, a message or a
decision with ``--detach``) is already in the store when :meth:`LocalEngine.submit` is called,
so it has nothing to send: the workers that poll the store find it. A worker running in the
same process (:class:`loopwright.cli._worker.Worker`, or a host's) subscribes with
:meth:`LocalEngine.subscribe` and is woken at once instead of at its next poll.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwright.abc import Engine
from loopwright.hookspecs import hookimpl
from loopwright.options import options_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["OPTIONS", "LocalEngine", "loopwright_register_engines"]

#: The options of the ``local`` engine: none.
OPTIONS: Mapping[str, Any] = options_schema({})


class LocalEngine(Engine):
    """Leaves submitted work in the store, where workers find it; wakes this process's workers.

    :param options: The engine's options (none).
    :param runtime: The open runtime (unused: the work is in its store already).
    """

    in_process = True

    def __init__(self, options: Mapping[str, Any] | None = None, runtime: Any = None) -> None:
        """Build the engine; it holds nothing but its subscribers."""
        del options, runtime
        self._subscribers: list[Callable[[str], None]] = []

    def __repr__(self) -> str:
        return "LocalEngine()"

    async def submit(self, instance_id: str) -> None:
        """Wake each worker of this process (:meth:`subscribe`); the work itself is in the store already."""
        for wake in list(self._subscribers):
            wake(instance_id)

    def subscribe(self, wake: Callable[[str], None]) -> Callable[[], None]:
        """Call ``wake(instance_id)`` at each :meth:`submit` made in this process; return the unsubscribe.

        ``wake`` runs in the submitter's task and must not block (set an event).
        """
        self._subscribers.append(wake)

        def unsubscribe() -> None:
            if wake in self._subscribers:
                self._subscribers.remove(wake)

        return unsubscribe


@hookimpl
def loopwright_register_engines(register: Callable[..., None]) -> None:
    """Register the ``local`` engine kind."""
    register("local", LocalEngine, options=OPTIONS)
