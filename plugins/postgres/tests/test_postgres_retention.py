"""Retention on the postgres store (issue 29, point 5): ``loopwright gc`` deletes an old tree, keeps a new one.

The same rules as on the embedded stores (``core/tests/test_retention.py``), through the CLI as a
subprocess against a real PostgreSQL server: a dry run deletes nothing, a real run deletes the
tree the retention no longer keeps, and an instance another process holds is left.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import loopwright

pytestmark = pytest.mark.anyio


def _lw(project: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LW_RET_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


async def test_gc_on_postgres_deletes_the_old_tree_and_leaves_the_new_and_the_held(
        tmp_path: Path, pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three instances: one backdated past the retention, one new, one backdated but held by another runner."""
    (tmp_path / "loopwright.yaml").write_text(
        f"store: {{kind: postgres, dsnEnv: LW_RET_DSN, schema: {pg_schema}}}\nretention: {{instances: 30d}}\n")
    (tmp_path / "echo.yaml").write_text("name: echo\nmodel: test:any\n")
    monkeypatch.setenv("LW_RET_DSN", pg_dsn)
    monkeypatch.chdir(tmp_path)
    async with loopwright.Runtime.from_file(tmp_path / "loopwright.yaml") as rt:
        ids = []
        for prompt in ("old", "new", "held"):
            run = await rt.start_agent("echo.yaml", prompt=prompt)
            await run.result()
            ids.append(run.instance_id)
        old, new, held = ids
        for iid in (old, held):
            head = await rt.store.read_header(iid)
            head["updatedAt"] = (dt.datetime.now(dt.UTC) - dt.timedelta(days=31)).isoformat()
            await rt.store.write_header(iid, head)
        dry = json.loads(_lw(tmp_path, pg_dsn, "--json", "gc", "--dry-run").stdout)
        assert (sorted(t["root"] for t in dry["expired"]), dry["deleted"]) == (sorted([old, held]), [])
        lease = await rt.store.acquire(held, "another worker")
        try:
            done = _lw(tmp_path, pg_dsn, "--json", "gc")
        finally:
            lease.release()
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["deleted"] == [old]
        assert [s["root"] for s in out["skipped"]] == [held]
        listed = {h["instanceId"] for h in await rt.store.list_headers()}
        assert listed == {new, held}
