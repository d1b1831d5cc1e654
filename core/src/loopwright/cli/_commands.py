"""The commands' work, by name: the module the click wiring imports to run a command.

Each function here takes the :class:`~loopwright.cli.CliSettings` and the parsed arguments of
one command, and returns its exit code; :mod:`loopwright.cli._wiring` calls it by the command's
name, importing this module only then, so that ``loopwright --help`` imports none of it. The
work itself lives in one module per family of commands:

* :mod:`~loopwright.cli._running`: ``run`` (and ``submit``), ``resume``;
* :mod:`~loopwright.cli._steer`: ``approve``, ``deny``, ``message``, ``cancel``, ``fork``, ``rewind``,
  ``delete``, ``gc``;
* :mod:`~loopwright.cli._inspect`: ``show``, ``ls``, ``records``;
* :mod:`~loopwright.cli._serving`: ``worker``, ``serve``, ``mcp-serve``;
* :mod:`~loopwright.cli._checks`: ``plugins``, ``validate``;
* :mod:`~loopwright.cli._memory`: ``memory remember``, ``memory recall``, ``memory forget``.

What only some commands use is imported inside them (the runtime and anyio, the live display
and the terminal question for the commands that follow a run, the worker loop, entry-point
metadata for ``plugins``), so that ``ls`` and ``show`` import no more than reading the store
takes: on an assembly a bare store can serve (:func:`loopwright._reading.bare_store`: a
built-in store and nothing else to open) they read it without a runtime, and without an event
loop for the file store; on any other, they open a runtime as every command does. For the
same reason a command imports only its own family's module: each name here is imported from
its module on first access (PEP 562, as :mod:`loopwright` does for its own names), so ``ls``
imports :mod:`~loopwright.cli._inspect` and not the modules that start, steer or serve runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopwright.cli._checks import plugins, validate
    from loopwright.cli._inspect import ls, records, show
    from loopwright.cli._memory import memory_forget, memory_recall, memory_remember
    from loopwright.cli._running import resume, run
    from loopwright.cli._serving import mcp_serve, server, worker
    from loopwright.cli._steer import approve, cancel, delete, deny, fork, gc, message, rewind

#: The module of each command's work, imported when the command asks for it (see the docstring).
_LAZY = {
    "approve": "_steer",
    "cancel": "_steer",
    "delete": "_steer",
    "deny": "_steer",
    "fork": "_steer",
    "gc": "_steer",
    "ls": "_inspect",
    "mcp_serve": "_serving",
    "memory_forget": "_memory",
    "memory_recall": "_memory",
    "memory_remember": "_memory",
    "message": "_steer",
    "plugins": "_checks",
    "records": "_inspect",
    "resume": "_running",
    "rewind": "_steer",
    "run": "_running",
    "server": "_serving",
    "show": "_inspect",
    "validate": "_checks",
    "worker": "_serving",
}

__all__ = [
    "approve",
    "cancel",
    "delete",
    "deny",
    "fork",
    "gc",
    "ls",
    "mcp_serve",
    "memory_forget",
    "memory_recall",
    "memory_remember",
    "message",
    "plugins",
    "records",
    "resume",
    "rewind",
    "run",
    "server",
    "show",
    "validate",
    "worker",
]


def __getattr__(name: str) -> Any:
    """Import a command's module on first access (see ``_LAZY``); raise AttributeError for other names."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"loopwright.cli.{module}"), name)
    globals()[name] = value
    return value
