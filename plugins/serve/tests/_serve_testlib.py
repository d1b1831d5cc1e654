"""Start ``loopwright serve`` in a subprocess, as a user would, and talk to it over real HTTP.

:func:`serving` runs ``python -m loopwright.cli serve -c ASSEMBLY --port 0``, reads the URL it
prints, waits for ``/healthz`` and yields a :class:`Server`; on the way out it sends SIGTERM and
waits for the process to end. Timeouts are hang guards only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import httpx

#: Seconds before a server that has not started counts as hung (a guard only).
START_GUARD = 60.0
#: Seconds a server may take to stop after SIGTERM before it is killed (a guard only).
STOP_GUARD = 30.0


@attrs.define
class Server:
    """A running ``loopwright serve``.

    Attributes:
        url: Its base URL (``http://127.0.0.1:PORT``).
        process: The subprocess.
        stderr: What it wrote to stderr so far (read by a thread).
    """

    url: str
    process: subprocess.Popen[str]
    stderr_lines: list[str] = attrs.field(factory=list)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def client(self, token: str | None = None, **kwargs: object) -> httpx.Client:
        """An httpx client for this server, with ``Authorization: Bearer TOKEN`` if given."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, **kwargs)  # type: ignore[arg-type]


def serve_command(assembly: Path, *extra: str) -> list[str]:
    """The argv of ``loopwright serve -c ASSEMBLY --port 0 EXTRA...`` in this interpreter."""
    return [sys.executable, "-m", "loopwright.cli", "serve", "-c", str(assembly), "--port", "0", *extra]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``LOOPWRIGHT_*`` variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env.update(extra or {})
    return env


@contextlib.contextmanager
def serving(assembly: Path, *extra: str, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, args: Sequence[str] | None = None) -> Iterator[Server]:
    """Run ``loopwright serve`` for ``assembly`` until the block ends; yield it once ``/healthz`` answers."""
    argv = list(args) if args is not None else serve_command(assembly, *extra)
    proc = subprocess.Popen(argv, cwd=cwd or assembly.parent, env=clean_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        first = proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", first)
        assert match, f"no URL on the first line: {first!r}; stderr: {''.join(lines)}"
        server = Server(match.group(1), proc, lines)
        deadline = time.monotonic() + START_GUARD
        while True:
            try:
                if httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, f"the server exited ({proc.returncode}): {''.join(lines)}"
            assert time.monotonic() < deadline, "the server did not answer /healthz"
            time.sleep(0.05)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GUARD)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
        proc.stdout.close()
        proc.stderr.close()


#: The CLI tests' fixtures: the replay provider (scripts/NAME.json), the tools, the agents.
FIXTURES = Path(__file__).resolve().parents[3] / "core" / "tests" / "cli_fixtures"
#: The definitions the project assembly registers.
AGENTS = ("approve", "chat", "done", "fail", "inputs", "loop", "slow")


def project(root: Path, server: str = "") -> Path:
    """Write ``root/loopwright.yaml``: a file store in ``root/store``, the fixtures' plugin and agents.

    :param server: YAML lines for the ``server:`` key (indented by the caller), if any.
    :return: The assembly file.
    """
    root.mkdir(parents=True, exist_ok=True)
    lines = ["store: {kind: file, path: ./store}", f"plugins: [{FIXTURES / 'replay_plugin.py'}]", "agentDefinitions:"]
    lines += [f"  {name}: {FIXTURES / 'agents' / f'{name}.yaml'}" for name in AGENTS]
    if server:
        lines += ["server:", server.rstrip("\n")]
    assembly = root / "loopwright.yaml"
    assembly.write_text("\n".join(lines) + "\n")
    return assembly


def cli(assembly: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``loopwright -c ASSEMBLY ARGS`` as a subprocess in the assembly's folder."""
    return subprocess.run([sys.executable, "-m", "loopwright.cli", "-c", str(assembly), *args],
                          cwd=assembly.parent, env=clean_env(env), capture_output=True, text=True,
                          timeout=120, check=False)


@attrs.frozen
class Event:
    """One Server-Sent Event: its ``id``, ``event`` type and JSON ``data``."""

    id: str
    event: str
    data: object


def read_events(client: httpx.Client, instance_id: str, until: Callable[[Event], bool], *,
                last_event_id: str | None = None, guard: float = 60.0) -> list[Event]:
    """Follow ``/v1/instances/ID/events`` until an event satisfies ``until``; return every event read.

    :param last_event_id: Sent as ``Last-Event-ID``, to resume.
    :param guard: Seconds before the stream counts as hung (a guard only).
    """
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events: list[Event] = []
    with client.stream("GET", f"/v1/instances/{instance_id}/events", headers=headers,
                       timeout=httpx.Timeout(guard)) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "data" in fields:
                event = Event(fields.get("id", ""), fields.get("event", "message"), json.loads(fields["data"]))
                events.append(event)
                if until(event):
                    return events
            fields = {}
    raise AssertionError(f"the stream ended before the event waited for; read: {events}")


def rests_in(*states: str) -> Callable[[Event], bool]:
    """An ``until`` for :func:`read_events`: a ``state`` record whose new state is one of ``states``."""
    def check(event: Event) -> bool:
        data = event.data if isinstance(event.data, dict) else {}
        return event.event == "record" and data.get("kind") == "state" and data.get("data", {}).get("to") in states
    return check


#: A plugin file with one tool, ``delete``, that always needs approval (the protocol surfaces' tests).
DELETE_TOOL_PLUGIN = '''\
import loopwright


@loopwright.tool(requires_approval=True)
def delete(path: str) -> str:
    """Pretend to delete a file.

    Args:
        path: The file.
    """
    return f"deleted {path}"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(delete)
'''
