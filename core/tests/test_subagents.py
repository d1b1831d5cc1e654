"""Sub-agents (seed 000): the agent tools, their grants, tools, files and reach rules, and subtree cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, records_of, reply, run_to_rest

import loopwright
from loopwright import Capabilities, ModelRequest, ToolStatus, Usage
from loopwright._definition import FileGrants

pytestmark = pytest.mark.anyio

SPAWN = Capabilities(agents_spawn=True)


def helper_file(folder: Path, name: str = "helper", tools: str = "[task_complete]", model: str = "c:m") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\nmodel: {model}\nsystemPrompt: You help.\ntools: {tools}\n")
    return path


def tool_results(request: ModelRequest) -> list[Any]:
    """The tool messages of the last turn of ``request``: (name, status, parsed content)."""
    out = []
    for m in reversed(request.messages):
        if m.role != "tool":
            break
        try:
            content = json.loads(m.content or "")
        except ValueError:
            content = m.content
        out.insert(0, (m.name, m.status, content))
    return out


def last_result(request: ModelRequest) -> Any:
    return tool_results(request)[-1][2]


def last_tool(request: ModelRequest) -> Any:
    """The content of the latest tool message, wherever it is."""
    message = next(m for m in reversed(request.messages) if m.role == "tool")
    return json.loads(message.content or "")


def parent_tools(*names: str) -> tuple[str, ...]:
    return names or ("run_agent_async", "await_agent")


async def test_definition_names_the_agent_and_the_older_agent_swarm_uri_still_works(tmp_path: Path) -> None:
    """Issue 31, point 6: ``definition`` is the plain name; ``agentSwarmUri`` (seed 000's) is still accepted.

    Both at once must agree; neither (and no agentId) is a result the model sees.
    """
    parent = Harness(
        reply(None, call("run_agent_async", definition="helper", prompt="one"),
              call("run_agent_async", agentSwarmUri="helper", prompt="two"),
              call("run_agent_async", definition="helper", agentSwarmUri="other", prompt="three"),
              call("run_agent_async", prompt="four")),
        reply("done"), provider="p")
    child = Harness(reply(None, call("task_complete", result="ok", summary="ok")), provider="c")
    path = helper_file(tmp_path / "agents")
    grants = Capabilities(agents_spawn=True, files=FileGrants(read=(str(tmp_path / "agents"),)))
    async with make_runtime(tmp_path, parent, child, capabilities=grants,
                            agent_definitions={"helper": str(path)}) as rt:
        run, _result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        await rt.wait_idle()
        results = [m for m in parent.requests[1].messages if m.role == "tool"]
        assert [m.status for m in results] == ["success", "success", "tool_error", "tool_error"], results
        assert [json.loads(m.content or "")["name"] for m in results[:2]] == ["helper", "helper"]
        assert "give one of them" in str(results[2].content)
        assert "exactly one of definition" in str(results[3].content)
        children = [await rt.store.read_header(c) for c in run.inst.header.children]
        assert sorted((h["agentSwarmUri"], h["delegationPrompt"]) for h in children) == [
            ("helper", "one"), ("helper", "two")]


async def test_a_child_runs_and_its_result_comes_back(tmp_path: Path) -> None:
    """run_agent_async starts a linked child with the caller's grants; await_agent reports its result;
    the child's cost rolls up into the caller's subtree cost (result, show, ls).
    """
    seen: dict[str, Any] = {}

    def wait_for_child(req: ModelRequest) -> Any:
        started = last_result(req)
        seen["started"] = started
        return reply(None, call("await_agent", ids=[started["instanceId"]]), usage=Usage(
            input_tokens=100, output_tokens=10, total_tokens=110, requests=1))

    def finish(req: ModelRequest) -> Any:
        seen["awaited"] = last_result(req)
        return reply("the child says 4", usage=Usage(input_tokens=100, output_tokens=10, total_tokens=110, requests=1))

    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="add 2 and 2"),
                           usage=Usage(input_tokens=100, output_tokens=10, total_tokens=110, requests=1)),
                     wait_for_child, finish, provider="p", priced=True)
    child = Harness(reply(None, call("task_complete", result="4", summary="added"),
                          usage=Usage(input_tokens=1000, output_tokens=100, total_tokens=1100, requests=1)),
                    provider="c", priced=True)
    path = helper_file(tmp_path / "agents")
    pricing = {"p:m": {"input": 1.0, "output": 10.0}, "c:m": {"input": 1.0, "output": 10.0}}
    grants = Capabilities(agents_spawn=True, files=FileGrants(read=(str(tmp_path / "agents"),)))
    async with make_runtime(tmp_path, parent, child, capabilities=grants, pricing=pricing,
                            agent_definitions={"helper": str(path)}) as rt:
        run, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        assert result.text == "the child says 4"
        child_id = seen["started"]["instanceId"]
        assert seen["started"]["name"] == "helper"
        report = seen["awaited"]
        assert report["done"] is True
        (agent,) = report["agents"]
        assert (agent["instanceId"], agent["state"], agent["stopReason"], agent["text"]) == (
            child_id, "stopped", "completed", "4")
        child_header = await rt.store.read_header(child_id)
        assert child_header["spawnerInstanceId"] == run.instance_id
        assert child_header["callerInstanceId"] == run.instance_id
        assert child_header["callerToolCallId"] == parent.sent[1][-2].tool_calls[0].id
        assert child_header["delegationPrompt"] == "add 2 and 2"
        assert child_header["depth"] == 1
        assert child_header["capabilities"] == (await rt.store.read_header(run.instance_id))["capabilities"]
        assert child.sent[0][-1].content == "add 2 and 2"
        own = 3 * (100 + 10 * 10) / 1_000_000
        child_cost = (1000 + 100 * 10) / 1_000_000
        assert result.cost.amount == pytest.approx(own)
        assert result.subtree_cost.amount == pytest.approx(own + child_cost)
        assert agent["cost"] == pytest.approx(child_cost)
        shown = await rt.summary(run.instance_id)
        assert shown["children"] == [child_id]
        assert shown["subtreeCost"] == pytest.approx(own + child_cost)
        listed = {s["instanceId"]: s for s in await rt.list_instances()}
        assert listed[run.instance_id]["subtreeCost"] == pytest.approx(own + child_cost)
        assert listed[child_id]["depth"] == 1
        starts = records_of(await rt.records(run.instance_id), "agent")
        assert starts == [{"action": "start", "instanceId": child_id, "definition": "helper",
                           "toolCallId": child_header["callerToolCallId"]}]


async def test_starting_an_agent_needs_the_spawn_grant(tmp_path: Path) -> None:
    """Without agents.spawn, run_agent_async is a tool_error naming the grant, and nothing starts."""
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="x")),
                     lambda req: reply(json.dumps(tool_results(req))), provider="p")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, agent_definitions={"helper": str(path)}) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        ((name, status, content),) = json.loads(result.text or "")
        assert (name, status) == ("run_agent_async", ToolStatus.TOOL_ERROR.value)
        assert "agents.spawn" in content
        assert len(await rt.list_instances()) == 1


async def test_depth_is_limited_by_the_grants(tmp_path: Path) -> None:
    """A child at maxDepth cannot start another agent: a tool_error naming the limit."""
    child = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="deeper")),
                    lambda req: reply(None, call("task_complete", result=json.dumps(tool_results(req)), summary="s")),
                    provider="c")
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="go")),
                     lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]])),
                     lambda req: reply(json.dumps(last_result(req))), provider="p")
    path = helper_file(tmp_path / "agents", tools="[run_agent_async, task_complete]")
    grants = Capabilities(agents_spawn=True, agents_max_depth=1)
    async with make_runtime(tmp_path, parent, child, capabilities=grants,
                            agent_definitions={"helper": str(path)}) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        (agent,) = json.loads(result.text or "")["agents"]
        ((name, status, content),) = json.loads(agent["text"])
        assert (name, status) == ("run_agent_async", "tool_error")
        assert "depth limit (1)" in content
        assert len(await rt.list_instances()) == 2  # the parent and one child, no grandchild


@pytest.mark.parametrize("case", ["outside", "symlink", "unheld_tool", "ok"])
async def test_definition_files_are_read_only_from_the_callers_roots(tmp_path: Path, case: str) -> None:
    """A definition file must lie under the caller's roots after symlinks are resolved, and may
    name only tools the caller holds (plus task_complete).
    """
    root = tmp_path / "work"
    outside = helper_file(tmp_path / "elsewhere")
    inside = helper_file(root)
    (root / "link.yaml").symlink_to(outside)
    greedy = helper_file(root, name="greedy", tools="[task_complete, query_agent]")
    target = {"outside": str(outside), "symlink": str(root / "link.yaml"), "unheld_tool": str(greedy),
              "ok": str(inside)}[case]
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri=target, prompt="x")),
                     lambda req: reply(json.dumps(tool_results(req))), provider="p")
    child = Harness(reply(None, call("task_complete", result="done", summary="s")), provider="c")
    grants = Capabilities(agents_spawn=True, files=FileGrants(read=(str(root),)))
    async with make_runtime(tmp_path, parent, child, capabilities=grants) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        ((_, status, content),) = json.loads(result.text or "")
        if case == "ok":
            assert status == "success"
            assert content["name"] == "helper"
            return
        assert status == "tool_error"
        if case == "unheld_tool":
            assert "'query_agent'" in content
        else:
            assert "file roots" in content
        assert len(await rt.list_instances()) == 1


async def test_agent_tools_reach_only_the_callers_descendants(tmp_path: Path) -> None:
    """message_agent, query_agent and await_agent refuse an instance the caller did not start,
    unless agentsMayReachAnyInstance; list_agent_instances lists only descendants.
    """
    other_h = Harness(reply("I am unrelated"), provider="c")
    async with make_runtime(tmp_path, other_h) as rt:
        other, _ = await run_to_rest(rt, defn(model="c:m"))
    for reach in (False, True):
        parent = Harness(
            reply(None, call("message_agent", agentId=other.instance_id, prompt="hi"),
                  call("query_agent", agentId=other.instance_id, query="unrelated"),
                  call("list_agent_instances")),
            lambda req: reply(json.dumps(tool_results(req))), provider="p")
        other_h.script(reply("got it"))
        async with make_runtime(tmp_path, parent, other_h, capabilities=SPAWN,
                                agents_may_reach_any_instance=reach) as rt:
            _, result = await run_to_rest(rt, defn(model="p:m", tools=("message_agent", "query_agent",
                                                                         "list_agent_instances")))
            (msg, query, listing) = json.loads(result.text or "")
            if not reach:
                assert msg[1] == query[1] == "tool_error"
                assert "not one this agent can reach" in msg[2]
                assert listing[2] == []
            else:
                assert msg[1] == query[1] == "success"
                assert query[2]["matches"][0]["excerpt"].startswith("I am unrelated")
                assert other.instance_id in {i["instanceId"] for i in listing[2]}
                with anyio.fail_after(10):
                    again = await rt.get_agent(other.instance_id)
                    await again.wait()


async def test_a_message_for_the_caller_ends_the_wait(tmp_path: Path) -> None:
    """await_agent returns early (done: false) when a message for the caller arrives; the
    message is then read at the caller's next turn.
    """
    release = anyio.Event()
    started = anyio.Event()

    async def slow(req: ModelRequest) -> Any:
        started.set()
        await release.wait()
        return reply(None, call("task_complete", result="late", summary="s"))

    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="take your time")),
                     lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]])),
                     lambda req: reply(json.dumps({"awaited": last_tool(req),
                                                   "next": req.messages[-1].content})),
                     provider="p")
    child = Harness(slow, provider="c")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN,
                            agent_definitions={"helper": str(path)}) as rt:
        run = await rt.start_agent(defn(model="p:m", tools=parent_tools()), prompt="go")
        with anyio.fail_after(10):
            await started.wait()
            while len(parent.requests) < 2:
                await anyio.sleep(0.01)
            await anyio.sleep(0.1)
            await run.message("stop waiting, I need you")
            result = await run.wait()
        assert result.text, (result.state, result.stop_reason, result.error)
        out = json.loads(result.text)
        assert out["awaited"]["done"] is False
        assert "message" in out["awaited"]["interrupted"]
        assert out["awaited"]["agents"][0]["state"] == "running"
        assert out["next"] == "stop waiting, I need you"
        release.set()


async def test_message_agent_without_arguments_points_at_run_agent_async(tmp_path: Path) -> None:
    """message_agent {} is a tool_error that names run_agent_async."""
    parent = Harness(reply(None, call("message_agent")), lambda req: reply(json.dumps(tool_results(req))),
                     provider="p")
    async with make_runtime(tmp_path, parent, capabilities=SPAWN) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=("message_agent",)))
        ((_, status, content),) = json.loads(result.text or "")
        assert status == "tool_error"
        assert "run_agent_async" in content


async def test_run_agent_async_messages_a_child_by_id(tmp_path: Path) -> None:
    """run_agent_async with agentId delivers the prompt to a child, which wakes up with it."""
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="first")),
                     lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]])),
                     lambda req: reply(None, call("run_agent_async", prompt="second",
                                                  agentId=last_result(req)["agents"][0]["instanceId"])),
                     lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]])),
                     lambda req: reply(json.dumps(last_result(req))), provider="p")
    child = Harness(reply("answer one"), lambda req: reply(f"answer to {req.messages[-1].content}"), provider="c")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN,
                            agent_definitions={"helper": str(path)}) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        (agent,) = json.loads(result.text or "")["agents"]
        assert agent["text"] == "answer to second"
        assert [m.source for m in child.sent[1] if m.role == "user"][-1] == "agent"


def test_the_agent_tools_are_registered_with_seed_names() -> None:
    """The seven agent tools exist with the input properties existing definitions use."""
    from loopwright.builtins.agent_tools import AGENT_TOOLS  # noqa: PLC0415

    props = {t.name: set(t.parameters["properties"]) for t in AGENT_TOOLS}
    assert props == {
        "run_agent_async": {"definition", "agentSwarmUri", "agentId", "prompt", "grants"},
        "await_agent": {"ids", "all"},
        "message_agent": {"agentId", "prompt"},
        "list_agent_instances": {"name", "state", "swarm"},
        "query_agent": {"agentId", "query"},
        "monitor_agent": {"agentId", "contextAt", "turns", "onFinish", "elapsed"},
        "await_monitor": {"timeout"},
    }


async def test_a_crash_while_the_caller_waits_resumes_both(tmp_path: Path) -> None:
    """SIGKILL the process while a parent awaits a child whose tool runs; a new runtime resumes
    the parent: its await_agent (idempotent) runs again, resumes the child left running, whose
    interrupted call gets unknown_outcome, and the parent gets the child's answer.
    """
    import signal  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from subagent_crash import runtime  # noqa: PLC0415

    script = Path(__file__).with_name("subagent_crash.py")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        with anyio.fail_after(30):
            line = await anyio.to_thread.run_sync(proc.stdout.readline)  # type: ignore[union-attr]
        parent_id, child_id = line.split()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    async with runtime(tmp_path) as rt:
        assert (await rt.store.read_header(child_id))["state"] == "running"
        run = await rt.resume(parent_id)
        with anyio.fail_after(20):
            result = await run.wait()
        assert result.text == "parent done: child done after unknown_outcome"
        child = await rt.store.read_header(child_id)
        assert (child["state"], child["spawnerInstanceId"]) == ("waiting", parent_id)
        assert (await rt.summary(parent_id))["children"] == [child_id]


# -- monitors --------------------------------------------------------------------------------------


async def test_an_onfinish_monitor_wakes_the_resting_watcher_with_a_runtime_message(tmp_path: Path) -> None:
    """monitor_agent {onFinish} is saved in the watcher's header; when the child rests, the monitor
    fires once: a monitor record, a monitor event, the monitor removed, and a message from the
    runtime that starts a new segment of the resting watcher.
    """
    release = anyio.Event()

    async def slow(req: ModelRequest) -> Any:
        await release.wait()
        return reply("child finished")

    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work")),
                     lambda req: reply(None, call("monitor_agent", agentId=last_result(req)["instanceId"],
                                                  onFinish=True)),
                     reply("I will wait for the alert"),
                     lambda req: reply("alert: " + (req.messages[-1].content or "")), provider="p")
    child = Harness(slow, provider="c")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN,
                            agent_definitions={"helper": str(path)}) as rt:
        run, first = await run_to_rest(rt, defn(model="p:m", tools=("run_agent_async", "monitor_agent")))
        assert first.text == "I will wait for the alert"
        armed = (await rt.store.read_header(run.instance_id))["monitors"]
        child_id = armed[0]["target"]
        assert (armed[0]["onFinish"], armed[0]["turnsAt"]) == (True, None)
        release.set()
        with anyio.fail_after(10):
            while len(parent.requests) < 4:
                await anyio.sleep(0.02)
            result = await run.wait()
        assert result.text == f"alert: [monitor] agent {child_id}: it finished: waiting"
        assert parent.sent[3][-1].source == "runtime"
        header = await rt.store.read_header(run.instance_id)
        assert header["monitors"] == []
        assert records_of(await rt.records(run.instance_id), "monitor") == [
            {"instanceId": child_id, "reason": "it finished: waiting"}]
        assert rt.monitors.armed(run.instance_id) == []


async def test_await_monitor_returns_the_alert_when_the_child_reaches_a_turn(tmp_path: Path) -> None:
    """A turns monitor fires after that many more turns of the child; a watcher blocked in
    await_monitor gets the alert as the call's result, not as a message.
    """
    release = anyio.Event()

    async def slow(req: ModelRequest) -> Any:
        await release.wait()
        return reply(None, call("task_complete", result="r", summary="s"))

    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work")),
                     lambda req: reply(None, call("monitor_agent", agentId=last_result(req)["instanceId"], turns=1)),
                     reply(None, call("await_monitor", timeout=20)),
                     lambda req: reply(json.dumps(last_result(req))), provider="p")
    child = Harness(slow, provider="c")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN,
                            agent_definitions={"helper": str(path)}) as rt:
        run = await rt.start_agent(defn(model="p:m", tools=("run_agent_async", "monitor_agent", "await_monitor")),
                                   prompt="go")
        with anyio.fail_after(10):
            while len(parent.requests) < 3:
                await anyio.sleep(0.02)
            await anyio.sleep(0.2)
            release.set()
            result = await run.wait()
        out = json.loads(result.text or "")
        assert out["timedOut"] is False
        (alert,) = out["fired"]
        assert alert["reason"] == "it reached turn 1"
        assert [m.role for m in parent.sent[3]][-2:] == ["assistant", "tool"]  # no monitor message


async def test_monitor_agent_reports_and_refuses(tmp_path: Path) -> None:
    """Without conditions monitor_agent only reports; a percentage without a known window, an
    unreachable agent and await_monitor with nothing armed are tool errors.
    """
    other_h = Harness(reply("unrelated"), provider="o")
    async with make_runtime(tmp_path, other_h) as rt:
        other, _ = await run_to_rest(rt, defn(model="o:m"))
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work")),
                     lambda req: reply(None,
                                       call("monitor_agent", agentId=last_result(req)["instanceId"]),
                                       call("monitor_agent", agentId=last_result(req)["instanceId"], contextAt="80%"),
                                       call("monitor_agent", agentId=other.instance_id, onFinish=True),
                                       call("await_monitor", timeout=1)),
                     lambda req: reply(json.dumps(tool_results(req))), provider="p")
    child = Harness(reply("done"), provider="c")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, child, other_h, capabilities=SPAWN,
                            agent_definitions={"helper": str(path)}) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=("run_agent_async", "monitor_agent",
                                                                     "await_monitor")))
        status, percent, unrelated, nothing = json.loads(result.text or "")
        assert status[1] == "success"
        assert status[2]["monitor"] is None
        assert status[2]["status"]["name"] == "helper"
        assert percent[1] == "tool_error"
        assert "context window" in percent[2]
        assert unrelated[1] == "tool_error"
        assert "not one this agent can reach" in unrelated[2]
        assert nothing[1] == "tool_error"
        assert "no monitor is armed" in nothing[2]


def test_context_at_accepts_counts_units_and_percentages() -> None:
    """contextAt: 12000, "400k", "1.5m", "80%" of a known window; anything else is a ToolError."""
    from loopwright._agents import parse_context_at  # noqa: PLC0415
    from loopwright.errors import ToolError  # noqa: PLC0415

    assert parse_context_at(12000, None) == 12000
    assert parse_context_at("400k", None) == 400_000
    assert parse_context_at("1.5m", None) == 1_500_000
    assert parse_context_at("80%", 200_000) == 160_000
    for bad in ("80%", "lots", "-5k", True, 0, "150%"):
        with pytest.raises(ToolError):
            parse_context_at(bad, None if bad == "80%" else 1000)


# -- budgets -------------------------------------------------------------------------------------


def _spend(tokens: int) -> Usage:
    return Usage(input_tokens=tokens, output_tokens=0, total_tokens=tokens, requests=1)


async def test_a_child_gets_what_remains_of_its_callers_limits(tmp_path: Path) -> None:
    """The child's budget is the caller's remaining tokens; it stops with limit_exceeded when it
    has spent them, although its own definition sets no limit.
    """
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work"), usage=_spend(300)),
                     lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]]),
                                       usage=_spend(10)),
                     lambda req: reply(json.dumps(last_result(req)), usage=_spend(10)), provider="p")
    child = Harness(reply(None, call("list_agent_instances"), usage=_spend(400)),
                    reply(None, call("list_agent_instances"), usage=_spend(400)),
                    reply("never reached", usage=_spend(1)), provider="c")
    path = helper_file(tmp_path / "agents", tools="[list_agent_instances]")
    limits = loopwright.Limits(tokens=2000)
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN, limits=limits,
                            agent_definitions={"helper": str(path)}) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        (agent,) = json.loads(result.text or "")["agents"]
        header = await rt.store.read_header(agent["instanceId"])
        assert header["budget"] == {"tokens": 1700, "toolCalls": 199}  # the default toolCalls limit is 200
        assert (agent["state"], agent["stopReason"]) == ("waiting", "waiting")
    parent2 = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work"), usage=_spend(300)),
                      lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]]),
                                        usage=_spend(10)),
                      lambda req: reply(json.dumps(last_result(req)), usage=_spend(10)), provider="p")
    child.replies[:] = [reply(None, call("list_agent_instances"), usage=_spend(400)),
                        reply(None, call("list_agent_instances"), usage=_spend(400)),
                        reply("never reached", usage=_spend(1))]
    async with make_runtime(tmp_path, parent2, child, capabilities=SPAWN, limits=loopwright.Limits(tokens=1000),
                            agent_definitions={"helper": str(path)}) as rt:
        run, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        await rt.wait_idle()  # the caller may stop (its limit counts the child's spending) before the child does
        (child_id,) = (await rt.store.read_header(run.instance_id))["children"]
        header = await rt.store.read_header(child_id)
        assert header["budget"] == {"tokens": 700, "toolCalls": 199}
        assert (header["state"], header["stopReason"], header["limit"]) == ("error", "limit_exceeded", "tokens")
        assert len(child.replies) == 1  # the third call never happened
        # The caller's own limit counts the child's 800 tokens: it stops too.
        assert (result.stop_reason.value, result.limit) == ("limit_exceeded", "tokens")


async def test_what_a_child_spends_counts_toward_its_callers_limit(tmp_path: Path) -> None:
    """The caller's tokens limit counts its children's spending: it stops once both together reach it."""
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work"), usage=_spend(100)),
                     lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]]),
                                       usage=_spend(100)),
                     reply("never reached", usage=_spend(1)), provider="p")
    child = Harness(reply("spent a lot", usage=_spend(850)), provider="c")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN, limits=loopwright.Limits(tokens=1000),
                            agent_definitions={"helper": str(path)}) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        assert (result.state.value, result.stop_reason.value, result.limit) == ("error", "limit_exceeded", "tokens")
        assert "1050 tokens used" in (result.error or "")
        assert len(parent.replies) == 1


async def test_no_agent_starts_without_budget_left(tmp_path: Path) -> None:
    """A caller whose toolCalls limit is used up by this very call cannot give a child any: tool_error."""
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work")),
                     lambda req: reply(json.dumps(tool_results(req))), provider="p")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, capabilities=SPAWN, limits=loopwright.Limits(tool_calls=1),
                            agent_definitions={"helper": str(path)}) as rt:
        _, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        ((_, status, content),) = json.loads(result.text or "")
        assert status == "tool_error"
        assert "toolCalls limit is used up" in content
        assert len(await rt.list_instances()) == 1


_CLI_PLUGIN = """
import anyio, json
import loopwright
from loopwright import Message, ModelResponse, ToolCall, Usage
from loopwright.abc import Provider


def answer(content=None, *calls):
    return ModelResponse(message=Message(role="assistant", content=content, tool_calls=calls),
                         usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2, requests=1))


