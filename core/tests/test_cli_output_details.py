"""Small details of the CLI's output, each run as ``python -m loopwright.cli`` in a subprocess.

A denied call's status is said once; tiny costs are printed in fixed notation; ``show`` on an
instance a killed process left running counts the turns it saved; the live line of a continued
instance starts from its totals; ``approve``, ``deny``, ``message`` and ``resume`` take
``--stream``; ``validate`` refuses an entry log clearly instead of reporting a problem per line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import in_terminal

#: The CLI tests' plugin file (tools ``delete`` and ``slow``, among others), copied into each project.
TOOLS = Path(__file__).parent / "cli_fixtures" / "replay_plugin.py"

USAGE = {"inputTokens": 10, "outputTokens": 5}
DELETE = {"toolCalls": [{"name": "delete", "arguments": {"path": "a.txt"}, "id": "c1"}], "usage": USAGE}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def _lw(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, capture_output=True,
                          text=True, env=_env(), timeout=120, check=False)


def _project(tmp_path: Path, replies: list[Any], tools: str = "delete", extra: str = "") -> Path:
    project = tmp_path / "p"
    project.mkdir()
    shutil.copy(TOOLS, project / "tools.py")
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [testing, tools.py]\n"
        f"providers: {{model: {{kind: scripted, file: model.yaml}}}}\n{extra}")
    (project / "model.yaml").write_text(json.dumps(replies))
    (project / "agent.yaml").write_text(f"name: agent\nmodel: model:any\ntools: [{tools}]\n")
    return project


def _held(project: Path) -> str:
    held = _lw(project, "--json", "run", "agent.yaml", "-p", "go")
    assert held.returncode == 3, held.stderr
    return json.loads(held.stdout)["instanceId"]


def test_a_denied_call_says_denied_once(tmp_path: Path) -> None:
    """deny --reason: the progress line reads '-> denied: not now', not 'denied: denied: not now'."""
    project = _project(tmp_path, [DELETE, "ok"])
    done = _lw(project, "deny", _held(project), "--reason", "not now")
    assert done.returncode == 0, done.stderr
    assert "turn 1: delete -> denied: not now" in done.stderr
    assert "denied: denied" not in done.stderr


def test_tiny_costs_are_printed_in_fixed_notation(tmp_path: Path) -> None:
    """A cost of 1.5e-06 USD is printed as $0.0000015 in the status line and in show."""
    project = _project(tmp_path, [{"text": "hi", "usage": USAGE}],
                       extra="pricing: {'model:any': {input: 0.1, output: 0.1}}\n")
    done = _lw(project, "run", "agent.yaml", "-p", "go")
    assert done.returncode == 0, done.stderr
    assert "cost $0.0000015" in done.stderr
    assert "e-0" not in done.stderr
    iid = done.stderr.split(":", 1)[0].rsplit("\n", 1)[-1]
    shown = _lw(project, "show", iid)
    assert "$0.0000015" in shown.stdout, shown.stdout


def test_show_counts_the_turns_a_killed_process_saved(tmp_path: Path) -> None:
    """SIGKILL mid-tool after one turn: show reports that turn's tokens, not 0."""
    marker = tmp_path / "slow.started"
    project = _project(tmp_path, [{"toolCalls": [{"name": "slow", "arguments": {"marker": str(marker)}}],
                                   "usage": USAGE}], tools="slow")
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "run", "agent.yaml", "-p", "go"],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        deadline = time.monotonic() + 60  # a hang guard only
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the slow tool never started"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate()
    (running,) = json.loads(_lw(project, "--json", "ls", "--state", "running").stdout)
    shown = _lw(project, "--json", "show", running["instanceId"])
    assert shown.returncode == 0, shown.stderr
    usage = json.loads(shown.stdout)["usage"]
    assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == (10, 5, 15)
    text = _lw(project, "show", running["instanceId"]).stdout
    assert "15 (10 in, 5 out)" in text
    listed = json.loads(_lw(project, "--json", "ls").stdout)
    assert listed[0]["usage"]["totalTokens"] in (0, 15)  # ls reads headers only


@pytest.mark.parametrize("command", ["approve", "deny", "message"])
def test_continuing_commands_take_stream(tmp_path: Path, command: str) -> None:
    """approve, deny and message accept --stream, as run does, and go on to rest."""
    project = _project(tmp_path, [DELETE, "finished", "finished"])
    iid = _held(project)
    args = ["message", iid, "hello"] if command == "message" else [command, iid]
    if command == "message":
        _lw(project, "approve", iid)
    done = _lw(project, *args, "--stream")
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout


def test_resume_takes_stream(tmp_path: Path) -> None:
    """resume accepts --stream (on a resting instance it prints its result)."""
    project = _project(tmp_path, ["hi"])
    iid = json.loads(_lw(project, "--json", "run", "agent.yaml", "-p", "go").stdout)["instanceId"]
    done = _lw(project, "resume", iid, "--stream")
    assert done.returncode == 0, done.stderr


def _in_terminal(cwd: Path, *args: str) -> tuple[int, str]:
    return in_terminal(cwd, *args, env=_env())


def test_the_live_line_of_approve_starts_from_the_instances_totals(tmp_path: Path) -> None:
    """On a terminal, approve's live line counts on from the 15 tokens of turn 1, never from 0."""
    project = _project(tmp_path, [DELETE, {"text": "finished", "usage": USAGE}])
    code, screen = _in_terminal(project, "approve", _held(project))
    assert code == 0, screen
    assert "turn 1 · 0 tool calls · 15 tokens" in screen or "turn 2 · 1 tool call · 30 tokens" in screen, screen
    assert " 0 tokens" not in screen


def test_validate_refuses_an_entry_log_clearly(tmp_path: Path) -> None:
    """validate on an instance's entries.jsonl: exit 2 with one problem naming it, not one per line."""
    project = _project(tmp_path, ["hi"])
    iid = json.loads(_lw(project, "--json", "run", "agent.yaml", "-p", "go").stdout)["instanceId"]
    entries = next((project / "store").rglob("entries.jsonl"))
    assert iid in str(entries)
    done = _lw(project, "--json", "validate", str(entries))
    assert done.returncode == 2
    (result,) = json.loads(done.stdout)
    (problem,) = result["problems"]
    assert "entry log" in problem["message"]
    records = next((project / "store").rglob("records.jsonl"), None)
    if records is not None:
        assert _lw(project, "validate", str(records)).returncode == 0
