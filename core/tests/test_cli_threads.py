"""``loopwright run --thread ID`` and ``loopwright delete ID`` as a user types them (issue 29, point 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COUNTER = '''\
"""A model that answers "said N": N is how many user messages it was sent."""

import loopwright
from loopwright import Message, ModelResponse
from loopwright.abc import Provider


class Counter(Provider):
    def __init__(self, settings):
        self.settings = settings

    async def complete(self, request):
        users = [m.content for m in request.messages if m.role == "user"]
        return ModelResponse(message=Message(role="assistant", content=f"said {len(users)}: {' | '.join(users)}"))


@loopwright.hookimpl
def loopwright_register_providers(register):
    register("counter", Counter)
'''


def lw(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture(params=["file", "sqlite"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    (tmp_path / "counter.py").write_text(COUNTER, encoding="utf-8")
    (tmp_path / "chat.yaml").write_text("name: chat\nmodel: counter:any\n", encoding="utf-8")
    (tmp_path / "other.yaml").write_text("name: other\nmodel: counter:any\n", encoding="utf-8")
    path = "./store" if request.param == "file" else "./store.db"
    (tmp_path / "loopwright.yaml").write_text(
        f"store: {{kind: {request.param}, path: {path}}}\nplugins: [counter.py]\n"
        "providers:\n  counter: {kind: counter}\n", encoding="utf-8")
    return tmp_path


def test_a_thread_is_started_then_continued_and_the_model_sees_every_message(project: Path) -> None:
    first = lw(project, "run", "--thread", "support-42", "chat.yaml", "-p", "my order is late")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "said 1: my order is late"
    second = lw(project, "run", "--thread", "support-42", "chat.yaml", "-p", "it is order 7")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "said 2: my order is late | it is order 7"
    listed = json.loads(lw(project, "ls", "--json").stdout)
    assert [i["instanceId"] for i in listed] == ["support-42"]
    assert listed[0]["usage"]["requests"] == 2


def test_thread_mistakes_are_usage_errors_that_create_nothing(project: Path) -> None:
    out = lw(project, "run", "--thread", "t", "chat.yaml")
    assert out.returncode == 2
    assert "give -p TEXT too" in out.stderr
    for bad in ("../x", "-rf", ".hidden", "a/b"):
        out = lw(project, "run", f"--thread={bad}", "chat.yaml", "-p", "hi")
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert "invalid thread id" in out.stderr, out.stderr
    assert json.loads(lw(project, "ls", "--json").stdout) == []
    assert lw(project, "run", "--thread", "t", "chat.yaml", "-p", "hi").returncode == 0
    out = lw(project, "run", "--thread", "t", "other.yaml", "-p", "hi")
    assert out.returncode == 2
    assert "is an instance of 'chat', not 'other'" in out.stderr


def test_delete_ends_the_thread_and_its_data_and_the_id_starts_afresh(project: Path) -> None:
    assert lw(project, "run", "--thread", "t1", "chat.yaml", "-p", "one").returncode == 0
    assert lw(project, "run", "--thread", "t2", "chat.yaml", "-p", "two").returncode == 0
    out = lw(project, "delete", "t1")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "deleted t1\n"
    assert [i["instanceId"] for i in json.loads(lw(project, "ls", "--json").stdout)] == ["t2"]
    shown = lw(project, "show", "t1")
    assert shown.returncode == 2
    assert "no instance 't1'" in shown.stderr
    again = lw(project, "delete", "t1")
    assert again.returncode == 2
    assert "no instance 't1'" in again.stderr
    fresh = lw(project, "run", "--thread", "t1", "chat.yaml", "-p", "new")
    assert fresh.stdout.strip() == "said 1: new"
    assert json.loads(lw(project, "delete", "t1", "--json").stdout) == {"deleted": ["t1"]}
    if (project / "store").is_dir():  # the file store keeps no trace of a deleted instance
        assert sorted(p.name for p in (project / "store").iterdir()) == ["t2"]
