"""MCP servers configured in loopwright.yaml: registered per runtime, stopped when that runtime closes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from _mcp_testlib import server_processes, stdio_server

import loopwright
import loopwright_mcp
from loopwright.errors import ConfigError
from loopwright_testing import FakeProvider, reply, tool_call

pytestmark = pytest.mark.anyio


def write_assembly(folder: Path, servers: dict[str, Any], **extra: Any) -> Path:
    """Write a loopwright.yaml (JSON is YAML) loading the mcp entry point with ``servers``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "loopwright.yaml"
    path.write_text(json.dumps({
        "store": {"path": str(folder / "store")},
        "plugins": ["mcp"],
        "pluginSettings": {"mcp": {"servers": servers}},
        **extra,
    }))
    return path


class FakeModels:
    """Serves ``fake:*`` with one FakeProvider."""

    def __init__(self) -> None:
        self.provider = FakeProvider()

    @loopwright.hookimpl
    def loopwright_register_providers(self, register: Any) -> None:
        register("fake", lambda _settings: self.provider)


def agent(*tools: str) -> dict[str, Any]:
    return {"name": "yaml-mcp", "model": "fake:any", "tools": list(tools)}


async def echo_through(rt: loopwright.Runtime, models: FakeModels, tool: str, text: str) -> loopwright.Message:
    """Run one scripted turn calling ``tool`` and return the tool's message."""
    models.provider.enqueue(reply(None, tool_call(tool, text=text)), "Done.")
    with anyio.fail_after(20):
        result = await (await rt.start_agent(agent(tool), prompt="Echo.")).result()
    assert result.text == "Done."
    message: loopwright.Message = models.provider.history[-1].messages[-1]
    assert message.role == "tool"
    return message


async def wait_until_gone(before: set[int]) -> None:
    with anyio.fail_after(5):
        while set(server_processes()) - before:
            await anyio.sleep(0.05)


async def test_servers_in_the_assembly_are_registered_called_and_stopped_on_close(
    tmp_path: Path, anyio_backend: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pluginSettings.mcp.servers → Runtime.from_file → SERVER__TOOL tools that work; closing stops the server."""
    monkeypatch.delenv(loopwright_mcp.CONFIG_ENV, raising=False)
    before = set(server_processes())
    path = write_assembly(tmp_path, {"yml": stdio_server(tools=["echo", "slow"], timeout=5),
                                     "off": {"command": "nowhere", "disabled": True}})
    models = FakeModels()
    async with loopwright.Runtime.from_file(path, plugins=[models], autoload=False) as rt:
        assert rt.plugins.registered_by("mcp") == {"tool": ["yml__echo", "yml__slow"]}
        assert rt.plugins.tools.get("yml__slow").timeout == 5.0
        assert len(set(server_processes()) - before) == 1
        message = await echo_through(rt, models, "yml__echo", "from yaml")
        assert (message.status, message.content) == ("success", "from yaml")
    await wait_until_gone(before)


async def test_two_runtimes_have_their_own_servers_and_close_apart(
    tmp_path: Path, anyio_backend: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runtimes of one process each start their own server; closing one leaves the other working."""
    monkeypatch.delenv(loopwright_mcp.CONFIG_ENV, raising=False)
    before = set(server_processes())
    first_models, second_models = FakeModels(), FakeModels()
    first = loopwright.Runtime.from_file(write_assembly(tmp_path / "a", {"same": stdio_server()}),
                                         plugins=[first_models], autoload=False)
    second = loopwright.Runtime.from_file(write_assembly(tmp_path / "b", {"same": stdio_server()}),
                                          plugins=[second_models], autoload=False)
    async with second:
        async with first:
            mine = set(server_processes()) - before
            assert len(mine) == 2
            message = await echo_through(first, first_models, "same__echo", "one")
            assert message.content == "one"
        with anyio.fail_after(5):
            while len(set(server_processes()) - before) != 1:
                await anyio.sleep(0.05)
        message = await echo_through(second, second_models, "same__echo", "still here")
        assert (message.status, message.content) == ("success", "still here")
    await wait_until_gone(before)


async def test_a_runtime_that_fails_to_open_leaves_no_server(
    tmp_path: Path, anyio_backend: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When a later server cannot be listed, the servers started for the runtime are stopped at once."""
    monkeypatch.delenv(loopwright_mcp.CONFIG_ENV, raising=False)
    before = set(server_processes())
    path = write_assembly(tmp_path, {"good": stdio_server(), "bad": stdio_server(tools=["nope"])})
    with pytest.raises(loopwright.errors.PluginError, match="has no tool nope"):
        async with loopwright.Runtime.from_file(path, autoload=False):
            pass
    await wait_until_gone(before)


def test_the_environment_file_adds_servers_and_replaces_same_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Servers of $LOOPWRIGHT_MCP_CONFIG come after the assembly's; a name in both is the file's."""
    settings = {"mcp": {"servers": {"a": {"command": "from-yaml"}, "b": {"command": "b", "cwd": "sub"}}}}
    monkeypatch.delenv(loopwright_mcp.CONFIG_ENV, raising=False)
    assert [(s.name, s.command) for s in loopwright_mcp.configured_servers(settings)] == [
        ("a", "from-yaml"), ("b", "b")]
    assert loopwright_mcp.configured_servers(settings, base_dir=tmp_path)[1].cwd == str(tmp_path / "sub")
    env_file = tmp_path / "mcp.json"
    env_file.write_text(json.dumps({"mcpServers": {"a": {"command": "from-env"}, "c": {"url": "http://h/mcp"}}}))
    monkeypatch.setenv(loopwright_mcp.CONFIG_ENV, str(env_file))
    assert [(s.name, s.command or s.url) for s in loopwright_mcp.configured_servers(settings)] == [
        ("a", "from-env"), ("b", "b"), ("c", "http://h/mcp")]
    assert loopwright_mcp.configured_servers({}) != ()


def test_settings_given_from_python_are_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Assembly built in Python skips the schema; the plugin still names the bad key."""
    monkeypatch.delenv(loopwright_mcp.CONFIG_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"pluginSettings\.mcp: unknown keys server; known: servers"):
        loopwright_mcp.configured_servers({"mcp": {"server": {}}})
    with pytest.raises(ConfigError, match=r"pluginSettings\.mcp\.servers: server 'x': a stdio server needs"):
        loopwright_mcp.configured_servers({"mcp": {"servers": {"x": {"args": []}}}})
    assert loopwright_mcp.configured_servers({"other": {}}) == ()


def processes_with(marker: str) -> list[int]:
    """Return the ids of live processes (anyone's children) whose environment holds ``marker``."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(entry.name))
        except OSError:
            continue
    return out


def test_the_cli_lists_the_tools_of_servers_configured_in_yaml(tmp_path: Path) -> None:
    """`loopwright plugins -c loopwright.yaml --json` shows the YAML's servers' tools; no server outlives it."""
    marker = tmp_path / "cli-calls.log"
    path = write_assembly(tmp_path, {"cli": stdio_server(marker, tools=["echo", "weather"])})
    env = {k: v for k, v in os.environ.items() if k != loopwright_mcp.CONFIG_ENV}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    out = subprocess.run([sys.executable, "-m", "loopwright.cli", "plugins", "-c", str(path), "--json"],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    (mcp,) = [p for p in json.loads(out.stdout) if p["name"] == "mcp"]
    assert mcp["registered"]["tools"] == ["cli__echo", "cli__weather"]
    assert "on_runtime_close" in mcp["hooks"]
    deadline = time.monotonic() + 5
    while processes_with(str(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(str(marker)) == []
