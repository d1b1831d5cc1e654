"""Attack 7 of issue 8: time limits hold during a call, and an abandoned tool thread keeps nothing alive.

The malicious party is the model's side of the wire (a server that streams nothing forever, never
answers, or asks to be retried much later) and a tool that ignores its timeout. Each test drives
the CLI (``python -m loopwright.cli``) or a host script as a subprocess and fails if the attack
succeeds: the limit is passed, or the process outlives the work. The timeouts here are hang
guards only; no test bounds how fast anything is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

#: Seconds a subprocess may take before the test calls it hung (it kills it and fails).
HANG_GUARD = 30

#: A Chat Completions stream chunk with nothing in it.
_EMPTY_CHUNK = json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                           "choices": [{"index": 0, "delta": {}, "finish_reason": None}]})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    mode = "stream"
    stop = threading.Event()
    requests = 0


class _Handler(BaseHTTPRequestHandler):
    """Answers every POST the way its server's ``mode`` says, never with an answer."""

    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.requests += 1
        mode = self.server.mode
        if mode == "retry":  # a transient failure that asks for a long wait before the next try
            body = b'{"error": {"message": "overloaded"}}'
            self.send_response(503)
            self.send_header("content-type", "application/json")
            self.send_header("retry-after", "50")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if mode == "silent":  # accepts the request and never answers
            self.server.stop.wait(HANG_GUARD * 2)
            return
        # "stream": an empty delta every 0.2 s, forever
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        try:
            while not self.server.stop.wait(0.2):
                self.wfile.write(f"data: {_EMPTY_CHUNK}\n\n".encode())
                self.wfile.flush()
        except OSError:
            return  # the client hung up


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.stop = threading.Event()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.stop.set()
        srv.shutdown()
        srv.server_close()


def _env() -> dict[str, str]:
    """The environment of a subprocess: entry-point plugins on (openai, scripted), no LOOPWRIGHT_ settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in ``cwd``; a process still alive after :data:`HANG_GUARD` seconds fails the test."""
    try:
        return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, env=_env(),
                              timeout=HANG_GUARD, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args[-3:])} still running after {HANG_GUARD} s: the attack succeeded "
                    f"(stderr so far: {exc.stderr!r})")


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(cwd, sys.executable, "-m", "loopwright.cli", *args)


def _show(cwd: Path, instance_id: str) -> dict[str, Any]:
    done = _cli(cwd, "show", "--json", instance_id)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _project(tmp_path: Path, providers: str, definition: str, plugin: str | None = None) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    plugins = "plugins: [sleepy.py]\n" if plugin else ""
    (root / "loopwright.yaml").write_text(f"store: {{kind: file, path: ./store}}\n{plugins}providers:\n"
                                          + textwrap.indent(textwrap.dedent(providers), "  "))
    (root / "agent.yaml").write_text(textwrap.dedent(definition))
    if plugin:
        (root / "sleepy.py").write_text(textwrap.dedent(plugin))
    return root


# ---------------------------------------------------------------------------------------------
# limits.elapsed bounds a model call in progress
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "stream"), [("stream", "true"), ("silent", "false"), ("retry", "false")])
def test_elapsed_bounds_a_model_call_in_progress(tmp_path: Path, server: _Server, mode: str, stream: str) -> None:
    """A stream of empty deltas, a server that never answers, a retry asked for 50 s later: ``elapsed: 2s`` holds.

    The segment ends ``limit_exceeded`` (``elapsed``), the instance is saved resting, and the CLI exits 1.
    """
    server.mode = mode
    port = server.server_address[1]
    root = _project(tmp_path, f"""\
        srv: {{kind: openai, baseUrl: "http://127.0.0.1:{port}/v1", stream: {stream}}}
        """, """\
        name: drip
        model: srv:drip-1
        limits: {elapsed: 2s}
        """)
    done = _cli(root, "--json", "run", "agent.yaml", "-p", "say something")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    assert (result["state"], result["stopReason"], result["limit"]) == ("error", "limit_exceeded", "elapsed"), result
    shown = _show(root, result["instanceId"])
    assert (shown["state"], shown["stopReason"]) == ("error", "limit_exceeded"), shown


