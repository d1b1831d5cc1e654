"""execute_terminal_command through a real Runtime: each shell mode, approvals across runtimes, process groups."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from _os_testlib import (
    Script,
    call,
    definition,
    gone,
    grants,
    reply,
    result_of,
    run_to_rest,
    runtime,
    runtime_id,
)

import loopwright_os._shell as shell_module
from loopwright import Limits, State, StopReason, ToolStatus

pytestmark = pytest.mark.anyio

SHELL = "execute_terminal_command"


async def test_none_mode_does_not_offer_the_tool(tmp_path: Path) -> None:
    """Under shell: none the model is not told about the tool, and a call to it is unknown_tool."""
    c = call(SHELL, command=f"touch {tmp_path}/ran")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="none")) as rt:
        run, result = await run_to_rest(rt, definition(SHELL))
    assert SHELL not in [t.name for t in script.requests[0].tools]
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.UNKNOWN_TOOL
    assert not (tmp_path / "ran").exists()
    assert result.state is State.WAITING


async def test_allow_runs_and_reports_exit_code_and_both_streams(tmp_path: Path) -> None:
    """Under allow the command runs; a non-zero exit is a normal result carrying the code and both streams."""
    c = call(SHELL, command="echo to-out; echo to-err >&2; exit 3")
    script = Script(reply(None, c), reply("done"))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.SUCCESS
    assert message.content == "exit code: 3\n--- stdout ---\nto-out\n\n--- stderr ---\nto-err\n"
    assert result_of(script.sent[1], c.id).content == message.content  # the model saw it


async def test_working_folder_is_the_first_writable_root_else_a_temporary_one(tmp_path: Path) -> None:
    """The command runs in the first writable root; without one, in a temporary folder removed afterwards."""
    work = tmp_path / "work"
    work.mkdir()
    in_root, in_temp = call(SHELL, command="pwd"), call(SHELL, command="pwd")
    script = Script(reply(None, in_root), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="allow", write=[work])) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    assert result_of(run.inst.transcript, in_root.id).content == f"exit code: 0\n--- stdout ---\n{work}\n"
    script = Script(reply(None, in_temp), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    scratch = Path(result_of(run.inst.transcript, in_temp.id).content.splitlines()[2])
    assert scratch.name.startswith("loopwright-shell-")
    assert not scratch.exists()


async def test_approval_mode_asks_the_hosts_approver(tmp_path: Path) -> None:
    """Under approval the runtime's approver decides inside the tool: yes runs, no is denied with its reason."""
    asked: list[tuple[str, str]] = []

    async def approver(command: str, context: object) -> bool | str:
        asked.append((command, context.instance_id))  # type: ignore[attr-defined]
        return True if "yes" in command else "not on my machine"

    yes = call(SHELL, command=f"touch {tmp_path}/yes")
    no = call(SHELL, command=f"touch {tmp_path}/no")
    script = Script(reply(None, yes), reply(None, no), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="approval"), shell_approver=approver) as rt:
        run, result = await run_to_rest(rt, definition(SHELL))
    assert result.state is State.WAITING  # never held at the loop's gate
    assert asked == [(yes.arguments["command"], run.instance_id), (no.arguments["command"], run.instance_id)]
    assert result_of(run.inst.transcript, yes.id).status is ToolStatus.SUCCESS
    denied = result_of(run.inst.transcript, no.id)
    assert denied.status is ToolStatus.DENIED
    assert denied.content == "denied: not on my machine"
    assert (tmp_path / "yes").exists()
    assert not (tmp_path / "no").exists()


async def test_a_sync_approver_that_says_no_denies(tmp_path: Path) -> None:
    """A plain-function approver (a terminal prompt) runs in a thread; False denies with a default reason."""
    c = call(SHELL, command=f"touch {tmp_path}/ran")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="approval"), shell_approver=lambda *_: False) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    denied = result_of(run.inst.transcript, c.id)
    assert (denied.status, denied.content) == (ToolStatus.DENIED, "denied: the shell approver refused the command")
    assert not (tmp_path / "ran").exists()


async def test_loop_approval_holds_and_runs_after_approve_in_another_runtime(tmp_path: Path) -> None:
    """Under loopApproval the call is held showing the command; a new Runtime over the same store approves it."""
    c = call(SHELL, command=f"echo hello > {tmp_path}/ran; echo done")
    first = Script(reply(None, c))
    async with runtime(tmp_path, first, grants(shell="loopApproval")) as rt:
        run, result = await run_to_rest(rt, definition(SHELL))
        instance_id = run.instance_id
    assert result.stop_reason is StopReason.WAITING_FOR_APPROVAL
    [pending] = result.pending_approvals
    assert (pending.tool_call_id, pending.tool) == (runtime_id(run.inst.transcript, c.id), SHELL)
    assert pending.reason == f"run shell command: {c.arguments['command']}"
    assert not (tmp_path / "ran").exists()

    second = Script(reply("it ran"))  # another "process": nothing is shared but the store
    async with runtime(tmp_path, second, grants(shell="loopApproval")) as rt:
        run = await rt.approve(instance_id)
        with anyio.fail_after(15):
            result = await run.wait()
    assert result.state is State.WAITING
    assert (tmp_path / "ran").read_text() == "hello\n"
    seen = result_of(second.sent[0], c.id)
    assert (seen.status, seen.content) == (ToolStatus.SUCCESS, "exit code: 0\n--- stdout ---\ndone\n")


