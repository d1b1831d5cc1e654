"""Cancelling `loopwright run` while a sync tool blocks in its thread: the CLI returns at once.

Ctrl-C (SIGINT, once or twice) and `loopwright cancel ID` from another process stop the instance
(saved ``stopped`` with ``cancelled: true``), and the `run` process exits 130 with no traceback,
abandoning the tool's thread, long before the tool (120 s) would have finished. The waits below
are hang guards, not timing bounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).with_name("cli_fixtures")
#: Seconds the `run` process may take to exit after the cancel (the tool would take 120).
HANG_GUARD = 30

_BLOCK_PLUGIN = '''\
"""A sync tool that blocks its thread for two minutes."""

import time
from pathlib import Path

import loopwright


@loopwright.tool
def block(marker: str) -> str:
    """Write a marker file, then block for two minutes.

    Args:
        marker: The file written when the tool starts.
    """
    Path(marker).write_text("started")
    time.sleep(120)
    return "unblocked"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(block)
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(FIXTURES, root)
    (root / "block_plugin.py").write_text(_BLOCK_PLUGIN)
    (root / "loopwright.yaml").write_text("store: {kind: file, path: ./store}\n"
                                          "plugins: [replay_plugin.py, block_plugin.py]\n")
    (root / "scripts" / "block.json").write_text(json.dumps(
        [{"calls": [{"name": "block", "arguments": {"marker": "block.started"}}]}, {"text": "after block"}]))
    (root / "agents" / "block.yaml").write_text("name: block\nmodel: replay:block\ntools: [block]\n"
                                                "limits: {toolTimeout: 10m}\n")
    return root


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def _lw(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=_env(), timeout=60, check=False)


def _start_blocked(project: Path) -> subprocess.Popen[str]:
    """Start `run agents/block.yaml` and return once its tool is blocking."""
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "run", "agents/block.yaml"], cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    marker = project / "block.started"
    deadline = time.monotonic() + 30
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"run ended before the tool started: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the tool never started: {proc.communicate()}")
        time.sleep(0.05)
    return proc


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Wait for the process to exit (hang guard :data:`HANG_GUARD`); return its code, stdout and stderr."""
    try:
        out, err = proc.communicate(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"run still alive {HANG_GUARD} s after the cancel (waiting for the tool): {err!r}")
    return proc.returncode, out, err


def _running_block(project: Path) -> str:
    listed = _lw(project, "ls", "--state", "running", "--json")
    ids = [s["instanceId"] for s in json.loads(listed.stdout) if s["name"] == "block"]
    assert len(ids) == 1, listed
    return ids[0]


def _assert_cancelled(project: Path, instance_id: str) -> None:
    shown = _lw(project, "show", "--json", instance_id)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert (data["state"], data["stopReason"], data["cancelled"]) == ("stopped", "cancelled", True), data


@pytest.mark.parametrize("second", [None, 0.0, 0.02, 0.1], ids=["once", "twice", "twice-20ms", "twice-100ms"])
def test_ctrl_c_returns_at_once_while_a_sync_tool_blocks(project: Path, second: float | None) -> None:
    """SIGINT once, or twice (the second while the cancel is saved, or while the process ends).

    Each time: exit 130 (not death by the signal), no traceback, the instance stopped and cancelled.
    """
    proc = _start_blocked(project)
    instance_id = _running_block(project)
    proc.send_signal(signal.SIGINT)
    if second is not None:
        time.sleep(second)
        with contextlib.suppress(ProcessLookupError):  # it may have exited already
            proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc)
    assert code == 130, err
    assert "Traceback" not in err, err
    assert out == ""
    _assert_cancelled(project, instance_id)


def test_cancel_from_another_process_returns_at_once_while_a_sync_tool_blocks(project: Path) -> None:
    """`loopwright cancel ID` from a second process: it exits 0, and the `run` process exits 130 without a traceback."""
    proc = _start_blocked(project)
    instance_id = _running_block(project)
    cancel = _lw(project, "cancel", instance_id)
    assert cancel.returncode == 0, cancel.stderr
    code, out, err = _finish(proc)
    assert code == 130, err
    assert "Traceback" not in err, err
    assert out == ""
    assert f"cancelled; resume with: loopwright message {instance_id}" in err
    _assert_cancelled(project, instance_id)
