"""Tests of the ``scripted`` provider and FakeProvider: replies from Python and YAML, and error replies."""

from __future__ import annotations

import re

import pytest
from lwtesting_tools import ToolsPlugin

import loopwright
import loopwright_testing
from loopwright import (
    Assembly,
    Definition,
    Message,
    ModelRequest,
    ModelResponse,
    ProviderSettings,
    StopReason,
    Usage,
)
from loopwright._definition import ProviderConfig, StoreConfig
from loopwright.errors import ConfigError, ProviderError, RunError
from loopwright_testing import FakeProvider, ScriptedProvider, error, load_script, reply, text, tool_call

pytestmark = pytest.mark.anyio


def _request(*texts: str) -> ModelRequest:
    return ModelRequest(
        model="m1", provider="fake", messages=tuple(Message(role="user", content=t) for t in texts or ("hi",))
    )


def _assembly(tmp_path, **providers: ProviderConfig) -> Assembly:
    return Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}), providers=providers)


async def test_replies_are_replayed_in_order():
    """Each request takes the next reply; strings, Messages and ModelResponses are all accepted."""
    fake = FakeProvider("one", Message(role="assistant", content="two"))
    fake.enqueue(ModelResponse(message=Message(role="assistant", content="three"), model="other"))
    assert fake.remaining == 3
    answers = [await fake.complete(_request()) for _ in range(3)]
    assert [a.message.content for a in answers] == ["one", "two", "three"]
    assert [a.model for a in answers] == ["m1", "m1", "other"]
    assert fake.remaining == 0
    assert fake.served == 3


async def test_helpers_build_tool_calls_with_ids_filled_in():
    """reply() and tool_call() build calls whose ids are filled in deterministically at replay."""
    fake = FakeProvider(reply("thinking", tool_call("add", a=1, b=2), tool_call("f", {"name": "x"})))
    response = await fake.complete(_request())
    calls = response.message.tool_calls
    assert response.message.content == "thinking"
    assert [(c.id, c.name, dict(c.arguments)) for c in calls] == [
        ("call_1_1", "add", {"a": 1, "b": 2}),
        ("call_1_2", "f", {"name": "x"}),
    ]
    assert response.finish_reason == "tool_calls"


async def test_usage_is_estimated_unless_given():
    """A reply without usage gets the characters/4 estimate; an explicit usage is kept."""
    fake = FakeProvider(text("abcd"), text("x", usage=Usage(input_tokens=7, output_tokens=3, requests=1)))
    first = await fake.complete(_request("x" * 8))
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.requests) == (2, 1, 1)
    second = await fake.complete(_request())
    assert second.usage == Usage(input_tokens=7, output_tokens=3, requests=1)


async def test_history_keeps_a_snapshot_of_each_request():
    """history holds every request with its messages as they were when it was sent."""
    fake = FakeProvider("a", "b")
    live = loopwright.Transcript([Message(role="user", content="hi")])
    await fake.complete(ModelRequest(model="m", provider="fake", messages=live))
    live.append(Message(role="assistant", content="a"))
    live.append(Message(role="user", content="more"))
    await fake.complete(ModelRequest(model="m", provider="fake", messages=live))
    assert [len(r.messages) for r in fake.history] == [1, 3]


async def test_running_out_is_a_clear_permanent_error():
    """A request with no reply left raises a non-transient ProviderError saying the script ran out."""
    fake = FakeProvider("only")
    await fake.complete(_request())
    with pytest.raises(ProviderError, match="script ran out") as caught:
        await fake.complete(_request())
    assert caught.value.transient is False
    assert caught.value.provider == "fake"
    assert caught.value.model == "m1"
    assert len(fake.history) == 2


async def test_error_replies_raise_provider_errors():
    """ScriptedError replies become ProviderErrors; exception instances are raised as they are."""
    boom = ProviderError("custom", provider="elsewhere", status=401)
    fake = FakeProvider(
        error("overloaded", status=503, transient=True, retry_after=2),
        boom,
        {"error": {"status": 429, "message": "slow down", "retryAfter": 1.5}},
        RuntimeError("bug"),
    )
    with pytest.raises(ProviderError) as first:
        await fake.complete(_request())
    assert (first.value.status, first.value.transient, first.value.retry_after) == (503, True, 2)
    assert "overloaded" in str(first.value)
    with pytest.raises(ProviderError) as second:
        await fake.complete(_request())
    assert second.value is boom
    with pytest.raises(ProviderError) as third:
        await fake.complete(_request())
    assert (third.value.status, third.value.transient, third.value.retry_after) == (429, True, 1.5)
    with pytest.raises(RuntimeError, match="bug"):
        await fake.complete(_request())