async def test_loop_approval_deny_gives_a_denied_result(tmp_path: Path) -> None:
    """Denying a held command gives the model a denied result with the reason; the command never runs."""
    c = call(SHELL, command=f"touch {tmp_path}/ran")
    script = Script(reply(None, c), reply("understood"))
    async with runtime(tmp_path, script, grants(shell="loopApproval")) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
        await run.deny(reason="too risky")
        with anyio.fail_after(15):
            await run.wait()
    seen = result_of(script.sent[1], c.id)
    assert (seen.status, seen.content) == (ToolStatus.DENIED, "denied: too risky")
    assert not (tmp_path / "ran").exists()


async def test_saved_approval_instance_without_an_approver_uses_the_loop_gate(tmp_path: Path) -> None:
    """An approval instance resumed in a runtime with no approver is held at the loop's gate, then runs on approve."""
    asked: list[str] = []
    first = Script(reply("ready"))
    async with runtime(tmp_path, first, grants(shell="approval"),
                       shell_approver=lambda cmd, _ctx: asked.append(cmd) or True) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
        instance_id = run.instance_id
    c = call(SHELL, command=f"touch {tmp_path}/ran")
    second = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, second, grants(shell="approval")) as rt:  # no approver here
        run = await rt.message(instance_id, "now run it")
        with anyio.fail_after(15):
            result = await run.wait()
        assert result.stop_reason is StopReason.WAITING_FOR_APPROVAL
        assert [p.reason for p in result.pending_approvals] == [f"run shell command: {c.arguments['command']}"]
        assert not (tmp_path / "ran").exists()
        await run.approve()
        with anyio.fail_after(15):
            result = await run.wait()
    assert result.state is State.WAITING
    assert (tmp_path / "ran").exists()
    assert asked == []


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """On timeout the command and its grandchildren are killed; the model gets the output so far."""
    pid_file = tmp_path / "grandchild"
    # 3 s: the shell has time to print 'started' even on a loaded machine; the sleeps outlast any guard.
    c = call(SHELL, command=f"sleep 600 & echo $! > {pid_file}; echo started; sleep 600", timeout=3)
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        with anyio.fail_after(120):  # a hang guard: only the timeout can end the command
            run, _ = await run_to_rest(rt, definition(SHELL))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.TOOL_ERROR
    assert message.content.startswith("timed out after 3 s: the command and every process it started were stopped")
    assert "killed by SIGTERM" in message.content
    assert "--- stdout ---\nstarted\n" in message.content
    assert await gone(int(pid_file.read_text()))


async def test_the_loops_tool_timeout_caps_the_command(tmp_path: Path) -> None:
    """A command's default timeout is cut short of the definition's tool timeout, so the tool reports it itself."""
    c = call(SHELL, command="sleep 30")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL, limits=Limits(tool_timeout=1.0)))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.TOOL_ERROR
    assert message.content.startswith("timed out after 0.5 s")


async def test_processes_left_behind_are_stopped_when_the_command_exits(tmp_path: Path) -> None:
    """A background process the command leaves behind is stopped when it exits, and the call does not wait for it."""
    c = call(SHELL, command="sleep 600 > /dev/null 2>&1 & echo $!")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        with anyio.fail_after(120):  # a hang guard: a call that waited for the sleep would never end here
            run, _ = await run_to_rest(rt, definition(SHELL))
    content = result_of(run.inst.transcript, c.id).content
    assert await gone(int(content.split("--- stdout ---\n")[1]))


async def test_cancelling_the_run_kills_the_running_command(tmp_path: Path) -> None:
    """Cancelling a run while a command runs stops its whole process group."""
    pid_file = tmp_path / "pid"
    c = call(SHELL, command=f"sleep 30 & echo $! > {pid_file}; wait")
    script = Script(reply(None, c))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        run = await rt.start_agent(definition(SHELL), prompt="go")
        with anyio.fail_after(10):
            while not pid_file.exists() or not pid_file.read_text().strip():
                await anyio.sleep(0.02)
            await run.cancel()
        result = await run.wait()
    assert result.stop_reason is StopReason.CANCELLED
    assert await gone(int(pid_file.read_text()))


async def test_output_is_capped_per_stream_with_a_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long output keeps its first and last bytes, with a marker saying how much was dropped."""
    monkeypatch.setattr(shell_module, "OUTPUT_HEAD", 1000)
    monkeypatch.setattr(shell_module, "OUTPUT_TAIL", 1000)
    c = call(SHELL, command="printf 'START'; head -c 300000 /dev/zero | tr '\\0' x; printf 'END'; echo small >&2")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    content = result_of(run.inst.transcript, c.id).content
    out = content.split("--- stdout ---\n")[1].split("\n--- stderr ---")[0]
    assert out.startswith("START")
    assert out.endswith("END")
    assert "[... 298,008 bytes of stdout omitted: it had 300,008 bytes; the first 1,000 and the last 1,000" in out
    assert len(out) < 2200
    assert content.endswith("--- stderr ---\nsmall\n")


async def test_default_output_cap_stays_under_the_loops_cut(tmp_path: Path) -> None:
    """With the default caps, two full streams still fit the loop's 100,000-character result limit."""
    c = call(SHELL, command="head -c 1000000 /dev/zero | tr '\\0' o; head -c 1000000 /dev/zero | tr '\\0' e >&2")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="allow")) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    content = result_of(run.inst.transcript, c.id).content
    assert "bytes of stdout omitted" in content
    assert "bytes of stderr omitted" in content
    assert "[truncated" not in content
    assert len(content) < 100_000
