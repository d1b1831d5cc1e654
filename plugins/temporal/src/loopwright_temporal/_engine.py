"""The Temporal engine: :class:`TemporalEngine` (``engine: {kind: temporal, ...}``).

The store remembers, Temporal dispatches. A runtime whose engine is Temporal runs nothing
in-process: :meth:`TemporalEngine.submit` starts the instance's workflow (workflow id = instance
id) if it is not running, and signals it ``wake``, in one call (signal-with-start), whenever the
store got work for the instance: a new instance, a message, a decision, a cancel, a resume. A
worker (``loopwright temporal-worker``) then runs the workflow's activity, which advances the
instance from the store.

A completed workflow of the same id (its instance was stopped) is started again; one that runs
(the instance waits for someone, or runs) gets the signal. So ``submit`` is safe to repeat: a
wake the workflow does not need costs it one activity that finds nothing to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from loopwright.abc import Engine
from loopwright_temporal._workflow import WAKE, WORKFLOW, InstanceInput, Timeouts

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.runtime import Runtime as TemporalRuntime

    from loopwright import Runtime
    from loopwright_temporal._settings import TemporalSettings

__all__ = ["TemporalEngine", "connect"]


async def connect(settings: TemporalSettings, runtime: TemporalRuntime | None = None) -> Client:
    """Connect a Temporal client to ``settings.address`` and ``settings.namespace``.

    :param runtime: The SDK runtime (its Rust threads) to connect on; default the SDK's global one.
    :raises loopwright.errors.LoopwrightError: The cluster cannot be reached (with its address).
    """
    from temporalio.client import Client  # noqa: PLC0415 - the SDK loads only when the engine is used

    from loopwright.errors import LoopwrightError  # noqa: PLC0415

    try:
        return await Client.connect(settings.address, namespace=settings.namespace, runtime=runtime)
    except RuntimeError as exc:
        raise LoopwrightError(f"engine temporal: cannot reach the Temporal cluster at {settings.address} "
                              f"(namespace {settings.namespace}): {exc}") from exc


class TemporalEngine(Engine):
    """Dispatches instances through Temporal workflows (see the module docstring).

    Attributes:
        in_process: ``False``: segments run in Temporal workers, not in the submitting process.
        settings: Where the cluster is, and the task queue.
    """

    in_process: ClassVar[bool] = False

    def __init__(self, settings: TemporalSettings, *, client: Client | None = None,
                 runtime: Runtime | None = None) -> None:
        """Dispatch through the cluster of ``settings``; connect on first use (or use ``client``).

        :param runtime: The loopwright runtime that opened the engine: :meth:`run_worker` runs
            its segments.
        """
        self.settings = settings
        self._client = client
        self._runtime_of_worker = runtime
        self._runtime: TemporalRuntime | None = None

    def __repr__(self) -> str:
        s = self.settings
        return f"TemporalEngine({s.address!r}, namespace={s.namespace!r}, task_queue={s.task_queue!r})"

    async def client(self) -> Client:
        """Return the engine's client, connecting it the first time."""
        if self._client is None:
            from temporalio.runtime import Runtime as TemporalRuntime  # noqa: PLC0415 - see connect()
            from temporalio.runtime import TelemetryConfig  # noqa: PLC0415

            # A runtime of the engine's own, dropped by aclose() (see there).
            self._runtime = TemporalRuntime(telemetry=TelemetryConfig())
            self._client = await connect(self.settings, self._runtime)
        return self._client

    async def submit(self, instance_id: str) -> None:
        """Make a worker advance ``instance_id``: start its workflow if needed and signal ``wake``.

        :raises loopwright.errors.LoopwrightError: The cluster cannot be reached or refused the
            call (naming the instance; its work stays in the store).
        """
        from temporalio.common import WorkflowIDReusePolicy  # noqa: PLC0415 - see connect()
        from temporalio.service import RPCError  # noqa: PLC0415

        from loopwright.errors import LoopwrightError  # noqa: PLC0415

        kept = (f"its work is saved in the store: 'loopwright resume {instance_id}' (or any command on it) "
                "hands it over again")
        try:
            client = await self.client()
            timeouts = Timeouts(heartbeat=self.settings.heartbeat_timeout, segment=self.settings.segment_timeout)
            await client.start_workflow(
                WORKFLOW, InstanceInput(instance_id=instance_id, timeouts=timeouts), id=instance_id,
                task_queue=self.settings.task_queue, start_signal=WAKE,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)
        except LoopwrightError as exc:
            raise LoopwrightError(f"instance {instance_id}: {exc}; {kept}") from exc
        except RPCError as exc:
            raise LoopwrightError(f"instance {instance_id}: engine temporal: the cluster at {self.settings.address} "
                                  f"refused to start or signal its workflow: {exc}; {kept}") from exc

    async def run_worker(self, *, poll: float, max_concurrent: int, once: bool, grace: float) -> int | None:
        """Run a Temporal worker on the engine's task queue in the engine's runtime (``loopwright worker``).

        The same worker as ``loopwright temporal-worker`` (:func:`loopwright_temporal._worker.serve`):
        it runs until SIGTERM or SIGINT, then drains for up to ``grace`` seconds. ``poll`` does
        not apply (Temporal hands out the work); with ``once`` it returns ``None``, so the
        command drains what the store holds, as for any engine.
        """
        del poll
        if once or self._runtime_of_worker is None:
            return None
        from loopwright_temporal._worker import serve  # noqa: PLC0415 - the worker only in a worker process

        return await serve(await self.client(), self._runtime_of_worker, self.settings,
                           max_concurrent=max_concurrent, grace=grace)

    async def describe(self, instance_id: str) -> dict[str, Any]:
        """Return the status of ``instance_id``'s workflow (for ``show`` and tests): ``{status, runId}``."""
        handle = (await self.client()).get_workflow_handle(instance_id)
        info = await handle.describe()
        return {"status": info.status.name if info.status else None, "runId": info.run_id,
                "parentId": info.parent_id}

    async def aclose(self) -> None:
        """Drop the client and the SDK runtime it connected on, now.

        The SDK has no close: its Rust threads stop when its runtime object is collected. Left
        to interpreter shutdown, one of them may call into Python while it finalizes, which
        aborts a short-lived process such as ``loopwright run --detach`` (temporalio/sdk-python
        issue 300); collected here, while Python runs, they stop cleanly.
        """
        import gc  # noqa: PLC0415 - only when closing

        owned = self._runtime is not None
        self._client = None
        self._runtime = None
        if owned:
            gc.collect()
