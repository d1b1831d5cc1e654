"""``loopwright worker`` on the postgres store: work left by other processes, and two workers at once.

Every CLI call is a new process (the ``loopwright`` console script), as workers on other
machines would be. The models and tools are ``core/tests/worker_plugin.py``'s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopwright import call_digest
from loopwright.abc import StoreSettings

LOOPWRIGHT = str(Path(sys.executable).with_name("loopwright"))
PLUGIN = Path(__file__).resolve().parents[3] / "core" / "tests" / "worker_plugin.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str, pg_schema: str) -> Path:
    """A folder with an assembly on the test schema, the worker plugin and a definition per script."""
    shutil.copy(PLUGIN, tmp_path / "worker_plugin.py")
    (tmp_path / "loopwright.yaml").write_text(
        f"store:\n  kind: postgres\n  dsnEnv: LW_WORKER_DSN\n  schema: {pg_schema}\n"
        "plugins: [loopwright_postgres, worker_plugin.py]\n")
    for name, tools in (("chat", "[]"), ("slow", "[nap]"), ("approve", "[delete]"), ("brief", "[nap]")):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nmodel: script:{name}\ntools: {tools}\n")
    return tmp_path


def _env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    return {**env, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1", "LW_WORKER_DSN": dsn}


def lw(project: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOOPWRIGHT, *args], cwd=project, env=_env(dsn), capture_output=True, text=True,
                          timeout=60, check=False)


def start(project: Path, dsn: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([LOOPWRIGHT, *args], cwd=project, env=_env(dsn), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_json(project: Path, dsn: str, *args: str) -> dict[str, Any]:
    done = lw(project, dsn, "run", "--json", *args)
    assert done.returncode in (0, 3), done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def store_call(dsn: str, schema: str, fn: Any) -> Any:
    """Run ``await fn(store)`` on a PostgresStore of the test schema, from this (another) process."""
    from loopwright_postgres import PostgresStore  # noqa: PLC0415

    async def main() -> Any:
        settings = StoreSettings(kind="postgres", base_dir=Path.cwd(), options={"dsn": dsn, "schema": schema})
        async with PostgresStore(settings) as store:
            return await fn(store)
    return anyio.run(main)


def post_message(dsn: str, schema: str, iid: str, text: str) -> None:
    store_call(dsn, schema, lambda store: store.post(
        iid, {"type": "message", "text": text, "source": "api", "at": "2026-01-01T00:00:00Z"}))


def test_once_on_an_empty_store_exits_0(project: Path, pg_dsn: str) -> None:
    """--once with nothing to do exits 0 and prints nothing."""
    done = lw(project, pg_dsn, "worker", "--once", "--json")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_runner_killed_mid_run_is_resumed(project: Path, pg_dsn: str) -> None:
    """SIGKILL frees the advisory lock; a worker finds the instance and resumes it."""
    proc = start(project, pg_dsn, "run", "slow.yaml")
    try:
        deadline = time.monotonic() + 30
        while not (project / "slow.started").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.communicate()
    (running,) = json.loads(lw(project, pg_dsn, "ls", "--state", "running", "--json").stdout)
    done = lw(project, pg_dsn, "worker", "--once", "--json")
    assert done.returncode == 0, done.stderr
    picked, finished = events(done.stdout)
    assert (picked["instanceId"], picked["reason"]) == (running["instanceId"], "resume")
    assert finished["text"].startswith("after slow: the call was interrupted")


def test_mail_and_decisions_written_elsewhere_are_picked_up(project: Path, pg_dsn: str, pg_schema: str) -> None:
    """A message posted to a resting instance and a decision written to a held call are both run."""
    chat = run_json(project, pg_dsn, "chat.yaml", "-p", "first")["instanceId"]
    held = run_json(project, pg_dsn, "approve.yaml")["instanceId"]
    idle = lw(project, pg_dsn, "worker", "--once", "--json")
    assert (idle.returncode, idle.stdout) == (0, "")  # resting, and a call still undecided

    async def decide(store: Any) -> None:
        h = await store.read_header(held)
        # A decision is bound to its call by ``decisionDigest`` (issue 11): one written without it is held again.
        h["pendingApprovals"] = [{**p, "decision": "denied", "decisionReason": "no",
                                  "decisionDigest": call_digest(p["tool"], p["arguments"])}
                                 for p in h["pendingApprovals"]]
        await store.write_header(held, h)

    post_message(pg_dsn, pg_schema, chat, "from elsewhere")
    store_call(pg_dsn, pg_schema, decide)
    done = lw(project, pg_dsn, "worker", "--once", "--json")
    assert done.returncode == 0, done.stderr
    got = {(e["event"], e["instanceId"]): e for e in events(done.stdout)}
    assert got[("pickedUp", chat)]["reason"] == "message"
    assert got[("pickedUp", held)]["reason"] == "approval"
    assert got[("finished", chat)]["text"] == "answer to: from elsewhere"
    assert got[("finished", held)]["text"].startswith("result: denied")
    assert len(got) == 4


def test_two_workers_never_run_one_instance_twice(project: Path, pg_dsn: str, pg_schema: str) -> None:
    """Two workers on one database share the work: each instance's message is answered exactly once."""
    ids = [run_json(project, pg_dsn, "brief.yaml")["instanceId"] for _ in range(6)]
    workers = [start(project, pg_dsn, "worker", "--poll", "20ms", "--json", "--max-concurrent", "4")
               for _ in range(2)]
    try:
        time.sleep(0.3)  # both are polling before the work appears
        for iid in ids:
            post_message(pg_dsn, pg_schema, iid, f"go {iid}")
        deadline = time.monotonic() + 30
        while True:
            states = json.loads(lw(project, pg_dsn, "ls", "--json").stdout)
            if all(s["state"] == "waiting" and s["usage"]["totalTokens"] == 45 for s in states):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.1)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        outs = [w.communicate(timeout=30) for w in workers]
    finally:
        for w in workers:
            w.kill()
    assert [w.returncode for w in workers] == [0, 0], [err for _out, err in outs]
    seen = [(e["event"], e["instanceId"]) for out, _err in outs for e in events(out)]
    assert Counter(seen) == Counter([("pickedUp", iid) for iid in ids] + [("finished", iid) for iid in ids])
    for iid in ids:
        records = [json.loads(r) for r in lw(project, pg_dsn, "records", iid, "--kind", "turn").stdout.splitlines()]
        assert [r["data"]["turn"] for r in records] == [1, 2, 3]
        calls = lw(project, pg_dsn, "records", iid, "--kind", "tool_call").stdout.splitlines()
        assert len(calls) == 1


