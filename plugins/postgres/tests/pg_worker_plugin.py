"""A scripted provider and a counted tool for the postgres worker tests (fencing, outages, connections, NOTIFY).

The model ``steps:N`` rests at once ("ready"); a message then makes it call ``step`` N times in a
row, one call a turn, and answer ``done`` after the last result. Which reply comes next is the
number of assistant messages in the transcript, so a script goes on correctly in whichever
process picks the instance up. Each ``step`` call is tagged ``<task prompt>:<k>`` and appends
its tag to ``effects.log`` (in the working folder) when it runs: the log counts how often each
call really ran. ``LW_STEP_SECONDS`` sets how long a step sleeps (default 0.3); with
``LW_STEP_BARRIER`` set to a file name, a step then also waits until that file exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

import loopwright
from loopwright.abc import Provider, ProviderSettings


class StepsProvider(Provider):
    """Plays the ``steps:N`` script; free."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    async def complete(self, request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        total = int(request.model)
        index = sum(1 for m in request.messages if m.role == "assistant")
        task = next((m.content for m in request.messages if m.role == "user"), "") or ""
        calls: tuple[loopwright.ToolCall, ...] = ()
        if index == 0:
            text: str | None = "ready"
        elif index <= total:
            text = None
            calls = (loopwright.ToolCall(id=f"call_{index}", name="step", arguments={"tag": f"{task}:{index}"}),)
        else:
            text = f"done {task}"
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1),
            finish_reason="tool_calls" if calls else "stop")


@loopwright.tool
async def step(tag: str) -> str:
    """Append the tag to effects.log, then sleep a moment.

    Args:
        tag: Which call this is.
    """
    with Path("effects.log").open("a") as f:
        f.write(tag + "\n")
    await anyio.sleep(float(os.environ.get("LW_STEP_SECONDS", "0.3")))
    barrier = os.environ.get("LW_STEP_BARRIER")
    while barrier and not Path(barrier).exists():
        await anyio.sleep(0.1)
    return f"stepped {tag}"


@loopwright.hookimpl
def loopwright_register_providers(register: Any) -> None:
    register("steps", StepsProvider)


@loopwright.hookimpl
def loopwright_register_tools(register: Any) -> None:
    register(step)
