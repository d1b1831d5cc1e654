"""MCP servers' tools called through a real runtime, against a real MCP server run as a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from _mcp_testlib import SERVER, server_processes, stdio_server

import loopwright_mcp
from loopwright import Message, State
from loopwright.errors import ConfigError, PluginError, ToolError
from loopwright_mcp import MCPServers, parse_servers, result_value, tool_name
from loopwright_testing import reply, tool_call


@pytest.fixture(scope="module")
def call_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "calls.log"


@pytest.fixture(scope="module")
def servers(call_log: Path) -> Any:
    """Two entries for the same server: ``t`` with the defaults, ``s`` with a 1 s timeout and options."""
    with MCPServers({
        "t": stdio_server(call_log),
        "s": stdio_server(timeout=1, requiresApproval=["echo"], parallelSafe=True, tools=["echo", "slow"]),
    }) as servers:
        yield servers


@pytest.fixture
def loopwright_plugins(servers: MCPServers) -> list[object]:
    return [servers]


def agent(*tools: str) -> dict[str, Any]:
    return {"name": "mcp-user", "model": "fake:any", "tools": list(tools)}


def tool_message(fake_provider: Any, request: int = 1) -> Message:
    message: Message = fake_provider.history[request].messages[-1]
    assert message.role == "tool"
    return message


def test_tools_are_registered_with_the_servers_names_schemas_and_descriptions(servers: MCPServers) -> None:
    """Each server tool becomes SERVER__TOOL with the server's schema and description; options apply."""
    tools = {t.name: t for t in servers.tools()}
    assert sorted(tools) == sorted([
        "t__echo", "t__fail", "t__slow", "t__weather", "t__picture", tool_name("t", "dotted.name"),
        "s__echo", "s__slow",
    ])
    echo = tools["t__echo"]
    assert echo.description == "Return the text, repeated."
    assert echo.parameters["properties"]["text"] == {"title": "Text", "type": "string"}
    assert echo.parameters["required"] == ["text"]
    assert echo.parallel_safe is False
    assert echo.requires_approval is False
    assert echo.timeout is None
    assert tools["s__echo"].requires_approval is True
    assert tools["s__slow"].requires_approval is False
    assert tools["s__slow"].parallel_safe is True
    assert tools["s__slow"].timeout == 1.0


def test_names_loopwright_cannot_hold_are_cleaned_and_kept_apart() -> None:
    """Characters outside A-Za-z0-9_- and names over 64 characters get a hash suffix."""
    assert tool_name("srv", "read_file") == "srv__read_file"
    dotted = tool_name("srv", "a.b")
    assert dotted.startswith("srv__a_b-")
    assert dotted != tool_name("srv", "a/b")
    long = tool_name("srv", "x" * 80)
    assert len(long) == 64
    assert long != tool_name("srv", "x" * 81)


@pytest.mark.anyio
async def test_a_call_reaches_the_server_and_the_model_reads_the_text(runtime: Any, fake_provider: Any) -> None:
    """A successful call returns the server's text content to the model."""
    fake_provider.enqueue(reply(None, tool_call("t__echo", text="hi", times=2)), "Done.")
    run = await runtime.start_agent(agent("t__echo"), prompt="Echo.")
    result = await run.result()
    assert result.text == "Done."
    message = tool_message(fake_provider)
    assert message.status == "success"
    assert message.content == "hi hi"
    assert [t.name for t in fake_provider.history[0].tools] == ["t__echo"]
    assert fake_provider.history[0].tools[0].parameters["required"] == ["text"]


@pytest.mark.anyio
async def test_an_error_result_is_a_tool_error(runtime: Any, fake_provider: Any) -> None:
    """isError: true becomes status tool_error with the server's message, and the run goes on."""
    fake_provider.enqueue(reply(None, tool_call("t__fail", message="the disk is full")), "Sorry.")
    run = await runtime.start_agent(agent("t__fail"), prompt="Fail.")
    result = await run.result()
    assert result.text == "Sorry."
    message = tool_message(fake_provider)
    assert message.status == "tool_error"
    assert "the disk is full" in (message.content or "")


@pytest.mark.anyio
async def test_structured_content_is_kept_as_data(runtime: Any, fake_provider: Any) -> None:
    """Structured content reaches the model as its JSON and stays data on the result."""
    fake_provider.enqueue(reply(None, tool_call("t__weather", city="Oslo")), "Mild.")
    run = await runtime.start_agent(agent("t__weather"), prompt="Weather?")
    await run.result()
    message = tool_message(fake_provider)
    assert message.status == "success"
    assert json.loads(message.content or "") == {"city": "Oslo", "celsius": 21.5}


