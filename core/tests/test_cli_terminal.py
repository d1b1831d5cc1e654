"""The CLI on a real terminal (a pseudo-terminal): streamed text and the shell-approval prompt."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopwright import AgentResult, Event, State, StopReason
from loopwright.cli._main import CliSettings
from loopwright.cli._output import report
from loopwright.cli._progress import LiveProgress

FIXTURES = Path(__file__).parent / "cli_fixtures"


def run_in_pty(args: list[str], cwd: Path, answer: bytes | None = None, timeout: float = 60.0,
               timings: list[float] | None = None) -> tuple[int, str]:
    """Run the CLI under a pseudo-terminal; type ``answer`` when it asks a question. Return (exit code, screen).

    :param timings: Given, receives the seconds from typing ``answer`` to the CLI's exit.
    """
    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes the CLI
        os.chdir(cwd)
        os.environ["COLUMNS"] = "200"
        os.execv(sys.executable, [sys.executable, "-m", "loopwright.cli", *args])  # noqa: S606
    out = b""
    deadline = time.monotonic() + timeout
    answered: float | None = None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
        if answer is not None and answered is None and b"[y/N]" in out:
            os.write(fd, answer)
            answered = time.monotonic()
    if time.monotonic() >= deadline:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timings is not None and answered is not None:
        timings.append(time.monotonic() - answered)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES, tmp_path / "p")
    return tmp_path / "p"


def test_streamed_answer_is_printed_once_as_it_arrives(project: Path) -> None:
    """With --stream on a terminal the answer streams to the screen and is not printed a second time."""
    code, screen = run_in_pty(["run", "agents/chat.yaml", "-p", "hello there", "--stream"], project)
    assert code == 0, screen
    scripts = json.loads((project / "scripts" / "chat.json").read_text())
    answer = scripts[0]["text"].replace("{last}", "hello there")
    assert screen.count(answer) == 1, screen


def shell_agent(project: Path, command: str) -> None:
    """Write ``agents/shell.yaml``, whose model asks to run ``command`` once, under a ``shell: approval`` grant."""
    (project / "scripts" / "shell.json").write_text(json.dumps([
        {"calls": [{"name": "execute_terminal_command", "arguments": {"command": command}}]},
        {"text": "result: {last}"},
    ]))
    (project / "agents" / "shell.yaml").write_text(
        "name: shell\nmodel: replay:shell\ntools: [execute_terminal_command]\n")
    assembly = (project / "loopwright.yaml").read_text() + "capabilities: {shell: approval}\n"
    (project / "loopwright.yaml").write_text(assembly)


def test_shell_approval_asks_at_the_terminal(project: Path) -> None:
    """Under `shell: approval`, the CLI asks on the terminal; 'y' runs the command, its output reaches the model."""
    shell_agent(project, "echo approved-run")
    code, screen = run_in_pty(["run", "agents/shell.yaml", "-p", "go"], project, answer=b"y\n")
    assert code == 0, screen
    assert "Run this command? [y/N]" in screen
    assert "echo approved-run" in screen
    assert "approved-run" in screen.split("[y/N]", 1)[1]


def test_shell_approval_refused_at_the_terminal(project: Path) -> None:
    """Answering no at the terminal gives the model a denied result and does not run the command."""
    marker = project / "ran.txt"
    shell_agent(project, f"touch {marker}")
    code, screen = run_in_pty(["run", "agents/shell.yaml", "-p", "go"], project, answer=b"n\n")
    assert code == 0, screen
    assert not marker.exists()
    assert "refused at the terminal" in screen


def test_live_display_prints_deltas_and_the_report_does_not_repeat_them(capsys: pytest.CaptureFixture[str]) -> None:
    """The live display writes streamed pieces to stdout as they come; the final report then prints no second copy."""
    progress = LiveProgress()
    with progress:
        for piece in ("stre", "amed ", "answer"):
            progress.event(Event(kind="text_delta", instance_id="i", turn=1, data={"delta": piece}))
        progress.event(Event(kind="text", instance_id="i", turn=1, data={"text": "streamed answer"}))
    assert capsys.readouterr().out == "streamed answer"
    settings = CliSettings()
    settings.streamed_text = progress.streamed_answer()
    result = AgentResult(instance_id="i", state=State.WAITING, stop_reason=StopReason.WAITING,
                         text="streamed answer")
    assert report(result, settings, turns=1) == 0
    assert capsys.readouterr().out == "\n"


def test_token_summary_names_calls_without_counts() -> None:
    """The token part of a summary line says how many model calls came back without counts."""
    from loopwright.cli._output import format_tokens  # noqa: PLC0415

    assert format_tokens({"inputTokens": 1000, "outputTokens": 234, "totalTokens": 1234}) == (
        "1,234 tokens (1,000 in, 234 out)")
    assert format_tokens({"inputTokens": 10, "outputTokens": 2, "unreportedRequests": 1}) == (
        "12 tokens (10 in, 2 out; 1 call not counted)")
    assert format_tokens({"unreportedRequests": 3}, unit="") == "0 (0 in, 0 out; 3 calls not counted)"


def test_ctrl_c_at_the_approval_question_returns_at_once(project: Path) -> None:
    """Ctrl-C while `[y/N]` waits: the CLI exits 130 within moments, no traceback, the command not run.

    The question reads the terminal in a thread that cannot be interrupted; the cancel abandons
    it (issue 10, item 4), and the instance is saved stopped.
    """
    marker = project / "ran.txt"
    shell_agent(project, f"touch {marker}")
    timings: list[float] = []
    code, screen = run_in_pty(["run", "agents/shell.yaml", "-p", "go"], project, answer=b"\x03", timings=timings,
                              timeout=30.0)
    assert code == 130, screen
    assert "Traceback" not in screen, screen
    (seconds,) = timings
    assert seconds < 5.0, screen  # "within a second or two", with slack for a loaded CI machine
    assert not marker.exists()
    listed = subprocess.run([sys.executable, "-m", "loopwright.cli", "--json", "ls"], cwd=project,
                            capture_output=True, text=True, check=True)
    (summary,) = json.loads(listed.stdout)
    assert (summary["state"], summary["cancelled"]) == ("stopped", True), summary
