"""``loopwright worker`` on the file store, run as a subprocess: resumes, mail, approvals, --once, signals.

Each test works in a fresh folder with an assembly (a file store in ``./store``) and the
``script:NAME`` models and tools of ``worker_plugin.py``. Instances are made by ``loopwright
run`` in other processes, and work is left for the worker the way other processes leave it:
a runner SIGKILLed mid-run, a message or a decision written to the store directly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import FileStore

PLUGIN = Path(__file__).with_name("worker_plugin.py")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with a file-store assembly, the worker plugin and one definition per script."""
    shutil.copy(PLUGIN, tmp_path / "worker_plugin.py")
    (tmp_path / "loopwright.yaml").write_text("store: {kind: file, path: ./store}\nplugins: [worker_plugin.py]\n")
    for name, tools in (("chat", "[]"), ("slow", "[nap]"), ("approve", "[delete]"), ("nap", "[nap]"),
                        ("long", "[nap]")):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nmodel: script:{name}\ntools: {tools}\n")
    return tmp_path


def lw(project: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def start(project: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "loopwright.cli", *args], cwd=project, env={**_env(), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_json(project: Path, *args: str) -> dict[str, Any]:
    done = lw(project, "run", "--json", *args)
    assert done.returncode in (0, 3), done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def store_call(project: Path, fn: Any) -> Any:
    """Run ``await fn(store)`` on the project's file store, from this (another) process."""
    async def main() -> Any:
        async with FileStore(StoreSettings(kind="file", base_dir=project, options={"path": "./store"})) as store:
            return await fn(store)
    return anyio.run(main)


def post_message(project: Path, iid: str, text: str) -> None:
    store_call(project, lambda store: store.post(
        iid, {"type": "message", "text": text, "source": "api", "at": "2026-01-01T00:00:00Z"}))


def header(project: Path, iid: str) -> dict[str, Any]:
    return store_call(project, lambda store: store.read_header(iid))  # type: ignore[no-any-return]


def kill_mid_run(project: Path) -> str:
    """Start the slow agent, SIGKILL its process in the middle of the tool call, return the instance id."""
    marker = project / "slow.started"
    proc = start(project, "run", "slow.yaml")
    try:
        wait_for(marker, proc)
    finally:
        proc.kill()
        proc.communicate()
    marker.unlink()
    (running,) = [i for i in json.loads(lw(project, "ls", "--state", "running", "--json").stdout) if not i["queued"]]
    return str(running["instanceId"])


def test_once_with_nothing_to_do_exits_0_quietly(project: Path) -> None:
    """--once on a store with only resting instances (and on an empty one) exits 0 and prints nothing."""
    empty = lw(project, "worker", "--once", "--json")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "")
    run_json(project, "chat.yaml", "-p", "hi")
    done = lw(project, "worker", "--once")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "worker: serving FileStore" in done.stderr


def test_a_runner_killed_mid_run_is_resumed_by_the_worker(project: Path) -> None:
    """An instance left running by a SIGKILLed process is resumed: its interrupted call is repaired, it rests."""
    iid = kill_mid_run(project)
    done = lw(project, "worker", "--once", "--json")
    assert done.returncode == 0, done.stderr
    picked, finished = events(done.stdout)
    assert (picked["event"], picked["instanceId"], picked["reason"]) == ("pickedUp", iid, "resume")
    assert (finished["event"], finished["instanceId"], finished["state"]) == ("finished", iid, "waiting")
    assert finished["text"].startswith("after slow: the call was interrupted")
    assert header(project, iid)["state"] == "waiting"
    # Nothing is left: a second pass finds no work.
    again = lw(project, "worker", "--once", "--json")
    assert (again.returncode, again.stdout) == (0, "")


def test_a_message_posted_to_a_resting_instance_is_answered(project: Path) -> None:
    """A message written to the mailbox of a waiting instance by another process is read and answered."""
    iid = run_json(project, "chat.yaml", "-p", "first")["instanceId"]
    post_message(project, iid, "from elsewhere")
    done = lw(project, "worker", "--once")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"picked up {iid}: message"
    assert lines[1].startswith(f"finished {iid}: waiting, 2 turns, 30 tokens")
    shown = json.loads(lw(project, "show", iid, "--json").stdout)
    assert shown["state"] == "waiting"
    texts = json.loads(lw(project, "message", iid, "third", "--json").stdout)
    assert texts["text"] == "answer to: third"
    turns = [json.loads(r) for r in lw(project, "records", iid, "--kind", "message").stdout.splitlines()]
    assert len(turns) == 2  # "from elsewhere" and "third", each delivered once


def test_an_approval_decided_elsewhere_continues_in_the_worker(project: Path) -> None:
    """A decision written to the header of a waiting_for_approval instance makes the worker continue it.

    A decision is bound to its call by ``decisionDigest`` (issue 11): one written without it is held again.
    """
    iid = run_json(project, "approve.yaml")["instanceId"]
    undecided = lw(project, "worker", "--once", "--json")
    assert (undecided.returncode, undecided.stdout) == (0, "")  # a call still waits: no work

    async def decide(store: FileStore) -> None:
        h = await store.read_header(iid)
        from loopwright import call_digest  # noqa: PLC0415

        h["pendingApprovals"] = [{**p, "decision": "approved", "decisionDigest": call_digest(p["tool"], p["arguments"])}
                                 for p in h["pendingApprovals"]]
        await store.write_header(iid, h)

    store_call(project, decide)
    done = lw(project, "worker", "--once", "--json")
    assert done.returncode == 0, done.stderr
    picked, finished = events(done.stdout)
    assert (picked["instanceId"], picked["reason"]) == (iid, "approval")
    assert (finished["state"], finished["text"]) == ("waiting", "result: deleted x")
    calls = [json.loads(r)["data"] for r in lw(project, "records", iid, "--kind", "tool_call").stdout.splitlines()]
    assert [(c["tool"], c["status"]) for c in calls] == [("delete", "success")]


def test_sigterm_lets_a_running_segment_rest_then_exits_0(project: Path) -> None:
    """SIGTERM while the worker runs a tool call: the segment finishes and rests, the worker exits 0."""
    iid = run_json(project, "nap.yaml")["instanceId"]
    worker = start(project, "worker", "--poll", "50ms", "--json")
    try:
        post_message(project, iid, "go")
        wait_for(project / "nap.started", worker)
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    kinds = [(e["event"], e["instanceId"]) for e in events(out)]
    assert kinds == [("pickedUp", iid), ("finished", iid)]
    assert events(out)[1]["text"] == "after nap: napped"
    h = header(project, iid)
    assert (h["state"], h.get("cancelled")) == ("waiting", False)


def test_ctrl_c_after_the_grace_leaves_the_instance_for_another_worker(project: Path) -> None:
    """SIGINT with --grace 0 mid-tool: exit 130 at once, the instance stays running, lease free; a worker resumes it."""
    iid = run_json(project, "long.yaml")["instanceId"]
    worker = start(project, "worker", "--poll", "50ms", "--grace", "0")
    try:
        post_message(project, iid, "go")
        wait_for(project / "long.started", worker)
        worker.send_signal(signal.SIGINT)
        out, err = worker.communicate(timeout=120)  # a hang guard only
    finally:
        worker.kill()
    assert worker.returncode == 130, err
    # It did not wait for the minute-long call: the call is still unanswered (the resume below
    # finds it interrupted, where a worker that waited would have saved its result).
    assert "Traceback" not in err
    assert out.splitlines() == [f"picked up {iid}: message", f"left running {iid}: another worker resumes it"]
    assert header(project, iid)["state"] == "running"
    done = lw(project, "worker", "--once", "--json")
    assert done.returncode == 0, done.stderr
    picked, finished = events(done.stdout)
    assert (picked["instanceId"], picked["reason"]) == (iid, "resume")
    assert finished["text"].startswith("after long: the call was interrupted")


def test_mail_read_by_a_stopped_worker_is_given_by_the_one_that_resumes(project: Path) -> None:
    """SIGTERM after a segment read a message into the header's queue, before its first turn: the resume gives it.

    The transcript the resume finds ends with the answer of the segment before (which rested);
    the queued message is what this segment began for, and the model must see it.
    """
    iid = run_json(project, "nap.yaml")["instanceId"]
    worker = start(project, "worker", "--poll", "50ms", "--grace", "0", LW_PAUSE_RUNNING="600")
    try:
        post_message(project, iid, "go")
        wait_for(project / f"paused.{iid}", worker)
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=120)  # a hang guard only
    finally:
        worker.kill()
    assert worker.returncode == 0, err
    h = header(project, iid)
    assert (h["state"], [m["text"] for m in h["inbox"]]) == ("running", ["go"])  # read, not given yet
    done = lw(project, "worker", "--once", "--json")
    assert done.returncode == 0, done.stderr
    picked, finished = events(done.stdout)
    assert (picked["instanceId"], picked["reason"]) == (iid, "resume")
    assert finished["text"] == "after nap: napped"
    assert header(project, iid)["inbox"] == []


