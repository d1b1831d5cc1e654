"""The Temporal engine against a real dev server: runs through the CLI, and the faults.

Every test drives separate processes as an operator would: ``loopwright temporal-worker``
workers, and ``loopwright run/approve/message`` commands on an assembly whose engine is
``temporal``. The test tools append a line to an effects file when a call *completes*, so a
completed call that ran twice shows up as a repeated line. Take-over waits are printed
(``-s`` shows them) and written to ``$LW_TEMPORAL_TIMINGS`` when set; nothing asserts a bound.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from temporalio.service import RPCError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from temporal_harness import Deployment, TemporalServer, free_port, temporal_cli

RESTING = {"waiting", "waiting_for_approval", "stopped", "error"}


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not JSON (exit {proc.returncode}): {proc.stdout!r} {proc.stderr!r}")


def _submit(dep: Deployment, agent: str, tag: str) -> str:
    """``run --detach --json``: submit an instance, return its id."""
    proc = dep.cli("run", "--detach", "--json", dep.agent(agent), "-i", f"tag={tag}", "-p", "go")
    assert proc.returncode == 0, proc.stderr
    return str(_json(proc)["instanceId"])


def _state(dep: Deployment, iid: str) -> str:
    return str(dep.header(iid).get("state"))


def _no_effect_twice(dep: Deployment) -> collections.Counter[str]:
    lines = dep.effect_lines()
    counts = collections.Counter(lines)
    assert all(n == 1 for n in counts.values()), f"a completed call ran twice: {counts}"
    return counts


def _timing(name: str, seconds: float) -> None:
    print(f"\n{name}: {seconds:.2f} s")  # noqa: T201 - the measured figure, shown under -s
    out = os.environ.get("LW_TEMPORAL_TIMINGS")
    if out:
        with Path(out).open("a") as f:
            f.write(json.dumps({"name": name, "seconds": round(seconds, 3)}) + "\n")


def _tool_statuses(dep: Deployment, iid: str) -> dict[str, str]:
    proc = dep.cli("records", iid)
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        data = rec.get("data") or {}
        if rec.get("kind") == "tool_call" and data.get("status"):
            out[str(data.get("toolCallId"))] = str(data["status"])
    return out


def _worker_of(dep: Deployment, marker: Path) -> subprocess.Popen[bytes]:
    """Return the worker whose pid the marker file holds."""
    pid = int(marker.read_text())
    found = [w for w in dep.workers if w.pid == pid]
    assert found, f"marker {marker.name} names pid {pid}, not one of the workers"
    return found[0]


def test_a_run_with_an_approval_and_a_message_from_other_processes(deployment: Deployment) -> None:
    """run, approve and message through the CLI each start or signal the instance's workflow; workers run it."""
    dep = deployment
    dep.start_worker()
    dep.start_worker()

    held = dep.cli("run", "--json", dep.agent("approve"), "-i", "tag=e2e-approve", "-p", "delete it")
    assert held.returncode == 3, held.stderr
    result = _json(held)
    iid = result["instanceId"]
    assert result["state"] == "waiting_for_approval"
    held_id = dep.runtime_id(iid, "call_del")
    assert [p["toolCallId"] for p in result["pendingApprovals"]] == [held_id]
    assert dep.effect_lines() == []

    approved = dep.cli("approve", "--json", iid)
    assert approved.returncode == 0, approved.stderr
    assert _json(approved)["text"] == "result: deleted old/notes.txt"
    assert _no_effect_twice(dep) == {f"{iid} {held_id} delete": 1}

    chat = dep.cli("run", "--json", dep.agent("chat"), "-i", "tag=e2e-chat", "-p", "hi")
    assert chat.returncode == 0, chat.stderr
    cid = _json(chat)["instanceId"]
    assert _json(chat)["text"] == "hello, what next?"
    answered = dep.cli("message", "--json", cid, "tell me more")
    assert answered.returncode == 0, answered.stderr
    assert _json(answered)["text"] == "you said: tell me more"

    # The workflows are Temporal's: visible with its own CLI, one per instance, by instance id.
    cli = temporal_cli()
    assert cli is not None
    for instance in (iid, cid):
        shown = subprocess.run([cli, "workflow", "describe", "-w", instance, "--address", dep.server.address,
                                "-o", "json"], capture_output=True, text=True, check=True)
        assert json.loads(shown.stdout)["workflowExecutionInfo"]["type"]["name"] == "loopwright.instance"
    assert {_state(dep, iid), _state(dep, cid)} <= RESTING


