"""A scripted provider and tools for the worker tests (``loopwright worker`` run as a subprocess).

The assemblies of ``test_worker.py`` (file store) and of the postgres store's worker tests list
this file in ``plugins:``. The model ``script:NAME`` plays ``SCRIPTS[NAME]``: which reply comes
next is the number of assistant messages already in the transcript, so a script goes on
correctly in whichever process picks the instance up; past the end, the last reply repeats. In
a reply's ``text``, ``{last}`` becomes the content of the transcript's last message.

With ``LW_PAUSE_RUNNING`` set (seconds), a segment pauses right after the header says
``running`` and before its first turn (an observer of the state change), having written
``paused.<instance id>``: a stop then leaves an instance whose mail was read from the mailbox
into the header's queue but not yet given to the model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

import loopwright
from loopwright.abc import Provider, ProviderSettings

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # Answers every message.
    "chat": [{"text": "answer to: {last}"}],
    # A minute-long tool call that writes slow.started when it starts, then the result.
    "slow": [{"calls": [{"name": "nap", "arguments": {"seconds": 60, "marker": "slow.started"}}]},
             {"text": "after slow: {last}"}],
    # A call held for approval, then the result.
    "approve": [{"text": "I will delete it", "calls": [{"name": "delete", "arguments": {"path": "x"},
                                                        "id": "call_del"}]},
                {"text": "result: {last}"}],
    # Rests at once; the first message starts a one-second tool call (marker nap.started).
    "nap": [{"text": "ready"},
            {"calls": [{"name": "nap", "arguments": {"seconds": 1, "marker": "nap.started"}}]},
            {"text": "after nap: {last}"}],
    # Rests at once; the first message starts a minute-long tool call (marker long.started).
    "long": [{"text": "ready"},
             {"calls": [{"name": "nap", "arguments": {"seconds": 60, "marker": "long.started"}}]},
             {"text": "after long: {last}"}],
    # A call the definition gates (``requiresApproval: [nap]``), which writes gate.ran when it runs.
    "gate": [{"calls": [{"name": "nap", "arguments": {"seconds": 0, "marker": "gate.ran"}}]},
             {"text": "after gate: {last}"}],
    # Rests at once; the first message starts a short tool call (so workers overlap).
    "brief": [{"text": "ready"},
              {"calls": [{"name": "nap", "arguments": {"seconds": 0.2}}]},
              {"text": "after brief nap: {last}"}],
}


class ScriptProvider(Provider):
    """Plays ``SCRIPTS[model]``; free, so its calls cost 0."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    async def complete(self, request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        replies = SCRIPTS[request.model]
        index = sum(1 for m in request.messages if m.role == "assistant")
        reply = replies[min(index, len(replies) - 1)]
        text = reply.get("text")
        if text is not None:
            text = text.replace("{last}", (request.messages[-1].content or "") if request.messages else "")
        calls = tuple(
            loopwright.ToolCall(id=c.get("id", f"call_{index}_{k}"), name=c["name"], arguments=c["arguments"])
            for k, c in enumerate(reply.get("calls", [])))
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1),
            finish_reason="tool_calls" if calls else "stop")


@loopwright.tool
async def nap(seconds: float, marker: str = "") -> str:
    """Write a marker file (if named), then sleep.

    Args:
        seconds: How long.
        marker: A file written when the call starts.
    """
    if marker:
        Path(marker).write_text("started")
    await anyio.sleep(seconds)
    return "napped"


@loopwright.tool(requires_approval=True)
def delete(path: str) -> str:
    """Pretend to delete a file.

    Args:
        path: The file.
    """
    return f"deleted {path}"


@loopwright.hookimpl
async def loopwright_on_state_change(instance: Any, old: str | None, new: str, stop_reason: str | None) -> None:
    del old, stop_reason
    pause = os.environ.get("LW_PAUSE_RUNNING")
    if pause and new == "running":
        Path(f"paused.{instance.instance_id}").write_text("paused")
        await anyio.sleep(float(pause))


@loopwright.hookimpl
def loopwright_register_providers(register: Any) -> None:
    register("script", ScriptProvider)


@loopwright.hookimpl
def loopwright_register_tools(register: Any) -> None:
    register(nap, delete)