def test_the_runtime_gives_each_post_an_id_of_its_own(project: Path) -> None:
    """Messages and cancel requests the runtime posts carry ids (what makes a retried post land once)."""
    iid = run_json(project, "chat.yaml", "-p", "hi")["instanceId"]
    for text in ("one", "two"):
        done = lw(project, "message", "--detach", iid, text)
        assert done.returncode == 0, done.stderr
    posts, _cursor = store_call(project, lambda store: store.read_posts(iid, 0))
    assert [p["text"] for p in posts] == ["one", "two"]
    ids = [p["id"] for p in posts]
    assert len(set(ids)) == 2
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids


# -- scheduling (issue 15 item 5) -------------------------------------------------------------


def test_a_dead_runners_instance_goes_ahead_of_the_queue(project: Path) -> None:
    """Queued instances wait behind one whose runner was SIGKILLed, even one killed after they were queued."""
    queued = [lw(project, "run", "--detach", "chat.yaml", "-p", f"q{n}").stdout.strip() for n in range(4)]
    assert all(queued), queued
    dead = kill_mid_run(project)
    done = lw(project, "worker", "--once", "--max-concurrent", "1", "--json")
    assert done.returncode == 0, done.stderr
    picked = [(e["instanceId"], e["reason"]) for e in events(done.stdout) if e["event"] == "pickedUp"]
    assert picked == [(dead, "resume"), *((iid, "start") for iid in queued)]


