"""Retention (issue 29, point 5): instance trees at rest past ``retention.instances`` are deleted.

``expired_trees`` decides from headers alone (what a tree is, what holds it, its newest change);
``Runtime.collect_garbage`` deletes through the store on the file and sqlite stores, skipping a
tree another runner holds; ``loopwright gc`` (``--dry-run``, ``--keep``) and an idle
``loopwright worker`` do it from the CLI, each run as a subprocess. The duration grammar gains
``d`` (days) for it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import Harness, defn, make_runtime, reply, run_to_rest

import loopwright
from loopwright._definition import Assembly, Retention, StoreConfig
from loopwright._retention import expired_trees
from loopwright.errors import InstanceNotFoundError, LoopwrightError

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)
DAY = 86400.0


def header(iid: str, *, days_old: float, state: str = "stopped", spawner: str | None = None,
           children: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A header as ``list_headers`` gives it, last changed ``days_old`` days before NOW."""
    return {"instanceId": iid, "name": f"agent-{iid}", "state": state, "spawnerInstanceId": spawner,
            "children": list(children), "updatedAt": (NOW - dt.timedelta(days=days_old)).isoformat(), **extra}


def test_a_tree_goes_when_all_of_it_rests_past_the_retention_newest_change_first() -> None:
    """A root and its children are one tree: it expires by its newest change, oldest trees first."""
    headers = [
        header("old", days_old=40, children=("old-child",)),
        header("old-child", days_old=35, spawner="old", state="error"),
        header("older", days_old=90, state="waiting"),
        header("recent-child-tree", days_old=40, children=("fresh",)),
        header("fresh", days_old=1, spawner="recent-child-tree"),
        header("new", days_old=2),
    ]
    expired = expired_trees(headers, 30 * DAY, now=NOW)
    assert [(t.root, t.ids) for t in expired] == [("older", ("older",)), ("old", ("old", "old-child"))]
    assert expired[1].updated_at == (NOW - dt.timedelta(days=35)).isoformat()
    assert expired[1].name == "agent-old"


@pytest.mark.parametrize("holding", [
    {"state": "running"}, {"state": "waiting_for_approval"}, {"queued": True},
    {"pendingApprovals": [{"toolCallId": "c"}]}, {"awaitingAnswer": {"toolCallId": "q", "question": "?"}},
    {"inbox": [{"text": "hi"}]}, {"updatedAt": "not a time"},
])
def test_nothing_running_held_asking_or_with_mail_is_ever_removed(holding: dict[str, Any]) -> None:
    """An old tree one of whose instances runs, waits on a person or has unread mail stays, whole."""
    child = {**header("child", days_old=400, spawner="root"), **holding}
    headers = [header("root", days_old=400, children=("child",)), child]
    assert expired_trees(headers, DAY, now=NOW) == []


def test_a_child_never_goes_alone() -> None:
    """Only roots are candidates: an old child of a recent root stays with it."""
    headers = [header("root", days_old=0.5, children=("child",)), header("child", days_old=100, spawner="root")]
    assert expired_trees(headers, DAY, now=NOW) == []


