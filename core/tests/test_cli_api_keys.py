"""A missing API key is bad input, named before anything is dialled; a refused plain-HTTP
connection is reported as such. Each case runs ``python -m loopwright.cli`` as a subprocess.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A local listening socket that never accepts: any connection waits in its backlog."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock
    finally:
        sock.close()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _dialled(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _lw(project: Path, *args: str, proxy: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LOOPWRIGHT_") and k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MY_KEY")
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if proxy is not None:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env[name] = proxy
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def _project(tmp_path: Path, providers: str, model: str) -> Path:
    project = tmp_path / "p"
    project.mkdir()
    (project / "loopwright.yaml").write_text(
        f"store: {{kind: file, path: ./store}}\nplugins: [openai, anthropic]\n{providers}")
    (project / "agent.yaml").write_text(f"name: agent\nmodel: {model}\n")
    return project


def _no_instance(project: Path) -> None:
    listed = _lw(project, "--json", "ls")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []


@pytest.mark.parametrize(("model", "variable"), [("openai:gpt-4o-mini", "OPENAI_API_KEY"),
                                                 ("anthropic:claude-haiku-4-5", "ANTHROPIC_API_KEY")])
def test_an_unset_vendor_key_exits_2_naming_it_and_dials_nothing(
    tmp_path: Path, listener: socket.socket, model: str, variable: str,
) -> None:
    """The vendor's key unset: exit 2 naming the variable, no connection (not even to a proxy), no instance."""
    project = _project(tmp_path, "", model)
    proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
    done = _lw(project, "run", "agent.yaml", "-p", "hi", proxy=proxy)
    assert done.returncode == 2, done.stderr
    assert f"environment variable {variable} is not set" in done.stderr
    assert "Traceback" not in done.stderr
    assert not _dialled(listener), "a connection was attempted"
    _no_instance(project)


def test_an_unset_api_key_env_exits_2_naming_it(tmp_path: Path, listener: socket.socket) -> None:
    """A provider's apiKeyEnv unset: exit 2 naming it, before any request to its baseUrl, no instance."""
    port = listener.getsockname()[1]
    project = _project(tmp_path, f"providers:\n  local: {{kind: openai, baseUrl: 'http://127.0.0.1:{port}/v1', "
                                 "apiKeyEnv: MY_KEY}\n", "local:m")
    done = _lw(project, "run", "agent.yaml", "-p", "hi")
    assert done.returncode == 2, done.stderr
    assert "environment variable MY_KEY (its apiKeyEnv) is not set" in done.stderr
    assert not _dialled(listener), "a connection was attempted"
    _no_instance(project)


def test_a_refused_plain_http_connection_says_refused_without_ssl(tmp_path: Path) -> None:
    """A baseUrl on a closed local port: the error says the connection was refused, not ``ssl:default``."""
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    project = _project(tmp_path, f"providers:\n  local: {{kind: openai, baseUrl: '{url}', maxRetries: 0}}\n",
                       "local:m")
    done = _lw(project, "run", "agent.yaml", "-p", "hi")
    assert done.returncode == 1, done.stderr
    assert "Connection refused" in done.stderr
    assert "ssl" not in done.stderr.lower()