def test_elapsed_bounds_a_compaction_summary_call(tmp_path: Path, server: _Server) -> None:
    """A ``compact`` strategy whose summary model never answers: ``elapsed`` ends the segment in the summary call."""
    server.mode = "silent"
    port = server.server_address[1]
    root = _project(tmp_path, f"""\
        srv: {{kind: openai, baseUrl: "http://127.0.0.1:{port}/v1"}}
        script:
          kind: scripted
          replies:
            - toolCalls: [{{name: ping, arguments: {{}}}}]
            - toolCalls: [{{name: ping, arguments: {{}}}}]
            - text: "never reached: the summary call comes first"
        """, """\
        name: compacting
        model: script:any
        tools: [ping]
        contextStrategy: {kind: compact, trigger: 1, keepLast: 1, model: "srv:summarizer"}
        limits: {elapsed: 5s}
        """, """\
        import loopwright


        @loopwright.tool
        def ping() -> str:
            \"\"\"Answer pong.\"\"\"
            return "pong"


        @loopwright.hookimpl
        def loopwright_register_tools(register):
            register(ping)
        """)
    done = _cli(root, "--json", "run", "agent.yaml", "-p", "ping")
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert (result["state"], result["stopReason"], result["limit"]) == ("error", "limit_exceeded", "elapsed"), result
    assert server.requests == 1  # the summary call was made, and cut off
    records = _cli(root, "records", "--json", result["instanceId"])
    kinds = [json.loads(line)["kind"] for line in records.stdout.splitlines()]
    assert "compaction" in kinds, records.stdout


# ---------------------------------------------------------------------------------------------
# an abandoned sync tool thread does not keep the process alive
# ---------------------------------------------------------------------------------------------

_SLEEPY = """\
    import time
    from pathlib import Path

    import loopwright


    @loopwright.tool
    def nap(marker: str) -> str:
        \"\"\"Write a marker, then sleep a minute, ignoring every timeout.

        Args:
            marker: The file written when the tool starts.
        \"\"\"
        Path(marker).write_text("started")
        time.sleep(60)
        return "rested"


    @loopwright.hookimpl
    def loopwright_register_tools(register):
        register(nap)
    """

_SCRIPTED = """\
    script:
      kind: scripted
      replies:
        - toolCalls: [{name: nap, arguments: {marker: nap.started}}]
        - text: "after the nap"
    """

_NAPPER = """\
    name: napper
    model: script:any
    tools: [nap]
    limits: {toolTimeout: 500ms}
    """


def test_cli_exits_when_a_sync_tool_ignores_its_timeout(tmp_path: Path) -> None:
    """`run` with a sync tool that sleeps 60 s under a 0.5 s timeout: the call gets ``timeout``, the CLI exits."""
    root = _project(tmp_path, _SCRIPTED, _NAPPER, _SLEEPY)
    done = _cli(root, "--json", "run", "agent.yaml", "-p", "nap")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    assert (result["state"], result["text"]) == ("waiting", "after the nap"), result
    assert (root / "nap.started").exists()
    records = _cli(root, "records", "--json", result["instanceId"])
    calls = [json.loads(line) for line in records.stdout.splitlines() if '"tool_call"' in line]
    assert [(c["data"]["tool"], c["data"]["status"]) for c in calls] == [("nap", "timeout")], records.stdout


def test_host_script_exits_when_a_sync_tool_ignores_its_timeout(tmp_path: Path) -> None:
    """``loopwright.run_agent`` in a host script returns, and the script's process exits, past the timeout."""
    root = _project(tmp_path, _SCRIPTED, _NAPPER, _SLEEPY)
    (root / "host.py").write_text(textwrap.dedent("""\
        import loopwright

        result = loopwright.run_agent("agent.yaml", prompt="nap", config="loopwright.yaml")
        print(result.state.value, result.text, sep="|")
        """))
    done = _run(root, sys.executable, "host.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "waiting|after the nap"
    assert (root / "nap.started").exists()
