"""Test helpers for the core suite: a scripted provider, a test plugin and runtime builders.

The core suite never depends on other distributions: runtimes are built with ``autoload=False``
and everything a test needs (a provider, tools, hooks) is registered through a plugin object.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import loopwright
from loopwright import Message, ModelRequest, ModelResponse, ToolCall, Usage, hookimpl
from loopwright._definition import Assembly, StoreConfig
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ProviderError

__all__ = [
    "Harness",
    "ScriptedProvider",
    "call",
    "entries_path",
    "make_runtime",
    "reply",
    "run_to_rest",
    "runtime_id",
    "tool_messages",
]

_ids = itertools.count(1)


def call(name: str, id: str | None = None, /, **arguments: Any) -> ToolCall:  # noqa: A002 - mirrors ToolCall
    """Return a tool call as a model would make it (a fresh id unless one is given)."""
    return ToolCall(id=id or f"c{next(_ids)}", name=name, arguments=arguments)


def raw_call(name: str, raw: str, id: str | None = None) -> ToolCall:  # noqa: A002
    """Return a tool call whose arguments the model wrote as text that is not a JSON object."""
    return ToolCall(id=id or f"c{next(_ids)}", name=name, arguments={}, raw_arguments=raw)


def reply(text: str | None = None, *calls: ToolCall, usage: Usage | None = None,
          finish_reason: str | None = None) -> ModelResponse:
    """Return a model response with ``text`` and ``calls`` (1 input + 1 output token by default)."""
    return ModelResponse(
        message=Message(role="assistant", content=text, tool_calls=tuple(calls)),
        usage=usage or Usage(input_tokens=1, output_tokens=1, total_tokens=2, requests=1),
        finish_reason=finish_reason or ("tool_calls" if calls else "stop"),
    )


class ScriptedProvider(Provider):
    """A provider that pops replies from a shared script and records every request.

    A script item is a :class:`ModelResponse`, an exception instance (raised), or a callable of
    the request (sync or async) returning either. An exhausted script raises a ProviderError that
    says so, so a test that makes more model calls than it planned fails loudly.
    """

    free = True

    def __init__(self, settings: ProviderSettings, harness: Harness) -> None:
        self.settings = settings
        self.harness = harness

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the next scripted reply."""
        h = self.harness
        h.requests.append(request)
        # The request's messages are the live transcript (never copied per turn), so keep what
        # was sent at the time.
        h.sent.append(list(request.messages))
        if not h.replies:
            raise ProviderError("the test script ran out of replies", provider=self.settings.name,
                                model=request.model)
        item = h.replies.pop(0)
        if callable(item) and not isinstance(item, BaseException):
            item = item(request)
            if inspect.isawaitable(item):
                item = await item
        if isinstance(item, BaseException):
            raise item
        return item


class PricedProvider(ScriptedProvider):
    """A scripted provider that is not free: its prices come from the assembly's overrides."""

    free = False


class Harness:
    """A plugin object: registers a scripted provider (kind ``s`` by default) and test tools.

    Attributes:
        replies: The script, consumed front first.
        requests: Every request the provider received, in order.
        sent: For each request, the messages as they were when it was sent.
        tools: Tools registered through ``loopwright_register_tools``.
    """

    def __init__(self, *replies: Any, tools: Iterable[Any] = (), provider: str = "s",
                 priced: bool = False) -> None:
        self.replies: list[Any] = list(replies)
        self.requests: list[ModelRequest] = []
        self.sent: list[list[Message]] = []
        self.tools = tuple(tools)
        self.provider_kind = provider
        self.priced = priced

    def script(self, *replies: Any) -> None:
        """Add replies at the end of the script."""
        self.replies.extend(replies)

    def _factory(self, settings: ProviderSettings) -> Provider:
        cls = PricedProvider if self.priced else ScriptedProvider
        return cls(settings, self)

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        register(self.provider_kind, self._factory)

    @hookimpl
    def loopwright_register_tools(self, register: Callable[..., None]) -> None:
        if self.tools:
            register(*self.tools)


