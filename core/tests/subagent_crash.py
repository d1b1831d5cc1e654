"""Helper process for test_subagents.py: a parent waiting for a child, until the test SIGKILLs it.

Usage::

    python subagent_crash.py TMP_PATH

Starts a parent that starts a child (``helper``) and awaits it; the child's ``block`` tool never
returns. Prints ``PARENT_ID CHILD_ID`` once the child's call has started, then waits to be killed.
The providers are stateless (each reply is chosen from the transcript), so the test process
continues the same instances with the same plugin after the kill.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from helpers import defn, make_runtime

import loopwright
from loopwright import Capabilities, Message, ModelRequest, ModelResponse, ToolCall, Usage
from loopwright.abc import Provider, ProviderSettings

PARENT = defn(name="parent", model="p:m", tools=("run_agent_async", "await_agent"))


def _tool_messages(request: ModelRequest) -> list[Message]:
    return [m for m in request.messages if m.role == "tool"]


def _answer(content: str | None = None, *calls: ToolCall) -> ModelResponse:
    return ModelResponse(message=Message(role="assistant", content=content, tool_calls=calls),
                         usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2, requests=1))


class ParentModel(Provider):
    """Starts ``helper``, awaits it, then answers with what it said."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    async def complete(self, request: ModelRequest) -> ModelResponse:
        done = _tool_messages(request)
        if not done:
            return _answer(None, ToolCall(id="start", name="run_agent_async",
                                          arguments={"agentSwarmUri": "helper", "prompt": "work"}))
        last = json.loads(done[-1].content or "{}")
        if done[-1].name == "run_agent_async":
            return _answer(None, ToolCall(id="wait", name="await_agent", arguments={"ids": [last["instanceId"]]}))
        return _answer("parent done: " + str(last["agents"][0]["text"]))


class ChildModel(Provider):
    """Calls ``block`` once, then answers with the status of that call."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    async def complete(self, request: ModelRequest) -> ModelResponse:
        done = _tool_messages(request)
        if not done:
            return _answer(None, ToolCall(id="block", name="block", arguments={}))
        return _answer(f"child done after {done[-1].status}")


async def block() -> str:
    """Wait a long time."""
    await anyio.sleep(3600)
    return "woke up"


class Plugin:
    """The two models and the ``block`` tool."""

    @loopwright.hookimpl
    def loopwright_register_providers(self, register: Any) -> None:
        register("p", ParentModel)
        register("c", ChildModel)

    @loopwright.hookimpl
    def loopwright_register_tools(self, register: Any) -> None:
        register(loopwright.tool(block))


def runtime(tmp_path: Path) -> loopwright.Runtime:
    """The runtime both processes use: the same store, grants and registered ``helper``."""
    folder = tmp_path / "agents"
    folder.mkdir(exist_ok=True)
    (folder / "helper.yaml").write_text("name: helper\nmodel: c:m\ntools: [block]\n")
    return make_runtime(tmp_path, Plugin(), capabilities=Capabilities(agents_spawn=True),
                        agent_definitions={"helper": str(folder / "helper.yaml")})


async def main(tmp: str) -> None:
    tmp_path = Path(tmp)
    async with runtime(tmp_path) as rt:
        run = await rt.start_agent(PARENT, prompt="go")
        while True:  # until the parent waits in await_agent and the child's block call has started
            header = await rt.store.read_header(run.instance_id)
            children = header.get("children") or []
            # The second call started is await_agent (the runtime renames the model's "wait").
            waiting = sum(e.get("t") == "start" for e in await rt.store.read_entries(run.instance_id)) >= 2
            if children and waiting and any(e.get("t") == "start" for e in await rt.store.read_entries(children[0])):
                break
            await anyio.sleep(0.02)
        sys.stdout.write(f"{run.instance_id} {children[0]}\n")
        sys.stdout.flush()
        await anyio.sleep(3600)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
