"""The instance workflow alone, on the real dev server, with a scripted ``loopwright.advance`` activity.

Each test runs an in-process worker whose activity answers from a list of
:class:`~loopwright_temporal._workflow.Advanced` results (one per call) and counts its calls, so
what the workflow decides (wait for a wake, back off while busy, start child workflows,
complete) is checked without a runtime.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from loopwright_temporal import TemporalEngine, TemporalSettings
from loopwright_temporal._workflow import ADVANCE, WAKE, WORKFLOW, Advanced, InstanceInput, InstanceWorkflow

if TYPE_CHECKING:
    from temporal_harness import TemporalServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # temporalio runs on asyncio


class Script:
    """The activity's answers per instance, and the calls it got."""

    def __init__(self, answers: dict[str, list[Advanced]]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        #: The workflow run each call came from, per instance, in order.
        self.runs: dict[str, list[str]] = {}
        self.called = anyio.Event()

    @activity.defn(name=ADVANCE)
    async def advance(self, instance_id: str) -> Advanced:
        self.calls.append(instance_id)
        self.runs.setdefault(instance_id, []).append(activity.info().workflow_run_id)
        self.called.set()
        self.called = anyio.Event()
        queue = self.answers[instance_id]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    async def wait_calls(self, instance_id: str, n: int) -> None:
        with anyio.fail_after(60):  # a hang guard
            while self.calls.count(instance_id) < n:
                await self.called.wait()


@pytest.fixture
async def client(temporal_server: TemporalServer) -> Client:
    return await Client.connect(temporal_server.address)


async def _run(client: Client, script: Script, body: Any) -> None:
    queue = f"wf-{secrets.token_hex(4)}"
    engine = TemporalEngine(TemporalSettings(task_queue=queue), client=client)
    async with Worker(client, task_queue=queue, workflows=[InstanceWorkflow], activities=[script.advance]):
        await body(engine)


async def _status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    return (await client.get_workflow_handle(workflow_id).describe()).status


async def test_a_resting_instance_waits_for_a_wake_and_a_stopped_one_completes(client: Client) -> None:
    """waiting: the workflow stays open until a wake; after the next activity says stopped, it completes."""
    iid = f"i-{secrets.token_hex(4)}"
    script = Script({iid: [Advanced(state="waiting", ran=True), Advanced(state="stopped", stop_reason="completed")]})

    async def body(engine: Any) -> None:
        await engine.submit(iid)
        await script.wait_calls(iid, 1)
        await anyio.sleep(1.0)  # nothing happens without a wake
        assert script.calls.count(iid) == 1
        assert await _status(client, iid) == WorkflowExecutionStatus.RUNNING
        await engine.submit(iid)
        result = await client.get_workflow_handle(iid).result()
        assert result["state"] == "stopped"
        assert script.calls.count(iid) == 2
        # A later submit starts a new run of the same workflow id.
        await engine.submit(iid)
        await script.wait_calls(iid, 3)

    await _run(client, script, body)


async def test_busy_backs_off_and_looks_again(client: Client) -> None:
    """busy (another runner holds the lease): the workflow looks again by itself, without a wake."""
    iid = f"i-{secrets.token_hex(4)}"
    script = Script({iid: [Advanced(state="running", busy=True), Advanced(state="running", busy=True),
                           Advanced(state="stopped", stop_reason="completed")]})

    async def body(engine: Any) -> None:
        await engine.submit(iid)
        await client.get_workflow_handle(iid).result()
        assert script.calls.count(iid) == 3

    await _run(client, script, body)


async def test_children_get_child_workflows_once(client: Client) -> None:
    """Each reported child id gets one child workflow of the caller's (parent id = the caller's instance id)."""
    root, child = f"r-{secrets.token_hex(4)}", f"c-{secrets.token_hex(4)}"
    script = Script({
        root: [Advanced(state="waiting", children=[child]), Advanced(state="stopped", children=[child])],
        child: [Advanced(state="waiting_for_approval"), Advanced(state="stopped")],
    })

    async def body(engine: Any) -> None:
        await engine.submit(root)
        await script.wait_calls(child, 1)
        info = await client.get_workflow_handle(child).describe()
        assert info.parent_id == root
        await engine.submit(child)  # a decision deep in the tree reaches the child's own workflow
        await client.get_workflow_handle(child).result()
        await engine.submit(root)
        await client.get_workflow_handle(root).result()
        assert script.calls.count(child) == 2  # the second report of the child started nothing

    await _run(client, script, body)


async def test_a_deadline_is_a_timer(client: Client) -> None:
    """A resting instance with a deadline is looked at again when it passes, without a wake."""
    iid = f"i-{secrets.token_hex(4)}"
    script = Script({iid: [Advanced(state="stopped", deadline=0.5), Advanced(state="stopped")]})

    async def body(engine: Any) -> None:
        await engine.submit(iid)
        await client.get_workflow_handle(iid).result()
        assert script.calls.count(iid) == 2

    await _run(client, script, body)


async def test_an_unknown_instance_completes_the_workflow(client: Client) -> None:
    """missing: the workflow ends at once."""
    iid = f"i-{secrets.token_hex(4)}"
    script = Script({iid: [Advanced(state="missing")]})

    async def body(engine: Any) -> None:
        await engine.submit(iid)
        assert (await client.get_workflow_handle(iid).result())["state"] == "missing"

    await _run(client, script, body)


async def test_a_long_instance_continues_as_new_and_keeps_working(client: Client) -> None:
    """Past its round limit the workflow continues as new: the next run carries the children, the
    pending wake and the limit, acts on the wake at once, and goes on answering wakes."""
    iid, child = f"i-{secrets.token_hex(4)}", f"c-{secrets.token_hex(4)}"
    script = Script({iid: [Advanced(state="waiting", ran=True, children=[child])],
                     child: [Advanced(state="waiting", ran=True)]})
    queue = f"wf-{secrets.token_hex(4)}"
    async with Worker(client, task_queue=queue, workflows=[InstanceWorkflow], activities=[script.advance]):
        first = await client.start_workflow(WORKFLOW, InstanceInput(instance_id=iid, max_iterations=2), id=iid,
                                            task_queue=queue)
        handle = client.get_workflow_handle(iid)
        for n in range(1, 7):  # round n's activity, then the wake that ends its wait
            await script.wait_calls(iid, n)
            await handle.signal(WAKE)
        await script.wait_calls(iid, 7)
        runs = list(dict.fromkeys(script.runs[iid]))
        assert runs[0] == first.first_execution_run_id
        # Two rounds per run: the 7 activities came from runs 1-3 and the start of run 4.
        assert [script.runs[iid].count(r) for r in runs] == [2, 2, 2, 1], script.runs[iid]
        assert (await client.get_workflow_handle(iid, run_id=runs[0]).describe()).status == \
            WorkflowExecutionStatus.CONTINUED_AS_NEW
        latest = await handle.describe()
        assert latest.status == WorkflowExecutionStatus.RUNNING
        assert latest.run_id == runs[-1]
        # The child workflow was started once, by the first run; later runs knew it (carried over).
        assert script.calls.count(child) == 1
        assert (await client.get_workflow_handle(child).describe()).parent_id == iid
        await handle.signal(WAKE)  # the newest run still answers
        await script.wait_calls(iid, 8)
        await handle.terminate()
        await client.get_workflow_handle(child).terminate()
