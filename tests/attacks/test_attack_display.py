"""Attacks on what a person is shown, and on what the agent tools tell a model (issue 8, attacks 4 and 8).

**What a person approves is what runs.** A malicious model asks for a shell command that holds a
carriage return and an ANSI escape (``... #\r\x1b[2Kls``): drawn raw on a terminal, the line is
erased and only ``ls`` is left to approve. Every place the CLI shows a call must show such
characters as visible escapes, and what ``approve`` runs must be exactly the call shown.

**No probing of ids.** The agent tools must answer a made-up instance id exactly as they answer
the real id of an instance the caller may not reach (a sibling's, a stranger's), so that a model
cannot learn which ids exist.

Each test plays the model with the ``scripted`` provider (replies in a YAML file the test
rewrites between CLI processes) and runs ``python -m loopwright.cli`` as a user would, piped or
under a pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

#: A command a person must not see as ``ls``: it saves its own argv (the exact command the shell
#: got), removes ~/x, and hides all that behind a carriage return and "erase line" (and a bidi
#: override for good measure).
ATTACK = 'cat /proc/$$/cmdline > "$HOME/ran.bin"; rm -rf "$HOME/x" #\r\x1b[2Kls \u202eexe.txt'
#: The raw parts that must never reach a screen from the argument.
RAW = ("#\r", "\x1b[2Kls", "\u202e")
#: How the argument looks escaped (in JSON-shaped argument lists, and in plain text).
ESCAPED_JSON = "#\\r\\u001b[2Kls \\u202eexe.txt"
ESCAPED_TEXT = "#\\r\\x1b[2Kls \\u202eexe.txt"

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc/PID/cmdline")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["HOME"] = str(home)
    env["COLUMNS"] = "250"
    return env


def lw(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``loopwright ARGS`` in ``project``, piped; the output is decoded as it is (a CR stays a CR)."""
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, capture_output=True,
                          env=_env(project / "home"), timeout=120, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def script(project: Path, name: str, replies: list[Any]) -> None:
    """Write what the model ``name`` answers in the next CLI process (JSON is YAML)."""
    (project / f"{name}.yaml").write_text(json.dumps(replies))


def run_in_pty(project: Path, args: list[str], answer: bytes, timeout: float = 120.0) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, answer its question with ``answer``; return (exit code, screen)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child becomes the CLI
        os.chdir(project)
        os.execve(sys.executable, [sys.executable, "-m", "loopwright.cli", *args],  # noqa: S606
                  _env(project / "home"))
    out = b""
    answered = False
    deadline = time.monotonic() + timeout  # a hang guard only
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
        if not answered and b"[y/N]" in out:
            os.write(fd, answer)
            answered = True
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.fixture
def shell_project(tmp_path: Path) -> Path:
    """An assembly granting ``shell: approval``, a definition with the shell tool, a home with ~/x."""
    project = tmp_path / "p"
    (project / "home" / "x").mkdir(parents=True)
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [os, testing]\n"
        "providers: {model: {kind: scripted, file: model.yaml}}\n"
        "capabilities: {shell: approval}\n")
    (project / "shell.yaml").write_text("name: shell\nmodel: model:any\ntools: [execute_terminal_command]\n")
    script(project, "model", [{"toolCalls": [{"name": "execute_terminal_command", "id": "call_1",
                                              "arguments": {"command": ATTACK}}]}])
    return project


def _no_raw(screen: str) -> None:
    for raw in RAW:
        assert raw not in screen, f"raw {raw!r} from the argument reached the screen: {screen!r}"


def _ran(project: Path) -> str:
    """The command the shell got, as it saved it: /bin/sh -c COMMAND."""
    argv = (project / "home" / "ran.bin").read_bytes().split(b"\0")
    assert argv[1] == b"-c", argv
    return argv[2].decode()


