"""Fallback models and structured output, end to end through the CLI (a subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "cli_fixtures"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "p"
    shutil.copytree(FIXTURES, root)
    return root


def lw(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_a_failing_model_falls_back_and_the_result_says_which_served(project: Path) -> None:
    """When the model fails for good, the next fallback model serves; --json and the records name it."""
    (project / "agents" / "fallback.yaml").write_text(
        "name: fallback\nmodel: replay:fail\nfallbackModels: [replay:chat]\n")
    done = lw(project, "run", "agents/fallback.yaml", "-p", "hi", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["state"], result["model"], result["text"]) == ("waiting", "replay:chat", "hello there")
    records = lw(project, "records", result["instanceId"]).stdout.splitlines()
    kinds = [json.loads(line) for line in records]
    assert [r["data"]["model"] for r in kinds if r["kind"] == "turn"] == ["replay:chat"]
    assert any(r["kind"] == "error" and r["data"].get("model") == "replay:fail" for r in kinds)


def test_every_model_failing_exits_1_naming_the_last_error(project: Path) -> None:
    """When the fallbacks fail too, the run ends in error: exit 1, the error on stderr."""
    (project / "agents" / "allfail.yaml").write_text(
        "name: allfail\nmodel: replay:fail\nfallbackModels: [replay:fail]\n")
    done = lw(project, "run", "agents/allfail.yaml", "-p", "hi")
    assert done.returncode == 1
    assert "upstream exploded" in done.stderr


def test_structured_output_is_parsed_into_output(project: Path) -> None:
    """A definition's output schema: the answer is validated and --json carries the parsed value."""
    (project / "scripts" / "structured.json").write_text(json.dumps([{"text": '{"city": "Oslo", "days": 3}'}]))
    (project / "agents" / "structured.yaml").write_text(
        "name: structured\nmodel: replay:structured\noutput:\n  type: object\n  required: [city, days]\n"
        "  properties:\n    city: {type: string}\n    days: {type: integer}\n")
    done = lw(project, "run", "agents/structured.yaml", "-p", "plan", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"city": "Oslo", "days": 3}


def test_invalid_structured_output_ends_output_invalid(project: Path) -> None:
    """Answers that keep failing the schema are re-prompted twice, then the run ends output_invalid (exit 1)."""
    (project / "scripts" / "badout.json").write_text(json.dumps([{"text": '{"city": 7}'}]))
    (project / "agents" / "badout.yaml").write_text(
        "name: badout\nmodel: replay:badout\noutput:\n  type: object\n  required: [city]\n"
        "  properties:\n    city: {type: string}\n")
    done = lw(project, "run", "agents/badout.yaml", "-p", "plan", "--json")
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert (result["stopReason"], result["output"]) == ("output_invalid", None)
    assert result["usage"]["requests"] == 3


def test_message_and_cancel_reach_a_run_in_another_process(project: Path) -> None:
    """`message` to an instance another process runs is delivered (exit 0); `cancel` stops that process's run."""
    env = {"PATH": "/usr/bin:/bin", "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    runner = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "--json", "run", "agents/slow.yaml"],
                              cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while not (project / "slow.started").exists():
            assert time.monotonic() < deadline, "the slow tool never started"
            time.sleep(0.05)
        (instance,) = json.loads(lw(project, "ls", "--json", "--state", "running").stdout)
        iid = instance["instanceId"]
        sent = lw(project, "message", iid, "are you there?")
        assert sent.returncode == 0, sent.stderr
        assert "delivered" in sent.stderr
        stopped = lw(project, "cancel", iid, "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["state"] == "stopped"
        out, _err = runner.communicate(timeout=30)
    finally:
        runner.kill()
    assert runner.returncode == 130
    assert json.loads(out)["cancelled"] is True
