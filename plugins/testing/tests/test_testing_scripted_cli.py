"""The ``scripted`` provider across processes, through the CLI as a subprocess.

Each CLI command is a new process with a new provider that reads the whole script again; it must
go on with the reply after the instance's last answer: after ``approve``, after ``message``, and
after ``resume`` of an instance a SIGKILL left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

TOOLS = '''
from pathlib import Path

import anyio

import loopwright


@loopwright.tool(requires_approval=True)
def delete(path: str) -> str:
    """Pretend to delete a file.

    Args:
        path: The file.
    """
    return f"deleted {path}"


@loopwright.tool
async def slow(marker: str) -> str:
    """Write a marker file and take a minute the first time; answer at once after that.

    Args:
        marker: The file written when the tool starts.
    """
    if Path(marker).exists():
        return "again"
    Path(marker).write_text("started")
    await anyio.sleep(60)
    return "done"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(delete, slow)
'''


def _lw(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def _project(tmp_path: Path, replies: list[Any], tools: str) -> Path:
    project = tmp_path / "p"
    project.mkdir()
    (project / "tools.py").write_text(TOOLS)
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [testing, tools.py]\n"
        "providers: {model: {kind: scripted, file: model.yaml}}\n")
    (project / "model.yaml").write_text(json.dumps(replies))
    (project / "agent.yaml").write_text(f"name: agent\nmodel: model:any\ntools: [{tools}]\n")
    return project


def _turns(project: Path, iid: str) -> int:
    """The number of model calls the instance made."""
    shown = _lw(project, "--json", "show", iid)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["usage"]["requests"]


def test_approve_in_a_new_process_goes_on_with_the_next_reply(tmp_path: Path) -> None:
    """run holds the call (exit 3); approve from a new process plays reply 2, not reply 1 again."""
    project = _project(tmp_path, [
        {"toolCalls": [{"name": "delete", "arguments": {"path": "a.txt"}, "id": "c1"}]},
        {"text": "deleted it"},
    ], "delete")
    held = _lw(project, "--json", "run", "agent.yaml", "-p", "delete a.txt")
    assert held.returncode == 3, held.stderr
    iid = json.loads(held.stdout)["instanceId"]
    done = _lw(project, "--json", "approve", iid)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["state"], data["text"]) == ("waiting", "deleted it")
    assert _turns(project, iid) == 2


def test_message_in_a_new_process_goes_on_with_the_next_reply(tmp_path: Path) -> None:
    """A message from a new process gets reply 2; a third message finds the script ran out."""
    project = _project(tmp_path, ["first answer", "second answer"], "delete")
    first = _lw(project, "--json", "run", "agent.yaml", "-p", "hi")
    assert first.returncode == 0, first.stderr
    iid = json.loads(first.stdout)["instanceId"]
    second = _lw(project, "message", iid, "again")
    assert second.returncode == 0, second.stderr
    assert second.stdout == "second answer\n"
    third = _lw(project, "message", iid, "and again")
    assert third.returncode == 1
    assert "the script ran out" in third.stderr


def test_resume_after_sigkill_goes_on_with_the_next_reply(tmp_path: Path) -> None:
    """SIGKILL mid-tool, then resume in a new process: the model's next reply is reply 2."""
    marker = tmp_path / "slow.started"
    project = _project(tmp_path, [
        {"toolCalls": [{"name": "slow", "arguments": {"marker": str(marker)}, "id": "s1"}]},
        {"text": "after the crash"},
    ], "slow")
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "--json", "run", "agent.yaml", "-p", "go"],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"})
    try:
        deadline = time.monotonic() + 60  # a hang guard only
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the slow tool never started"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate()
    running = json.loads(_lw(project, "--json", "ls", "--state", "running").stdout)
    assert len(running) == 1
    iid = running[0]["instanceId"]
    done = _lw(project, "resume", iid)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "after the crash\n"
    assert "unknown_outcome" in done.stderr
    assert _turns(project, iid) == 2  # no second call of the slow tool


@pytest.mark.parametrize("rewrite", [True, False])
def test_a_script_rewritten_between_processes_is_not_skipped(tmp_path: Path, *, rewrite: bool) -> None:
    """A script rewritten to hold only what comes next starts at its first reply; kept, it goes on."""
    project = _project(tmp_path, ["first answer", "second answer"], "delete")
    first = _lw(project, "--json", "run", "agent.yaml", "-p", "hi")
    iid = json.loads(first.stdout)["instanceId"]
    if rewrite:
        (project / "model.yaml").write_text(json.dumps(["rewritten answer"]))
    second = _lw(project, "message", iid, "again")
    assert second.returncode == 0, second.stderr
    assert second.stdout == ("rewritten answer\n" if rewrite else "second answer\n")


DOC = Path(__file__).resolve().parents[3] / "docs" / "testing-providers.md"


def test_the_docs_scripts_are_valid_scripts(tmp_path: Path) -> None:
    """Every YAML block of docs/testing-providers.md builds a scripted provider, inline or as a file."""
    from ruamel.yaml import YAML  # noqa: PLC0415 - only this test reads YAML

    from loopwright import ProviderSettings  # noqa: PLC0415
    from loopwright_testing import ScriptedProvider  # noqa: PLC0415

    blocks = DOC.read_text().split("```yaml\n")[1:]
    assert len(blocks) == 2
    built = []
    for block in blocks:
        data = YAML(typ="safe").load(block.split("```", 1)[0])
        if "providers" in data:
            options = dict(data["providers"]["model"])
        else:
            (tmp_path / "replies.yaml").write_text(block.split("```", 1)[0])
            options = {"kind": "scripted", "file": str(tmp_path / "replies.yaml")}
        kind = options.pop("kind")
        built.append(ScriptedProvider(ProviderSettings(name="model", kind=kind, options=options)).remaining)
    assert built == [4, 2]