async def test_callable_replies_see_the_request():
    """A callable reply (sync or async) is called with the request and its result is replayed."""

    async def echo_async(request):
        return f"async {request.messages[-1].content}"

    fake = FakeProvider(lambda request: f"sync {request.model}", echo_async)
    assert (await fake.complete(_request())).message.content == "sync m1"
    assert (await fake.complete(_request("yo"))).message.content == "async yo"


async def test_mapping_replies_and_delay():
    """The YAML mapping form takes text, toolCalls, finishReason, usage, model and delay."""
    fake = FakeProvider(
        {
            "text": "t",
            "toolCalls": [
                {"name": "add", "arguments": {"a": 1}, "id": "fixed"},
                {"name": "add", "arguments": '{"a": 2}'},
                {"name": "add", "arguments": "{oops"},
            ],
            "finishReason": "length",
            "usage": {"inputTokens": 5, "outputTokens": 6},
            "model": "m9",
            "delay": 0.01,
        }
    )
    response = await fake.complete(_request())
    calls = response.message.tool_calls
    assert [c.id for c in calls] == ["fixed", "call_1_2", "call_1_3"]
    assert dict(calls[1].arguments) == {"a": 2}
    assert calls[2].raw_arguments == "{oops"
    assert calls[2].arguments == {}
    assert response.finish_reason == "length"
    assert response.usage == Usage(input_tokens=5, output_tokens=6, total_tokens=11, requests=1)
    assert response.model == "m9"


def test_malformed_replies_fail_early_with_a_path():
    """A bad mapping reply raises ConfigError naming where it is; a bad type raises TypeError."""
    fake = FakeProvider("ok")
    with pytest.raises(ConfigError, match="unknown keys txt") as caught:
        fake.enqueue({"txt": "typo"})
    assert caught.value.problems[0].path == "replies[1]"
    with pytest.raises(ConfigError, match="name is required"):
        fake.enqueue({"toolCalls": [{"arguments": {}}]})
    with pytest.raises(ConfigError, match="inputTokens must be an integer"):
        fake.enqueue({"text": "x", "usage": {"inputTokens": -1}})
    with pytest.raises(ConfigError, match="error reply takes no text"):
        fake.enqueue({"error": "x", "text": "y"})
    with pytest.raises(TypeError, match="not int"):
        fake.enqueue(3)
    assert fake.remaining == 1


def test_options_from_the_assembly(tmp_path):
    """replies and file come from the provider's options; both at once, or a missing file, is an error."""
    provider = ScriptedProvider(ProviderSettings(name="s", kind="scripted", options={"replies": ["a", {"text": "b"}]}))
    assert provider.remaining == 2
    with pytest.raises(ConfigError, match="either replies or file"):
        ScriptedProvider(ProviderSettings(name="s", kind="scripted", options={"replies": [], "file": "x.yaml"}))
    with pytest.raises(ConfigError, match="cannot read script"):
        ScriptedProvider(ProviderSettings(name="s", kind="scripted", options={"file": str(tmp_path / "none.yaml")}))
    with pytest.raises(ConfigError, match=r"\$\.providers\.s\.replies\[0\]"):
        ScriptedProvider(ProviderSettings(name="s", kind="scripted", options={"replies": [{"bogus": 1}]}))


def test_load_script_accepts_a_list_or_a_replies_mapping(tmp_path):
    """A script file holds a list of replies or a mapping with one replies key."""
    (tmp_path / "a.yaml").write_text("- hello\n- text: there\n", encoding="utf-8")
    (tmp_path / "b.yaml").write_text("replies:\n  - hello\n", encoding="utf-8")
    (tmp_path / "c.yaml").write_text("hello: [\n", encoding="utf-8")
    (tmp_path / "d.yaml").write_text("just text\n", encoding="utf-8")
    assert load_script(tmp_path / "a.yaml") == ["hello", {"text": "there"}]
    assert load_script(tmp_path / "b.yaml") == ["hello"]
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_script(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="list of replies"):
        load_script(tmp_path / "d.yaml")


