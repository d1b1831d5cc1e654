"""Attacks on file paths: relative roots, folder races, hard links and record sinks inside a root.

Each test plays the malicious model with the ``scripted`` provider (``loopwright-testing``), through
the CLI as a subprocess (``python -m loopwright.cli``), as a user would, and fails if the attack
succeeds. A scripted provider replays its script from the start in every process, so before each
command the test writes the replies that process's model gives (``replies.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import FileStore

THEIRS = "other-folder-THEIRS"
MINE = "assembly-folder-own"

PLUGIN = '''
"""Tools for the attack tests: ping (held for approval by the definition) and a slow nap."""
import time
from pathlib import Path

import loopwright


@loopwright.tool
def ping() -> str:
    """Answer pong."""
    return "pong"


@loopwright.tool
def nap(marker: str) -> str:
    """Write a marker file, then sleep a minute.

    Args:
        marker: The file written when the tool starts.
    """
    Path(marker).write_text("started")
    time.sleep(60)
    return "rested"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(ping, nap)
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def lw(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``loopwright ARGS`` in ``cwd`` (the timeout is a hang guard only)."""
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def script(project: Path, *replies: Any) -> None:
    """Write what the model says in the next process."""
    (project / "replies.json").write_text(json.dumps(list(replies)))


def calls(*pairs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"toolCalls": [{"name": name, "arguments": args} for name, args in pairs]}


def store_call(project: Path, fn: Any) -> Any:
    """Run ``await fn(store)`` on the project's file store, from this (another) process."""
    async def main() -> Any:
        async with FileStore(StoreSettings(kind="file", base_dir=project, options={"path": "./store"})) as store:
            return await fn(store)
    return anyio.run(main)


def results(project: Path, iid: str) -> list[dict[str, Any]]:
    """Return the tool results (tool messages) saved in the instance's entry log."""
    entries = store_call(project, lambda store: store.read_entries(iid))
    return [e["m"] for e in entries if e.get("t") == "msg" and e["m"].get("role") == "tool"]


# ------------------------------------------------------------------------------------------
# Attack 3: relative roots are the assembly's folder, whatever the working folder
# ------------------------------------------------------------------------------------------


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """``project/`` (the assembly, granting ``write: [./work]``) and ``elsewhere/`` with its own ``work/``."""
    project = tmp_path / "project"
    (project / "work").mkdir(parents=True)
    (project / "work" / "own.txt").write_text(MINE)
    (project / "roots_plugin.py").write_text(PLUGIN)
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [loopwright_os, loopwright_testing, roots_plugin.py]\n"
        f"providers: {{model: {{kind: scripted, file: {json.dumps(str(project / 'replies.json'))}}}}}\n"
        "capabilities:\n  files: {write: [./work]}\n  agents: {spawn: true}\n")
    (project / "agent.yaml").write_text(
        "name: roots\nmodel: model:any\n"
        "tools: [read-file, write-file, list-directory, ping, nap, run_agent_async]\n"
        "requiresApproval: [ping]\n")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "work").mkdir(parents=True)
    (elsewhere / "work" / "secret.txt").write_text(THEIRS)
    (elsewhere / "work" / "evil.yaml").write_text("name: evil\nmodel: test:any\n")
    return project.resolve(), elsewhere.resolve()


def attack(project: Path, elsewhere: Path, step: str) -> dict[str, Any]:
    """The model's reach for the other folder's ``work/`` (and for its own), as one turn of calls."""
    return calls(
        ("read-file", {"path": "secret.txt"}),
        ("read-file", {"path": str(elsewhere / "work" / "secret.txt")}),
        ("list-directory", {"path": str(elsewhere / "work")}),
        ("write-file", {"path": f"{step}.txt", "content": step}),
        ("write-file", {"path": str(elsewhere / "work" / f"abs-{step}.txt"), "content": step}),
        ("run_agent_async", {"prompt": "go", "agentSwarmUri": str(elsewhere / "work" / "evil.yaml")}),
        ("read-file", {"path": "own.txt"}),
        ("read-file", {"path": str(project / "work" / "own.txt")}),
    )


