"""A ``turns`` monitor counts from the turn its target is in when it is armed, mid-turn included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, reply

import loopwright
from loopwright import Capabilities, ModelRequest

pytestmark = pytest.mark.anyio


def _last_result(request: ModelRequest) -> Any:
    message = next(m for m in reversed(request.messages) if m.role == "tool")
    return json.loads(message.content or "")


async def test_a_turns_monitor_armed_mid_turn_fires_one_turn_later(tmp_path: Path) -> None:
    """Armed with turns: 1 while the child runs a tool in its turn 1, it fires at turn 2, not at once."""
    started, release = anyio.Event(), anyio.Event()

    @loopwright.tool
    async def hold() -> str:
        """Wait until the test lets go."""
        started.set()
        await release.wait()
        return "held"

    class Tools:
        @loopwright.hookimpl
        def loopwright_register_tools(self, register: Any) -> None:
            register(hold)

    async def arm(req: ModelRequest) -> Any:
        await started.wait()  # the child is in its turn 1, inside the tool
        return reply(None, call("monitor_agent", agentId=_last_result(req)["instanceId"], turns=1))

    parent = Harness(reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="work")),
                     arm,
                     reply(None, call("await_monitor", timeout=30)),
                     lambda req: reply(json.dumps(_last_result(req))), provider="p")
    child = Harness(reply(None, call("hold")), reply(None, call("task_complete", result="r", summary="s")),
                    provider="c")
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "helper.yaml").write_text("name: helper\nmodel: c:m\ntools: [hold, task_complete]\n")
    async with make_runtime(tmp_path, parent, child, Tools(), capabilities=Capabilities(agents_spawn=True),
                            agent_definitions={"helper": str(agents / "helper.yaml")}) as rt:
        run = await rt.start_agent(defn(model="p:m", tools=("run_agent_async", "monitor_agent", "await_monitor")),
                                   prompt="go")
        with anyio.fail_after(30):  # a hang guard only
            while len(parent.requests) < 3:  # armed, and await_monitor asked for
                await anyio.sleep(0.02)
            # Give the monitor checks (every quarter second) time to see the child still in turn 1.
            await anyio.sleep(1.0)
            release.set()
            result = await run.wait()
        out = json.loads(result.text or "")
        (alert,) = out["fired"]
        assert alert["reason"] == "it reached turn 2"
