"""Test helpers: a scripted provider plugin, runtime builders and process checks.

Runtimes are built with ``autoload=False`` and the plugins a test needs (this scripted provider
and ``loopwright_os`` itself) registered explicitly, so no other installed plugin takes part.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

import loopwright
import loopwright_os
from loopwright import (
    Assembly,
    Capabilities,
    FileGrants,
    Message,
    ModelRequest,
    ModelResponse,
    StoreConfig,
    ToolCall,
    Usage,
    hookimpl,
)
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ProviderError

_ids = itertools.count(1)

ALL_TOOLS = ("execute_terminal_command", "/agent-tools/os/read-file", "/agent-tools/os/write-file",
             "/agent-tools/os/list-directory")


def call(name: str, **arguments: Any) -> ToolCall:
    """Return a tool call as a model would make it, with a fresh id."""
    return ToolCall(id=f"c{next(_ids)}", name=name, arguments=arguments)


def reply(text: str | None = None, *calls: ToolCall) -> ModelResponse:
    """Return a model answer with ``text`` and ``calls``."""
    return ModelResponse(message=Message(role="assistant", content=text, tool_calls=tuple(calls)),
                         usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2, requests=1),
                         finish_reason="tool_calls" if calls else "stop")


class Script:
    """A plugin object registering provider kind ``s``, which answers from a list of replies.

    Attributes:
        replies: What the model says next, front first.
        requests: Every request it received.
        sent: For each request, a copy of its messages at the time.
    """

    def __init__(self, *replies: ModelResponse) -> None:
        self.replies = list(replies)
        self.requests: list[ModelRequest] = []
        self.sent: list[list[Message]] = []

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        register("s", lambda settings: _ScriptedProvider(settings, self))


class _ScriptedProvider(Provider):
    free = True

    def __init__(self, settings: ProviderSettings, script: Script) -> None:
        self.settings = settings
        self.script = script

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.script.requests.append(request)
        self.script.sent.append(list(request.messages))
        if not self.script.replies:
            raise ProviderError("the test script ran out of replies", provider="s", model=request.model)
        return self.script.replies.pop(0)


def grants(*, shell: str = "none", read: Sequence[Path] = (), write: Sequence[Path] = ()) -> Capabilities:
    """Return grants with the given shell mode and roots."""
    return Capabilities(shell=shell,  # type: ignore[arg-type]
                        files=FileGrants(read=tuple(map(str, read)), write=tuple(map(str, write))))


def runtime(tmp: Path, script: Script, caps: Capabilities, **kwargs: Any) -> loopwright.Runtime:
    """Return a runtime over the file store ``tmp/store`` with the scripted provider and this plugin."""
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(tmp / "store")}), capabilities=caps)
    return loopwright.Runtime(asm, plugins=(script, loopwright_os), autoload=False, **kwargs)


def definition(*tools: str, **kwargs: Any) -> loopwright.Definition:
    """Return a definition on the scripted model with ``tools`` (all of this plugin's by default)."""
    return loopwright.Definition(name="t", model="s:m", tools=tools or ALL_TOOLS, **kwargs)


async def run_to_rest(rt: loopwright.Runtime, defn: loopwright.Definition, prompt: str = "go",
                      ) -> tuple[loopwright.AgentRun, loopwright.AgentResult]:
    """Start ``defn`` and wait (raising nothing) until it rests."""
    run = await rt.start_agent(defn, prompt=prompt)
    with anyio.fail_after(15):
        result = await run.wait()
    return run, result


def result_of(messages: Sequence[Message], call_id: str) -> Message:
    """Return the tool message answering the call the model named ``call_id``.

    The runtime gives every call its own id; the model's id is kept as the result's
    ``provider_call_id``.
    """
    found = [m for m in messages if m.role == "tool" and m.provider_call_id == call_id]
    assert len(found) == 1, f"{len(found)} results for {call_id}"
    return found[0]


RUNTIME_ID = re.compile(r"^lw-\d+-\d+-[0-9a-f]{6}$")
"""The shape of the runtime's own id for a tool call: ``lw-TURN-INDEX-RANDOM6HEX``."""


def runtime_id(messages: Sequence[Message], call_id: str) -> str:
    """Return the runtime's id of the call the model named ``call_id`` (exactly one must exist)."""
    found = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls if c.provider_id == call_id]
    assert len(found) == 1, f"{len(found)} calls named {call_id}"
    assert RUNTIME_ID.match(found[0]), found[0]
    return found[0]


def alive(pid: int) -> bool:
    """Return whether ``pid`` is a live process (a zombie waiting to be reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


async def gone(pid: int, within: float = 60.0) -> bool:
    """Wait for ``pid`` to be gone; return whether it is (False after ``within`` seconds).

    ``within`` is a hang guard, not a bound a loaded machine must meet: the wait ends as soon as
    the process is gone.
    """
    with anyio.move_on_after(within):
        while alive(pid):
            await anyio.sleep(0.02)
        return True
    return False