class Parent(Provider):
    free = True

    def __init__(self, settings):
        self.settings = settings

    async def complete(self, request):
        if not any(m.role == "tool" for m in request.messages):
            return answer(None, ToolCall(id="s", name="run_agent_async",
                                         arguments={"agentSwarmUri": "helper", "prompt": "work"}))
        return answer("started it")


class Child(Provider):
    free = True

    def __init__(self, settings):
        self.settings = settings

    async def complete(self, request):
        await anyio.sleep(1.0)
        return answer("child done")


@loopwright.hookimpl
def loopwright_register_providers(register):
    register("p", Parent)
    register("c", Child)
"""


def test_loopwright_run_waits_for_the_agents_it_started(tmp_path: Path) -> None:
    """`loopwright run` prints the agent's result, then waits for the agents it started to rest,
    so leaving the command does not interrupt them; the exit code is the agent's.
    """
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    (tmp_path / "plugin.py").write_text(_CLI_PLUGIN)
    (tmp_path / "parent.yaml").write_text("name: parent\nmodel: p:m\ntools: [run_agent_async]\n")
    (tmp_path / "helper.yaml").write_text("name: helper\nmodel: c:m\ntools: [task_complete]\n")
    (tmp_path / "loopwright.yaml").write_text(
        "store: {kind: file, path: store}\nplugins: [plugin.py]\n"
        "capabilities: {agents: {spawn: true}}\nagentDefinitions: {helper: helper.yaml}\n")
    proc = subprocess.run([sys.executable, "-m", "loopwright.cli", "run", "parent.yaml", "-p", "go"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "started it" in proc.stdout
    assert "waiting for 1 agent(s) it started" in proc.stderr
    (folder,) = [p for p in (tmp_path / "store").iterdir()
                 if json.loads((p / "instance.json").read_text())["name"] == "helper"]
    child = json.loads((folder / "instance.json").read_text())
    assert (child["state"], child["text"]) == ("waiting", "child done")


async def test_the_caller_lists_its_child_before_the_child_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's saved header lists the child's id before the child is created (issue 17), so a
    process stopped in between never leaves a child outside its caller's tree."""
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="x")),
                     lambda req: reply(json.dumps(last_result(req))), provider="p")
    child = Harness(reply("done"), provider="c")
    path = helper_file(tmp_path / "agents")
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN,
                            agent_definitions={"helper": str(path)}) as rt:
        listed_when_created: dict[str, Any] = {}
        create_leased = type(rt.store).create_leased

        async def spy(store: Any, instance_id: str, header: Any, owner: str) -> Any:
            spawner = header.get("spawnerInstanceId")
            if spawner:
                listed_when_created[instance_id] = (await store.read_header(spawner)).get("children")
            return await create_leased(store, instance_id, header, owner)

        monkeypatch.setattr(type(rt.store), "create_leased", spy)
        run, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        await rt.wait_idle()
        child_id = json.loads(result.text or "")["instanceId"]
        assert listed_when_created == {child_id: [child_id]}
        assert (await rt.store.read_header(run.instance_id))["children"] == [child_id]


