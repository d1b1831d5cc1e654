"""loopwright's Temporal engine plugin: the ``temporal`` engine kind and the ``temporal-worker`` command.

A deployment is a set of Temporal workers: every instance is a workflow (workflow id = instance
id) whose activities advance it over the assembly's shared store, and messages, decisions and
cancels wake it with a signal. Found through the entry point ``temporal = "loopwright_temporal"``
of group ``loopwright``. An assembly uses it as::

    store: {kind: postgres, dsnEnv: LOOPWRIGHT_DSN}   # shared by every worker
    engine:
      kind: temporal
      address: temporal.internal:7233    # or addressEnv: TEMPORAL_ADDRESS; default localhost:7233
      namespace: default                 # default
      taskQueue: loopwright              # default
      heartbeatTimeout: 10s              # default: a silent worker is taken for dead after this
      maxConcurrent: 100                 # default: segments one worker runs at once

and runs workers with ``loopwright temporal-worker`` (as many as wanted, anywhere).
``plugins/temporal/README.md`` and ``docs/scale-out.md`` describe the design, the guarantees and
the measured costs.

Importing this module is cheap: it imports neither temporalio nor the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwright import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from loopwright_temporal._engine import TemporalEngine
    from loopwright_temporal._settings import TemporalSettings

__all__ = [
    "TemporalEngine",
    "TemporalSettings",
    "loopwright_register_commands",
    "loopwright_register_engines",
    "make_engine",
]


def make_engine(options: Mapping[str, Any], runtime: Any = None) -> TemporalEngine:
    """Build a :class:`TemporalEngine` from the ``engine:`` options (the factory registered as ``temporal``).

    :param options: The ``engine:`` mapping without ``kind`` (checked against the schema already).
    :param runtime: The runtime opening the engine (``loopwright worker`` runs its segments in it).

    :raises loopwright.errors.ConfigError: An option is invalid.
    """
    from loopwright_temporal._engine import TemporalEngine  # noqa: PLC0415 - keeps import cheap
    from loopwright_temporal._settings import TemporalSettings  # noqa: PLC0415

    return TemporalEngine(TemporalSettings.from_options(options), runtime=runtime)


@hookimpl
def loopwright_register_engines(register: Callable[..., None]) -> None:
    """Register the engine kind ``temporal`` (its options are checked against :data:`_settings.SCHEMA`)."""
    from loopwright_temporal._settings import SCHEMA  # noqa: PLC0415 - only the schema, no SDK

    register("temporal", make_engine, options=SCHEMA)


@hookimpl
def loopwright_register_commands(register: Callable[..., None]) -> None:
    """Register ``loopwright temporal-worker``."""
    from loopwright_temporal._command import temporal_worker  # noqa: PLC0415 - click only when the CLI asks

    register(temporal_worker)


def __getattr__(name: str) -> Any:
    # ``loopwright_temporal.TemporalEngine`` works, but imports temporalio only when asked for.
    if name == "TemporalEngine":
        from loopwright_temporal import _engine  # noqa: PLC0415

        return _engine.TemporalEngine
    if name == "TemporalSettings":
        from loopwright_temporal import _settings  # noqa: PLC0415

        return _settings.TemporalSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
