"""A message is given to the model once, whatever the kill between its entry and the header that empties the queue.

The runner that delivers queued mail saves each message's entry, then the header without the
queue. Killed in between, it leaves the message both in the log and in the saved queue; the
runner that resumes must not give it again. Each message entry carries its post's id, and the
resume drops the queued posts the current segment already gave (``Recovery.repair_records``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kill_matrix
import pytest
from kill_matrix import Scenario, Stage

pytestmark = pytest.mark.slow


def _lw(folder: Path, *args: str, point: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=folder, text=True, capture_output=True,
                          env=kill_matrix.environment(point), timeout=120, check=False)


def _users(folder: Path, iid: str) -> list[str]:
    entries, _raw = kill_matrix.read_instance_log(folder, iid, "entries.jsonl")
    messages, _started = kill_matrix.replay(entries)
    return [m.get("content") for m in messages if m.get("role") == "user"]


def test_a_kill_after_a_messages_entry_before_the_header_gives_it_once(tmp_path: Path) -> None:
    folder = tmp_path / "mail"
    kill_matrix.prepare(folder, Scenario(0, "mixed", (Stage("plain"),)))
    ran = _lw(folder, "run", "agent.yaml", "-p", kill_matrix.PROMPT, "--json")
    assert ran.returncode in (0, 3), ran.stderr
    iid = json.loads(ran.stdout)["instanceId"]
    # The message's process starts a segment for it and, at the first turn boundary, saves the
    # message's entry (the first user message it appends), then dies before the header is saved.
    killed = _lw(folder, "message", iid, "hello once", point="entry:prompt:1:after")
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    header = kill_matrix.read_header(folder, iid)
    assert header is not None
    assert [m.get("text") for m in header.get("inbox") or []] == ["hello once"]  # still queued on disk
    assert _users(folder, iid).count("hello once") == 1  # and already in the log
    resumed = _lw(folder, "resume", iid, "--json")
    assert resumed.returncode in (0, 3), resumed.stderr
    assert _users(folder, iid).count("hello once") == 1
    header = kill_matrix.read_header(folder, iid)
    assert header is not None
    assert not header.get("inbox")