async def test_a_child_that_cannot_start_leaves_its_callers_list(tmp_path: Path) -> None:
    """A definition error found as the child is created (a required input not given) is a tool_error,
    and the id listed for the child leaves the caller's saved header again: no child, none listed."""
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="x")),
                     lambda req: reply(json.dumps(tool_results(req))), provider="p")
    folder = tmp_path / "agents"
    folder.mkdir()
    path = folder / "helper.yaml"
    path.write_text("name: helper\nmodel: p:m\ninputs:\n  topic: string\ntools: [task_complete]\n")
    async with make_runtime(tmp_path, parent, capabilities=SPAWN, agent_definitions={"helper": str(path)}) as rt:
        run, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        ((name, status, content),) = json.loads(result.text or "")
        assert (name, status) == ("run_agent_async", ToolStatus.TOOL_ERROR.value)
        assert "cannot start 'helper'" in content
        assert "topic" in content
        assert not (await rt.store.read_header(run.instance_id)).get("children")
        assert len(await rt.list_instances()) == 1


async def test_a_listed_child_that_was_never_created_is_skipped(tmp_path: Path) -> None:
    """An id a caller listed for a child a stopped process never created names no instance: the tree,
    its costs, its approvals, the summary, the listing and a fork's note leave it out; await_agent
    refuses it as any id it cannot reach."""
    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="x")),
                     lambda req: reply(None, call("await_agent", ids=[last_result(req)["instanceId"]])),
                     reply("parent done"), provider="p", priced=True)
    child = Harness(reply("child done", usage=Usage(input_tokens=1000, output_tokens=100, total_tokens=1100,
                                                    requests=1)), provider="c", priced=True)
    path = helper_file(tmp_path / "agents")
    pricing = {"p:m": {"input": 1.0, "output": 10.0}, "c:m": {"input": 1.0, "output": 10.0}}
    ghost = "20261202-000000-deadbeef"
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN, pricing=pricing,
                            agent_definitions={"helper": str(path)}) as rt:
        run, result = await run_to_rest(rt, defn(model="p:m", tools=parent_tools()))
        assert result.text == "parent done"
        before = await rt.subtree_cost(run.instance_id)
        header = await rt.store.read_header(run.instance_id)
        (child_id,) = header["children"]
        await rt.store.write_header(run.instance_id, {**header, "children": [child_id, ghost]})
    parent.replies += [reply(None, call("await_agent", ids=[ghost])), lambda req: reply(json.dumps(tool_results(req)))]
    async with make_runtime(tmp_path, parent, child, capabilities=SPAWN, pricing=pricing,
                            agent_definitions={"helper": str(path)}) as rt:
        assert before is not None
        assert await rt.subtree_cost(run.instance_id) == pytest.approx(before)
        tree = await rt.tree(run.instance_id)
        assert [c["instanceId"] for c in tree["children"]] == [child_id]
        assert tree["subtreeCost"] == pytest.approx(before)
        assert await rt.tree_approvals(run.instance_id) == []
        shown = await rt.summary(run.instance_id)
        assert shown["subtreeCost"] == pytest.approx(before)
        assert {s["instanceId"] for s in await rt.list_instances()} == {run.instance_id, child_id}
        fork = await rt.fork(run.instance_id)
        note = fork.inst.transcript[-1].content or ""
        assert child_id in note
        assert ghost not in note
        again = await rt.get_agent(run.instance_id)
        await again.message("wait for the ghost")
        ((name, status, content),) = json.loads((await again.wait()).text or "")
        assert (name, status) == ("await_agent", ToolStatus.TOOL_ERROR.value)
        assert "not one this agent can reach" in content
