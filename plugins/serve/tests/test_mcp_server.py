"""The MCP server, driven by the official ``mcp`` client over streamable HTTP (``loopwright serve``) and stdio
(``loopwright mcp-serve``), and used back as an MCP tool source by a loopwright runtime."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _protocols_testlib import TOKEN_ENV, TOKENS, make_project, transcript, working
from _serve_testlib import Server, clean_env, serving
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from loopwright import approval_digest

pytestmark = pytest.mark.anyio

AGENTS = {
    "mcp_list": ["unused"],
    "mcp_work": [{"text": "working", "toolCalls": [{"name": "echo", "arguments": {"text": "one"}}]},
                 {"toolCalls": [{"name": "echo", "arguments": {"text": "two"}}]},
                 "worked twice"],
    "mcp_approve": [{"toolCalls": [{"name": "delete", "arguments": {"path": "m.txt"}, "id": "call_m"}]}, "done"],
    "mcp_ask": [{"toolCalls": [{"name": "ask_user", "arguments": {"question": "Which city?"}}]}],
    "mcp_stdio": [{"toolCalls": [{"name": "echo", "arguments": {"text": "piped"}}]}, "answered over stdio"],
    "mcp_inputs": ["cloudy"],
    "mcp_target": ["the served agent's answer"],
}
#: Seconds a call may take before the test counts it as hung (a guard only).
GUARD = 60.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("mcp"), AGENTS, tools={"mcp_ask": ["ask_user"]}, keys={
        "mcp_inputs": {"systemPrompt": "Weather for {{ city }}.",
                       "inputs": {"city": {"type": "string", "description": "Where."}}}})


@pytest.fixture(scope="module")
def server(project: Path) -> Iterator[Server]:
    with serving(project, env=TOKEN_ENV) as running:
        yield running


@contextlib.asynccontextmanager
async def _http_client(server: Server, token: str = TOKENS["runner"]) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http, \
            Client(streamable_http_client(f"{server.url}/mcp", http_client=http), read_timeout_seconds=GUARD) as client:
        yield client


def _stdio(project: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "loopwright.cli", "mcp-serve", "-c", str(project)],
                                 env=clean_env(), cwd=str(project.parent))


async def test_every_registered_definition_is_a_tool(server: Server) -> None:
    """``list_tools`` over HTTP: one tool per definition, input ``{prompt, inputs?}``, with an output schema."""
    async with _http_client(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert sorted(tools) == sorted(AGENTS)
    tool = tools["mcp_list"]
    assert tool.description == "The test agent mcp_list."
    assert tool.input_schema["required"] == ["prompt"]
    assert set(tool.input_schema["properties"]) == {"prompt", "inputs"}
    assert "instanceId" in (tool.output_schema or {})["properties"]


async def test_a_call_answers_with_the_agents_text_and_reports_progress(server: Server, project: Path) -> None:
    """A call runs the agent (its own tools inside), sends progress per turn and tool call, and names the instance."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async with _http_client(server) as client:
        result = await client.call_tool("mcp_work", {"prompt": "work twice"}, progress_callback=on_progress)
    assert not result.is_error
    assert [block.text for block in result.content] == ["worked twice"]  # type: ignore[union-attr]
    structured = result.structured_content or {}
    assert structured["state"] == "waiting"
    assert structured["text"] == "worked twice"
    instance_id = structured["instanceId"]
    assert [m["content"] for m in transcript(project, instance_id) if m["role"] == "tool"] == ["echo: one", "echo: two"]
    values = [value for value, _total, _message in progress]
    assert values == sorted(values)
    assert len(values) >= 4  # two tool calls and at least two finished turns
    assert all(instance_id in (message or "") for _v, _t, message in progress)
    assert any("calling echo" in (message or "") for _v, _t, message in progress)


async def test_a_call_held_for_approval_is_a_result_that_says_so(server: Server, project: Path) -> None:
    """A held call is no error: the text says the agent waits, and the structured content lists the call.

    The call is named by the runtime's own id and shown with the digest a decision on it must carry.
    """
    async with _http_client(server) as client:
        result = await client.call_tool("mcp_approve", {"prompt": "delete m.txt"})
    assert not result.is_error
    structured = result.structured_content or {}
    assert structured["state"] == "waiting_for_approval"
    header = json.loads((project.parent / "store" / structured["instanceId"] / "instance.json").read_text())
    (saved,) = header["pendingApprovals"]
    call = saved["toolCallId"]
    assert re.fullmatch(r"lw-1-0-[0-9a-f]{6}", call), call  # the model named it call_m
    assert structured["pendingApprovals"] == [
        {"toolCallId": call, "digest": approval_digest(saved), "tool": "delete", "arguments": {"path": "m.txt"}}]
    text = result.content[0].text  # type: ignore[union-attr]
    assert "waiting for approval" in text
    assert structured["instanceId"] in text
    assert f"call {call}, digest {approval_digest(saved)}" in text


