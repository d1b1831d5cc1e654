"""Steering a tree from its root through the Python API (issue 11): tree approvals, exact-call decisions,
subtree events, and rewind/fork."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import RUNTIME_ID, Harness, call, defn, make_runtime, reply, runtime_id

import loopwright
from loopwright import Capabilities, ModelRequest
from loopwright._types import call_digest
from loopwright.errors import LoopwrightError

pytestmark = pytest.mark.anyio

SPAWN = Capabilities(agents_spawn=True)
ran: list[str] = []


@loopwright.tool(parallel_safe=False)
def touch(name: str) -> str:
    """Record that it ran.

    Args:
        name: What to record.
    """
    ran.append(name)
    return f"touched {name}"


def started(req: ModelRequest) -> list[str]:
    return [json.loads(m.content or "{}")["instanceId"] for m in req.messages
            if m.role == "tool" and m.name == "run_agent_async"]


def definition_file(folder: Path, name: str, model: str, tools: list[str], **keys: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "model": model, "tools": tools, **keys}))
    return path


def three_levels(tmp_path: Path) -> tuple[loopwright.Runtime, loopwright.Definition]:
    """root (p) starts mid (m) and awaits it; mid starts leaf (l) and awaits it; leaf's touch is held."""
    ran.clear()
    root = Harness(reply(None, call("run_agent_async", "r1", agentSwarmUri="mid", prompt="go")),
                   lambda req: reply(None, call("await_agent", "r2", ids=started(req))),
                   reply("root done"), provider="p", tools=[touch])
    mid = Harness(reply(None, call("run_agent_async", "m1", agentSwarmUri="leaf", prompt="go")),
                  lambda req: reply(None, call("await_agent", "m2", ids=started(req))),
                  reply("mid done"), provider="m")
    leaf = Harness(reply(None, call("touch", "leaf-call", name="leaf")), reply("leaf done"), provider="l")
    agents = tmp_path / "agents"
    paths = {"mid": definition_file(agents, "mid", "m:x", ["run_agent_async", "await_agent"]),
             "leaf": definition_file(agents, "leaf", "l:x", ["touch"], requiresApproval=["touch"])}
    rt = make_runtime(tmp_path, root, mid, leaf, capabilities=SPAWN,
                      agent_definitions={k: str(v) for k, v in paths.items()})
    return rt, defn(model="p:x", tools=["run_agent_async", "await_agent"])


async def wait_until(predicate: Any) -> None:
    with anyio.fail_after(30):  # a hang guard only
        while not predicate():
            await anyio.sleep(0.02)


async def test_the_roots_run_lists_and_approves_a_call_held_two_levels_down(tmp_path: Path) -> None:
    """``run.pending_approvals()`` names the grandchild's call with its path; ``run.approve(tool_call_id=)``
    on the root decides it there, the grandchild runs it once, and every caller goes on to the root."""
    rt, root_defn = three_levels(tmp_path)
    async with rt:
        run = await rt.start_agent(root_defn, prompt="go")
        await wait_until(lambda: rt.stalled(run.instance_id))
        assert run.state.value == "running"
        (pending,) = await run.pending_approvals()
        assert pending.instance_id is not None
        leaf_call = runtime_id((await rt.get_agent(pending.instance_id)).inst.transcript, "leaf-call")
        assert (pending.tool_call_id, pending.tool, dict(pending.arguments)) == (leaf_call, "touch", {"name": "leaf"})
        assert [step["name"] for step in pending.path] == ["t", "mid", "leaf"]
        assert pending.path[0]["instanceId"] == run.instance_id
        assert pending.instance_id == pending.path[-1]["instanceId"]
        assert ran == []
        await run.approve(tool_call_id=leaf_call)
        with anyio.fail_after(30):
            result = await run.result()
        assert result.text == "root done"
        assert ran == ["leaf"]
        assert result.pending_approvals == ()
        with pytest.raises(LoopwrightError, match=f"no call '{leaf_call}' is waiting for approval"):
            await run.approve(tool_call_id=leaf_call)


