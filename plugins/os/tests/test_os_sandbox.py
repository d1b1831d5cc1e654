"""``shell: sandbox`` through a real Runtime and real bubblewrap: what a command sees, its limits, failing closed.

The attacks (reading a secret, the network, a fork bomb ...) are in ``tests/attacks/test_attack_sandbox.py``;
these tests check the mode works as documented. Where the sandbox cannot start they are skipped,
unless ``LOOPWRIGHT_REQUIRE_SANDBOX=1`` (as in CI), where they fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from _os_testlib import Script, call, definition, grants, reply, result_of, run_to_rest, runtime

import loopwright
import loopwright_os
from loopwright import Assembly, Capabilities, FileGrants, State, StopReason, StoreConfig, ToolStatus
from loopwright.capabilities import BWRAP_ENV, intersect, narrow_shell, sandbox_problem
from loopwright.errors import ConfigError, ToolError
from loopwright_os._sandbox import SandboxSettings, plan_sandbox, sandbox_settings

pytestmark = pytest.mark.anyio

SHELL = "execute_terminal_command"
PROBLEM = sandbox_problem()
needs_sandbox = pytest.mark.skipif(PROBLEM is not None and os.environ.get("LOOPWRIGHT_REQUIRE_SANDBOX") != "1",
                                   reason=f"the sandbox cannot start here: {PROBLEM}")


def test_the_sandbox_starts_on_this_machine_when_ci_requires_it() -> None:
    """Under LOOPWRIGHT_REQUIRE_SANDBOX=1 the probe must succeed: a CI without bubblewrap fails here, loudly."""
    if os.environ.get("LOOPWRIGHT_REQUIRE_SANDBOX") != "1":
        pytest.skip("LOOPWRIGHT_REQUIRE_SANDBOX is not set")
    assert PROBLEM is None


MODES = ("none", "allow", "approval", "loopApproval", "sandbox", "sandboxLoopApproval")


@pytest.mark.parametrize("parent", MODES)
@pytest.mark.parametrize("child", MODES)
def test_narrowing_never_unsandboxes_and_never_drops_an_approval(parent: str, child: str) -> None:
    """A child's mode is sandboxed if either side is, asks at least whoever either side asks, and is symmetric."""
    got = narrow_shell(parent, child)
    assert got == narrow_shell(child, parent)
    if "none" in (parent, child):
        assert got == "none"
        return
    assert (got in ("sandbox", "sandboxLoopApproval")) == ("sandbox" in parent + child)
    if "sandbox" in parent + child:
        assert got != "allow"
    asks = {"allow": 0, "sandbox": 0, "approval": 1, "loopApproval": 2, "sandboxLoopApproval": 2}
    assert asks[got] >= max(asks[parent], asks[child])
    assert narrow_shell(got, parent) == got  # narrowing again changes nothing


def test_a_sandbox_parent_never_grants_allow_through_intersect() -> None:
    """``intersect`` of a sandbox parent with a child asking for ``allow`` gives ``sandbox``."""
    parent = Capabilities(shell="sandbox")
    assert intersect(parent, Capabilities(shell="allow")).shell == "sandbox"
    assert intersect(parent, Capabilities(shell="loopApproval")).shell == "sandboxLoopApproval"
    assert intersect(parent, None).shell == "sandbox"


@needs_sandbox
async def test_a_sandboxed_command_runs_in_its_write_root_and_writes_there(tmp_path: Path) -> None:
    """The command runs in the first write root, its file lands on the host, and it reports like ``allow``."""
    work = tmp_path / "work"
    work.mkdir()
    c = call(SHELL, command="pwd; echo made > out.txt; echo oops >&2; exit 4")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="sandbox", write=[work])) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.SUCCESS
    assert message.content == f"exit code: 4\n--- stdout ---\n{work}\n\n--- stderr ---\noops\n"
    assert (work / "out.txt").read_text() == "made\n"


@needs_sandbox
async def test_without_a_write_root_the_command_works_in_a_private_tmp(tmp_path: Path) -> None:
    """No write root: the working folder is the sandbox's own /tmp, which the host never sees."""
    c = call(SHELL, command="pwd; echo x > here.txt; ls")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="sandbox")) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    assert result_of(run.inst.transcript, c.id).content == "exit code: 0\n--- stdout ---\n/tmp\nhere.txt\n"
    assert not Path("/tmp/here.txt").exists()  # noqa: S108 - the host's /tmp, which the command did not get


