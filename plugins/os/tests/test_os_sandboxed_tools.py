"""``sandboxed_tool``: a plugin's tool whose every call runs a program in the caller's sandbox (issue 28, point 2).

Real bubblewrap through a real Runtime: the program gets the call's arguments as JSON on stdin,
sees only the caller's roots and the tool's own binds, has no network without the grant, and a
failing, slow or flooding program gives ``tool_error``. Skipped where the sandbox cannot start,
unless ``LOOPWRIGHT_REQUIRE_SANDBOX=1``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from _os_testlib import Script, call, grants, reply, result_of, run_to_rest

import loopwright
import loopwright_os
from loopwright import Assembly, Capabilities, FileGrants, StoreConfig, Tool, ToolStatus, hookimpl
from loopwright.capabilities import BWRAP_ENV, sandbox_problem
from loopwright_os import sandboxed_tool

PROBLEM = sandbox_problem()
pytestmark = [pytest.mark.anyio, pytest.mark.skipif(
    PROBLEM is not None and os.environ.get("LOOPWRIGHT_REQUIRE_SANDBOX") != "1",
    reason=f"the sandbox cannot start here: {PROBLEM}")]

PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
          "additionalProperties": False}


class _Tools:
    """A plugin registering the given tools."""

    def __init__(self, *tools: Tool) -> None:
        self.tools = tools

    @hookimpl
    def loopwright_register_tools(self, register: Callable[..., None]) -> None:
        register(*self.tools)


def _program(tmp_path: Path, body: str) -> Path:
    """Write a shell script into ``tmp_path/tool`` (the tool's own folder, bound read-only) and return it."""
    folder = tmp_path / "tool"
    folder.mkdir(exist_ok=True)
    script = folder / "run.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def _runtime(tmp_path: Path, script: Script, caps: Capabilities, *tools: Tool) -> loopwright.Runtime:
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}), capabilities=caps)
    return loopwright.Runtime(asm, plugins=(script, loopwright_os, _Tools(*tools)), autoload=False)


async def test_the_program_reads_its_arguments_and_sees_only_the_callers_roots(tmp_path: Path) -> None:
    """The arguments arrive as JSON on stdin; the program reads in the caller's root, not beside it, nor the store."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("three little words")
    (tmp_path / "secret.txt").write_text("canary-outside")
    program = _program(tmp_path, 'read -r args; echo "args=$args"; cat "$(pwd)/notes.txt"; echo; '
                                 f'cat {tmp_path}/secret.txt 2>&1; ls {tmp_path / "store"} 2>&1; '
                                 'echo "env=$(env | grep -c .)"')
    tool = sandboxed_tool(name="reader", description="Read.", parameters=PARAMS, argv=[str(program)],
                          binds=[program.parent])
    c = call("reader", path="notes.txt")
    script = Script(reply(None, c), reply("ok"))
    async with _runtime(tmp_path, script, grants(shell="none", read=[work], write=[work]), tool) as rt:
        run, _ = await run_to_rest(rt, loopwright.Definition(name="t", model="s:m", tools=("reader",)))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.SUCCESS, message.content
    text = message.content or ""
    assert f"args={json.dumps({'path': 'notes.txt'})}" in text
    assert "three little words" in text
    assert "canary-outside" not in text
    assert "No such file or directory" in text
    assert "env=5" in text  # PATH, HOME, TMPDIR, LANG, PWD: the runtime's environment is not passed on


async def test_a_failing_program_is_a_tool_error_with_its_stderr(tmp_path: Path) -> None:
    """Exit 3 with a message on stderr: ``tool_error`` naming the exit code and carrying the message."""
    program = _program(tmp_path, 'echo "no such path" >&2; exit 3')
    tool = sandboxed_tool(name="failing", description="Fail.", parameters=PARAMS, argv=[str(program)],
                          binds=[program.parent])
    c = call("failing", path="x")
    script = Script(reply(None, c), reply("ok"))
    async with _runtime(tmp_path, script, grants(), tool) as rt:
        run, _ = await run_to_rest(rt, loopwright.Definition(name="t", model="s:m", tools=("failing",)))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.TOOL_ERROR
    assert message.content == "failing failed (exit code 3)\nno such path"


async def test_a_flooding_program_is_stopped_at_the_output_limit(tmp_path: Path) -> None:
    """A program that prints without end is stopped at ``outputBytes`` (here 64 KiB), as the shell is."""
    program = _program(tmp_path, "yes flood")
    tool = sandboxed_tool(name="flood", description="Flood.", parameters=PARAMS, argv=[str(program)],
                          binds=[program.parent], settings={"sandbox": {"outputBytes": 65536}})
    c = call("flood", path="x")
    script = Script(reply(None, c), reply("ok"))
    async with _runtime(tmp_path, script, grants(), tool) as rt:
        run, _ = await run_to_rest(rt, loopwright.Definition(name="t", model="s:m", tools=("flood",)))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.TOOL_ERROR
    assert (message.content or "").startswith("flood was stopped: its output passed the limit of 65,536 bytes")


def test_bad_factory_arguments_are_errors_at_once(tmp_path: Path) -> None:
    """Bad arguments to the factory are errors at once: an empty argv, malformed settings."""
    with pytest.raises(ValueError, match="argv must be a non-empty list"):
        sandboxed_tool(name="x", description="x", parameters=PARAMS, argv=[])
    with pytest.raises(ValueError, match="looks like a secret"):
        sandboxed_tool(name="x", description="x", parameters=PARAMS, argv=["/bin/true"],
                       settings={"sandbox": {"env": ["OPENAI_API_KEY"]}})


async def test_a_bind_that_would_show_the_store_refuses_the_call(tmp_path: Path) -> None:
    """A tool bound to a folder holding the store: each call is refused before anything runs."""
    marker = tmp_path / "ran"
    program = _program(tmp_path, f"touch {marker}")
    tool = sandboxed_tool(name="leaky", description="Leak.", parameters=PARAMS, argv=[str(program)],
                          binds=[tmp_path])  # tmp_path holds the store
    c = call("leaky", path="x")
    script = Script(reply(None, c), reply("ok"))
    async with _runtime(tmp_path, script, grants(), tool) as rt:
        run, _ = await run_to_rest(rt, loopwright.Definition(name="t", model="s:m", tools=("leaky",)))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.TOOL_ERROR
    assert "refusing to start the sandbox: the store at" in (message.content or "")
    assert not marker.exists()


def test_no_sandbox_means_no_sandboxed_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where bubblewrap is missing the tool cannot be made: the plugin fails at load, never runs it unsandboxed."""
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "missing-bwrap"))
    with pytest.raises(RuntimeError, match="cannot be registered: the sandbox cannot start on this machine"):
        sandboxed_tool(name="x", description="x", parameters=PARAMS, argv=["/bin/true"])


def test_grants_reach_the_sandbox_of_each_call() -> None:
    """The sandbox is built per call from the caller's grants (two grants, two different binds)."""
    from loopwright_os._sandbox import SandboxSettings, plan_sandbox  # noqa: PLC0415

    one = plan_sandbox(["/bin/true"], Capabilities(files=FileGrants(read=("/usr/share",))), base=Path("/"),
                       private=(), settings=SandboxSettings())
    two = plan_sandbox(["/bin/true"], Capabilities(network=True), base=Path("/"), private=(),
                       settings=SandboxSettings())
    assert "--share-net" not in one.argv
    assert "--share-net" in two.argv
    assert one.reads == (Path("/usr/share"),)
    assert one.argv[-1] == "/bin/true"