async def test_subtree_events_are_tagged_with_instance_and_depth(tmp_path: Path) -> None:
    """``events(subtree=True)`` yields the grandchild's events too, each with its instance id and depth."""
    rt, root_defn = three_levels(tmp_path)
    seen: list[tuple[str, int, str]] = []
    async with rt:
        run = await rt.start_agent(root_defn, prompt="go")

        async def collect() -> None:
            seen.extend([(event.instance_id, event.data["depth"], event.kind)
                         async for event in run.events(subtree=True)])

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            await wait_until(lambda: rt.stalled(run.instance_id))
            (pending,) = await run.pending_approvals()
            await run.approve(tool_call_id=pending.tool_call_id)
        leaf_id = pending.instance_id
    depths = {iid: depth for iid, depth, _kind in seen}
    assert depths[run.instance_id] == 0
    assert depths[leaf_id] == 2
    assert len(depths) == 3
    assert (leaf_id, 2, "approval") in seen
    assert (leaf_id, 2, "tool_result") in seen


async def test_the_result_of_a_resting_root_lists_its_childs_held_call(tmp_path: Path) -> None:
    """A root that answered while its child waits: ``AgentResult.pending_approvals`` names the child's call."""
    ran.clear()
    root = Harness(reply(None, call("run_agent_async", "r1", agentSwarmUri="leaf", prompt="go")), reply("started"),
                   provider="p", tools=[touch])
    leaf = Harness(reply(None, call("touch", "leaf-call", name="leaf")), reply("leaf done"), provider="l")
    path = definition_file(tmp_path / "agents", "leaf", "l:x", ["touch"], requiresApproval=["touch"])
    async with make_runtime(tmp_path, root, leaf, capabilities=SPAWN, agent_definitions={"leaf": str(path)}) as rt:
        run = await rt.start_agent(defn(model="p:x", tools=["run_agent_async"]), prompt="go")
        with anyio.fail_after(30):
            await run.wait()
            await rt.wait_idle()  # the child rests too: it holds its call
        result = await run.wait()
        assert result.state.value == "waiting"
        (pending,) = result.pending_approvals
        assert pending.instance_id is not None
        assert pending.instance_id != run.instance_id
        leaf_call = runtime_id((await rt.get_agent(pending.instance_id)).inst.transcript, "leaf-call")
        assert pending.tool_call_id == leaf_call
        await run.approve(tool_call_id=leaf_call)
        await wait_until(lambda: not rt.running())
        assert ran == ["leaf"]


def test_the_digest_is_of_canonical_json() -> None:
    """The digest a decision is bound to ignores key order and changes with any argument."""
    assert call_digest("touch", {"a": 1, "b": "é"}) == call_digest("touch", {"b": "é", "a": 1})
    assert call_digest("touch", {"a": 1}) != call_digest("touch", {"a": 2})
    assert call_digest("touch", {"a": 1}) != call_digest("note", {"a": 1})


async def test_runtime_fork_after_a_restart_keeps_grants_and_goes_on_from_the_turn(tmp_path: Path) -> None:
    """``Runtime.fork(id, at_turn=1)`` in a new runtime: the fork rests, records forkedFrom, keeps the grants,
    and its next turn sees the history up to turn 1 only."""
    grants = Capabilities(network=False)
    first = Harness(reply("a1"), reply("a2"), provider="s")
    async with make_runtime(tmp_path, first, capabilities=grants) as rt:
        run = await rt.start_agent(defn(), prompt="one")
        await run.wait()
        await run.message("two")
        result = await run.wait()
        assert result.text == "a2"
        original = run.instance_id
    second = Harness(reply("b"), provider="s")
    async with make_runtime(tmp_path, second, capabilities=grants) as rt:
        fork = await rt.fork(original, at_turn=1)
        header = await rt.store.read_header(fork.instance_id)
        assert header["forkedFrom"] == {"instanceId": original, "turn": 1}
        assert header["state"] == "waiting"
        assert header["capabilities"] == (await rt.store.read_header(original))["capabilities"]
        await fork.message("three")
        assert (await fork.wait()).text == "b"
        assert [m.content for m in second.sent[0] if m.role == "user"] == ["one", "three"]
        with pytest.raises(LoopwrightError, match="turn 5 is not in its history"):
            await rt.fork(original, at_turn=5)