@pytest.mark.anyio
async def test_find_work_leaves_out_rest_and_held_leases_and_uses_its_index(
    store_factory: Any, pg_dsn: str, pg_schema: str,
) -> None:
    """find_work lists decided approvals, unread mail and running instances without a live lease; indexed."""
    import psycopg  # noqa: PLC0415

    store = store_factory()
    try:
        headers: dict[str, dict[str, Any]] = {
            "resting": {"state": "waiting"},
            "mail": {"state": "stopped", "inboxCursor": 0},
            "read": {"state": "waiting"},
            "undecided": {"state": "waiting_for_approval", "pendingApprovals": [{"toolCallId": "a", "decision": None}]},
            "decided": {"state": "waiting_for_approval", "pendingApprovals": [{"toolCallId": "a",
                                                                               "decision": "approved"}]},
            "dead": {"state": "running"},
            "live": {"state": "running"},
            "nul": {"state": "waiting", "text": "\u0000"},
        }
        for iid, h in headers.items():
            await store.create(iid, {"instanceId": iid, **h})
        await store.post("mail", {"type": "message", "text": "hi"})
        await store.post("read", {"type": "message", "text": "hi"})
        _posts, cursor = await store.read_posts("read", 0)
        await store.write_header("read", {"instanceId": "read", "state": "waiting", "inboxCursor": cursor})
        other = store_factory()
        lease = await other.acquire("live", "someone else")
        try:
            assert await store.find_work(limit=10) == ["mail", "decided", "dead"]
            assert len(await store.find_work(limit=1)) == 1
        finally:
            lease.release()
            await other.aclose()
        assert set(await store.find_work(limit=10)) == {"mail", "decided", "dead", "live"}
    finally:
        await store.aclose()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(row[0] for row in conn.execute(
            f"EXPLAIN SELECT id FROM {pg_schema}.instances WHERE (state = 'running' OR (state = "  # noqa: S608
            "'waiting_for_approval' AND decided) OR (state IN ('waiting', 'stopped', 'error') AND "
            "last_post > inbox_cursor)) ORDER BY state = 'running', updated_at, id LIMIT 5").fetchall())
    assert "instances_work" in plan, plan


@pytest.mark.anyio
async def test_tables_made_before_find_work_get_its_columns(store_factory: Any, pg_dsn: str, pg_schema: str) -> None:
    """A schema whose instances table lacks the find_work columns gets them, filled from headers and posts."""
    import psycopg  # noqa: PLC0415

    store = store_factory()
    try:
        await store.create("old", {"instanceId": "old", "state": "waiting", "inboxCursor": 0})
        await store.post("old", {"type": "message", "text": "hi"})
    finally:
        await store.aclose()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP INDEX {pg_schema}.instances_work")
        for column in ("state", "inbox_cursor", "decided", "last_post"):
            conn.execute(f"ALTER TABLE {pg_schema}.instances DROP COLUMN {column}")
    again = store_factory()
    try:
        assert await again.find_work(limit=5) == ["old"]
    finally:
        await again.aclose()
