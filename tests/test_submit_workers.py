"""Submitting work to ``loopwright worker`` processes, through the CLI, on every store (issue 15 item 4).

Two workers poll a store while 20 instances are submitted with ``run --detach`` and 5 more are
started with a plain ``run`` (which used to race the workers: a worker took the fresh instance
before its creator held the lease, and the creator failed with "running elsewhere"). Every
submitted instance must be started exactly once, by one worker, and every plain run must run in
its own process. The postgres store runs when ``LOOPWRIGHT_TEST_POSTGRES_DSN`` names a server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "core" / "tests" / "worker_plugin.py"
SUBMITTED = 20
PLAIN = 5


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return {**env, **extra}


def _project(tmp_path: Path, store: str) -> Path:
    shutil.copy(PLUGIN, tmp_path / "worker_plugin.py")
    plugins = "loopwright_postgres, worker_plugin.py" if "postgres" in store else "worker_plugin.py"
    (tmp_path / "loopwright.yaml").write_text(f"store: {store}\nplugins: [{plugins}]\n")
    (tmp_path / "brief.yaml").write_text("name: brief\nmodel: script:brief\ntools: [nap]\n")
    (tmp_path / "chat.yaml").write_text("name: chat\nmodel: script:chat\n")
    return tmp_path


def _lw(project: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "loopwright.cli", *args], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _instances(project: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", "ls", "--json"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    data: list[dict[str, Any]] = json.loads(done.stdout)
    return data


@pytest.mark.parametrize("store", ["file", "sqlite", "postgres"])
def test_twenty_submitted_instances_each_run_once_beside_plain_runs(tmp_path: Path, store: str,
                                                                    request: pytest.FixtureRequest) -> None:
    extra: dict[str, str] = {}
    if store == "postgres":
        extra["LOOPWRIGHT_DSN"] = request.getfixturevalue("fresh_database")
        config = "{kind: postgres, dsnEnv: LOOPWRIGHT_DSN}"
    else:
        config = {"file": "{kind: file, path: ./store}", "sqlite": "{kind: sqlite, path: ./lw.db}"}[store]
    project = _project(tmp_path, config)
    env = _env(extra)
    workers = [_lw(project, env, "worker", "--poll", "20ms", "--json") for _ in range(2)]
    try:
        # The two workers serve before anything is written: every start below races their polls.
        submits = [_lw(project, env, "run", "--detach", "--json", "brief.yaml", "-p", f"task {n}")
                   for n in range(SUBMITTED)]
        plains = [_lw(project, env, "run", "--json", "chat.yaml", "-p", f"plain {n}") for n in range(PLAIN)]
        submitted = []
        for proc in submits:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            submitted.append(json.loads(out)["instanceId"])
        plain = []
        for proc in plains:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err  # never "running elsewhere"
            assert "elsewhere" not in err
            plain.append(json.loads(out)["instanceId"])
        # Each submitted instance rests once a worker has started it (a hang guard, not a timing check).
        deadline = time.monotonic() + 600
        while True:
            states = {i["instanceId"]: i["state"] for i in _instances(project, env)}
            if all(states.get(iid) == "waiting" for iid in submitted):
                break
            assert all(w.poll() is None for w in workers), [w.communicate() for w in workers]
            assert time.monotonic() < deadline, states
            time.sleep(0.2)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        logs = [w.communicate(timeout=120) for w in workers]
    for w, (_out, err) in zip(workers, logs, strict=True):
        assert w.returncode == 0, err
        assert "elsewhere" not in err
        assert "Traceback" not in err
    events = [json.loads(line) for out, _err in logs for line in out.splitlines() if line.strip()]
    picked = Counter((e["instanceId"], e["reason"]) for e in events if e["event"] == "pickedUp")
    assert picked == Counter({(iid, "start"): 1 for iid in submitted})  # once each; no plain run taken
    shown = {i["instanceId"]: i for i in _instances(project, env)}
    assert len(shown) == SUBMITTED + PLAIN
    assert all(shown[iid]["state"] == "waiting" and not shown[iid]["queued"] for iid in (*submitted, *plain))
    # Each ran once: "brief" answers its task with one model call ("ready").
    assert {shown[iid]["usage"]["requests"] for iid in submitted} == {1}