def make_runtime(tmp_path: Path, *plugins: object, store_dir: str = "store", **assembly: Any,
                 ) -> loopwright.Runtime:
    """Return a runtime over a file store in ``tmp_path / store_dir`` with only ``plugins`` added."""
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / store_dir)}), **assembly)
    return loopwright.Runtime(asm, plugins=plugins, autoload=False)


def defn(**kwargs: Any) -> loopwright.Definition:
    """Return a definition named ``t`` on the scripted model ``s:m`` unless told otherwise."""
    kwargs.setdefault("name", "t")
    kwargs.setdefault("model", "s:m")
    tools = kwargs.get("tools")
    if tools is not None:
        kwargs["tools"] = tuple(t if isinstance(t, str) else t.name for t in tools)
    return loopwright.Definition(**kwargs)


async def run_to_rest(rt: loopwright.Runtime, definition: loopwright.Definition, prompt: str | None = "go",
                      inputs: Mapping[str, Any] | None = None, *, timeout: float = 10.0,
                      ) -> tuple[loopwright.AgentRun, loopwright.AgentResult]:
    """Start ``definition`` and wait (without raising) until it rests."""
    run = await rt.start_agent(definition, inputs, prompt)
    with anyio.fail_after(timeout):
        result = await run.wait()
    return run, result


def tool_messages(transcript: Sequence[Message]) -> list[Message]:
    """Return the tool-result messages of a transcript, in order."""
    return [m for m in transcript if m.role == "tool"]


def result_for(transcript: Sequence[Message], call_id: str) -> Message:
    """Return the tool message answering the call the model named ``call_id`` (exactly one must exist)."""
    found = [m for m in transcript if m.role == "tool" and m.provider_call_id == call_id]
    assert len(found) == 1, f"{len(found)} results for {call_id}: {found}"
    return found[0]


RUNTIME_ID = re.compile(r"^lw-\d+-\d+-[0-9a-f]{6}$")
"""The shape of the runtime's own id for a tool call: ``lw-TURN-INDEX-RANDOM6HEX``."""


def runtime_id(source: Sequence[Message] | Sequence[ToolCall], wire_id: str) -> str:
    """Return the runtime's id of the call the model named ``wire_id`` (exactly one must exist).

    ``source`` is a transcript (the calls of its assistant messages are searched) or calls.
    """
    calls: list[ToolCall] = []
    for item in source:
        if isinstance(item, ToolCall):
            calls.append(item)
        elif item.role == "assistant":
            calls.extend(item.tool_calls)
    found = [c.id for c in calls if c.provider_id == wire_id]
    assert len(found) == 1, f"{len(found)} calls named {wire_id}: {calls}"
    assert RUNTIME_ID.match(found[0]), found[0]
    return found[0]


def entries_path(rt: loopwright.Runtime, instance_id: str) -> Path:
    """Return the file store's entry log of an instance."""
    return Path(rt.store.root) / instance_id / "entries.jsonl"  # type: ignore[attr-defined]


def records_of(records: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    """Return the ``data`` of every record of ``kind``."""
    return [r["data"] for r in records if r["kind"] == kind]


def dumps(value: Any) -> str:
    """Compact JSON, for comparing saved data."""
    return json.dumps(value, sort_keys=True)


def read_line(proc: subprocess.Popen[str]) -> str:
    """Return the next line a helper process printed; fail the test (with its stderr) if it exited."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(5)
        assert proc.stderr is not None
        pytest.fail(f"helper exited early ({proc.returncode}): {proc.stderr.read()}")
    return line.strip()


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a helper process, reap it and close its pipes."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def in_terminal(cwd: Path, *args: str, env: Mapping[str, str]) -> tuple[int, str]:
    """Run ``python -m loopwright.cli ARGS`` on a pseudo-terminal (120 columns); return its exit code and screen."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, stdin=follower,
                            stdout=follower, stderr=follower, env={**env, "COLUMNS": "120", "TERM": "xterm"})
    os.close(follower)
    chunks = []
    try:
        while select.select([leader], [], [], 30)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        proc.wait(30)
    return proc.returncode, b"".join(chunks).decode(errors="replace")