async def test_a_fork_keeps_the_originals_narrower_grants_and_a_widened_header_gains_nothing(tmp_path: Path) -> None:
    """An original started with less than the runtime grants forks with exactly that, never the runtime's; an
    original whose saved grants were edited to claim more forks with no more than the runtime's."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    wide = Capabilities(files=loopwright.FileGrants(read=(str(work),), write=(str(work),)), shell="approval",  # noqa: S604 - a grant, not a shell
                        network=True, agents_spawn=True, agents_max_agents=9)
    narrow = Capabilities(files=loopwright.FileGrants(read=(str(work / "sub"),)))
    async with make_runtime(tmp_path, Harness(reply("a"), reply("b")), capabilities=wide) as rt:
        run = await rt.start_agent(defn(), prompt="one", capabilities=narrow)
        await run.wait()
        fork = await rt.fork(run.instance_id)
        saved = (await rt.store.read_header(fork.instance_id))["capabilities"]
        assert saved == (await rt.store.read_header(run.instance_id))["capabilities"]
        assert fork.inst.grants == run.inst.grants
        assert fork.inst.grants.files.read == (str(work / "sub"),)
        assert (fork.inst.grants.files.write, fork.inst.grants.network, fork.inst.grants.agents_spawn) == ((), False,
                                                                                                          False)
        assert fork.inst.grants.shell == "none"
        # The original's header now claims everything: its fork still gets no more than this runtime grants.
        header = await rt.store.read_header(run.instance_id)
        header["capabilities"] = {"files": {"read": ["/"], "write": ["/"]}, "shell": "allow", "network": True,
                                  "agents": {"spawn": True, "maxDepth": 99, "maxAgents": 10_000}}
        await rt.store.write_header(run.instance_id, header)
    async with make_runtime(tmp_path, Harness(), capabilities=wide) as rt:
        fork = await rt.fork(run.instance_id)
        grants = fork.inst.grants
        assert all(Path(r).is_relative_to(work) for r in (*grants.files.read, *grants.files.write)), grants.files
        assert grants.network is True  # both sides grant it
        assert (grants.shell, grants.agents_max_agents) == ("approval", 9)


async def test_a_call_a_hook_changed_before_it_was_held_runs_as_shown_once_approved(tmp_path: Path) -> None:
    """A hook rewrites touch's argument, then the definition holds the call: the approval shows the rewritten
    call, approving it is accepted, and the tool runs exactly what was shown, once."""
    ran.clear()

    class Rewrite:
        @loopwright.hookimpl
        def loopwright_before_tool_call(self, call: Any) -> Any:
            return loopwright.ModifyInputs({"name": "rewritten"}) if call.arguments.get("name") == "asked" else None

    h = Harness(reply(None, call("touch", "c1", name="asked")), reply("done"), tools=[touch])
    async with make_runtime(tmp_path, h, Rewrite()) as rt:
        run = await rt.start_agent(defn(tools=["touch"], requires_approval=("touch",)), prompt="go")
        with anyio.fail_after(30):
            result = await run.wait()
        (pending,) = result.pending_approvals
        assert dict(pending.arguments) == {"name": "rewritten"}
        assert pending.tool_call_id == runtime_id(run.inst.transcript, "c1")
        await run.approve(tool_call_id=pending.tool_call_id)
        with anyio.fail_after(30):
            result = await run.wait()
        assert result.text == "done"
        assert ran == ["rewritten"]


async def test_a_call_a_hook_changed_before_it_was_held_runs_as_shown_when_decided_after_a_restart(
        tmp_path: Path) -> None:
    """The held call's rewritten arguments are durable: a fresh runtime on the same store, without the hook,
    shows the rewritten call, approving it runs exactly that once, and the model's call stays in the log."""
    ran.clear()

    class Rewrite:
        @loopwright.hookimpl
        def loopwright_before_tool_call(self, call: Any) -> Any:
            return loopwright.ModifyInputs({"name": "rewritten"}) if call.arguments.get("name") == "asked" else None

    definition = defn(tools=["touch"], requires_approval=("touch",))
    async with make_runtime(tmp_path, Harness(reply(None, call("touch", "c1", name="asked")), tools=[touch]),
                            Rewrite()) as rt:
        run = await rt.start_agent(definition, prompt="go")
        with anyio.fail_after(30):
            await run.wait()
        iid = run.instance_id
    header = json.loads((tmp_path / "store" / iid / "instance.json").read_text())
    (saved,) = header["pendingApprovals"]
    c1 = saved["toolCallId"]
    assert RUNTIME_ID.match(c1), c1
    assert saved["arguments"] == {"name": "rewritten"}
    assert saved["originalDigest"] == call_digest("touch", {"name": "asked"})
    second = Harness(reply("done"), tools=[touch])
    async with make_runtime(tmp_path, second) as rt:  # no hook here: what was shown is what runs
        run = await rt.get_agent(iid)
        assert runtime_id(run.inst.transcript, "c1") == c1
        (pending,) = await run.pending_approvals()
        assert (pending.tool_call_id, dict(pending.arguments)) == (c1, {"name": "rewritten"})
        await run.approve(tool_call_id=c1)
        with anyio.fail_after(30):
            result = await run.wait()
        assert result.text == "done"
        assert ran == ["rewritten"]
        # The model's own call stays as it made it; its result is the tool's, as for any call a hook changed.
        (assistant,) = [m for m in second.sent[0] if m.role == "assistant"]
        assert dict(assistant.tool_calls[0].arguments) == {"name": "asked"}
        (answer,) = [m for m in second.sent[0] if m.role == "tool"]
        assert answer.content == "touched rewritten"
        assert (answer.tool_call_id, answer.provider_call_id) == (c1, "c1")
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(LoopwrightError, match=f"no call '{c1}' is waiting for approval"):
            await (await rt.get_agent(iid)).approve(tool_call_id=c1)
    assert ran == ["rewritten"]