def assert_confined(project: Path, elsewhere: Path, iid: str, step: str) -> None:
    """Nothing of ``elsewhere/work`` was reached in ``step``; the agent's own root still was."""
    assert sorted(p.name for p in (elsewhere / "work").iterdir()) == ["evil.yaml", "secret.txt"]
    assert (project / "work" / f"{step}.txt").read_text() == step
    done = results(project, iid)
    assert not any(THEIRS in json.dumps(r) for r in done), "the other folder's secret was read"
    assert not any(r["name"] == "run_agent_async" and r["status"] == "success" for r in done), \
        "a definition in the other folder was started"
    own = [r for r in done if MINE in json.dumps(r)]
    assert len(own) >= 2, "the agent's own root was not readable"


def test_relative_roots_do_not_follow_the_working_folder(folders: tuple[Path, Path]) -> None:
    """Grants ``write: [./work]`` saved at ``run`` in the assembly's folder mean that folder's ``work/``
    on ``approve``, ``message``, ``worker`` and ``resume`` run from a folder with its own ``work/``."""
    project, elsewhere = folders
    config = str(project / "loopwright.yaml")
    script(project, calls(("ping", {})))
    started = lw(project, "run", "--json", "agent.yaml", "-p", "go")
    assert started.returncode == 3, started.stderr
    iid = json.loads(started.stdout)["instanceId"]
    header = store_call(project, lambda store: store.read_header(iid))
    assert header["capabilities"]["files"]["write"] == [str(project / "work")]

    script(project, attack(project, elsewhere, "approve"), {"text": "done"})
    done = lw(elsewhere, "-c", config, "approve", iid)
    assert done.returncode == 0, done.stderr
    assert_confined(project, elsewhere, iid, "approve")

    script(project, attack(project, elsewhere, "message"), {"text": "done"})
    done = lw(elsewhere, "-c", config, "message", iid, "again")
    assert done.returncode == 0, done.stderr
    assert_confined(project, elsewhere, iid, "message")

    script(project, attack(project, elsewhere, "worker"), {"text": "done"})
    store_call(project, lambda store: store.post(
        iid, {"type": "message", "text": "from elsewhere", "source": "api", "at": "2026-01-01T00:00:00Z"}))
    done = lw(elsewhere, "-c", config, "worker", "--once")
    assert done.returncode == 0, done.stderr
    assert_confined(project, elsewhere, iid, "worker")

    marker = project / "nap.started"
    script(project, calls(("nap", {"marker": str(marker)})))
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "-c", config, "message", iid, "nap"],
                            cwd=project, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(6000):  # a hang guard of about a minute
            if marker.exists() or proc.poll() is not None:
                break
            anyio.run(anyio.sleep, 0.01)
        assert marker.exists(), proc.communicate()
    finally:
        proc.kill()
        proc.communicate()
    script(project, attack(project, elsewhere, "resume"), {"text": "done"})
    done = lw(elsewhere, "-c", config, "resume", iid)
    assert done.returncode == 0, done.stderr
    assert_confined(project, elsewhere, iid, "resume")


HOST = """
import sys

import anyio

from loopwright import Capabilities, FileGrants, Runtime


async def main(project):
    async with Runtime.from_file(project + "/loopwright.yaml") as rt:
        run = await rt.start_agent(project + "/agent.yaml", prompt="go",
                                   capabilities=Capabilities(files=FileGrants(write=("./work",))))
        await run.result()
        print(run.instance_id)


anyio.run(main, sys.argv[1])
"""


