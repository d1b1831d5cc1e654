"""Start ``loopwright serve`` in a subprocess, as a user would, and talk to it over real HTTP.

:func:`serving` runs ``python -m loopwright.cli serve -c ASSEMBLY --port 0``, reads the URL it
prints, waits for ``/healthz`` and yields a :class:`Server`; on the way out it sends SIGTERM and
waits for the process to end. Timeouts are hang guards only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
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