def test_sigkill_mid_model_call_another_worker_takes_over(deployment: Deployment) -> None:
    """A worker killed in a model call: its activity's heartbeat stops, another worker resumes the instance."""
    dep = deployment
    dep.start_worker()
    dep.start_worker()
    iid = _submit(dep, "model-kill", "mk")
    marker = dep.folder / "effects.model.mk.1"
    dep.wait_for("the slow model call to start", marker.exists)
    victim = _worker_of(dep, marker)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait()
    dep.wait_for("another worker to call the model again", lambda: int(marker.read_text()) != victim.pid)
    _timing("take-over after SIGKILL mid model call", time.monotonic() - killed_at)
    dep.wait_for("the instance to rest", lambda: _state(dep, iid) in RESTING)
    assert dep.header(iid)["stopReason"] == "waiting"
    counts = _no_effect_twice(dep)
    assert counts == {f"{iid} {dep.runtime_id(iid, 'call_a')} effect": 1,
                      f"{iid} {dep.runtime_id(iid, 'call_b')} effect": 1}


def test_sigkill_mid_tool_call_the_call_is_not_run_twice(deployment: Deployment) -> None:
    """A worker killed in a non-idempotent tool call: that call is unknown_outcome; completed calls don't re-run."""
    dep = deployment
    dep.start_worker()
    dep.start_worker()
    iid = _submit(dep, "tool-kill", "tk")
    dep.wait_for("the slow tool call to be asked for", lambda: dep.call_id(iid, "call_slow") is not None)
    slow = dep.runtime_id(iid, "call_slow")
    started = dep.folder / f"effects.started.{slow}"
    dep.wait_for("the slow tool call to start", started.exists)
    victim = _worker_of(dep, started)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait()
    after = dep.folder / "effects.model.tk.2"
    dep.wait_for("another worker to go on", after.exists)
    _timing("take-over after SIGKILL mid tool call", time.monotonic() - killed_at)
    dep.wait_for("the instance to rest", lambda: _state(dep, iid) in RESTING)
    assert int(after.read_text()) != victim.pid
    counts = _no_effect_twice(dep)
    assert counts == {f"{iid} {dep.runtime_id(iid, 'call_a')} effect": 1,
                      f"{iid} {dep.runtime_id(iid, 'call_c')} effect": 1}
    assert _tool_statuses(dep, iid).get(slow) == "unknown_outcome"


def test_sigterm_drains_the_worker(deployment: Deployment) -> None:
    """SIGTERM: the worker takes no more work, lets the segment in flight rest, and exits 0."""
    dep = deployment
    worker = dep.start_worker()
    iid = _submit(dep, "drain", "dr")
    marker = dep.folder / "effects.model.dr.0"
    dep.wait_for("the model call to start", marker.exists)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.log.read_text()  # type: ignore[attr-defined]
    header = dep.header(iid)
    assert header["state"] == "waiting", header
    assert _no_effect_twice(dep) == {f"{iid} {dep.runtime_id(iid, 'call_a')} effect": 1}