def test_work_submitted_while_the_worker_reads_the_store_is_not_left_for_the_next_poll(project: Path) -> None:
    """The lost wakeup: the worker made its wake event after reading the store, so a wake in between was lost.

    The worker polls once an hour; an instance is submitted in its process while it reads the
    store (so that read does not list it). The submit's wakeup must start it now.
    """
    from loopwright._config import load_assembly  # noqa: PLC0415 - the assembly, as the CLI reads it
    from loopwright._runtime import Runtime  # noqa: PLC0415
    from loopwright.cli._main import CliSettings  # noqa: PLC0415
    from loopwright.cli._worker import Worker  # noqa: PLC0415

    submitted: list[str] = []

    class RacedStore(FileStore):
        async def find_work(self, *, limit: int) -> list[str]:
            ids = await super().find_work(limit=limit)
            if not submitted:  # the work arrives after the store was read, before the worker waits
                submitted.append(await rt.submit(str(project / "chat.yaml"), prompt="hi"))
            return ids

    store = RacedStore(StoreSettings(kind="file", base_dir=project, options={"path": "./store"}))
    rt = Runtime(load_assembly(project / "loopwright.yaml"), store=store, autoload=False)

    async def main() -> str:
        async with store, rt:
            worker = Worker(rt, CliSettings(), poll=3600, max_concurrent=2, once=False, grace=0)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.serve)
                with anyio.fail_after(60):  # a hang guard: the wakeup must not wait for the hour-long poll
                    while not submitted or (await store.read_header(submitted[0]))["state"] != "waiting":
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
            return str((await store.read_header(submitted[0]))["state"])

    assert anyio.run(main) == "waiting"