@pytest.mark.anyio
async def test_images_are_summarised(runtime: Any, fake_provider: Any) -> None:
    """An image block becomes one line with its type and size."""
    fake_provider.enqueue(reply(None, tool_call("t__picture")), "Nice.")
    run = await runtime.start_agent(agent("t__picture"), prompt="Draw.")
    await run.result()
    assert tool_message(fake_provider).content == "[image: image/png, 70 bytes]"


@pytest.mark.anyio
async def test_a_slow_call_times_out_and_the_session_still_works(runtime: Any, fake_provider: Any) -> None:
    """A call past the server's timeout gets status timeout; the next call on the same session succeeds."""
    fake_provider.enqueue(reply(None, tool_call("s__slow", seconds=30)),
                          reply(None, tool_call("s__slow", seconds=0)), "Done.")
    run = await runtime.start_agent(agent("s__slow"), prompt="Wait.")
    result = await run.result()  # the first call's status says the timeout ended it, not the 30 s sleep
    assert result.text == "Done."
    first = tool_message(fake_provider, 1)
    assert first.status == "timeout"
    assert "1 s" in (first.content or "")
    second = tool_message(fake_provider, 2)
    assert (second.status, second.content) == ("success", "slept 0.0")


@pytest.mark.anyio
async def test_invalid_arguments_never_reach_the_server(runtime: Any, fake_provider: Any, call_log: Path) -> None:
    """Arguments that fail the server's schema get invalid_arguments before the server is called."""
    fake_provider.enqueue(reply(None, tool_call("t__echo", times="twice", marker="never-sent")), "Oops.")
    run = await runtime.start_agent(agent("t__echo"), prompt="Echo.")
    await run.result()
    message = tool_message(fake_provider)
    assert message.status == "invalid_arguments"
    assert "text: required" in (message.content or "")
    assert "never-sent" not in (call_log.read_text() if call_log.exists() else "")
    assert "echo twice" not in (call_log.read_text() if call_log.exists() else "")


@pytest.mark.anyio
async def test_requires_approval_holds_the_call(runtime: Any, fake_provider: Any) -> None:
    """A tool listed under requiresApproval is held; approving it runs the call."""
    fake_provider.enqueue(reply(None, tool_call("s__echo", text="ok")), "Approved and done.")
    run = await runtime.start_agent(agent("s__echo"), prompt="Echo.")
    held = await run.result()
    assert held.state == State.WAITING_FOR_APPROVAL
    assert [p.tool for p in held.pending_approvals] == ["s__echo"]
    await run.approve()
    done = await run.result()
    assert done.text == "Approved and done."
    assert tool_message(fake_provider).content == "ok"


@pytest.mark.anyio
async def test_no_server_process_is_left_after_closing(anyio_backend: str, tmp_path: Path) -> None:
    """The session opened for listing serves the calls, and closing stops the server process."""
    import loopwright  # noqa: PLC0415
    from loopwright_testing import FakeProvider  # noqa: PLC0415

    before = set(server_processes())
    fake = FakeProvider()
    fake.enqueue(reply(None, tool_call("own__echo", text="x")), "Done.")
    assembly = loopwright.Assembly(store=loopwright.StoreConfig(kind="file", options={"path": str(tmp_path / "s")}))

    class FakePlugin:
        @loopwright.hookimpl
        def loopwright_register_providers(self, register: Any) -> None:
            register("fake", lambda _settings: fake)

    async with MCPServers({"own": stdio_server()}) as servers:
        async with loopwright.Runtime(assembly, plugins=[FakePlugin(), servers], autoload=False) as rt:
            result = await (await rt.start_agent(agent("own__echo"), prompt="Echo.")).result()
            assert result.text == "Done."
            assert len(set(server_processes()) - before) == 1
        assert len(set(server_processes()) - before) == 1  # the object, not the runtime, owns the session
    with anyio.fail_after(5):
        while set(server_processes()) - before:
            await anyio.sleep(0.05)


def test_a_server_that_cannot_start_fails_loading_with_its_name() -> None:
    """A server that does not answer is a PluginError naming the server."""
    with MCPServers({"broken": {"command": sys.executable, "args": ["-c", "pass"]}}, connect_timeout=5) as servers, \
            pytest.raises(PluginError, match="'broken'"):
        servers.tools()


def test_an_unknown_tool_in_the_allow_list_is_an_error(call_log: Path) -> None:
    """tools: [...] naming a tool the server lacks fails with the tools it has."""
    with MCPServers({"t": stdio_server(tools=["echo", "nope"])}) as servers, \
            pytest.raises(PluginError, match=r"has no tool nope; it has: dotted\.name, echo"):
        servers.tools()


