"""``onToolException: fail`` (seed 002): a tool that raises ends the run in ``error``, after its result is saved.

Without it (``continue``, the default) a raising tool is a ``tool_failed`` result the model sees
and the run goes on (``test_loop.py`` covers that). With it, only a raise ends the run: a
``ToolError``, a timeout and a denial stay results either way. The result of the raising call is
saved before the run ends, so the store answers every call the model made; a call of the same
turn that would have waited (held for approval) gets a ``skipped`` result instead of a hold that
would outlive the run. Driven through the API on a file store and through the CLI as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, reply, result_for, run_to_rest

import loopwright
from loopwright import State, StopReason, ToolError, ToolStatus
from loopwright._config import load_definition
from loopwright.errors import ConfigError

pytestmark = pytest.mark.anyio


async def reloaded(tmp_path: Path, h: Harness, instance_id: str) -> loopwright.Instance:
    """Return the instance as a new runtime reads it back from the store."""
    async with make_runtime(tmp_path, h) as rt:
        return (await rt.get_agent(instance_id)).inst


@loopwright.tool
async def broken() -> str:
    """Crash."""
    raise KeyError("missing")


@loopwright.tool
def picky() -> str:
    """Refuse, as a tool that knows what went wrong."""
    raise ToolError("cannot do that")


@loopwright.tool(timeout=0.1)
async def sleepy() -> str:
    """Sleep past the timeout."""
    await anyio.sleep(5)
    return "woke"


@loopwright.tool(requires_approval=True)
def guarded() -> str:
    """Needs a person's yes."""
    return "done"


@loopwright.tool
def fine() -> str:
    """Work."""
    return "ok"


async def test_a_raising_tool_ends_the_run_in_error_after_its_result_is_saved(tmp_path: Path) -> None:
    """The run ends ``error`` naming the tool and the exception; the model is not called again."""
    h = Harness(reply(None, call("fine", "f"), call("broken", "b")), reply("never"), tools=[fine, broken])
    rt = make_runtime(tmp_path, h)
    async with rt:
        run, result = await run_to_rest(rt, defn(tools=[fine, broken], on_tool_exception="fail"))
        assert (result.state, result.stop_reason) == (State.ERROR, StopReason.ERROR)
        assert result.error == "tool 'broken' raised KeyError: 'missing' (onToolException: fail)"
        assert len(h.sent) == 1
    saved = await reloaded(tmp_path, h, run.instance_id)
    # Both results are in the store: the one that raised, and the one that ran beside it.
    transcript = saved.transcript
    assert result_for(transcript, "b").status is ToolStatus.TOOL_FAILED
    assert result_for(transcript, "b").content == "KeyError: 'missing'"
    assert result_for(transcript, "f").status is ToolStatus.SUCCESS


async def test_the_default_goes_on_and_the_model_sees_the_failure(tmp_path: Path) -> None:
    """Without the option (``continue``) the same raise is a result and the run goes on."""
    h = Harness(reply(None, call("broken", "b")), reply("after"), tools=[broken])
    rt = make_runtime(tmp_path, h)
    async with rt:
        _run, result = await run_to_rest(rt, defn(tools=[broken]))
    assert (result.state, result.text) == (State.WAITING, "after")
    assert h.sent[-1][-1].status is ToolStatus.TOOL_FAILED


@pytest.mark.parametrize(("tool", "status"), [(picky, ToolStatus.TOOL_ERROR), (sleepy, ToolStatus.TIMEOUT)])
async def test_a_tool_error_or_a_timeout_is_a_result_even_with_fail(
        tmp_path: Path, tool: loopwright.Tool, status: ToolStatus) -> None:
    """``fail`` is about raises only: what a tool reports on purpose, and its deadline, stay results."""
    h = Harness(reply(None, call(tool.name, "c")), reply("after"), tools=[tool])
    rt = make_runtime(tmp_path, h)
    async with rt:
        _run, result = await run_to_rest(rt, defn(tools=[tool], on_tool_exception="fail"))
    assert (result.state, result.text) == (State.WAITING, "after")
    assert h.sent[-1][-1].status is status


async def test_a_held_call_of_the_failing_turn_is_skipped_not_left_waiting(tmp_path: Path) -> None:
    """The run that ends leaves no hold behind: the held call of its turn gets a ``skipped`` result."""
    h = Harness(reply(None, call("guarded", "g"), call("broken", "b")), reply("never"), tools=[guarded, broken])
    rt = make_runtime(tmp_path, h)
    async with rt:
        run, result = await run_to_rest(rt, defn(tools=[guarded, broken], on_tool_exception="fail"))
        assert result.state is State.ERROR
    saved = await reloaded(tmp_path, h, run.instance_id)
    assert not saved.pending_approvals
    skipped = result_for(saved.transcript, "g")
    assert skipped.status is ToolStatus.SKIPPED
    assert skipped.content == "skipped: the run ended because 'broken' raised"


async def test_an_approved_call_that_raises_ends_the_run_too(tmp_path: Path) -> None:
    """A held call that a person approves runs through the same path: its raise ends the run."""

    @loopwright.tool(name="guarded", requires_approval=True)
    def guarded_broken() -> str:
        """Needs a yes, then crashes."""
        raise RuntimeError("boom")

    h = Harness(reply(None, call("guarded", "g")), reply("never"), tools=[guarded_broken])
    rt = make_runtime(tmp_path, h)
    async with rt:
        run, result = await run_to_rest(rt, defn(tools=[guarded_broken], on_tool_exception="fail"))
        assert result.state is State.WAITING_FOR_APPROVAL
        await rt.approve(run.instance_id, run.inst.pending_approvals[0].tool_call_id)
        with anyio.fail_after(10):
            result = await run.wait()
    assert (result.state, result.error) == (
        State.ERROR, "tool 'guarded' raised RuntimeError: boom (onToolException: fail)")
    assert len(h.sent) == 1


def test_the_yaml_option_loads_and_a_wrong_value_names_its_line(tmp_path: Path) -> None:
    """``onToolException`` is read from a definition file; any value but the two is refused with its place."""
    good = tmp_path / "good.yaml"
    good.write_text("name: a\nmodel: test:any\nonToolException: fail\n")
    assert load_definition(good).on_tool_exception == "fail"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: a\nmodel: test:any\nonToolException: stop\n")
    with pytest.raises(ConfigError) as info:
        load_definition(bad)
    assert "bad.yaml:3:" in str(info.value)
    assert "onToolException" in str(info.value)


def test_the_cli_exits_with_the_error_and_names_the_tool(tmp_path: Path) -> None:
    """``loopwright run`` of such a definition ends in ``error`` (exit 1) and says which tool raised."""
    (tmp_path / "tools.py").write_text(
        "import loopwright\n\n\n@loopwright.tool\ndef explode() -> str:\n"
        '    """Crash."""\n    raise ValueError("kaboom")\n\n\n'
        "@loopwright.hookimpl\ndef loopwright_register_tools(register):\n    register(explode)\n")
    (tmp_path / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\nplugins: [testing, tools.py]\n"
        "providers: {model: {kind: scripted, file: model.yaml}}\n")
    (tmp_path / "model.yaml").write_text(json.dumps(
        [{"toolCalls": [{"name": "explode", "arguments": {}, "id": "c1"}]}, {"text": "never"}]))
    (tmp_path / "agent.yaml").write_text("name: agent\nmodel: model:any\ntools: [explode]\nonToolException: fail\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", "--json", "run", "agent.yaml", "-p", "go"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["state"] == "error"
    assert out["error"] == "tool 'explode' raised ValueError: kaboom (onToolException: fail)"
