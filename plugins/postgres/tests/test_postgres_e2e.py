"""End to end on a postgres store: agents run, are shown, listed and continued from other processes.

Every CLI call is a new process (the ``loopwright`` console script), as operators and workers
on other machines would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import loopwright
from loopwright.errors import InstanceLockedError

pytestmark = pytest.mark.anyio

LOOPWRIGHT = str(Path(sys.executable).with_name("loopwright"))


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str, pg_schema: str) -> Path:
    """A folder with an assembly on the test schema (DSN from an env var) and one agent definition."""
    (tmp_path / "loopwright.yaml").write_text(
        f"store:\n  kind: postgres\n  dsnEnv: LW_E2E_DSN\n  schema: {pg_schema}\n", encoding="utf-8")
    (tmp_path / "echo.yaml").write_text(
        "name: echo\nmodel: test:any\nsystemPrompt: You answer.\n", encoding="utf-8")
    return tmp_path


def cli(project: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LW_E2E_DSN": dsn}
    return subprocess.run([LOOPWRIGHT, *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def ok_json(proc: subprocess.CompletedProcess[str]) -> object:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cli_run_show_records_ls_and_message_across_processes(project: Path, pg_dsn: str) -> None:
    """An agent run by one process is shown, listed and continued by others, all through the database."""
    started = ok_json(cli(project, pg_dsn, "run", "echo.yaml", "-p", "first question", "--json"))
    assert isinstance(started, dict)
    iid = started["instanceId"]
    assert (started["state"], started["text"]) == ("waiting", "test answer to: first question")
    assert not (project / ".loopwright").exists()  # nothing went to the file store

    shown = ok_json(cli(project, pg_dsn, "show", iid, "--json"))
    assert isinstance(shown, dict)
    assert (shown["instanceId"], shown["state"], shown["stopReason"]) == (iid, "waiting", "waiting")

    listed = ok_json(cli(project, pg_dsn, "ls", "--json"))
    assert isinstance(listed, list)
    assert [s["instanceId"] for s in listed] == [iid]

    records = cli(project, pg_dsn, "records", iid)
    assert records.returncode == 0, records.stderr
    kinds = [json.loads(line)["kind"] for line in records.stdout.splitlines()]
    assert "turn" in kinds
    assert "state" in kinds

    continued = ok_json(cli(project, pg_dsn, "message", iid, "second question", "--json"))
    assert isinstance(continued, dict)
    assert (continued["instanceId"], continued["state"]) == (iid, "waiting")
    assert continued["text"] == "test answer to: second question"


async def test_runtime_resumes_by_id_and_takes_a_message_posted_by_another_process(
    project: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Runtime on the postgres store runs an agent; a message from another process continues it here."""
    monkeypatch.setenv("LW_E2E_DSN", pg_dsn)
    monkeypatch.chdir(project)
    async with loopwright.Runtime.from_file(project / "loopwright.yaml") as rt:
        assert type(rt.store).__name__ == "PostgresStore"
        run = await rt.start_agent("echo.yaml", prompt="hello")
        result = await run.result()
        assert (result.state.value, result.text) == ("waiting", "test answer to: hello")
        iid = run.instance_id

    # Another process posts a message and continues the instance itself.
    continued = ok_json(cli(project, pg_dsn, "message", iid, "from elsewhere", "--json"))
    assert isinstance(continued, dict)
    assert continued["text"] == "test answer to: from elsewhere"

    # A new runtime (a restarted process) loads it by id with the whole transcript.
    async with loopwright.Runtime.from_file(project / "loopwright.yaml") as rt:
        again = await rt.get_agent(iid)
        users = [m.content for m in again.inst.transcript if m.role == "user"]
        assert users == ["hello", "from elsewhere"]
        await again.message("and once more")
        assert (await again.result()).text == "test answer to: and once more"
        # While this runtime holds the lease, another runtime cannot take it.
        lease = await rt.store.acquire(iid, rt.owner)
        try:
            async with loopwright.Runtime.from_file(project / "loopwright.yaml") as other:
                with pytest.raises(InstanceLockedError):
                    await other.resume(iid)
        finally:
            lease.release()