async def test_an_agent_asking_the_user_answers_with_its_question(server: Server) -> None:
    """An ``ask_user`` rest: the text and the structured content carry the question, and the instance to answer."""
    async with _http_client(server) as client:
        result = await client.call_tool("mcp_ask", {"prompt": "weather?"})
    assert not result.is_error
    structured = result.structured_content or {}
    assert structured["question"] == "Which city?"
    assert structured["state"] == "waiting"
    text = result.content[0].text  # type: ignore[union-attr]
    assert "Which city?" in text
    assert structured["instanceId"] in text


async def test_inputs_are_in_the_schema_and_reach_the_definition(server: Server, project: Path) -> None:
    """The tool's ``inputs`` lists the definition's inputs; given, they are templated into its prompts."""
    async with _http_client(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        result = await client.call_tool("mcp_inputs", {"prompt": "weather?", "inputs": {"city": "Oslo"}})
    inputs = tools["mcp_inputs"].input_schema["properties"]["inputs"]
    assert inputs["properties"] == {"city": {"type": "string", "description": "Where."}}
    assert inputs["required"] == ["city"]
    assert result.content[0].text == "cloudy"  # type: ignore[union-attr]
    instance_id = (result.structured_content or {})["instanceId"]
    assert transcript(project, instance_id)[0]["content"] == "Weather for Oslo."


async def test_bad_arguments_are_an_error_result(server: Server) -> None:
    """A call without a prompt is an ``is_error`` result that says what is missing (no instance starts)."""
    async with _http_client(server) as client:
        result = await client.call_tool("mcp_list", {"inputs": {}})
    assert result.is_error
    assert "prompt" in result.content[0].text  # type: ignore[union-attr]


async def test_mcp_serve_over_stdio(project: Path) -> None:
    """``loopwright mcp-serve -c ASSEMBLY``: the same tools over stdio, with progress and the instance id."""
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async with Client(_stdio(project), read_timeout_seconds=GUARD) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        result = await client.call_tool("mcp_stdio", {"prompt": "over the pipe"}, progress_callback=on_progress)
    assert sorted(names) == sorted(AGENTS)
    assert [block.text for block in result.content] == ["answered over stdio"]  # type: ignore[union-attr]
    instance_id = (result.structured_content or {})["instanceId"]
    assert any("calling echo" in (m or "") for m in progress), progress
    assert transcript(project, instance_id)[0]["content"] == "over the pipe"


def test_mcp_serve_without_loopwright_serve_exits_2_with_the_pip_hint(tmp_path: Path) -> None:
    """Without the loopwright-serve package, ``mcp-serve`` exits 2 and says what to install."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['loopwright_serve'] = None\n")
    env = clean_env({"PYTHONPATH": str(tmp_path)})
    proc = subprocess.run([sys.executable, "-m", "loopwright.cli", "mcp-serve"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=GUARD, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert 'pip install "loopwright[serve]"' in proc.stderr


def test_a_loopwright_runtime_uses_the_served_agents_as_mcp_tools(server: Server, tmp_path: Path) -> None:
    """The loop closes: another assembly names the server in pluginSettings.mcp, and its agent calls the served one."""
    caller = tmp_path / "caller"
    (caller / "agents").mkdir(parents=True)
    servers = {"served": {"url": f"{server.url}/mcp", "headers": {"Authorization": f"Bearer {TOKENS['runner']}"}}}
    replies = [{"toolCalls": [{"name": "served__mcp_target", "arguments": {"prompt": "answer me"}, "id": "call_s"}]},
               "relayed"]
    (caller / "loopwright.yaml").write_text(json.dumps({
        "store": {"kind": "file", "path": "./store"}, "plugins": ["mcp"],
        "pluginSettings": {"mcp": {"servers": servers}},
        "providers": {"script": {"kind": "scripted", "replies": replies}},
    }))
    (caller / "agents" / "caller.yaml").write_text(json.dumps(
        {"name": "caller", "model": "script:any", "tools": ["served__mcp_target"]}))
    proc = subprocess.run([sys.executable, "-m", "loopwright.cli", "run", "--json", "agents/caller.yaml", "-p", "ask"],
                          cwd=caller, env=clean_env(), capture_output=True, text=True, timeout=GUARD, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["text"] == "relayed"
    messages = transcript(caller / "loopwright.yaml", result["instanceId"])
    tool_result: dict[str, Any] = next(m for m in messages if m["role"] == "tool")
    assert tool_result["status"] == "success"
    assert tool_result["content"] == "the served agent's answer"


async def test_a_server_that_does_not_run_agents_answers_through_a_worker(tmp_path: Path) -> None:
    """``server.run: false``: a tool call is submitted, a ``loopwright worker`` runs it, its answer is the result."""
    assembly = make_project(tmp_path, {"mcp_queued": ["answered by the worker"]})
    assembly.write_text(assembly.read_text().replace("server: {tokens:", "server: {run: false, tokens:"))
    with serving(assembly, env=TOKEN_ENV) as queued, working(assembly, clean_env(TOKEN_ENV)):
        async with _http_client(queued) as client:
            result = await client.call_tool("mcp_queued", {"prompt": "queue it"})
    assert [block.text for block in result.content] == ["answered by the worker"]  # type: ignore[union-attr]
    instance_id = (result.structured_content or {})["instanceId"]
    header = json.loads((tmp_path / "store" / instance_id / "instance.json").read_text())
    assert header["submittedBy"] != header["runner"]
