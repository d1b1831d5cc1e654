"""A Temporal worker that runs loopwright instances: :func:`serve`.

One worker process polls the engine's task queue for workflow tasks (the small, deterministic
:class:`~loopwright_temporal._workflow.InstanceWorkflow`) and activity tasks
(``loopwright.advance``, which runs segments in the process's one open runtime). Start as many
as you like, on as many machines, against the same store and Temporal cluster.

Stopping (SIGTERM, or SIGINT/Ctrl-C): the worker stops polling and waits up to ``grace``
seconds for the segments it runs to rest (it drains). Segments still running then are stopped
as a crash would stop them, but cleanly: the runtime closes, whatever they saved stays saved,
the instance stays ``running`` and its lease is released, and the activity's retry resumes it
on another worker. A second signal skips the wait.
"""

from __future__ import annotations

import signal
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from loopwright_temporal._activities import Advancer
from loopwright_temporal._workflow import InstanceWorkflow

if TYPE_CHECKING:
    from temporalio.client import Client

    from loopwright import Runtime
    from loopwright_temporal._settings import TemporalSettings

__all__ = ["build_worker", "serve"]

#: Modules the sandbox passes through instead of importing again per workflow run: this
#: package (its workflow module imports only the standard library and temporalio) and the
#: core it is a plugin of, which the package's ``__init__`` imports.
_PASSTHROUGH = ("loopwright", "loopwright_temporal", "pluggy", "attrs", "cattrs", "anyio", "sniffio")

#: Seconds a workflow task waits for the worker that has the workflow cached before any worker takes it.
_STICKY = 3.0


def _log(line: str) -> None:
    sys.stderr.write(f"temporal worker: {line}\n")
    sys.stderr.flush()


def build_worker(client: Client, rt: Runtime, settings: TemporalSettings, *, max_concurrent: int | None = None,
                 grace: float = 30.0) -> Worker:
    """Return a worker for ``settings.task_queue`` whose activities run in ``rt`` (open)."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*_PASSTHROUGH)
    return Worker(
        client, task_queue=settings.task_queue, workflows=[InstanceWorkflow],
        activities=[Advancer(rt, log=_log).advance], identity=rt.owner,
        max_concurrent_activities=max_concurrent or settings.max_concurrent,
        graceful_shutdown_timeout=timedelta(seconds=grace),
        # A workflow task meant for a dead worker's cache goes to any worker after this (default 10 s).
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=_STICKY),
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )


async def serve(client: Client, rt: Runtime, settings: TemporalSettings, *, max_concurrent: int | None = None,
                grace: float = 30.0) -> int:
    """Run a worker until SIGTERM or SIGINT; return the exit code (0, or 130 after SIGINT)."""
    worker = build_worker(client, rt, settings, max_concurrent=max_concurrent, grace=grace)
    got: list[int] = []
    sys.stderr.write(f"temporal worker: task queue {settings.task_queue!r} on {settings.address} "
                     f"(namespace {settings.namespace}), up to {max_concurrent or settings.max_concurrent} "
                     f"segments at once, as {rt.owner}\n")
    sys.stderr.flush()

    async def watch() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                got.append(int(signum))
                if len(got) == 1:
                    sys.stderr.write(f"temporal worker: stopping: draining for up to {grace:g} s\n")
                    sys.stderr.flush()
                    tg.start_soon(worker.shutdown)
                else:
                    sys.stderr.write("temporal worker: second signal: not waiting\n")
                    sys.stderr.flush()
                    break
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await worker.run()
        tg.cancel_scope.cancel()
    return 130 if got and got[0] == signal.SIGINT else 0