async def test_a_hooked_held_call_whose_logged_call_changed_is_refused(tmp_path: Path) -> None:
    """The shown (rewritten) call binds to the model's call it replaced: once the log's call differs from
    that one, approving is refused and nothing runs."""
    ran.clear()

    class Rewrite:
        @loopwright.hookimpl
        def loopwright_before_tool_call(self, call: Any) -> Any:
            return loopwright.ModifyInputs({"name": "rewritten"}) if call.arguments.get("name") == "asked" else None

    async with make_runtime(tmp_path, Harness(reply(None, call("touch", "c1", name="asked")), tools=[touch]),
                            Rewrite()) as rt:
        run = await rt.start_agent(defn(tools=["touch"], requires_approval=("touch",)), prompt="go")
        with anyio.fail_after(30):
            await run.wait()
        iid = run.instance_id
    log = tmp_path / "store" / iid / "entries.jsonl"
    assert '"name":"asked"' in log.read_text()
    log.write_text(log.read_text().replace('"name":"asked"', '"name":"other"'))
    async with make_runtime(tmp_path, Harness(reply("done"), tools=[touch])) as rt:
        run = await rt.get_agent(iid)
        with pytest.raises(LoopwrightError, match="is not the call shown for approval"):
            await run.approve(tool_call_id=runtime_id(run.inst.transcript, "c1"))
    assert ran == []
