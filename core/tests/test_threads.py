"""Threads and deleting (issue 29, point 1): a conversation a caller names, comes back to, and deletes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import loopwright
from loopwright import Definition, Message, ModelRequest, ModelResponse, State, ToolCall, hookimpl
from loopwright._definition import Assembly, Capabilities, FileGrants, StoreConfig
from loopwright.abc import Provider
from loopwright.errors import ConfigError, InstanceLockedError, InstanceNotFoundError, LoopwrightError

pytestmark = pytest.mark.anyio


class Recorder(Provider):
    """Answers ``said N`` (N: how many user messages it saw), keeping every request's messages.

    A prompt ``spawn`` makes it start a child (``run_agent_async``) first; a prompt ``hold``
    makes it wait for :attr:`gate` before answering.
    """

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        self.gate = anyio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        users = [str(m.content) for m in request.messages if m.role == "user"]
        self.seen.append(users)
        last = request.messages[-1]
        if last.role == "user" and last.content == "spawn":
            call = ToolCall(id="c1", name="run_agent_async",
                            arguments={"definition": "child", "prompt": "hello child"})
            return ModelResponse(message=Message(role="assistant", tool_calls=(call,)), finish_reason="tool_calls")
        if last.role == "user" and last.content == "hold":
            await self.gate.wait()
        return ModelResponse(message=Message(role="assistant", content=f"said {len(users)}"))


@pytest.fixture(params=["file", "sqlite"])
def assembly(request: pytest.FixtureRequest, tmp_path: Path) -> Assembly:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "child.yaml").write_text("name: child\nmodel: rec:any\n", encoding="utf-8")
    path = "instances" if request.param == "file" else "store.db"
    grants = Capabilities(agents_spawn=True, files=FileGrants(read=(str(tmp_path / "agents"),)))
    return Assembly(store=StoreConfig(kind=request.param, options={"path": str(tmp_path / path)}),
                    agent_definitions={"child": str(tmp_path / "agents" / "child.yaml")}, capabilities=grants)


@pytest.fixture
def model() -> Recorder:
    return Recorder()


def runtime(assembly: Assembly, model: Recorder) -> loopwright.Runtime:
    class Plugin:
        @hookimpl
        def loopwright_register_providers(self, register: Any) -> None:
            register("rec", lambda _settings: model)

    return loopwright.Runtime(assembly, plugins=[Plugin()])


async def until(condition: Any) -> None:
    """Wait (a hang guard of 30 s) until ``condition()`` holds."""
    with anyio.fail_after(30):
        while not condition():
            await anyio.sleep(0.01)


CHAT = Definition(name="chat", model="rec:any", tools=("run_agent_async",))


async def test_a_thread_starts_then_each_send_is_a_message_the_model_sees_after_the_others(
        assembly: Assembly, model: Recorder) -> None:
    async with runtime(assembly, model) as rt:
        first = await (await rt.thread("support-42", CHAT).send("hello")).result()
        assert first.text == "said 1"
        second = await (await rt.thread("support-42", CHAT).send("and again")).result()
        assert second.text == "said 2"
        assert model.seen[-1] == ["hello", "and again"]
        assert [i["instanceId"] for i in await rt.list_instances()] == ["support-42"]
    # A new process (a new runtime over the same store) comes back to it.
    async with runtime(assembly, model) as rt:
        third = await (await rt.thread("support-42", CHAT).send("third")).result()
        assert third.text == "said 3"
        assert model.seen[-1] == ["hello", "and again", "third"]


async def test_a_send_while_the_thread_runs_is_read_after_the_running_turn(
        assembly: Assembly, model: Recorder) -> None:
    async with runtime(assembly, model) as rt:
        run = await rt.thread("t", CHAT).send("hold")
        await until(lambda: model.seen)
        again = await rt.thread("t", CHAT).send("queued")
        assert again is run
        model.gate.set()
        await until(lambda: model.seen[-1] == ["hold", "queued"] and run.state is not State.RUNNING)
        result = await run.result()
        assert result.text == "said 2"


async def test_a_thread_id_follows_the_id_rule_and_keeps_its_definition(assembly: Assembly, model: Recorder) -> None:
    async with runtime(assembly, model) as rt:
        for bad in ("", "../x", "-rf", "a/b", ".hidden", "x" * 129):
            with pytest.raises(ConfigError, match="invalid thread id"):
                rt.thread(bad, CHAT)
        await (await rt.thread("t", CHAT).send("hi")).result()
        with pytest.raises(ConfigError, match="is an instance of 'chat', not 'other'"):
            await rt.thread("t", Definition(name="other", model="rec:any")).send("hi")


async def test_delete_removes_a_thread_with_its_children_and_the_id_starts_afresh(
        assembly: Assembly, model: Recorder) -> None:
    async with runtime(assembly, model) as rt:
        run = await rt.thread("tree", CHAT).send("spawn")
        await run.result()
        await rt.wait_idle()
        ids = {i["instanceId"] for i in await rt.list_instances()}
        assert "tree" in ids
        assert len(ids) == 2  # the thread and its child
        child = (ids - {"tree"}).pop()
        with pytest.raises(LoopwrightError, match="delete the root"):
            await rt.delete(child)
        deleted = await rt.delete("tree")
        assert deleted == [child, "tree"]
        assert await rt.list_instances() == []
        with pytest.raises(InstanceNotFoundError):
            await rt.get_agent("tree")
        with pytest.raises(InstanceNotFoundError):
            await rt.delete("tree")
        fresh = await (await rt.thread("tree", CHAT).send("new start")).result()
        assert fresh.text == "said 1"


async def test_delete_is_refused_while_the_thread_runs_and_deletes_nothing(
        assembly: Assembly, model: Recorder) -> None:
    async with runtime(assembly, model) as rt:
        run = await rt.thread("busy", CHAT).send("hold")
        await until(lambda: model.seen)
        with pytest.raises(LoopwrightError, match="cancel it"):
            await rt.delete("busy")
        model.gate.set()
        await run.result()
        assert [i["instanceId"] for i in await rt.list_instances()] == ["busy"]
        # Running in another process: its lease is held there.
        model.gate = anyio.Event()
        async with runtime(assembly, model) as other:
            running = await other.thread("busy", CHAT).send("hold")
            await until(lambda: len(model.seen) >= 2)
            with pytest.raises(InstanceLockedError):
                await rt.delete("busy")
            model.gate.set()
            await running.result()
        assert [i["instanceId"] for i in await rt.list_instances()] == ["busy"]


async def test_retention_takes_a_tree_whole_and_finishes_one_a_crash_cut_short(
        assembly: Assembly, model: Recorder) -> None:
    """gc deletes a thread with its child; a tree a killed gc left half-deleted goes on the next pass."""
    import datetime as dt  # noqa: PLC0415 - this test only

    async def backdate(rt: loopwright.Runtime, iid: str) -> None:
        head = await rt.store.read_header(iid)
        head["updatedAt"] = (dt.datetime.now(dt.UTC) - dt.timedelta(days=3)).isoformat()
        await rt.store.write_header(iid, head)

    async with runtime(assembly, model) as rt:
        for name in ("whole", "cut"):
            await (await rt.thread(name, CHAT).send("spawn")).result()
            await rt.wait_idle()
        headers = await rt.store.list_headers()
        children = {h["spawnerInstanceId"]: h["instanceId"] for h in headers if h.get("spawnerInstanceId")}
        for iid in ("whole", "cut", *children.values()):
            await backdate(rt, iid)
        # A gc killed after it deleted the child of "cut" (children go first) and before its root.
        await rt.store.delete(children["cut"])
        done = await rt.collect_garbage(keep=86400)
        assert sorted(done.deleted) == sorted([children["whole"], "whole", "cut"])
        assert done.deleted.index(children["whole"]) < done.deleted.index("whole")
        assert await rt.list_instances() == []