def test_held_shell_command_is_shown_escaped_and_approve_runs_exactly_it(shell_project: Path) -> None:
    """Piped, the held call's listing, the progress lines and ``show`` escape it; ``approve`` runs what was shown."""
    project = shell_project
    run = lw(project, "run", "shell.yaml", "-p", "go")
    assert run.returncode == 3, run  # waiting for approval
    _no_raw(run.stdout + run.stderr)
    assert ESCAPED_JSON in run.stdout, run.stdout  # the call, as JSON arguments
    assert ESCAPED_TEXT in run.stdout, run.stdout  # the reason "run shell command: ..."
    assert ESCAPED_TEXT in run.stderr, run.stderr  # "waits for approval: ..."
    instance = run.stdout.split()[1]

    shown = lw(project, "show", instance)
    assert shown.returncode == 0, shown
    _no_raw(shown.stdout)
    assert ESCAPED_JSON in shown.stdout, shown.stdout
    listed = lw(project, "ls")
    _no_raw(listed.stdout)

    exact = lw(project, "show", instance, "--json")
    _no_raw(exact.stdout)  # escaped by JSON, and still the exact value:
    pending = json.loads(exact.stdout)["pendingApprovals"]
    assert [p["arguments"] for p in pending] == [{"command": ATTACK}]  # JSON keeps the exact value

    script(project, "model", ["done"])
    approved = lw(project, "approve", instance)
    assert approved.returncode == 0, approved
    _no_raw(approved.stdout + approved.stderr)
    assert _ran(project) == pending[0]["arguments"]["command"]
    assert not (project / "home" / "x").exists()
    records = lw(project, "records", instance, "--kind", "tool_call")
    calls = [json.loads(line)["data"] for line in records.stdout.splitlines()]
    assert [(c["toolCallId"], c["tool"], c["status"]) for c in calls] == [
        (pending[0]["toolCallId"], "execute_terminal_command", "success")]


def test_terminal_approval_prompt_and_live_view_show_the_command_escaped(shell_project: Path) -> None:
    """On a terminal the live view and the approval question escape the command; 'y' runs exactly it."""
    project = shell_project
    script(project, "model", [
        {"toolCalls": [{"name": "execute_terminal_command", "arguments": {"command": ATTACK}}]}, "done"])
    code, screen = run_in_pty(project, ["run", "shell.yaml", "-p", "go"], b"y\n")
    assert code == 0, screen
    question = screen.split("[y/N]", 1)[0]
    assert "Run this command?" in question, screen
    _no_raw(screen)
    assert ESCAPED_TEXT in question, question  # the question shows the command as text
    assert ESCAPED_JSON in question, question  # the live view's call line shows its arguments
    assert _ran(project) == ATTACK



#: Characters that must never be shown raw: C0 and C1 controls, DEL, bidi embeddings, overrides
#: and isolates, marks, zero-width characters, line and paragraph separators, a tag character.
HIDDEN = ("\x00\x07\x08\t\n\x0b\x0c\r\x1b\x7f\x85\x9b\u061c\u200b\u200c\u200d\u200e\u200f"
          "\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\u2028\u2029\ufeff\U000e0041")


#: The Unicode categories of characters that act on a screen or draw nothing.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


@given(st.lists(st.one_of(st.sampled_from(HIDDEN), st.characters()), max_size=40).map("".join))
def test_the_display_helper_shows_every_hidden_character_as_an_escape(text: str) -> None:
    """safe_text leaves no hidden character and keeps text without one as it is; safe_json parses back exactly."""
    from loopwright.display import is_hidden, safe_json, safe_text  # noqa: PLC0415

    assert all(is_hidden(c) for c in HIDDEN)
    for shown, kept in ((safe_text(text), ""), (safe_text(text, multiline=True), "\n\t")):
        assert not any(unicodedata.category(c) in HIDDEN_CATEGORIES and c not in kept for c in shown), repr(shown)
    if not any(is_hidden(c) for c in text):
        assert safe_text(text) == text
    encoded = safe_json({"command": text}, indent=2)
    assert json.loads(encoded) == {"command": text}
    assert not any(unicodedata.category(c) in HIDDEN_CATEGORIES and c != "\n" for c in encoded), repr(encoded)


# ---------------------------------------------------------------------------------------------
# Attack 8: an agent probes which instance ids exist
# ---------------------------------------------------------------------------------------------

#: A well-formed id no instance has.
MADE_UP = "20260101-000000-0badc0de"


@pytest.fixture
def agents_project(tmp_path: Path) -> Path:
    """A parent that starts agents, a child definition, a stranger and a probing agent, all scripted."""
    project = tmp_path / "p"
    (project / "agents").mkdir(parents=True)
    (project / "home").mkdir()
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [testing]\n"
        "providers:\n"
        "  parent: {kind: scripted, file: parent.yaml}\n"
        "  child: {kind: scripted, file: child.yaml}\n"
        "  probe: {kind: scripted, file: probe.yaml}\n"
        "capabilities: {agents: {spawn: true}}\n"
        "agentDefinitions: {child: agents/child.yaml, probe: agents/probe.yaml}\n")
    (project / "agents" / "parent.yaml").write_text(
        "name: parent\nmodel: parent:any\ntools: [run_agent_async, await_agent]\n")
    (project / "agents" / "child.yaml").write_text("name: child\nmodel: child:any\n")
    (project / "agents" / "stranger.yaml").write_text("name: stranger\nmodel: child:any\n")
    (project / "agents" / "probe.yaml").write_text(
        "name: probe\nmodel: probe:any\n"
        "tools: [run_agent_async, message_agent, await_agent, monitor_agent, query_agent, list_agent_instances]\n")
    return project


