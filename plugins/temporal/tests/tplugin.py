"""A scripted provider and effect-counting tools for the Temporal engine's tests and benchmark.

The test assemblies list this file in ``plugins:``. The model ``tscript:NAME`` plays the replies
of ``tscripts/NAME.json`` (next to this file); which reply comes next is the number of assistant
messages in the transcript, so the script goes on correctly in any worker process, after any
crash, for any number of instances at once (the ``replay`` provider of ``core/tests/cli_fixtures``,
with delays). A reply is ``{"text", "calls": [{"name", "arguments", "id"?}], "delay"?, "once"?}``; past
the end the last reply repeats. ``{last}`` in ``text`` becomes the last message's content.

Set ``LW_TEST_DELAY`` (seconds) to give every reply that delay (the benchmark's model latency).

Tools (each appends one line ``<instance> <call id> <tool>`` to ``$LW_EFFECTS`` when it
*completes*, so a completed call that ran twice shows as a repeated line; the call id is the
runtime's own, ``lw-TURN-INDEX-HEX6``: ``Deployment.runtime_id`` maps the script's id to it):

- ``effect(note)``: completes at once.
- ``slow_effect(note, seconds)``: touches ``$LW_EFFECTS.started.<call id>``, sleeps, completes.
- ``delete(path)``: needs approval; completes at once.

The model ``ttree:ROLE`` is a sub-agent tree, worked out from the transcript: ``root`` starts
the registered agent ``holder`` (``run_agent_async``), waits for it (``await_agent``), then
answers ``root done: <holder's text>``; ``holder`` calls ``delete`` (held for approval), then
answers ``holder done``. ``watch`` starts ``holder`` too, arms an ``elapsed: 6s`` monitor on it
(``monitor_agent``) and rests (``watch armed``); once the monitor's message comes, it answers
``watch done: <the message>``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio

import loopwright
from loopwright.abc import Provider, ProviderSettings

SCRIPTS = Path(__file__).parent / "tscripts"


class ScriptProvider(Provider):
    """Plays ``tscripts/<model>.json``; free."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings
        self._delay = float(os.environ.get("LW_TEST_DELAY") or 0)

    async def complete(self, request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        replies = json.loads((SCRIPTS / f"{request.model}.json").read_text())
        index = sum(1 for m in request.messages if m.role == "assistant")
        reply: dict[str, Any] = replies[min(index, len(replies) - 1)]
        delay = float(reply.get("delay", self._delay))
        effects = os.environ.get("LW_EFFECTS")
        if effects and reply.get("delay"):
            # ``"once": true``: only the first request for this reply waits (a worker killed in
            # it leaves the marker; the worker that takes over answers at once).
            marker = Path(f"{effects}.model.{request.messages[0].content if request.messages else ''}.{index}")
            if reply.get("once") and marker.exists():
                delay = 0.0
            marker.write_text(str(os.getpid()))
        if delay:
            await anyio.sleep(delay)
        text = reply.get("text")
        if text is not None:
            last = request.messages[-1].content if request.messages else ""
            text = text.replace("{last}", last or "")
        calls = tuple(
            loopwright.ToolCall(id=c.get("id", f"call_{index}_{k}"), name=c["name"], arguments=c.get("arguments", {}))
            for k, c in enumerate(reply.get("calls", [])))
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1),
            finish_reason="tool_calls" if calls else "stop")


class TreeProvider(Provider):
    """The ``ttree`` roles (see the module docstring); free."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    async def complete(self, request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        results = {m.name: m for m in request.messages if m.role == "tool"}
        turn = sum(1 for m in request.messages if m.role == "assistant")
        call: tuple[str, dict[str, Any]] | None = None
        text = None
        if request.model == "root":
            if "run_agent_async" not in results:
                call = ("run_agent_async", {"agentSwarmUri": "holder", "prompt": "hold"})
            elif "await_agent" not in results:
                started = json.loads(results["run_agent_async"].content or "{}")["instanceId"]
                call = ("await_agent", {"ids": [started]})
            else:
                agents = json.loads(results["await_agent"].content or "{}").get("agents") or [{}]
                text = f"root done: {agents[0].get('text')}"
        elif request.model == "watch":
            if "run_agent_async" not in results:
                call = ("run_agent_async", {"agentSwarmUri": "holder", "prompt": "hold"})
            elif "monitor_agent" not in results:
                started = json.loads(results["run_agent_async"].content or "{}")["instanceId"]
                call = ("monitor_agent", {"agentId": started, "elapsed": "6s"})
            elif request.messages[-1].role == "user" and (request.messages[-1].content or "").startswith("[monitor]"):
                text = f"watch done: {request.messages[-1].content}"
            else:
                text = "watch armed"
        elif "delete" not in results:
            call = ("delete", {"path": "tree.txt"})
        else:
            text = "holder done"
        calls = (loopwright.ToolCall(id=f"{request.model}_{turn}", name=call[0], arguments=call[1]),) if call else ()
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=1, output_tokens=1, total_tokens=2, requests=1),
            finish_reason="tool_calls" if calls else "stop")


def _effect(ctx: loopwright.ToolContext, tool: str) -> None:
    path = os.environ.get("LW_EFFECTS")
    if path:
        with Path(path).open("a") as f:
            f.write(f"{ctx.instance_id} {ctx.tool_call_id} {tool}\n")


@loopwright.tool(parallel_safe=False)
def effect(note: str, ctx: loopwright.ToolContext) -> str:
    """Record an effect.

    Args:
        note: Anything.
    """
    _effect(ctx, "effect")
    return f"effect {note}"


@loopwright.tool(parallel_safe=False)
async def slow_effect(note: str, seconds: float, ctx: loopwright.ToolContext) -> str:
    """Start, wait, then record an effect.

    Args:
        note: Anything.
        seconds: How long to take.
    """
    path = os.environ.get("LW_EFFECTS")
    if path:
        Path(f"{path}.started.{ctx.tool_call_id}").write_text(str(os.getpid()))
    await anyio.sleep(seconds)
    _effect(ctx, "slow_effect")
    return f"slow {note}"


@loopwright.tool(requires_approval=True, parallel_safe=False)
def delete(path: str, ctx: loopwright.ToolContext) -> str:
    """Pretend to delete a file.

    Args:
        path: The file.
    """
    _effect(ctx, "delete")
    return f"deleted {path}"


@loopwright.hookimpl
def loopwright_register_providers(register: Any) -> None:
    register("tscript", ScriptProvider)
    register("ttree", TreeProvider)


@loopwright.hookimpl
def loopwright_register_tools(register: Any) -> None:
    register(effect, slow_effect, delete)