SCRIPT = """\
replies:
  - toolCalls:
      - name: add
        arguments: {a: 20, b: 22}
    usage: {inputTokens: 100, outputTokens: 10}
  - text: "the answer is 42"
    usage: {inputTokens: 120, outputTokens: 5}
"""


async def test_yaml_script_drives_a_real_run(tmp_path):
    """A scripted provider reading a YAML file drives a run with a real tool call on the file store."""
    (tmp_path / "script.yaml").write_text(SCRIPT, encoding="utf-8")
    tools = ToolsPlugin()
    assembly = _assembly(
        tmp_path, script=ProviderConfig(kind="scripted", options={"file": str(tmp_path / "script.yaml")})
    )
    async with loopwright.Runtime(assembly, plugins=[loopwright_testing, tools], autoload=False) as rt:
        run = await rt.start_agent(Definition(name="x", model="script:gpt-x", tools=("add",)), None, "add 20 and 22")
        result = await run.result()
        records = await rt.records(run.instance_id)
        provider = rt.provider("script")
    assert result.text == "the answer is 42"
    assert result.stop_reason is StopReason.WAITING
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.requests) == (220, 15, 2)
    assert result.cost.amount == 0
    assert tools.calls == ["add"]
    # The runtime gives the call its own id; the script's id is kept as the wire id.
    [made] = [c for m in run.inst.transcript if m.role == "assistant" for c in m.tool_calls]
    assert made.provider_id == "call_1_1"
    assert re.fullmatch(r"lw-1-0-[0-9a-f]{6}", made.id), made.id
    [call] = [r["data"] for r in records if r["kind"] == "tool_call"]
    assert (call["toolCallId"], call["status"]) == (made.id, "success")
    tool_message = provider.history[1].messages[-1]
    assert (tool_message.role, tool_message.content) == ("tool", "42")
    assert (tool_message.tool_call_id, tool_message.provider_call_id) == (made.id, "call_1_1")


async def test_error_reply_fails_the_run(tmp_path):
    """A scripted error reply ends the run in the error state, with the ProviderError as the cause."""
    assembly = _assembly(
        tmp_path,
        s=ProviderConfig(kind="scripted", options={"replies": [{"error": {"status": 400, "message": "bad request"}}]}),
    )
    async with loopwright.Runtime(assembly, plugins=[loopwright_testing], autoload=False) as rt:
        run = await rt.start_agent(Definition(name="x", model="s:m"), None, "hi")
        with pytest.raises(RunError) as caught:
            await run.result()
    assert isinstance(caught.value.cause, ProviderError)
    assert caught.value.cause.status == 400
    assert caught.value.result.state is loopwright.State.ERROR
    assert "bad request" in caught.value.result.error


async def test_transient_error_falls_back(tmp_path):
    """After a transient scripted failure, the definition's fallback model answers."""
    assembly = _assembly(
        tmp_path,
        s=ProviderConfig(kind="scripted", options={"replies": [{"error": {"status": 503, "message": "overloaded"}}]}),
    )
    async with loopwright.Runtime(assembly, plugins=[loopwright_testing], autoload=False) as rt:
        run = await rt.start_agent(Definition(name="x", model="s:m", fallback_models=("test:any",)), None, "hi")
        result = await run.result()
    assert result.text == "test answer to: hi"


async def test_invalid_raw_arguments_reach_the_loop(runtime, fake_provider):
    """A call whose arguments are not JSON gets an invalid_arguments result, and the run goes on."""
    fake_provider.enqueue({"toolCalls": [{"name": "add", "arguments": "{not json"}]}, "gave up")
    run = await runtime.start_agent(Definition(name="x", model="fake:any", tools=("add",)), None, "add")
    result = await run.result()
    assert result.text == "gave up"
    tool_message = fake_provider.history[1].messages[-1]
    assert tool_message.status == "invalid_arguments"
