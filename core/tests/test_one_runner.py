"""One runner per instance, and steering an instance that runs elsewhere (mailbox and leases).

Two Runtime objects over one store stand for two processes: the file store's lock is an
``flock`` on a file description, so two runtimes in one process exclude each other exactly as
two processes do.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, reply

import loopwright
from loopwright import State, StopReason
from loopwright.errors import InstanceLockedError

pytestmark = pytest.mark.anyio


def slow_tool(started: anyio.Event, release: anyio.Event) -> loopwright.Tool:
    @loopwright.tool(name="slow")
    async def slow() -> str:
        """Wait until released."""
        started.set()
        await release.wait()
        return "slow done"
    return slow


async def test_a_second_runner_fails_at_once_with_running_elsewhere(tmp_path: Path) -> None:
    """While one runtime runs an instance, another cannot resume it: InstanceLockedError, at once."""
    started, release = anyio.Event(), anyio.Event()
    slow = slow_tool(started, release)
    h = Harness(reply(None, call("slow", "s1")), reply("finished"), tools=[slow])
    async with make_runtime(tmp_path, h) as a, make_runtime(tmp_path, Harness(tools=[slow])) as b:
        run = await a.start_agent(defn(tools=[slow]), prompt="go")
        await started.wait()
        header = await b.store.read_header(run.instance_id)
        header["state"] = "running"
        # The runner holds the lease until ``release`` is set, below: a resume that waited for it
        # would hang (the guard is only that); being refused at all is being refused at once.
        with anyio.fail_after(60), pytest.raises(InstanceLockedError) as info:
            await b.resume(run.instance_id)
        assert "running elsewhere" in str(info.value)
        release.set()
        assert (await run.result()).text == "finished"


async def test_a_message_posted_elsewhere_is_read_at_the_next_turn_boundary(tmp_path: Path) -> None:
    """A message from another runtime reaches a running instance after the results of the current turn."""
    started, release = anyio.Event(), anyio.Event()
    slow = slow_tool(started, release)
    h = Harness(reply(None, call("slow", "s1")), reply("saw it"), tools=[slow])
    async with make_runtime(tmp_path, h) as a, make_runtime(tmp_path, Harness(tools=[slow])) as b:
        run = await a.start_agent(defn(tools=[slow]), prompt="go")
        await started.wait()
        other = await b.message(run.instance_id, "also check the logs")
        assert not other.running  # B did not take the instance over
        release.set()
        result = await run.result()
    assert result.text == "saw it"
    roles = [(m.role, m.content) for m in h.sent[1]]
    assert roles[-2:] == [("tool", "slow done"), ("user", "also check the logs")]


async def test_a_message_that_arrives_as_the_segment_ends_starts_the_next_one(tmp_path: Path) -> None:
    """A message posted after the last turn boundary is not lost: the runner starts a new segment for it."""
    gate = anyio.Event()
    replies = iter(["first answer", "second answer"])

    class Gated(Harness):
        pass

    h = Gated()

    async def answer(request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        text = next(replies)
        if text == "first answer":
            await gate.wait()
        return reply(text)

    h.script(answer, answer)
    async with make_runtime(tmp_path, h) as a, make_runtime(tmp_path, Harness()) as b:
        run = await a.start_agent(defn(), prompt="go")
        await anyio.sleep(0.05)
        await b.message(run.instance_id, "one more thing")
        gate.set()
        with anyio.fail_after(5):
            while True:
                result = await run.wait()
                if result.text == "second answer":
                    break
                await anyio.sleep(0.01)
    assert [m.content for m in h.sent[1] if m.role == "user"] == ["go", "one more thing"]


async def test_cancel_from_another_runtime_stops_a_long_tool_call(tmp_path: Path) -> None:
    """A cancel requested elsewhere stops the running instance within a poll interval, keeping the partial turn."""
    started, release = anyio.Event(), anyio.Event()
    slow = slow_tool(started, release)
    h = Harness(reply(None, call("slow", "s1")), reply("unreached"), tools=[slow])
    async with make_runtime(tmp_path, h) as a, make_runtime(tmp_path, Harness(tools=[slow])) as b:
        run = await a.start_agent(defn(tools=[slow]), prompt="go")
        await started.wait()
        with anyio.fail_after(5):
            other = await b.cancel(run.instance_id)
        assert (other.inst.state, other.inst.header.cancelled) == (State.STOPPED, True)
        result = await run.wait()
    assert (result.state, result.stop_reason, result.cancelled) == (State.STOPPED, StopReason.CANCELLED, True)
    assert any(m.tool_calls for m in run.inst.transcript)


async def test_a_stale_cancel_request_does_not_cancel_the_next_segment(tmp_path: Path) -> None:
    """A cancel request that arrives after the run rested is dropped, not applied to a later segment."""
    h = Harness(reply("one"), reply("two"))
    async with make_runtime(tmp_path, h) as a:
        run = await a.start_agent(defn(), prompt="go")
        await run.result()
        await a.store.post(run.instance_id, {"type": "cancel", "at": "x"})
        await run.message("again")
        result = await run.result()
    assert (result.state, result.text) == (State.WAITING, "two")


async def test_approval_from_another_runtime_continues_there(tmp_path: Path) -> None:
    """A decision made through a second runtime over the same store continues the run in that runtime."""
    ran: list[int] = []

    @loopwright.tool(requires_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        ran.append(amount)
        return "paid"

    h1 = Harness(reply(None, call("pay", "p1", amount=5)), tools=[pay])
    h2 = Harness(reply("done paying"), tools=[pay])
    async with make_runtime(tmp_path, h1) as a:
        run = await a.start_agent(defn(tools=[pay]), prompt="go")
        assert (await run.result()).state is State.WAITING_FOR_APPROVAL
        async with make_runtime(tmp_path, h2) as b:
            other = await b.approve(run.instance_id)
            result = await other.result()
    assert (result.text, ran) == ("done paying", [5])


async def test_a_copy_changed_elsewhere_is_reloaded_before_it_runs(tmp_path: Path) -> None:
    """A runtime holding an old copy of an instance reloads it before running a new segment."""
    h1 = Harness(reply("one"), reply("three"))
    h2 = Harness(reply("two"))
    async with make_runtime(tmp_path, h1) as a:
        run = await a.start_agent(defn(), prompt="go")
        await run.result()
        async with make_runtime(tmp_path, h2) as b:
            await (await b.message(run.instance_id, "second")).result()
        await run.message("third")
        result = await run.result()
    contents = [m.content for m in run.inst.transcript if m.role in ("user", "assistant")]
    assert contents == ["go", "one", "second", "two", "third", "three"]
    assert result.text == "three"


async def test_waiting_for_approval_does_not_count_toward_the_elapsed_limit(tmp_path: Path) -> None:
    """The time a held call waits for a person is left out of the segment's elapsed limit."""

    @loopwright.tool(requires_approval=True)
    def gated() -> str:
        """Needs a yes."""
        return "ran"

    h = Harness(reply(None, call("gated", "g")), reply("finished"), tools=[gated])
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.start_agent(defn(tools=[gated], limits=loopwright.Limits(elapsed=60)), prompt="go")
        assert (await run.result()).state is State.WAITING_FOR_APPROVAL
        # The person took an hour (no real waiting: the saved clock is moved back by it). The
        # segment started more than the whole elapsed budget ago; all but seconds of it was the wait.
        header = await rt.store.read_header(run.instance_id)
        header["segmentStartedAt"] -= 3600
        header["pausedAt"] -= 3600
        header["updatedAt"] = "moved back by the test"
        await rt.store.write_header(run.instance_id, header)
        await run.approve()
        result = await run.result()
    assert (result.state, result.text) == (State.WAITING, "finished")