@pytest.fixture(params=["file", "sqlite"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _store(tmp_path: Path, kind: str) -> StoreConfig:
    path = tmp_path / ("store" if kind == "file" else "store.db")
    return StoreConfig(kind=kind, options={"path": str(path)})


async def _backdate(rt: Any, instance_id: str, days: float) -> None:
    head = await rt.store.read_header(instance_id)
    head["updatedAt"] = (dt.datetime.now(dt.UTC) - dt.timedelta(days=days)).isoformat()
    await rt.store.write_header(instance_id, head)


@pytest.mark.anyio
async def test_collect_garbage_deletes_old_trees_keeps_new_ones_and_a_dry_run_deletes_nothing(
        tmp_path: Path, store_kind: str) -> None:
    """On a real store: the old tree goes (header, log, records), the new one stays; dry runs only list."""
    h = Harness(reply("one"), reply("two"))
    rt = loopwright.Runtime(Assembly(store=_store(tmp_path, store_kind), retention=Retention(instances=30 * DAY)),
                            plugins=[h], autoload=False)
    async with rt:
        old, _ = await run_to_rest(rt, defn())
        new, _ = await run_to_rest(rt, defn())
        await _backdate(rt, old.instance_id, 31)
        dry = await rt.collect_garbage(dry_run=True)
        assert ([t.root for t in dry.expired], dry.deleted, dry.dry_run) == ([old.instance_id], (), True)
        await rt.store.read_header(old.instance_id)  # still there
        done = await rt.collect_garbage()
        assert done.deleted == (old.instance_id,)
        with pytest.raises(InstanceNotFoundError):
            await rt.store.read_header(old.instance_id)
        assert await rt.store.read_entries(new.instance_id)
        again = await rt.collect_garbage()
        assert (again.expired, again.deleted) == ((), ())


@pytest.mark.anyio
async def test_a_tree_another_runner_holds_is_left_for_the_next_pass(tmp_path: Path) -> None:
    """A lease held elsewhere is never broken: the tree is skipped with the reason, and goes later."""
    h = Harness(reply("one"))
    rt = make_runtime(tmp_path, h, retention=Retention(instances=DAY))
    async with rt:
        old, _ = await run_to_rest(rt, defn())
        await _backdate(rt, old.instance_id, 2)
        lease = await rt.store.acquire(old.instance_id, "another worker")
        try:
            done = await rt.collect_garbage()
        finally:
            lease.release()
        assert done.deleted == ()
        assert [root for root, _reason in done.skipped] == [old.instance_id]
        assert (await rt.collect_garbage()).deleted == (old.instance_id,)


@pytest.mark.anyio
async def test_without_a_retention_collect_garbage_says_so(tmp_path: Path) -> None:
    """No ``retention.instances`` and no ``keep``: an error that says what to set, and nothing deleted."""
    rt = make_runtime(tmp_path, Harness())
    async with rt:
        with pytest.raises(LoopwrightError, match="retention"):
            await rt.collect_garbage()


def _lw(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def _project(tmp_path: Path, retention: str = "") -> Path:
    (tmp_path / "loopwright.yaml").write_text(f"store: {{kind: file, path: ./store}}\nplugins: [testing]\n{retention}")
    (tmp_path / "agent.yaml").write_text("name: agent\nmodel: test:any\n")
    return tmp_path


def _run(project: Path) -> str:
    done = _lw(project, "--json", "run", "agent.yaml", "-p", "hi")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["instanceId"])


def test_gc_on_the_command_line_dry_run_then_for_real(tmp_path: Path) -> None:
    """``gc --dry-run`` names what would go and keeps it; ``gc`` deletes it; ``ls`` no longer lists it."""
    project = _project(tmp_path, "retention: {instances: 30d}\n")
    iid = _run(project)
    kept = _lw(project, "gc")
    assert (kept.returncode, kept.stdout) == (0, "nothing is past its retention\n"), kept.stderr
    dry = _lw(project, "gc", "--dry-run", "--keep", "0s")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith(f"would delete {iid} (agent), unchanged since ")
    assert iid in _lw(project, "ls").stdout
    done = _lw(project, "--json", "gc", "--keep", "0s")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deleted"] == [iid]
    assert iid not in _lw(project, "ls").stdout


def test_gc_without_a_retention_is_bad_input(tmp_path: Path) -> None:
    """No retention and no ``--keep``: exit 2, naming the key to set."""
    project = _project(tmp_path)
    _run(project)
    done = _lw(project, "gc")
    assert done.returncode == 2
    assert "retention" in done.stderr


def test_an_idle_worker_applies_the_retention(tmp_path: Path) -> None:
    """``worker --once`` with nothing to run deletes what is past ``retention.instances`` and says so."""
    project = _project(tmp_path, "retention: {instances: 1ms}\n")
    iid = _run(project)
    done = _lw(project, "worker", "--once")
    assert done.returncode == 0, done.stderr
    assert f"deleted {iid} (past its retention)" in done.stdout
    assert iid not in _lw(project, "ls").stdout


def test_a_bad_retention_names_its_line(tmp_path: Path) -> None:
    """``retention.instances`` takes the duration grammar, days included; anything else is refused at its place."""
    project = _project(tmp_path, "retention: {instances: 30 days}\n")
    done = _lw(project, "gc")
    assert done.returncode == 2
    assert "loopwright.yaml:3:" in done.stderr
