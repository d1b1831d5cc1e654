"""Every example under examples/ runs as its README says.

Each example's README has one ```bash block: the exact commands a user types in the example's
folder. A test copies the folder to a temporary one, runs that block there with bash (the
workspace's venv first on PATH, as after ``source .venv/bin/activate``), and checks what it
printed and what it left in the store. Everything runs offline, on the ``test`` provider or an
example's own model. The postgres example needs a server: LOOPWRIGHT_TEST_POSTGRES_DSN (set by
scripts/test.sh's throwaway server); without it the test skips, unless
LOOPWRIGHT_REQUIRE_POSTGRES=1 (CI), where it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
#: A hang guard only: the slowest example takes a few seconds.
TIMEOUT = 300

pytestmark = pytest.mark.slow


def commands(example: str) -> str:
    """The README's one ```bash block."""
    blocks = re.findall(r"```bash\n(.*?)```", (EXAMPLES / example / "README.md").read_text(), re.DOTALL)
    assert len(blocks) == 1, f"examples/{example}/README.md must have exactly one bash block"
    return blocks[0]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    return {**base, "PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}", **extra}


def tracked(example: str) -> list[str]:
    """The files of ``examples/EXAMPLE`` git tracks (what a clone has; never what a run of it left)."""
    done = subprocess.run(["git", "ls-files", "-z", "--", f"examples/{example}"], cwd=ROOT, capture_output=True,
                          check=True)
    return [name for name in done.stdout.decode().split("\0") if name]