def test_relative_roots_a_host_asks_for_are_the_assemblys_folder(folders: tuple[Path, Path]) -> None:
    """``start_agent(capabilities=write: [./work])`` from a host script run in another folder grants
    the assembly's ``work/``, not the working folder's."""
    project, elsewhere = folders
    (elsewhere / "host.py").write_text(HOST)
    script(project, attack(project, elsewhere, "host"), {"text": "done"})
    done = subprocess.run([sys.executable, "host.py", str(project)], cwd=elsewhere, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    iid = done.stdout.strip()
    (elsewhere / "host.py").unlink()
    assert_confined(project, elsewhere, iid, "host")
    header = store_call(project, lambda store: store.read_header(iid))
    assert header["capabilities"]["files"]["write"] == [str(project / "work")]


def test_a_saved_relative_root_fails_closed(folders: tuple[Path, Path]) -> None:
    """A header whose saved root is relative (an old or tampered one) is refused from any folder:
    it is never resolved against the working folder."""
    project, elsewhere = folders
    config = str(project / "loopwright.yaml")
    script(project, {"text": "hi"})
    started = lw(project, "run", "--json", "agent.yaml", "-p", "go")
    assert started.returncode == 0, started.stderr
    iid = json.loads(started.stdout)["instanceId"]

    async def relative(store: FileStore) -> None:
        header = await store.read_header(iid)
        header["capabilities"]["files"]["write"] = ["./work"]
        await store.write_header(iid, header)

    store_call(project, relative)
    script(project, attack(project, elsewhere, "tampered"), {"text": "done"})
    for cwd in (elsewhere, project):
        done = lw(cwd, "-c", config, "message", iid, "again")
        assert done.returncode != 0, done.stdout
        assert "'./work' is not absolute" in done.stderr
        assert iid in done.stderr
    assert sorted(p.name for p in (elsewhere / "work").iterdir()) == ["evil.yaml", "secret.txt"]
    assert not (project / "work" / "tampered.txt").exists()
    assert not any(r["name"] == "read-file" for r in results(project, iid))


# ------------------------------------------------------------------------------------------
# Attack 8: a record sink inside a granted root
# ------------------------------------------------------------------------------------------

SINK_PLUGIN = '''
"""A third-party record sink that reports the file it writes."""
from pathlib import Path

import loopwright
from loopwright.abc import RecordSink


class Audit(RecordSink):
    def __init__(self, options):
        self.path = Path(options["path"]).resolve()

    async def write(self, record):
        with self.path.open("a") as f:
            f.write(record.kind + "\\\\n")

    def locations(self):
        return (self.path,)


@loopwright.hookimpl
def loopwright_register_record_sinks(register):
    register("audit", Audit)
'''


@pytest.mark.parametrize(("grant", "sink"), [
    ("write: [./work]", "{kind: jsonl, path: work/audit.jsonl}"),
    ("read: [./work]", "{kind: jsonl, path: work/audit.jsonl}"),
    ("write: [./work/logs/audit.jsonl]", "{kind: jsonl, path: work/logs/audit.jsonl}"),
    ("write: [./work/logs]", "{kind: jsonl, path: work/link/audit.jsonl}"),
    ("write: [./work]", "{kind: audit, path: work/audit.log}"),
], ids=["write-root", "read-root", "the-file-itself", "through-a-symlink", "third-party-sink"])
def test_a_record_sink_inside_a_granted_root_is_refused(tmp_path: Path, grant: str, sink: str) -> None:
    """The audit log may not lie where an agent reaches: the runtime refuses to open (exit 2), before
    any model call, and the log the agent meant to overwrite is untouched."""
    project = tmp_path
    (project / "work" / "logs").mkdir(parents=True)
    (project / "work" / "link").symlink_to(project / "work" / "logs")
    for log in ("audit.jsonl", "audit.log", "logs/audit.jsonl"):
        (project / "work" / log).write_text("original\n")
    (project / "sink_plugin.py").write_text(SINK_PLUGIN)
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [loopwright_os, loopwright_testing, sink_plugin.py]\n"
        f"providers: {{model: {{kind: scripted, file: {json.dumps(str(project / 'replies.json'))}}}}}\n"
        f"capabilities:\n  files: {{{grant}}}\n"
        f"records: [{sink}]\n")
    (project / "agent.yaml").write_text("name: forger\nmodel: model:any\ntools: [write-file]\n")
    script(project, calls(*(("write-file", {"path": str(project / "work" / log), "content": "forged\n"})
                            for log in ("audit.jsonl", "audit.log", "logs/audit.jsonl"))), {"text": "done"})
    done = lw(project, "run", "agent.yaml", "-p", "go")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "record sink" in done.stderr
    assert "lies within the granted file root" in done.stderr
    for log in ("audit.jsonl", "audit.log", "logs/audit.jsonl"):
        assert (project / "work" / log).read_text() == "original\n"


def test_a_record_sink_outside_the_roots_records(tmp_path: Path) -> None:
    """A sink beside the granted root opens and records, its relative path taken from the assembly's
    folder whatever the working folder; the agent cannot write it."""
    project = tmp_path / "project"
    (project / "work").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [loopwright_os, loopwright_testing]\n"
        f"providers: {{model: {{kind: scripted, file: {json.dumps(str(project / 'replies.json'))}}}}}\n"
        "capabilities:\n  files: {write: [./work]}\n"
        "records: [{kind: jsonl, path: audit.jsonl}]\n")
    (project / "agent.yaml").write_text("name: forger\nmodel: model:any\ntools: [write-file]\n")
    script(project, calls(("write-file", {"path": str(project / "audit.jsonl"), "content": "forged\n"})),
           {"text": "done"})
    done = lw(elsewhere, "-c", str(project / "loopwright.yaml"), "run", "--json", str(project / "agent.yaml"),
              "-p", "go")
    assert done.returncode == 0, done.stderr
    assert list(elsewhere.iterdir()) == []
    lines = (project / "audit.jsonl").read_text().splitlines()
    assert "forged" not in lines
    assert any(json.loads(line)["kind"] == "tool_call" for line in lines)


