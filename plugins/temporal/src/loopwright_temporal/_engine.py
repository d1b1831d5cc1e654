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

    from loopwright_temporal._settings import TemporalSettings

__all__ = ["TemporalEngine", "connect"]


async def connect(settings: TemporalSettings) -> Client:
    """Connect a Temporal client to ``settings.address`` and ``settings.namespace``.

    :raises loopwright.errors.LoopwrightError: The cluster cannot be reached (with its address).
    """
    from temporalio.client import Client  # noqa: PLC0415 - the SDK loads only when the engine is used

    from loopwright.errors import LoopwrightError  # noqa: PLC0415

    try:
        return await Client.connect(settings.address, namespace=settings.namespace)
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

    def __init__(self, settings: TemporalSettings, *, client: Client | None = None) -> None:
        """Dispatch through the cluster of ``settings``; connect on first use (or use ``client``)."""
        self.settings = settings
        self._client = client

    def __repr__(self) -> str:
        s = self.settings
        return f"TemporalEngine({s.address!r}, namespace={s.namespace!r}, task_queue={s.task_queue!r})"

    async def client(self) -> Client:
        """Return the engine's client, connecting it the first time."""
        if self._client is None:
            self._client = await connect(self.settings)
        return self._client

    async def submit(self, instance_id: str) -> None:
        """Make a worker advance ``instance_id``: start its workflow if needed and signal ``wake``.

        :raises loopwright.errors.LoopwrightError: The cluster cannot be reached.
        """
        from temporalio.common import WorkflowIDReusePolicy  # noqa: PLC0415 - see connect()

        client = await self.client()
        timeouts = Timeouts(heartbeat=self.settings.heartbeat_timeout, segment=self.settings.segment_timeout)
        await client.start_workflow(
            WORKFLOW, InstanceInput(instance_id=instance_id, timeouts=timeouts), id=instance_id,
            task_queue=self.settings.task_queue, start_signal=WAKE,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)

    async def describe(self, instance_id: str) -> dict[str, Any]:
        """Return the status of ``instance_id``'s workflow (for ``show`` and tests): ``{status, runId}``."""
        handle = (await self.client()).get_workflow_handle(instance_id)
        info = await handle.describe()
        return {"status": info.status.name if info.status else None, "runId": info.run_id,
                "parentId": info.parent_id}

    async def aclose(self) -> None:
        """Forget the client (the SDK's connection closes with it)."""
        self._client = None
