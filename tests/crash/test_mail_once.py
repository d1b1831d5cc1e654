"""A message is given to the model once, whatever the kill between its entry and the header that empties the queue.

The runner that delivers queued mail saves each message's entry, then the header without the
queue. Killed in between, it leaves the message both in the log and in the saved queue; the
runner that resumes must not give it again. Each message entry carries its post's id, and the
resume drops the queued posts the current segment already gave (``Recovery.repair_records``).

And it is given at all: a runner that takes over a dead one reads the mailbox into the queue as
its segment starts; when the interrupted turn then ends the segment (``task_complete``), the
queued message starts the next segment (``Mailbox.has_mail``), as mail that came after the last
turn boundary does (the kill matrix found it lost: s0137 of seed 858318773).
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


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_a_message_that_takes_over_a_turn_ending_the_instance_is_read(tmp_path: Path, store: str) -> None:
    folder = tmp_path / "mail"
    kill_matrix.prepare(folder, Scenario(0, "complete", (Stage("plain"),), store))
    # The run dies once the last answer (charge, then task_complete) is saved, before its calls start.
    ran = _lw(folder, "run", "agent.yaml", "-p", kill_matrix.PROMPT, "--json", point="entry:answer:3:after")
    assert ran.returncode == -9, (ran.returncode, ran.stderr)
    (iid,) = kill_matrix.instance_ids(folder)
    assert kill_matrix.read_header(folder, iid)["state"] == "running"  # its runner is dead
    # The message's process takes the instance over: its segment reads the post into the queue,
    # runs the two calls, and task_complete completes the instance before any turn boundary.
    posted = _lw(folder, "message", iid, "hello after the end", "--json")
    assert posted.returncode == 0, posted.stderr
    users = _users(folder, iid)
    assert users.count("hello after the end") == 1, users
    header = kill_matrix.read_header(folder, iid)
    assert header is not None
    assert not header.get("inbox"), header.get("inbox")
    assert header["state"] == "waiting"  # the message's segment: answered past the script's end