def copy(example: str, tmp_path: Path) -> Path:
    """Copy the tracked files of ``example`` to a fresh folder (issue 31, point 5: not what earlier runs left)."""
    folder = tmp_path / example
    for name in tracked(example):
        target = folder / Path(name).relative_to(f"examples/{example}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return folder


def run_readme(example: str, folder: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", commands(example)], cwd=folder, env=env(**extra), capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def lw_json(folder: Path, *args: str, **extra: str) -> Any:
    done = subprocess.run([BIN / "loopwright", *args, "--json"], cwd=folder, env=env(**extra), capture_output=True,
                          text=True, timeout=TIMEOUT, check=True)
    return json.loads(done.stdout)


def records(folder: Path, instance_id: str, kind: str, **extra: str) -> list[dict[str, Any]]:
    done = subprocess.run([BIN / "loopwright", "records", instance_id, "--kind", kind], cwd=folder, env=env(**extra),
                          capture_output=True, text=True, timeout=TIMEOUT, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_every_example_has_a_readme_and_a_test() -> None:
    """A new example folder needs a README with its commands and a test here."""
    folders = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith("."))
    tested = sorted(n.removeprefix("test_").replace("_", "-") for n in globals() if n.startswith("test_")
                    and (EXAMPLES / n.removeprefix("test_").replace("_", "-")).is_dir())
    assert folders == tested
    for name in folders:
        commands(name)
        assert f"]({name}/)" in (EXAMPLES / "README.md").read_text(), f"examples/README.md does not list {name}"


def test_quickstart(tmp_path: Path) -> None:
    folder = copy("quickstart", tmp_path)
    out = run_readme("quickstart", folder).stdout
    assert 'test answer: count_words -> 1; count_letters -> {"total": 1, "a": 1}\nrun exited 0' in out


def test_approvals(tmp_path: Path) -> None:
    """run holds the call and exits 3 without running it; approve, a second process, runs it once."""
    folder = copy("approvals", tmp_path)
    out = run_readme("approvals", folder).stdout
    assert "is waiting for approval of 1 call" in out
    assert "run exited 3" in out
    # The held call is named by the runtime's own id (lw-TURN-INDEX-HEX6), the same in run's
    # listing and in show, between the two processes.
    [held] = re.findall(r"^  (lw-1-0-[0-9a-f]{6})  publish ", out, re.MULTILINE)
    assert f"pending approval  {held} publish" in out
    assert "test answer: publish -> published 'a'\napprove exited 0" in out
    assert (folder / ".loopwright" / "published.txt").read_text() == "a\n"
    [instance] = lw_json(folder, "ls")
    assert (instance["state"], instance["pendingApprovals"]) == ("waiting", [])
    [call] = records(folder, instance["instanceId"], "tool_call")
    assert (call["data"]["tool"], call["data"]["status"]) == ("publish", "success")


def test_sub_agents(tmp_path: Path) -> None:
    """The lead starts two researchers, awaits both, and reports their answers; all are linked."""
    folder = copy("sub-agents", tmp_path)
    out = run_readme("sub-agents", folder).stdout
    instances = lw_json(folder, "ls")
    lead = next(i for i in instances if i["name"] == "lead")
    children = [i for i in instances if i["name"] == "researcher"]
    assert len(instances) == 3
    assert len(children) == 2
    for child in children:
        assert child["callerInstanceId"] == lead["instanceId"]
        assert child["state"] == "waiting"
    answers = sorted(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("- researcher "))
    assert answers == ["test answer to: apples", "test answer to: pears"]
    assert sorted(lw_json(folder, "show", lead["instanceId"])["children"]) == sorted(c["instanceId"] for c in children)
    assert "run exited 0" in out
    calls = [r["data"]["tool"] for r in records(folder, lead["instanceId"], "tool_call")]
    assert sorted(calls) == ["await_agent", "run_agent_async", "run_agent_async"]


def test_hook_plugin(tmp_path: Path) -> None:
    """The policy blocks delete_note before the tool runs; the model reads the reason; read_note runs."""
    folder = copy("hook-plugin", tmp_path)
    out = run_readme("hook-plugin", folder).stdout
    assert "run exited 0" in out
    assert "test answer: read_note -> Buy milk.; delete_note -> blocked: " in out
    assert "policy: only notes named tmp-* may be deleted, not 'a'" in out
    assert (folder / "notes" / "a").is_file(), "the blocked tool ran"
    [instance] = lw_json(folder, "ls")
    statuses = {r["data"]["tool"]: r["data"]["status"] for r in records(folder, instance["instanceId"], "tool_call")}
    assert statuses == {"read_note": "success", "delete_note": "blocked"}


def test_mcp_tools(tmp_path: Path) -> None:
    """The stdio server's tool is listed and called through the server."""
    folder = copy("mcp-tools", tmp_path)
    out = run_readme("mcp-tools", folder).stdout
    assert "tools: dictionary__define" in out
    assert ("test answer: dictionary__define -> a: the first letter of the alphabet; also the indefinite article"
            "\nrun exited 0") in out
    [instance] = lw_json(folder, "ls")
    [call] = records(folder, instance["instanceId"], "tool_call")
    assert (call["data"]["tool"], call["data"]["status"]) == ("dictionary__define", "success")


def test_postgres_workers(tmp_path: Path, fresh_database: str) -> None:
    """Three instances' messages are each run once, by one of the two workers, which exit 0 on SIGTERM."""
    folder = copy("postgres-workers", tmp_path)
    out = run_readme("postgres-workers", folder, LOOPWRIGHT_TEST_POSTGRES_DSN=fresh_database).stdout
    assert "worker 1 exited 0" in out
    assert "worker 2 exited 0" in out
    instances = lw_json(folder, "ls", LOOPWRIGHT_DSN=fresh_database)
    ids = [i["instanceId"] for i in instances]
    assert len(ids) == 3
    assert all((i["state"], i["usage"]["requests"]) == ("waiting", 2) for i in instances), instances
    events = [json.loads(line) for log in ("worker-1.jsonl", "worker-2.jsonl")
              for line in (folder / ".loopwright" / log).read_text().splitlines() if line.strip()]
    assert Counter((e["event"], e["instanceId"]) for e in events) == Counter(
        [("pickedUp", i) for i in ids] + [("finished", i) for i in ids])
    assert {e["reason"] for e in events if e["event"] == "pickedUp"} == {"message"}
    assert {e["text"] for e in events if e["event"] == "finished"} == {"test answer to: And how are they grown?"}


def test_running_every_example_in_place_leaves_only_ignored_files(tmp_path: Path, fresh_database: str) -> None:
    """Issue 31: in a clone where every example's README was run in its own folder, git sees nothing new.

    Each example writes only to git-ignored places (``.loopwright/``, logs the root
    ``.gitignore`` names), so such a clone is a fresh clone to every test (which copies only
    tracked files) and to ``git status``. Run in a real ``git clone`` of this checkout.
    """
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=TIMEOUT)
    names = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith("."))
    for name in names:
        extra = {"LOOPWRIGHT_TEST_POSTGRES_DSN": fresh_database} if name == "postgres-workers" else {}
        done = subprocess.run(["bash", "-c", commands(name)], cwd=clone / "examples" / name, env=env(**extra),
                              capture_output=True, text=True, timeout=TIMEOUT, check=False)
        assert done.returncode == 0, f"{name}:\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    left = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone, capture_output=True,
                          text=True, check=True).stdout
    assert left == "", f"running the examples left files git does not ignore:\n{left}"
    ignored = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "examples"],
                             cwd=clone, capture_output=True, text=True, check=True).stdout
    assert ".loopwright/" in ignored  # the examples did run, and wrote where they should
