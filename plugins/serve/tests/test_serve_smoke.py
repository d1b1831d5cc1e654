"""``loopwright serve`` starts as a subprocess, prints its URL, answers /healthz, and stops on SIGTERM."""

from __future__ import annotations

import subprocess
from pathlib import Path

from _serve_testlib import clean_env, serve_command, serving


def test_serve_starts_answers_healthz_and_stops(tmp_path: Path) -> None:
    assembly = tmp_path / "loopwright.yaml"
    assembly.write_text("store: {kind: file, path: ./store}\n")
    with serving(assembly) as server:
        with server.client() as client:
            health = client.get("/healthz")
            assert health.status_code == 200
            assert health.json()["status"] == "ok"
            listed = client.get("/v1/instances")
            assert listed.status_code == 200
            assert listed.json() == []
        process = server.process
    assert process.returncode == 0, server.stderr
    assert "loopback only" in server.stderr


def _serve_exits(assembly: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(serve_command(assembly, *extra), cwd=assembly.parent, env=clean_env(env),
                          capture_output=True, text=True, timeout=60, check=False)


def test_an_unset_token_variable_is_a_config_error_with_its_place(tmp_path: Path) -> None:
    assembly = tmp_path / "loopwright.yaml"
    assembly.write_text("server:\n  tokens:\n    - {name: ci, tokenEnv: SERVE_TEST_UNSET, scopes: [read]}\n")
    proc = _serve_exits(assembly)
    assert proc.returncode == 2, proc.stderr
    assert "\n  loopwright.yaml:3:" in proc.stderr  # beneath the working directory: named relative to it
    assert "SERVE_TEST_UNSET" in proc.stderr
    assert "listening" not in proc.stdout


def test_a_non_loopback_host_without_tokens_is_refused(tmp_path: Path) -> None:
    assembly = tmp_path / "loopwright.yaml"
    assembly.write_text("store: {kind: file, path: ./store}\n")
    proc = _serve_exits(assembly, "--host", "0.0.0.0")  # noqa: S104 - refused before anything is bound
    assert proc.returncode == 2, proc.stderr
    assert "without tokens" in proc.stderr
    assert "listening" not in proc.stdout