def test_the_temporal_server_stops_and_starts_again(tmp_path: Path, temporal_server: TemporalServer) -> None:
    """The server goes away mid-segment and comes back on the same file: the instance finishes, signals work again."""
    server = TemporalServer(temporal_server.cli, tmp_path)
    server.start()
    (tmp_path / "dep").mkdir()
    dep = Deployment(tmp_path / "dep", server)
    try:
        dep.start_worker()
        iid = _submit(dep, "drain", "sr")
        dep.wait_for("the model call to start", (dep.folder / "effects.model.sr.0").exists)
        server.stop()
        stopped_at = time.monotonic()
        time.sleep(4)  # the model call ends and the segment rests while the server is away
        server.start()
        down = time.monotonic() - stopped_at
        dep.wait_for("the instance to rest", lambda: _state(dep, iid) in RESTING)
        _timing(f"instance rested after a server outage of {down:.1f} s", time.monotonic() - stopped_at)
        answered = dep.cli("message", "--json", iid, "again")
        assert answered.returncode == 0, answered.stderr + dep.workers[0].log.read_text()  # type: ignore[attr-defined]
        assert _json(answered)["text"] == "done: again"
        assert _no_effect_twice(dep) == {f"{iid} {dep.runtime_id(iid, 'call_a')} effect": 1}
    finally:
        dep.stop_workers()
        server.stop()


def test_a_sub_agent_is_a_child_workflow_and_a_deep_approval_reaches_it(
        temporal_server: TemporalServer, tmp_path: Path) -> None:
    """A child instance gets a child workflow of its caller's; approving its call from the root wakes it."""
    agents = Path(__file__).resolve().parent / "agents"
    dep = Deployment(tmp_path, temporal_server, extra=(
        "capabilities: {agents: {spawn: true, maxDepth: 3}}\n"
        f"agentDefinitions: {{root: '{agents / 'tree-root.yaml'}', holder: '{agents / 'tree-holder.yaml'}'}}\n"))
    try:
        dep.start_worker()
        dep.start_worker()
        submitted = dep.cli("run", "--detach", "--json", "root", "-p", "go")
        assert submitted.returncode == 0, submitted.stderr
        root = str(_json(submitted)["instanceId"])

        def holder() -> dict[str, Any] | None:
            children = dep.header(root).get("children") or []
            return dep.header(children[0]) if children else None

        dep.wait_for("the child to hold its call", lambda: (holder() or {}).get("state") == "waiting_for_approval")
        child = holder()
        assert child is not None
        call = child["pendingApprovals"][0]["toolCallId"]
        engine = _engine(dep)

        def parent_of_child() -> str | None:
            try:
                return anyio.run(engine.describe, child["instanceId"])["parentId"]
            except RPCError:  # not started yet: the caller's activity signals it within a heartbeat
                return None

        dep.wait_for("the child's workflow", lambda: parent_of_child() is not None)
        assert parent_of_child() == root
        assert dep.effect_lines() == []

        approved = dep.cli("approve", "--json", root, "--call", call)
        assert approved.returncode == 0, approved.stderr
        assert _json(approved)["text"] == "root done: holder done"
        assert _no_effect_twice(dep) == {f"{child['instanceId']} {call} delete": 1}
        assert {_state(dep, root), _state(dep, child["instanceId"])} <= RESTING
    finally:
        dep.stop_workers()


