"""``loopwright temporal-worker``: run a Temporal worker for the assembly's instances.

The options default to the assembly's ``engine: {kind: temporal, ...}``; flags override them
(``--address`` and friends let a worker run against an assembly that names no engine, as
tests and benchmarks do).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import click

from loopwright.cli import CliSettings

__all__ = ["temporal_worker"]


def _duration(_ctx: Any, _param: Any, value: str | None) -> float | None:
    from loopwright import parse_duration  # noqa: PLC0415 - the core's loader only when the command runs

    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("temporal-worker")
@click.option("--address", help="The Temporal frontend's host:port (default: the engine's, else localhost:7233).")
@click.option("--namespace", help="The Temporal namespace (default: the engine's, else 'default').")
@click.option("--task-queue", help="The task queue to poll (default: the engine's, else 'loopwright').")
@click.option("--max-concurrent", type=click.IntRange(min=1), metavar="N",
              help="The most segments run at once (default: the engine's maxConcurrent, else 100).")
@click.option("--grace", default="30s", show_default=True, callback=_duration, metavar="DURATION",
              help="After SIGTERM or Ctrl-C, how long running segments may take to rest before they are "
                   "left running for another worker.")
def temporal_worker(address: str | None, namespace: str | None, task_queue: str | None,
                    max_concurrent: int | None, grace: float) -> None:
    """Run a Temporal worker: it advances the instances whose workflows are on the task queue.

    Start any number, on any machines, against the same store and Temporal cluster. It runs
    until SIGTERM or Ctrl-C, then drains (see --grace).
    """
    import anyio  # noqa: PLC0415 - the runtime only when the command runs

    from loopwright.errors import ConfigError, LoopwrightError  # noqa: PLC0415

    settings = click.get_current_context().find_object(CliSettings) or CliSettings()
    flags = {"address": address, "namespace": namespace, "taskQueue": task_queue, "maxConcurrent": max_concurrent}
    try:
        code = anyio.run(_serve, settings, {k: v for k, v in flags.items() if v is not None}, grace)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except LoopwrightError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)


async def _serve(settings: CliSettings, flags: Mapping[str, Any], grace: float) -> int:
    from loopwright import Runtime  # noqa: PLC0415
    from loopwright_temporal._engine import TemporalEngine  # noqa: PLC0415
    from loopwright_temporal._settings import TemporalSettings  # noqa: PLC0415
    from loopwright_temporal._worker import serve  # noqa: PLC0415

    rt = Runtime.from_file(settings.assembly_path())
    options = TemporalSettings.from_options({**engine_options(rt), **flags})
    async with TemporalEngine(options) as engine, rt:
        return await serve(await engine.client(), rt, options, grace=grace)


def engine_options(rt: Any) -> Mapping[str, Any]:
    """Return the options of the runtime's assembly's ``engine:`` when its kind is ``temporal``, else ``{}``."""
    engine = rt.assembly.engine
    return dict(engine.options) if engine.kind == "temporal" else {}