def test_the_entry_point_reads_the_file_named_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LOOPWRIGHT_MCP_CONFIG names a {mcpServers: ...} file; without it the entry point registers nothing."""
    registered: list[Any] = []
    monkeypatch.delenv(loopwright_mcp.CONFIG_ENV, raising=False)
    loopwright_mcp.loopwright_register_tools(registered.extend, settings={}, runtime=None)
    assert registered == []
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"envsrv": stdio_server(tools=["echo"]),
                                                 "off": {"command": "nowhere", "disabled": True}}}))
    monkeypatch.setenv(loopwright_mcp.CONFIG_ENV, str(config))
    try:
        loopwright_mcp.loopwright_register_tools(lambda *tools: registered.extend(tools), settings={}, runtime=None)
        assert [t.name for t in registered] == ["envsrv__echo"]
    finally:
        for servers in loopwright_mcp._shared.values():
            servers.close()
        loopwright_mcp._shared.clear()


def test_importing_the_plugin_does_not_import_mcp() -> None:
    """loopwright, loopwright_mcp and `loopwright --help` stay clear of the mcp SDK."""
    code = "import sys, loopwright, loopwright_mcp; sys.exit('mcp' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    code = ("import sys; from loopwright.cli import main; sys.argv = ['loopwright', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nsys.exit('mcp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True)
    assert out.returncode == 0, out.stderr
    assert b"Usage" in out.stdout


def test_configuration_problems_name_the_server_and_key() -> None:
    """Bad names, unknown keys, missing commands and mixed transports are ConfigErrors."""
    with pytest.raises(ConfigError, match="a server name"):
        parse_servers({"a__b": {"command": "x"}})
    with pytest.raises(ConfigError, match="unknown keys colour"):
        parse_servers({"a": {"command": "x", "colour": "red"}})
    with pytest.raises(ConfigError, match="needs a command"):
        parse_servers({"a": {"args": ["x"]}})
    with pytest.raises(ConfigError, match="headers is for http"):
        parse_servers({"a": {"command": "x", "headers": {}}})
    with pytest.raises(ConfigError, match="positive number"):
        parse_servers({"a": {"command": "x", "timeout": 0}})
    (http,) = parse_servers({"mcpServers": {"h": {"url": "http://localhost:1/mcp", "headers": {"A": "b"}}}})
    assert (http.transport, http.url, http.headers) == ("http", "http://localhost:1/mcp", {"A": "b"})
    (sse,) = parse_servers({"e": {"type": "sse", "url": "https://example.invalid/sse"}})
    assert sse.transport == "sse"


def test_result_mapping_of_other_content() -> None:
    """Resource links and embedded resources are described; an error without text still says so."""
    from mcp import types  # noqa: PLC0415

    result = types.CallToolResult(content=[
        types.ResourceLink(name="log", uri="file:///tmp/log", mime_type="text/plain"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="mem://a", text="hello")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="mem://b", mime_type="application/zip", blob="AAAA")),
    ])
    assert result_value(result) == (
        "[resource link: file:///tmp/log (log, text/plain)]\n[resource: mem://a]\nhello\n"
        "[resource: mem://b, application/zip, 3 bytes]")
    with pytest.raises(ToolError, match="without a message"):
        result_value(types.CallToolResult(content=[], is_error=True))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def http_url() -> Any:
    """Run the test server over streamable HTTP on a local port."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("the HTTP test server did not start")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.anyio
async def test_streamable_http_servers_work_the_same(http_url: str, tmp_path: Path, anyio_backend: str) -> None:
    """A server reached by URL lists and answers calls like a stdio one, headers included."""
    import loopwright  # noqa: PLC0415
    from loopwright_testing import FakeProvider  # noqa: PLC0415

    fake = FakeProvider()
    fake.enqueue(reply(None, tool_call("web__echo", text="over http"), tool_call("web__fail", message="no")), "Ok.")
    assembly = loopwright.Assembly(store=loopwright.StoreConfig(kind="file", options={"path": str(tmp_path / "s")}))

    class FakePlugin:
        @loopwright.hookimpl
        def loopwright_register_providers(self, register: Any) -> None:
            register("fake", lambda _settings: fake)

    servers = MCPServers({"web": {"url": http_url, "headers": {"X-Test": "1"}}})
    async with servers, loopwright.Runtime(assembly, plugins=[FakePlugin(), servers], autoload=False) as rt:
        result = await (await rt.start_agent(agent("web__echo", "web__fail"), prompt="Go.")).result()
    assert result.text == "Ok."
    messages = fake.history[1].messages
    assert (messages[-2].status, messages[-2].content) == ("success", "over http")
    assert messages[-1].status == "tool_error"