def test_an_elapsed_monitor_fires_through_the_workflow_timer(temporal_server: TemporalServer, tmp_path: Path) -> None:
    """A watcher arms ``elapsed: 6s`` on its child and rests; its workflow's timer wakes it, and the monitor fires.

    The worker that ran the watcher is stopped once it rests, and a new one started: no runtime
    holds the watcher loaded, so nothing but the workflow's timer can wake it (the child rests
    holding a call for approval, and nobody posts to the watcher). The monitor's message is in
    the watcher's answer, no earlier than the time it was given, and came through the new worker.
    """
    agents = Path(__file__).resolve().parent / "agents"
    dep = Deployment(tmp_path, temporal_server, extra=(
        "capabilities: {agents: {spawn: true, maxDepth: 3}}\n"
        f"agentDefinitions: {{watch: '{agents / 'tree-watch.yaml'}', holder: '{agents / 'tree-holder.yaml'}'}}\n"))

    def answer() -> str:
        # The watcher's last answer, from its entry log (the workers write it; nothing here runs it).
        entries = (dep.folder / "store" / watcher / "entries.jsonl").read_text().splitlines()
        said = [e["m"].get("content") for e in map(json.loads, entries)
                if e.get("t") == "msg" and e["m"].get("role") == "assistant"]
        return str(said[-1] or "") if said else ""

    try:
        first = dep.start_worker(name="first")
        submitted = dep.cli("run", "--detach", "--json", "watch", "-p", "go")
        assert submitted.returncode == 0, submitted.stderr
        watcher = str(_json(submitted)["instanceId"])
        dep.wait_for("the watcher to rest with its monitor armed",
                     lambda: answer() == "watch armed" and _state(dep, watcher) == "waiting")
        armed = dep.header(watcher)["monitors"][0]
        child = armed["target"]
        dep.stop_workers()
        assert first.returncode == 0
        assert time.time() < armed["elapsedAt"], "the first worker took too long to stop for this test"
        dep.start_worker(name="second")
        dep.wait_for("the monitor's message to be answered", lambda: answer().startswith("watch done:"))
        assert time.time() >= armed["elapsedAt"]
        assert answer() == (f"watch done: [monitor] agent {child}: the time you gave it has passed "
                            "(it keeps running)")
        header = dep.header(watcher)
        assert not header.get("monitors")  # fired once, then disarmed
        assert f"pid {dep.workers[-1].pid}" in header["runner"]  # the new worker ran the answer
        assert dep.header(child)["state"] == "waiting_for_approval"  # the child was not what woke it
        assert dep.effect_lines() == []
    finally:
        dep.stop_workers()


def _engine(dep: Deployment) -> Any:
    from loopwright_temporal import make_engine  # noqa: PLC0415 - the SDK only for the tests that ask

    return make_engine({"address": dep.server.address, "taskQueue": dep.task_queue})


def test_an_unreachable_cluster_fails_the_command_and_keeps_the_work(deployment: Deployment) -> None:
    """run --detach with the cluster out of reach: exit 1 naming the instance; resume hands it over later."""
    dep = deployment
    good = dep.assembly.read_text()
    dep.assembly.write_text(good.replace(dep.server.address, f"127.0.0.1:{free_port()}"))
    failed = dep.cli("run", "--detach", dep.agent("chat"), "-i", "tag=unreachable", "-p", "hi")
    assert failed.returncode == 1, failed.stderr
    listed = dep.cli("ls", "--json")
    [summary] = json.loads(listed.stdout)
    iid = summary["instanceId"]
    assert f"instance {iid}: engine temporal: cannot reach the Temporal cluster" in failed.stderr
    assert f"loopwright resume {iid}" in failed.stderr
    assert summary["state"] == "running"

    dep.assembly.write_text(good)
    dep.start_worker()
    resumed = dep.cli("resume", "--json", iid)
    assert resumed.returncode == 0, resumed.stderr
    assert _json(resumed)["text"] == "hello, what next?"


def test_cancel_from_another_process_stops_a_running_instance(deployment: Deployment) -> None:
    """cancel: the worker running the instance stops its tool call; the instance rests cancelled, its workflow ends."""
    dep = deployment
    dep.start_worker()
    iid = _submit(dep, "tool-kill", "cx")
    dep.wait_for("the slow tool call to be asked for", lambda: dep.call_id(iid, "call_slow") is not None)
    started = dep.folder / f"effects.started.{dep.runtime_id(iid, 'call_slow')}"
    dep.wait_for("the slow tool call to start", started.exists)
    cancelled = dep.cli("cancel", "--json", iid)
    assert cancelled.returncode == 0, cancelled.stderr
    header = dep.header(iid)
    assert (header["state"], header["stopReason"], header["cancelled"]) == ("stopped", "cancelled", True)
    engine = _engine(dep)
    dep.wait_for("the workflow to complete", lambda: anyio.run(engine.describe, iid)["status"] == "COMPLETED")
    assert _no_effect_twice(dep) == {f"{iid} {dep.runtime_id(iid, 'call_a')} effect": 1}
