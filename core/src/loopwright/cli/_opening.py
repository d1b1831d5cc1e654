"""How the commands open what they work on: the assembly, its runtime, an instance by id, the event loop.

Every command that works on instances starts here: :func:`runtime` builds the runtime of the
assembly the options name (with the terminal approver on a terminal), :func:`assembly` loads the
assembly without a runtime (for the commands that may read a bare store), :func:`lookup` and
:func:`read_header` turn an unknown or malformed instance id into bad input (exit 2), and
:func:`sync` runs an async command under :func:`anyio.run`: with
:meth:`loopwright._reading.BareStore.run`, which ``ls`` and ``show`` call, this is the only place
loopwright goes from sync to async.

The runtime, the assembly loader, anyio and the terminal approver are imported inside the
functions that use them, so that importing this module (as ``ls`` and ``show`` do) costs no more
than reading the store takes.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from loopwright.cli._exits import EXIT_USAGE, CliError
from loopwright.errors import InstanceNotFoundError, StoreError, shown_path

if TYPE_CHECKING:
    from loopwright._definition import Assembly
    from loopwright._runtime import AgentRun, Runtime
    from loopwright.abc import Store
    from loopwright.cli._settings import CliSettings

__all__ = ["assembly", "lookup", "read_header", "runtime", "sync"]


def sync(fn: Callable[..., Awaitable[int]]) -> Callable[..., int]:
    """Return ``fn`` made synchronous: each call runs it under ``anyio.run`` and returns its exit code."""
    @functools.wraps(fn)
    def wrapper(*args: Any) -> int:
        import anyio  # noqa: PLC0415 - the event loop only for commands that need one: keeps ls and show cheap

        return anyio.run(functools.partial(fn, *args))
    return wrapper


def runtime(settings: CliSettings, assembly: Assembly | None = None) -> Runtime:
    """Return the runtime of the assembly the options name, or of ``assembly`` once loaded (not opened yet).

    On an interactive terminal (and without ``--json``), shell commands under an ``approval``
    grant are asked about at the terminal; elsewhere they wait at the loop's approval gate.

    :raises CliError: (exit 2) ``-c`` names a file that does not exist.
    """
    from loopwright._runtime import Runtime  # noqa: PLC0415 - the runtime only for commands that open one: keeps ls and show cheap

    interactive = not settings.json and sys.stdin.isatty() and sys.stderr.isatty()
    kwargs: dict[str, Any] = {}
    if interactive:
        from loopwright.cli._progress import terminal_approver  # noqa: PLC0415 - only on a terminal, for a cheap start

        kwargs["shell_approver"] = terminal_approver
    if assembly is not None:
        return Runtime(assembly, **kwargs)
    return Runtime.from_file(settings.assembly_path(), **kwargs)


def assembly(settings: CliSettings) -> Assembly:
    """Return the assembly the options name, as :meth:`Runtime.from_file <loopwright.Runtime.from_file>` loads it.

    An assembly is loaded and validated, but nothing it names is opened; with no assembly file,
    the default (empty) assembly.
    """
    from loopwright._config import assembly_from_file  # noqa: PLC0415 - the loader only when a command reads the assembly
    from loopwright._definition import Assembly  # noqa: PLC0415 - with the loader

    return assembly_from_file(settings.assembly_path()) or Assembly()


async def lookup(rt: Runtime, instance_id: str) -> AgentRun:
    """Return the run of ``instance_id``.

    :raises CliError: (exit 2) no such instance in the store, or a malformed id.
    """
    try:
        return await rt.get_agent(instance_id)
    except InstanceNotFoundError:
        raise CliError(_not_found(rt.store, instance_id), EXIT_USAGE) from None
    except StoreError as exc:
        if "invalid instance id" in str(exc):
            raise CliError(str(exc), EXIT_USAGE) from None
        raise


async def read_header(store: Store, instance_id: str) -> dict[str, Any]:
    """Return the saved header of ``instance_id``, with the same errors as :func:`lookup`."""
    try:
        return await store.read_header(instance_id)
    except InstanceNotFoundError:
        raise CliError(_not_found(store, instance_id), EXIT_USAGE) from None
    except StoreError as exc:
        if "invalid instance id" in str(exc):
            raise CliError(str(exc), EXIT_USAGE) from None
        raise


def _not_found(store: Store, instance_id: str) -> str:
    """Return the message for an id the store does not hold: where it looked, and how to list what it holds."""
    where = ", ".join(shown_path(p) for p in store.locations())
    return (f"no instance {instance_id!r} in the store{' at ' + where if where else ''} "
            "('loopwright ls' lists them)")