def _probes(label: str, target: str, name: str) -> list[dict[str, Any]]:
    """Every agent tool pointed at ``target`` (and a list filtered by its definition ``name``)."""
    return [
        {"id": f"message_{label}", "name": "message_agent", "arguments": {"agentId": target, "prompt": "hi"}},
        {"id": f"run_{label}", "name": "run_agent_async", "arguments": {"agentId": target, "prompt": "hi"}},
        {"id": f"await_{label}", "name": "await_agent", "arguments": {"ids": [target]}},
        {"id": f"monitor_{label}", "name": "monitor_agent", "arguments": {"agentId": target}},
        {"id": f"arm_{label}", "name": "monitor_agent", "arguments": {"agentId": target, "onFinish": True}},
        {"id": f"query_{label}", "name": "query_agent", "arguments": {"agentId": target, "query": "done"}},
        {"id": f"list_{label}", "name": "list_agent_instances", "arguments": {"name": name}},
        {"id": f"swarm_{label}", "name": "list_agent_instances", "arguments": {"swarm": name}},
    ]


def _tool_results(project: Path, instance_id: str) -> dict[str, tuple[str, str]]:
    """Read the instance's transcript: the model's call id -> (status, content) of each tool result."""
    import anyio  # noqa: PLC0415 - only this test reads a store in-process

    from loopwright import Runtime  # noqa: PLC0415

    async def read() -> dict[str, tuple[str, str]]:
        async with Runtime.from_file(project / "loopwright.yaml") as rt:
            run = await rt.get_agent(instance_id)
            return {str(m.provider_call_id): (str(m.status.value if m.status else None), str(m.content))
                    for m in run.inst.transcript if m.role == "tool"}

    return anyio.run(read)


def test_agent_tools_answer_a_made_up_id_as_they_answer_an_unreachable_one(
    agents_project: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stranger's, a sibling's and the parent's real ids get the answers a made-up id gets, apart from the id."""
    project = agents_project
    script(project, "child", ["stranger done"])
    stranger = json.loads(lw(project, "--json", "run", "agents/stranger.yaml", "-p", "x").stdout)["instanceId"]
    script(project, "parent", [
        {"toolCalls": [{"name": "run_agent_async", "arguments": {"agentSwarmUri": "child", "prompt": "x"}}]},
        "started"])
    script(project, "child", ["sibling done"])
    started = lw(project, "--json", "run", "agents/parent.yaml", "-p", "x")
    assert started.returncode == 0, started
    parent = json.loads(started.stdout)["instanceId"]
    everyone = json.loads(lw(project, "--json", "ls").stdout)
    sibling = next(s["instanceId"] for s in everyone if s["spawnerInstanceId"] == parent)

    targets = {"madeup": (MADE_UP, "nobody"), "stranger": (stranger, "stranger"),
               "sibling": (sibling, "child"), "parent": (parent, "parent")}
    script(project, "probe", [
        {"toolCalls": [c for label, (iid, name) in targets.items() for c in _probes(label, iid, name)]}, "probed"])
    script(project, "parent", [
        {"toolCalls": [{"name": "run_agent_async", "arguments": {"agentSwarmUri": "probe", "prompt": "x"}}]},
        "started"])
    again = lw(project, "message", parent, "again")
    assert again.returncode == 0, again
    everyone = json.loads(lw(project, "--json", "ls").stdout)
    probe = next(s["instanceId"] for s in everyone if s["name"] == "probe")

    monkeypatch.setenv("LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD", "1")
    results = _tool_results(project, probe)
    for call in _probes("madeup", MADE_UP, "nobody"):
        tool = call["id"].removesuffix("_madeup")
        answers = {label: (results[f"{tool}_{label}"][0], results[f"{tool}_{label}"][1].replace(iid, "ID"))
                   for label, (iid, _name) in targets.items()}
        assert len(set(answers.values())) == 1, f"{call['name']} tells ids apart: {answers}"
        status, content = answers["madeup"]
        if call["name"] == "list_agent_instances":
            assert (status, json.loads(content)) == ("success", [])
        else:
            assert status == "tool_error", answers  # refused, and alike
            assert "ID" in content, content  # the answer names the id it refuses