# ------------------------------------------------------------------------------------------
# Attack 8: write-file's folders under a flipping symlink; reading a planted hard link
# ------------------------------------------------------------------------------------------


def os_project(project: Path, settings: str = "") -> Path:
    """An assembly granting ``write: [./work]``, with ``outside/`` (a secret) next to the root."""
    (project / "work").mkdir()
    (project / "outside").mkdir()
    (project / "outside" / "secret.txt").write_text(THEIRS)
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [loopwright_os, loopwright_testing]\n"
        f"providers: {{model: {{kind: scripted, file: {json.dumps(str(project / 'replies.json'))}}}}}\n"
        f"capabilities:\n  files: {{write: [./work]}}\n{settings}")
    (project / "agent.yaml").write_text(
        "name: racer\nmodel: model:any\ntools: [write-file, read-file]\nlimits: {toolCalls: 1000}\n")
    return project


def test_a_symlink_flipped_during_write_file_makes_nothing_outside(tmp_path: Path) -> None:
    """While a thread flips ``work/dd`` between a folder and a link to ``outside/``, 600 calls of
    ``write-file dd/newN/x.txt`` make no folder or file outside the root."""
    import threading  # noqa: PLC0415 - only this test races
    import time  # noqa: PLC0415

    project = os_project(tmp_path)
    work, outside = project / "work", project / "outside"
    # 20 turns of 30 calls (a turn runs at most 32).
    turns = [calls(*(("write-file", {"path": f"dd/new{t}-{n}/x.txt", "content": "x"}) for n in range(30)))
             for t in range(20)]
    script(project, *turns, {"text": "done"})
    stop = threading.Event()

    def flip() -> None:
        aside = 0
        while not stop.is_set():
            dd = work / "dd"
            if dd.is_dir() and not dd.is_symlink():
                aside += 1
                dd.rename(work / f"dd-{aside}")  # the real folder stays inside the root
            with contextlib.suppress(OSError):
                dd.symlink_to(outside)
            time.sleep(0.0003)  # each state lasts about as long as a check
            with contextlib.suppress(OSError):
                dd.unlink()
            time.sleep(0.0003)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        done = lw(project, "run", "--json", "agent.yaml", "-p", "go", timeout=600)
    finally:
        stop.set()
        flipper.join()
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"], "write-file made something outside"
    assert (outside / "secret.txt").read_text() == THEIRS
    written = list(work.glob("*/*/x.txt"))
    assert written, "no write succeeded: the race was not run"


@pytest.mark.parametrize("allowed", [False, True], ids=["default", "allowHardLinks"])
def test_a_planted_hard_link_to_an_outside_file_is_not_read(tmp_path: Path, allowed: bool) -> None:
    """``work/hard``, a hard link to ``outside/secret.txt``, is refused by read-file (and write-file)
    unless the assembly sets ``pluginSettings: {os: {allowHardLinks: true}}``; then only reads work."""
    project = os_project(tmp_path, "pluginSettings: {os: {allowHardLinks: true}}\n" if allowed else "")
    os.link(project / "outside" / "secret.txt", project / "work" / "hard")
    (project / "work" / "plain.txt").write_text(MINE)
    script(project, calls(("read-file", {"path": "hard"}), ("read-file", {"path": "plain.txt"}),
                          ("write-file", {"path": "hard", "content": "pwned"})), {"text": "done"})
    done = lw(project, "run", "--json", "agent.yaml", "-p", "go")
    assert done.returncode == 0, done.stderr
    hard, plain, write = results(project, json.loads(done.stdout)["instanceId"])
    assert (plain["status"], plain["content"]) == ("success", MINE)
    assert write["status"] == "tool_error"
    assert "has other hard links" in write["content"]
    assert (project / "outside" / "secret.txt").read_text() == THEIRS
    if allowed:
        assert (hard["status"], hard["content"]) == ("success", THEIRS)
    else:
        assert hard["status"] == "tool_error"
        assert "has other hard links" in hard["content"]
        assert THEIRS not in hard["content"]