@needs_sandbox
async def test_only_the_named_variables_reach_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pluginSettings.os.sandbox.env`` passes a variable by name; every other one of the host is cleared."""
    monkeypatch.setenv("LW_PASSED", "passed-value")
    monkeypatch.setenv("LW_KEPT_OUT", "kept-out-value")
    c = call(SHELL, command="env | sort")
    script = Script(reply(None, c), reply("ok"))
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}),
                   capabilities=grants(shell="sandbox"), plugin_settings={"os": {"sandbox": {"env": ["LW_PASSED"]}}})
    async with loopwright_os_runtime(asm, script) as rt:
        run, _ = await run_to_rest(rt, definition(SHELL))
    content = result_of(run.inst.transcript, c.id).content
    names = sorted(line.split("=", 1)[0] for line in content.split("--- stdout ---\n")[1].splitlines() if "=" in line)
    assert names == ["HOME", "LANG", "LW_PASSED", "PATH", "PWD", "TMPDIR"]
    assert "LW_PASSED=passed-value" in content
    assert "kept-out-value" not in content


def loopwright_os_runtime(asm: Assembly, script: Script) -> loopwright.Runtime:
    """Return a runtime over ``asm`` with the scripted provider and this plugin."""
    return loopwright.Runtime(asm, plugins=(script, loopwright_os), autoload=False)


def test_a_secret_looking_name_is_refused_in_the_settings() -> None:
    """Passing ``OPENAI_API_KEY`` (or a *TOKEN, *SECRET, *PASSWORD) on to the sandbox is a settings error."""
    for name in ("OPENAI_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "MY_SECRET"):
        with pytest.raises(ValueError, match="looks like a secret"):
            sandbox_settings({"sandbox": {"env": [name]}})
    with pytest.raises(ValueError, match="positive whole number"):
        sandbox_settings({"sandbox": {"processes": 0}})
    with pytest.raises(ValueError, match="takes only"):
        sandbox_settings({"sandbox": {"procs": 5}})
    assert sandbox_settings({"sandbox": {"env": ["LANGUAGE"], "processes": 9}}) == SandboxSettings(
        env=("LANGUAGE",), processes=9)


@needs_sandbox
async def test_sandbox_loop_approval_holds_then_runs_sandboxed(tmp_path: Path) -> None:
    """Under sandboxLoopApproval the call is held; approved, it runs in the sandbox (it cannot see the host's /etc)."""
    work = tmp_path / "work"
    work.mkdir()
    c = call(SHELL, command="ls /etc 2>&1; echo ran > ran.txt")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="sandboxLoopApproval", write=[work])) as rt:
        run, result = await run_to_rest(rt, definition(SHELL))
        assert result.stop_reason is StopReason.WAITING_FOR_APPROVAL
        assert not (work / "ran.txt").exists()
        await run.approve()
        with anyio.fail_after(30):
            result = await run.wait()
    assert result.state is State.WAITING
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.SUCCESS
    assert "No such file or directory" in message.content
    assert (work / "ran.txt").read_text() == "ran\n"


async def test_a_missing_bwrap_refuses_the_assembly_when_it_loads(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``shell: sandbox`` with no bubblewrap is a ConfigError at open, naming capabilities.shell and why."""
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    script = Script(reply("never"))
    for mode in ("sandbox", "sandboxLoopApproval"):
        rt = runtime(tmp_path, script, grants(shell=mode))
        with pytest.raises(ConfigError) as caught:
            async with rt:
                pass
        message = str(caught.value)
        assert f"capabilities.shell is {mode!r}, but the sandbox cannot start on this machine" in message
        assert "no-such-bwrap" in message
        assert "not an executable file" in message
    async with runtime(tmp_path, script, grants(shell="allow")):
        pass  # the other modes do not need it


@needs_sandbox
async def test_a_sandbox_that_breaks_after_load_fails_the_call_and_runs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bubblewrap gone between load and call: the call is a tool_error and the command never runs unsandboxed."""
    work = tmp_path / "work"
    work.mkdir()
    c = call(SHELL, command="touch ran.txt")
    script = Script(reply(None, c), reply("ok"))
    async with runtime(tmp_path, script, grants(shell="sandbox", write=[work])) as rt:
        monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "gone-bwrap"))
        run, _ = await run_to_rest(rt, definition(SHELL))
    message = result_of(run.inst.transcript, c.id)
    assert message.status is ToolStatus.TOOL_ERROR
    assert message.content.startswith("the sandbox cannot start on this machine, so the command was not run")
    assert not (work / "ran.txt").exists()


@needs_sandbox
def test_a_store_or_sink_visible_in_the_sandbox_is_refused(tmp_path: Path) -> None:
    """A private location under a root, or under a system folder bound in, refuses the sandbox; elsewhere it is fine."""
    root = tmp_path / "root"
    (root / "store").mkdir(parents=True)
    caps = Capabilities(shell="sandbox", files=FileGrants(read=(str(root),)))
    settings = SandboxSettings()
    with pytest.raises(ToolError, match=r"the store at .*/root/store would be visible in it through .*/root"):
        plan_sandbox("true", caps, base=tmp_path, private=[("the store", root / "store")], settings=settings)
    with pytest.raises(ToolError, match="a record sink at /usr/share would be visible in it through /usr"):
        plan_sandbox("true", caps, base=tmp_path, private=[("a record sink", Path("/usr/share"))], settings=settings)
    with pytest.raises(ToolError, match="would be visible"):  # a store containing a root
        plan_sandbox("true", caps, base=tmp_path, private=[("the store", tmp_path)], settings=settings)
    plan = plan_sandbox("true", caps, base=tmp_path, private=[("the store", tmp_path / "elsewhere")],
                        settings=settings)
    assert plan.reads == (root.resolve(),)


@needs_sandbox
def test_roots_are_bound_after_symlinks_are_resolved(tmp_path: Path) -> None:
    """A root given through a link is bound at its real path, as the file tools resolve it; missing ones are not."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    read = (str(tmp_path / "link"), str(tmp_path / "absent"))
    caps = Capabilities(shell="sandbox", files=FileGrants(read=read, write=("link",)))
    plan = plan_sandbox("true", caps, base=tmp_path, private=(), settings=SandboxSettings())
    assert plan.writes == (real.resolve(),)
    assert plan.reads == ()  # the read root lies in the write root; the absent one is not bound
    assert plan.workdir == str(real.resolve())
    assert "--bind" in plan.argv
    assert str(tmp_path / "link") not in plan.argv
